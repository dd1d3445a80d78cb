"""``goodput`` and ``check``: where each step's wall clock went, and what would make that number lie."""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from nemo_telemetry.cli._common import (EXIT_FINDINGS, console, fail, library_errors, print_json,
                                        ray_messages_on_stderr)
from nemo_telemetry.cli.app import app
from nemo_telemetry.cli.startup import skip_pyarrow_pandas_probe

if TYPE_CHECKING:
    from nemo_telemetry.analysis import RunGoodput

# The analysis and the renderings (numpy, pyarrow, rich) are imported inside each command, so
# that defining the commands, and so `--help`, loads none of them.

_SOURCE_HELP = "A dataset directory (from `ingest`) or OTLP dump files."
_THREADS_HELP = ("Threads the read may keep busy (default: the CPUs this process may run on, fewer under a "
                 "cgroup CPU quota; or NEMO_TELEMETRY_THREADS).")
_MEMORY_HELP = ("Bytes, or a size such as 512M or 4G, the in-memory path may take before goodput streams the "
                "dataset in batches (default: a quarter of the memory available, the tighter of the host's and "
                "the cgroup limit's; or NEMO_TELEMETRY_MEMORY_BUDGET).")
_ENGINE_HELP = ("local: this process (streams a dataset larger than memory); ray: Ray tasks on the cluster "
                "RAY_ADDRESS names, else a local one (needs a dataset directory).")


# -- goodput -----------------------------------------------------------------------------------


@app.command("goodput")
def goodput_command(
    source: Path = typer.Argument(..., help=_SOURCE_HELP),
    output: str = typer.Option("table", "--format", "-f", help="table, json or csv (one row per step)."),
    run: Optional[str] = typer.Option(None, "--run", help="Only this run (nemo.run.id)."),
    by: str = typer.Option("step", "--by", help="step: a row per step; rank: a row per (service, rank); fleet: "
                                                "GPU-seconds per fleet (rl.fleet) and bucket, and the cluster; "
                                                "fleet,step: the same per step too."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Also write a stacked bar chart: FILE.png or FILE.html."),
    baseline: Optional[Path] = typer.Option(None, "--baseline", help="Compare with another run's SOURCE, "
                                                                      "bucket by bucket per mean step."),
    engine: str = typer.Option("local", "--engine", help=_ENGINE_HELP),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help=_THREADS_HELP),
    memory_budget: Optional[str] = typer.Option(None, "--memory-budget", help=_MEMORY_HELP),
) -> None:
    """Goodput per step: wall clock split into productive / overhead / idle / wasted / unattributed.

    Example: nemo-telemetry goodput ./dataset --format json --baseline ./yesterday
    """
    if output not in ("table", "json", "csv"):
        raise fail(f"--format {output}: choose table, json or csv")
    if by not in ("step", "rank", "fleet", "fleet,step"):
        raise fail(f"--by {by}: choose step, rank, fleet or fleet,step")
    if plot is not None and plot.suffix.lower() not in (".png", ".html"):
        raise fail(f"--plot {plot}: the file name must end in .png or .html")
    skip_pyarrow_pandas_probe()
    from nemo_telemetry.analysis import (GOODPUT_COLUMNS, ReadSettings, goodput_document,
                                         goodput_with_engine, read_for_analysis, run_goodput, span_census)
    from nemo_telemetry.cli.render import bar_width_for, render_census, render_fleets, render_run

    with library_errors():
        settings = ReadSettings.from_machine(threads=threads, memory_budget=memory_budget)
        with ray_messages_on_stderr(engine):  # stdout holds the document alone
            runs = goodput_with_engine(source, engine=engine, run_id=run, by=by, threads=settings.threads,
                                       memory_budget=settings.memory_budget)
        # what the source holds, read only when some run has no step to report (the usual run costs nothing more)
        census = (span_census(source, run_id=run, settings=settings)
                  if not runs or any(r.steps.num_rows == 0 for r in runs) else None)
        base = run_goodput(read_for_analysis(baseline, columns=GOODPUT_COLUMNS)) if baseline is not None else ()
        if plot is not None:
            from nemo_telemetry.analysis import write_goodput_plot  # matplotlib is optional

            write_goodput_plot(runs, plot)
    if output == "json":
        print_json(goodput_document(runs, baseline=base, census=census))
    elif output == "csv":
        _write_csv(runs, by)
    else:
        out = console()
        if not runs:
            out.print(render_census(census, source))
        for item in runs:
            if item.fleets is not None:  # --by fleet: the GPU-seconds tables, as wide as their numbers need
                tables, notes = render_fleets(item)
                needed = _natural_width(out, tables)
                (console(width=needed) if needed > out.width else out).print(tables)
                out.print(notes)
                continue
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
    from rich.measure import Measurement

    return Measurement.get(out, out.options.update(width=10_000), renderable).maximum


def _write_csv(runs: tuple[RunGoodput, ...], by: str) -> None:
    from nemo_telemetry.analysis import FLEET_COLUMNS, STEP_COLUMNS

    writer = csv.writer(sys.stdout, lineterminator="\n")
    if by in ("fleet", "fleet,step"):  # a row per fleet and the cluster row ("cluster"), per run (and step)
        per_step = by == "fleet,step"
        writer.writerow(["run_id", *(["iteration"] if per_step else []), *FLEET_COLUMNS])
        for run in runs:
            if run.fleets is None:
                continue
            sections = ([(i, t.to_pylist(), c) for i, t, c in run.fleets.steps] if per_step
                        else [(None, run.fleets.fleets.to_pylist(), run.fleets.cluster)])
            for iteration, rows, cluster in sections:
                for row in (*rows, cluster):
                    writer.writerow([run.run_id, *([iteration] if per_step else []),
                                     *("" if row[c] is None else row[c] for c in FLEET_COLUMNS)])
        return
    tables = [r.ranks if by == "rank" else r.steps for r in runs]
    columns = tables[0].column_names if tables else list(STEP_COLUMNS)
    writer.writerow(columns)
    for table in tables:
        for row in table.to_pylist():
            writer.writerow(["" if row[c] is None else row[c] for c in columns])


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
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help=_THREADS_HELP),
    memory_budget: Optional[str] = typer.Option(None, "--memory-budget", help=_MEMORY_HELP),
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
    skip_pyarrow_pandas_probe()
    from nemo_telemetry.analysis import ReadSettings, check_with_engine
    from nemo_telemetry.cli.render import render_report

    with library_errors(), ray_messages_on_stderr(engine):  # stdout holds the report alone
        settings = ReadSettings.from_machine(threads=threads, memory_budget=memory_budget)
        report = check_with_engine(source, engine=engine, run_id=run, unattributed_threshold=unattributed_threshold,
                                   overlap_tolerance_s=tolerance_s, threads=settings.threads,
                                   memory_budget=settings.memory_budget)
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
