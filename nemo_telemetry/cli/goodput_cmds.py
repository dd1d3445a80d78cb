"""``goodput`` and ``check``: where each step's wall clock went, and what would make that number lie."""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path
from typing import Optional

import typer
from rich import box
from rich.console import Group
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from nemo_telemetry.analysis import (BUCKETS, GOODPUT_COLUMNS, SEVERITIES, STEP_COLUMNS, CheckReport, RunGoodput,
                                     check_with_engine, goodput_document, goodput_with_engine, read_for_analysis,
                                     run_goodput)
from nemo_telemetry.cli._common import EXIT_FINDINGS, console, fail, library_errors, print_json
from nemo_telemetry.cli.app import app

BUCKET_STYLES = {"productive": "green", "overhead": "yellow", "idle": "blue", "wasted": "red"}
UNATTRIBUTED_STYLE = "grey50"
SEVERITY_STYLES = {"error": "bold red", "warning": "yellow", "info": "cyan"}
BAR_WIDTH = 30
_SOURCE_HELP = "A dataset directory (from `ingest`) or OTLP dump files."
_ENGINE_HELP = ("local: this process (streams a dataset larger than memory); ray: Ray tasks on the cluster "
                "RAY_ADDRESS names, else a local one (needs a dataset directory).")


# -- goodput -----------------------------------------------------------------------------------


@app.command("goodput")
def goodput_command(
    source: Path = typer.Argument(..., help=_SOURCE_HELP),
    output: str = typer.Option("table", "--format", "-f", help="table, json or csv (one row per step)."),
    run: Optional[str] = typer.Option(None, "--run", help="Only this run (nemo.run.id)."),
    by: str = typer.Option("step", "--by", help="step: a row per step; rank: a row per (service, rank)."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Also write a stacked bar chart: FILE.png or FILE.html."),
    baseline: Optional[Path] = typer.Option(None, "--baseline", help="Compare with another run's SOURCE, "
                                                                      "bucket by bucket per mean step."),
    engine: str = typer.Option("local", "--engine", help=_ENGINE_HELP),
) -> None:
    """Goodput per step: wall clock split into productive / overhead / idle / wasted / unattributed.

    Example: nemo-telemetry goodput ./dataset --format json --baseline ./yesterday
    """
    if output not in ("table", "json", "csv"):
        raise fail(f"--format {output}: choose table, json or csv")
    if by not in ("step", "rank"):
        raise fail(f"--by {by}: choose step or rank")
    if plot is not None and plot.suffix.lower() not in (".png", ".html"):
        raise fail(f"--plot {plot}: the file name must end in .png or .html")
    with library_errors():
        runs = goodput_with_engine(source, engine=engine, run_id=run, by=by)
        base = run_goodput(read_for_analysis(baseline, columns=GOODPUT_COLUMNS)) if baseline is not None else ()
        if plot is not None:
            from nemo_telemetry.analysis import write_goodput_plot  # noqa: PLC0415 (matplotlib is optional)

            write_goodput_plot(runs, plot)
    if output == "json":
        print_json(goodput_document(runs, baseline=base))
    elif output == "csv":
        _write_csv(runs, by)
    else:
        out = console()
        if not runs:
            out.print(f"no step spans and no bucketed spans in {source}")
        for item in runs:
            rendered = render_run(item, base, bar_width=bar_width_for(out.width))
            if by == "rank":  # a row per process keeps every service name whole, even past the terminal's width
                needed = _natural_width(out, rendered)
                (console(width=needed) if needed > out.width else out).print(rendered)
            else:
                out.print(rendered)
    if plot is not None:
        console(stderr=output != "table").print(f"wrote {plot}")


def _natural_width(out, renderable) -> int:
    """The width ``renderable`` takes when nothing has to be shortened."""
    return Measurement.get(out, out.options.update(width=10_000), renderable).maximum


NO_STEPS_NOTE = (
    "no step spans in run {run}: per-step goodput needs rl.<algo>.step spans, which the 'step' group "
    "emits. Enable it with span_groups: per_step (the preset with step and the leaf groups inside it), or "
    "add step to the spec; the bucketed spans found are summed below as outside any step.")


def _write_csv(runs: tuple[RunGoodput, ...], by: str) -> None:
    writer = csv.writer(sys.stdout, lineterminator="\n")
    tables = [r.ranks if by == "rank" else r.steps for r in runs]
    columns = tables[0].column_names if tables else list(STEP_COLUMNS)
    writer.writerow(columns)
    for table in tables:
        for row in table.to_pylist():
            writer.writerow(["" if row[c] is None else row[c] for c in columns])


def step_bar(row: dict, longest_wall_s: float, width: int = BAR_WIDTH) -> Text:
    """One stacked bar: a cell per bucket's share, unattributed in grey; length follows the wall."""
    cells = round(width * row["wall_s"] / longest_wall_s) if longest_wall_s > 0 else 0
    parts = [(b, row[f"{b}_s"]) for b in BUCKETS] + [("unattributed", row["unattributed_s"])]
    scale = sum(v for _, v in parts) or 1.0
    bar = Text()
    used = 0
    for i, (name, seconds) in enumerate(parts):
        n = cells - used if i == len(parts) - 1 else round(cells * seconds / scale)
        n = max(0, min(n, cells - used))
        glyph = "░" if name == "unattributed" else "█"
        bar.append(glyph * n, style=BUCKET_STYLES.get(name, UNATTRIBUTED_STYLE))
        used += n
    return bar


def bar_width_for(console_width: int) -> int:
    """What is left of the terminal for the bars after the numbers (at least 8 cells)."""
    return max(8, min(BAR_WIDTH, console_width - 79))


def _fmt(value: float | None) -> str:
    """Seconds in at most 7 characters: 3 decimals (a demo's steps are short), fewer as the number grows."""
    if value is None:
        return "-"
    digits = 3 if abs(value) < 10 else 2 if abs(value) < 1000 else 1 if abs(value) < 10000 else 0
    return f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None or value != value else f"{value:.1%}"


_HEADERS = {"productive": "prod", "overhead": "ovhd", "idle": "idle", "wasted": "waste"}


def render_run(run: RunGoodput, baseline: tuple[RunGoodput, ...] = (), *, bar_width: int = BAR_WIDTH) -> Group:
    """The run's table (a row per step or per rank, and the total), then what fell outside the steps.

    A run without step spans gets, instead of an empty table, the reason and the group to enable.
    """
    if run.steps.num_rows == 0:
        return Group(Text(NO_STEPS_NOTE.format(run=run.run_id), style="yellow"), *_run_notes(run, baseline))
    rows = (run.ranks if run.ranks is not None else run.steps).to_pylist()
    table = Table(title=f"run {run.run_id}: goodput per {'rank' if run.ranks is not None else 'step'} (seconds)",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0, 0, 1))
    first = ("process",) if run.ranks is not None else ("step",)
    # numbers never wrap or shrink; with --by rank the table is printed as wide as its longest service name
    for name in (*first, "wall", *BUCKETS, "unattr", "double", "goodput"):  # seconds, then a ratio
        table.add_column(_HEADERS.get(name, name), justify="right", style=BUCKET_STYLES.get(name),
                         no_wrap=True, min_width=5 if name == "step" else 8 if name == "process" else 7)
    if run.ranks is None:
        table.add_column("", no_wrap=True, overflow="crop")
    longest = max([r["wall_s"] for r in rows] or [0.0])
    for r in rows:
        head = (f"{r['service_name'] or '-'}:{'-' if r['rank'] is None else r['rank']}"
                if run.ranks is not None else str(r["iteration"]),)
        table.add_row(*head, _fmt(r["wall_s"]), *(_fmt(r[f"{b}_s"]) for b in BUCKETS), _fmt(r["unattributed_s"]),
                      _fmt(r["double_counted_s"]), _pct(r["goodput"]),
                      *([step_bar(r, longest, bar_width)] if run.ranks is None else []))
    t = run.total
    table.add_section()
    table.add_row("total", _fmt(t["wall_s"]), *(_fmt(t[f"{b}_s"]) for b in BUCKETS),
                  _fmt(t["unattributed_s"]), _fmt(t["double_counted_s"]), _pct(t["goodput"]),
                  *([""] if run.ranks is None else []), style="bold")
    return Group(table, *_efficiency_table(run), *_run_notes(run, baseline))


