"""``verify`` and ``repair``: which committed files of a dataset are damaged and which spans are
stored twice, and a consistent committed state without either."""

from __future__ import annotations

from pathlib import Path

import typer

from nemo_telemetry.cli._common import EXIT_FINDINGS, EXIT_USAGE, console, library_errors, print_json
from nemo_telemetry.cli.app import app


@app.command("verify")
def verify_command(
    dataset: Path = typer.Argument(..., help="A dataset directory (the --out of ingest or collect)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Read every committed file of a dataset whole and count the spans stored twice; changes nothing.

    Exit 2 when a committed file is damaged, 1 when spans are stored twice, 0 when the dataset is sound.

    Example: nemo-telemetry verify run.dataset
    """
    from nemo_telemetry.analysis import verify_dataset

    with library_errors():
        report = verify_dataset(dataset)
    if as_json:
        print_json(report.to_dict())
    else:
        out = console()
        for item in report.damaged:
            out.print(f"damaged: {item.path}: {item.problem}"
                      + (f" ({item.rows} rows committed)" if item.rows is not None else ""), soft_wrap=True)
        if report.duplicate_spans:
            out.print(f"{report.duplicate_spans} span(s) stored more than once", soft_wrap=True)
        if report.ok:
            out.print(f"{dataset}: {report.files} committed file(s), all intact; no span stored twice", soft_wrap=True)
        else:
            out.print(f"to repair: nemo-telemetry repair {dataset}", soft_wrap=True)
    if report.damaged:
        raise typer.Exit(EXIT_USAGE)
    if report.duplicate_spans:
        raise typer.Exit(EXIT_FINDINGS)


@app.command("repair")
def repair_command(
    dataset: Path = typer.Argument(..., help="A dataset directory (the --out of ingest or collect)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Drop damaged files from a dataset's commit record and remove spans stored twice, keeping every intact span once.

    Takes the dataset's writer lock (exit 2 while ingest, collect or monitor --port writes it).
    Damaged files move to DATASET/_damaged/; their spans are lost from the dataset until the
    ingest of their dumps runs again (the report names the command where the record knows it).

    Example: nemo-telemetry repair run.dataset
    """
    from nemo_telemetry.analysis import repair_dataset

    with library_errors():
        report = repair_dataset(dataset)
    if as_json:
        print_json(report.to_dict())
        return
    out = console()
    for item in report.dropped:
        out.print(f"dropped: {item.path}: {item.problem}"
                  + (f" ({item.rows} rows lost)" if item.rows is not None else ""), soft_wrap=True)
    if report.duplicates_removed:
        out.print(f"removed {report.duplicates_removed} duplicate span(s), rewrote {report.files_rewritten} file(s)",
                  soft_wrap=True)
    if report.renamed:
        out.print(f"renamed {report.renamed} committed file(s) into place", soft_wrap=True)
    for command in report.restore:
        out.print(f"to store the lost spans again, run: {command}", soft_wrap=True)
    if any(item.restore is None for item in report.dropped):
        out.print("the spans of files whose ingest the record does not name (or a collect's) are lost unless "
                  "their dumps are ingested again, or their exporters send them again", soft_wrap=True)
    out.print(f"{dataset}: consistent" + ("" if report.changed else " already; nothing changed"), soft_wrap=True)
