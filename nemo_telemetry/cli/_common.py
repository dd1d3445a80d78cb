"""Helpers every command shares: one console, and library errors turned into exit code 2."""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any, Iterator

import typer
from rich.console import Console
from rich.markup import escape

from nemo_telemetry.errors import NemoTelemetryError

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2


def console(*, stderr: bool = False, width: int | None = None) -> Console:
    """A console for one command; stdout unless told otherwise; the terminal's width unless given."""
    return Console(stderr=stderr, highlight=False, soft_wrap=False, width=width)


def print_json(payload: Any) -> None:
    """Stable JSON on stdout (no rich markup, sorted nowhere: the contract's key order)."""
    sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")


def fail(message: str, code: int = EXIT_USAGE) -> "typer.Exit":
    """Print an error on stderr and return the Exit to raise."""
    # soft_wrap: an error is one line a user can grep, not a paragraph wrapped at the terminal width
    console(stderr=True).print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


@contextlib.contextmanager
def library_errors() -> Iterator[None]:
    """Turn a typed library error into its message on stderr and exit code 2."""
    try:
        yield
    except NemoTelemetryError as exc:
        raise fail(str(exc)) from None