def _efficiency_table(run: RunGoodput) -> list:
    """The step's efficiency metrics (rl.efficiency.seconds) beside its span buckets, when recorded."""
    columns = [c for c in run.steps.column_names if c.startswith("efficiency/")]
    if not columns or run.ranks is not None:
        return []
    table = Table(title="efficiency metrics per step (seconds, rl.efficiency.seconds)", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0, 0, 1))
    table.add_column("step", justify="right", min_width=5)
    for column in columns:
        table.add_column(column.removeprefix("efficiency/").removesuffix("_s"), justify="right", no_wrap=True)
    for row in run.steps.select(["iteration", *columns]).to_pylist():
        table.add_row(str(row["iteration"]), *(_fmt(None if v != v else v) for v in (row[c] for c in columns)))
    return [table]


def _run_notes(run: RunGoodput, baseline: tuple[RunGoodput, ...]) -> list:
    notes: list = []
    o = run.outside_steps
    if o["spans"]:
        its = ", ".join(str(i) for i in o["iterations"][:10]) or "none"
        buckets = ", ".join(f"{b} {_fmt(o[f'{b}_s'])} s" for b in BUCKETS if o[f"{b}_s"])
        notes.append(Text(f"outside any step: {buckets} ({o['spans']} spans; iterations without a step: {its}; "
                          f"{o['unstamped_spans']} unstamped)"))
    if run.job_wall_s is not None:
        share = run.total["wall_s"] / run.job_wall_s if run.job_wall_s > 0 else None
        notes.append(Text(f"job wall: {_fmt(run.job_wall_s)} s; steps cover {_pct(share)} of it"))
    for out in run.outliers:
        notes.append(Text(f"slow step {out.iteration}: {_fmt(out.wall_s)} s > {_fmt(out.threshold_s)} s "
                          f"(median + 3 MAD); {out.bucket} grew most (+{_fmt(out.grew_by_s)} s)", style="cyan"))
    if baseline:
        from nemo_telemetry.analysis import compare_runs  # noqa: PLC0415

        other = next((b for b in baseline if b.run_id == run.run_id), baseline[0])
        notes.append(_baseline_table(run, other, compare_runs(run, other)))
    return notes


