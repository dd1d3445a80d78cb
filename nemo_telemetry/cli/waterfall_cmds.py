"""``waterfall``: a run's span trees in the terminal, or exported for Perfetto or a browser."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import typer

from nemo_telemetry.analysis import DEFAULT_COLLAPSE_THRESHOLD
from nemo_telemetry.cli._common import console, fail, library_errors
from nemo_telemetry.cli.app import app

# The analysis and the renderings (numpy, pyarrow, rich) are imported inside the command, so that
# defining it, and so `--help`, loads none of them.

_UNITS_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000,
             "m": 60_000_000_000, "min": 60_000_000_000, "h": 3_600_000_000_000}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zµ]*)\s*$")


@app.command("waterfall")
def waterfall_command(
    source: Path = typer.Argument(..., help="A dataset directory (from `ingest`) or OTLP dump files."),
    run: Optional[str] = typer.Option(None, "--run", help="Only this run (nemo.run.id)."),
    trace: Optional[str] = typer.Option(None, "--trace", help="Only this trace (id or a unique prefix)."),
    step: Optional[int] = typer.Option(None, "--step", help="Expand this step (rl.iteration) in full."),
    depth: Optional[int] = typer.Option(None, "--depth", min=0, help="Deepest level shown (top level is 0)."),
    min_duration: str = typer.Option("0", "--min-duration", help="Hide spans shorter than this (5ms, 1s, 250us)."),
    collapse: int = typer.Option(DEFAULT_COLLAPSE_THRESHOLD, "--collapse", min=1,
                                 help="Collapse more than this many same-name siblings into one line."),
    expand: bool = typer.Option(False, "--expand", help="Unfold every step instead of one line each."),
    export: Optional[Path] = typer.Option(
        None, "--export", help="Write FILE.json (Perfetto) or FILE.html instead: every span of the selection "
                               "(--run, --trace, --step); the other options shape the terminal view only."),
) -> None:
    """Show span trees with a time bar per span: by default the job's steps, one line each.

    Example: nemo-telemetry waterfall ./dataset --step 3 --min-duration 5ms
    """
    min_ns = parse_duration(min_duration)
    if export is not None and export.suffix.lower() not in (".json", ".html"):
        raise fail(f"--export {export}: the file name must end in .json (Perfetto) or .html (browser view)")
    from nemo_telemetry.analysis import read_spans, waterfall
    from nemo_telemetry.cli.render import print_waterfall

    with library_errors():
        spans = read_spans(source)
        if export is not None:
            _export(spans, export, run=run, trace=trace, step=step, source=source)
            return
        shown = waterfall(spans, run_id=run, trace_id=trace, step=step, depth=depth, min_duration_ns=min_ns,
                          collapse_threshold=collapse, fold_steps=False if expand else None)
    print_waterfall(shown, console())


def _export(spans, path: Path, *, run, trace, step, source) -> None:
    from nemo_telemetry.analysis import read_logs, to_chrome_trace, to_html

    if path.suffix.lower() == ".json":
        import json

        document = to_chrome_trace(spans, run_id=run, trace_id=trace, step=step)
        path.write_text(json.dumps(document, separators=(",", ":")), encoding="utf-8")
        what = f"{sum(1 for e in document['traceEvents'] if e['ph'] == 'X')} spans, open it in ui.perfetto.dev"
    else:
        logs = read_logs(source)
        path.write_text(to_html(spans, run_id=run, trace_id=trace, step=step, logs=logs), encoding="utf-8")
        what = "open it in a browser"
    console().print(f"wrote {path} ({what})")


def parse_duration(text: str) -> int:
    """``5ms`` / ``1.5s`` / ``250us`` / ``2m`` / ``100ns`` / a bare number of seconds -> ns."""
    match = _DURATION.match(text.lower())
    unit = match.group(2) if match else ""
    if not match or (unit and unit not in _UNITS_NS):
        raise fail(f"--min-duration {text!r}: expected a number and a unit, e.g. 5ms, 1s, 250us, 2m")
    return int(float(match.group(1)) * _UNITS_NS[unit or "s"])
