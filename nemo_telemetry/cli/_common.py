"""Helpers every command shares: one console, library errors and OS errors turned into one line
and exit code 2, our warnings as one line each on stderr.

rich is imported when a command first prints, so that ``--help`` does not pay for it."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import sys
import threading
import warnings
from typing import TYPE_CHECKING, Any, Iterator

import typer

from nemo_telemetry.analysis import CompiledPathWarning, IncompleteDatasetWarning, IngestWarning
from nemo_telemetry.errors import NemoTelemetryError

if TYPE_CHECKING:
    from rich.console import Console

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2


def console(*, stderr: bool = False, width: int | None = None) -> Console:
    """A console for one command; stdout unless told otherwise; the terminal's width unless given."""
    from rich.console import Console  # only a command that prints loads rich

    return Console(stderr=stderr, highlight=False, soft_wrap=False, width=width)


def ray_messages_on_stderr(engine: str):
    """While Ray runs a command's work, what Ray prints to stdout (its raylet's "a worker died" notes,
    on a thread of its own) goes to stderr: stdout holds the command's output only, so JSON parses."""
    return contextlib.redirect_stdout(sys.stderr) if engine == "ray" else contextlib.nullcontext()


def print_json(payload: Any) -> None:
    """Stable JSON on stdout (no rich markup, sorted nowhere: the contract's key order)."""
    sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")


def fail(message: str, code: int = EXIT_USAGE) -> "typer.Exit":
    """Print an error on stderr and return the Exit to raise."""
    from rich.markup import escape

    # soft_wrap: an error is one line a user can grep, not a paragraph wrapped at the terminal width
    console(stderr=True).print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


_SHOWN_WARNINGS = (IncompleteDatasetWarning, IngestWarning, CompiledPathWarning)
_OS_ERROR_HINTS = {
    errno.ENOSPC: "free some space, then run the same command again",
    errno.EDQUOT: "free some space, then run the same command again",
    errno.EACCES: "check the permissions, or choose another path",
    errno.EPERM: "check the permissions, or choose another path",
    errno.EROFS: "the file system is read-only; choose another path",
    errno.ENOTDIR: "a part of the path is a file, not a directory; choose another path",
    errno.EEXIST: "a part of the path is a file, not a directory; choose another path",
}


def warn_line(message: str) -> None:
    """One warning on stderr, one line a user can grep."""
    from rich.markup import escape

    console(stderr=True).print(f"[yellow]warning:[/] {escape(message)}", soft_wrap=True)


def os_error_message(exc: OSError) -> str:
    """``<path>: <cause>; <what to do>`` for an error of the operating system (full disk, permissions)."""
    path = exc.filename if exc.filename is not None else "input/output"
    cause = os.strerror(exc.errno) if exc.errno else str(exc)
    hint = _OS_ERROR_HINTS.get(exc.errno)
    return f"{path}: {cause}" + (f"; {hint}" if hint else "")


@contextlib.contextmanager
def library_errors() -> Iterator[None]:
    """Turn a typed library error or an OS error into one line on stderr and exit code 2, and
    print each distinct warning of ours (an incomplete dataset, rejected records) as one line."""
    shown: set[str] = set()
    with warnings.catch_warnings():
        other = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if not issubclass(category, _SHOWN_WARNINGS):
                other(message, category, filename, lineno, file, line)
            elif str(message) not in shown:
                shown.add(str(message))
                warn_line(str(message))

        warnings.showwarning = show
        for category in _SHOWN_WARNINGS:
            warnings.simplefilter("always", category)  # every reader warns; each message is shown once
        try:
            yield
        except NemoTelemetryError as exc:
            raise fail(str(exc)) from None
        except OSError as exc:
            raise fail(os_error_message(exc)) from None


@contextlib.contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An event SIGINT and SIGTERM set, taken before a server command loads anything: a signal
    while it starts (imports, the dataset, the kernels) stops it cleanly once it can, instead of
    interrupting whatever runs or being lost."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