def _baseline_table(run: RunGoodput, other: RunGoodput, diff: dict) -> Table:
    table = Table(title=f"mean step: run {run.run_id} against baseline {other.run_id}", title_justify="left")
    for name in ("", "current", "baseline", "delta"):
        table.add_column(name, justify="right")
    for key, values in diff.items():
        pct = key == "goodput"
        show = _pct if pct else _fmt
        delta = values["delta"]
        sign = "" if delta is None else ("+" if delta >= 0 else "")
        table.add_row(key.removesuffix("_s"), show(values["current"]), show(values["baseline"]),
                      "-" if delta is None else sign + (f"{delta * 100:.1f} pt" if pct else f"{_fmt(delta)} s"))
    return table


# -- check -------------------------------------------------------------------------------------


@app.command("check")
def check_command(
    source: Path = typer.Argument(..., help=_SOURCE_HELP),
    output: str = typer.Option("table", "--format", "-f", help="table or json."),
    fail_on: str = typer.Option("error", "--fail-on", help="Exit 1 when a finding at this severity or worse "
                                                            "exists: error, warning or never."),
    unattributed_threshold: float = typer.Option(0.2, "--unattributed-threshold", min=0.0, max=1.0,
                                                 help="Share of a step under no bucketed span that is a finding."),
    overlap_tolerance: str = typer.Option("1ms", "--overlap-tolerance",
                                          help="Bucketed spans overlapping by at most this much are clock "
                                               "granularity, an info finding: 1ms, 500us, 0.002 (seconds)."),
    run: Optional[str] = typer.Option(None, "--run", help="Only this run (nemo.run.id)."),
    engine: str = typer.Option("local", "--engine", help=_ENGINE_HELP),
) -> None:
    """Findings that would make the goodput breakdown lie; exit 1 when one is at error severity.

    Example: nemo-telemetry check ./dataset --format json --fail-on warning
    """
    if output not in ("table", "json"):
        raise fail(f"--format {output}: choose table or json")
    if fail_on not in ("error", "warning", "never"):
        raise fail(f"--fail-on {fail_on}: choose error, warning or never")
    tolerance_s = parse_duration_s(overlap_tolerance)
    if tolerance_s is None:
        raise fail(f"--overlap-tolerance {overlap_tolerance}: give a duration >= 0 such as 1ms, 500us or 0.002 "
                   "(seconds)")
    with library_errors():
        report = check_with_engine(source, engine=engine, run_id=run, unattributed_threshold=unattributed_threshold,
                                   overlap_tolerance_s=tolerance_s)
    if output == "json":
        print_json(report.to_dict())
    else:
        console().print(render_report(report))
    if fail_on != "never" and report.has(fail_on):
        raise typer.Exit(EXIT_FINDINGS)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)(?:e([+-]?\d+))?\s*(s|ms|us|µs|ns)?\s*$")
_UNIT_S = {None: 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def parse_duration_s(text: str) -> float | None:
    """``"1ms"`` -> 0.001; a bare number is seconds; None for anything else (or a negative)."""
    match = _DURATION.match(text)
    if match is None:
        return None
    number, exponent, unit = match.groups()
    return float(number) * 10.0 ** int(exponent or 0) * _UNIT_S[unit]


def render_report(report: CheckReport) -> Group:
    """A heading line and the message per finding (worst first), then the counts."""
    counts = report.counts
    summary = Text(", ".join(f"{counts[s]} {s}" for s in SEVERITIES), style="bold")
    if not report.findings:
        return Group(Text("no findings: the breakdown is consistent", style="green"), summary)
    lines: list = []
    for f in report.findings:
        where = [f"run {f.run_id}" if f.run_id is not None else None,
                 f"step {f.iteration}" if f.iteration is not None else None,
                 f"trace {f.trace_id}" if f.trace_id else None]
        head = Text.assemble((f"{f.severity:<8}", SEVERITY_STYLES[f.severity]), (f"{f.code}", "bold"),
                             "  " + ", ".join(w for w in where if w))
        lines += [head, Padding(Text(f.message), (0, 0, 1, 4))]
    hidden = sum(counts["by_code"].values()) - len(report.findings)
    if hidden > 0:
        lines.append(Text(f"{hidden} more findings not listed (the first of each code are; see counts)"))
    return Group(*lines, summary)
