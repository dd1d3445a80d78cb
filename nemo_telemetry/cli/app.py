"""The Typer application: one module per command family registers its commands on ``app``.

Exit codes (pinned by the CLI contract): 0 ok, 1 findings at error severity, 2 bad usage or
unreadable input.
"""

from __future__ import annotations

import typer

from nemo_telemetry.cli.startup import console_script_process, freeze_for_exit

app = typer.Typer(
    name="nemo-telemetry",
    help="Where did the wall clock of my RL run go? Goodput and waterfalls from OTLP traces.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Click's own help layout: Typer's rich panels show flags as "<bool>" as if they took a value
    # and cut long option names (--unattributed-threshold) to fit their first column.
    rich_markup_mode=None,
)

# Command modules register themselves on `app` when imported; keep this list sorted.
from nemo_telemetry.cli import dataset_cmds  # noqa: E402,F401
from nemo_telemetry.cli import demo_cmds  # noqa: E402,F401
from nemo_telemetry.cli import goodput_cmds  # noqa: E402,F401
from nemo_telemetry.cli import ingest_cmds  # noqa: E402,F401
from nemo_telemetry.cli import lint_cmds  # noqa: E402,F401
from nemo_telemetry.cli import monitor_cmds  # noqa: E402,F401
from nemo_telemetry.cli import registry_cmds  # noqa: E402,F401
from nemo_telemetry.cli import waterfall_cmds  # noqa: E402,F401


def main() -> None:
    """Console-script entry point: this process runs the one command, with its own settings
    (:mod:`nemo_telemetry.cli.startup`), which the Typer app run inside another program does not get."""
    console_script_process()
    try:
        app()
    finally:
        freeze_for_exit()


if __name__ == "__main__":
    # Run as ``python -m nemo_telemetry.cli.app`` this file is ``__main__``, a second copy whose
    # ``app`` no command module registered on: run the package module's entry point instead.
    from nemo_telemetry.cli.app import main as package_main

    package_main()
