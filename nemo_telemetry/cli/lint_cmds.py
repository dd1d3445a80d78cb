"""``lint``: instrumentation call sites that would make the goodput breakdown or the waterfall lie."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import List

import typer

from nemo_telemetry.cli._common import EXIT_FINDINGS, console, library_errors, print_json
from nemo_telemetry.cli.app import app


class LintFormat(str, Enum):
    text = "text"
    json = "json"


@app.command()
def lint(
    paths: List[Path] = typer.Argument(..., help="Python files or directories to check (never imported)."),
    output_format: LintFormat = typer.Option(
        LintFormat.text, "--format", "-f", help="text: file:line: code: message; json: a list of findings."
    ),
) -> None:
    """Check instrumentation call sites: groups vs primitives, U_ aliases, carriers, raw OTel spans.

    Codes: leaf-on-umbrella, umbrella-on-leaf, umbrella-alias, undispatched-carrier, raw-otel-span.
    Exit 1 when anything is found, 2 when a path cannot be read.

    Example: nemo-telemetry lint src/ --format json
    """
    from nemo_telemetry.analysis import lint_paths

    with library_errors():
        findings = lint_paths(paths)
    if output_format is LintFormat.json:
        print_json([finding.to_dict() for finding in findings])
    else:
        out = console()
        for finding in findings:
            out.print(str(finding), markup=False, highlight=False, soft_wrap=True)
        summary = f"{len(findings)} finding(s)" if findings else "no findings"
        console(stderr=True).print(f"nemo-telemetry lint: {summary}", markup=False, highlight=False)
    if findings:
        raise typer.Exit(EXIT_FINDINGS)
