"""Renderings that more than one command prints: a run's goodput table, a check report, a waterfall.

``goodput``, ``check`` and ``waterfall`` print them, and ``demo`` prints all three for its run,
so they live here, beside no command.
"""

from __future__ import annotations

import re

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.padding import Padding
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import Text

from nemo_telemetry.analysis import BUCKETS, SEVERITIES, CheckReport, RunGoodput, SpanCensus, Waterfall, compare_runs

__all__ = ["BUCKET_STYLES", "UNATTRIBUTED_STYLE", "UNBUCKETED_STYLE", "SEVERITY_STYLES", "CRITICAL_MARK", "BAR_WIDTH",
           "NO_STEPS_NOTE", "FAILED_MARK", "MEASUREMENTS", "FLEET_STYLES", "step_bar", "bar_width_for", "render_run",
           "render_fleets", "render_report", "format_duration",
           "render_waterfall", "print_waterfall", "render_monitor", "render_census", "run_words"]

BUCKET_STYLES = {"productive": "green", "overhead": "yellow", "idle": "blue", "wasted": "red"}
UNATTRIBUTED_STYLE = "grey50"
UNBUCKETED_STYLE = UNATTRIBUTED_STYLE
SEVERITY_STYLES = {"error": "bold red", "warning": "yellow", "info": "cyan"}
CRITICAL_MARK = "◆"
FAILED_MARK = "✗"  # a failed step's row: its step span or a bucketed span in it ended in error status
BAR_WIDTH = 30

NO_STEPS_NOTE = (
    "no step spans in run {run}: per-step goodput needs rl.<algo>.step spans, which the 'step' group "
    "emits. Enable it with span_groups: per_step (the preset with step and the leaf groups inside it), or "
    "add step to the spec; the bucketed spans found are summed below as outside any step.")


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


def run_words(run_id: str | None) -> str:
    """How a run is named in a heading: by its id, or as the spans that carry none."""
    return f"run {_run_label(run_id)}"


def _run_label(run_id: str | None) -> str:
    return run_id if run_id is not None else "(no nemo.run.id)"


def render_census(census: SpanCensus | None, source) -> Group:
    """What a source with no run to report holds (goodput's answer when it has no step)."""
    notes = census.notes() if census is not None else []
    if not notes:
        return Group(Text(f"no step spans and no bucketed spans in {source}", style="yellow"))
    counts = Text(f"{source}: {census.spans:,} spans, {census.rl_spans:,} with an rl.* attribute, "
                  f"{census.step_spans:,} step spans", style="bold")
    return Group(counts, *(Text(f"{code}: {message}", style="yellow") for code, _, message in notes))


def render_run(run: RunGoodput, baseline: tuple[RunGoodput, ...] = (), *, bar_width: int = BAR_WIDTH) -> Group:
    """The run's table (a row per step or per rank, and the total), then what fell outside the steps.

    A run without step spans gets, instead of an empty table, the reason and the group to enable.
    """
    if run.steps.num_rows == 0:
        return Group(Text(NO_STEPS_NOTE.format(run=_run_label(run.run_id)), style="yellow"),
                     *_run_notes(run, baseline))
    rows = (run.ranks if run.ranks is not None else run.steps).to_pylist()
    table = Table(title=f"{run_words(run.run_id)}: goodput per {'rank' if run.ranks is not None else 'step'} (seconds)",
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
                if run.ranks is not None else _step_label(r),)
        table.add_row(*head, _fmt(r["wall_s"]), *(_fmt(r[f"{b}_s"]) for b in BUCKETS), _fmt(r["unattributed_s"]),
                      _fmt(r["double_counted_s"]), _pct(r["goodput"]),
                      *([step_bar(r, longest, bar_width)] if run.ranks is None else []))
    t = run.total
    table.add_section()
    table.add_row("total", _fmt(t["wall_s"]), *(_fmt(t[f"{b}_s"]) for b in BUCKETS),
                  _fmt(t["unattributed_s"]), _fmt(t["double_counted_s"]), _pct(t["goodput"]),
                  *([""] if run.ranks is None else []), style="bold")
    caveats = [Text(c, style="yellow") for c in getattr(run, "caveats", ())]  # under the total, before anything else
    return Group(table, *caveats, *_failed_note(run), *_efficiency_table(run), *_run_notes(run, baseline))


_FLEET_BUCKETS = ("productive", "overhead", "wasted", "idle", "unknown")
_FLEET_HEADERS = {"productive": "prod", "overhead": "ovhd", "wasted": "waste", "idle": "idle", "unknown": "unknown"}
FLEET_STYLES = {**BUCKET_STYLES, "unknown": UNATTRIBUTED_STYLE}


def render_fleets(run: RunGoodput) -> tuple[Group, Group]:
    """``--by fleet``: the tables (a row per fleet and the cluster row, in GPU-seconds, per step
    too with ``fleet,step``), and the notes under them (the run's caveats, and what would make the
    fleet figures lie), apart so that the notes wrap at the terminal's width."""
    fleets = run.fleets
    window = "the job less rl.init.total (async)" if fleets.windowing == "job" else "the step windows"
    title = f"run {run.run_id}: GPU-seconds per fleet over {window}"
    tables = [_fleet_table(title, [(None, fleets.fleets.to_pylist(), fleets.cluster)])]
    if fleets.per_step:
        tables.append(_fleet_table(f"run {run.run_id}: GPU-seconds per fleet and step",
                                   [(i, t.to_pylist(), c) for i, t, c in fleets.steps]))
    notes = [Text(c, style="yellow") for c in getattr(run, "caveats", ())]
    notes += [Text(f"{f.code}: {f.message}", style=SEVERITY_STYLES.get(f.severity, "yellow")) for f in fleets.findings]
    return Group(*tables), Group(*notes)


def _fleet_table(title: str, sections: list) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0, 0, 1))
    per_step = sections and sections[0][0] is not None
    heads = (*(("step",) if per_step else ()), "fleet", "gpus", "procs", "source", "GPU-s",
             *(_FLEET_HEADERS[b] for b in _FLEET_BUCKETS), "goodput", "tok/s/GPU")
    for name in heads:
        style = FLEET_STYLES.get(next((b for b, h in _FLEET_HEADERS.items() if h == name), ""), None)
        table.add_column(name, justify="left" if name in ("fleet", "source") else "right", style=style, no_wrap=True)
    for i, (iteration, rows, cluster) in enumerate(sections):
        if i:
            table.add_section()
        for row in rows:
            table.add_row(*_fleet_cells(row, iteration, per_step))
        table.add_row(*_fleet_cells(cluster, iteration, per_step), style="bold")
    return table


def _fleet_cells(row: dict, iteration, per_step: bool) -> tuple:
    tokens = row.get("tokens_per_s_per_gpu")
    return (*((str(iteration),) if per_step else ()), row["fleet"], str(row["gpus"]), str(row["processes"]),
            (row["source"] or "").replace("_", " "), _fmt(row["gpu_seconds"]),
            *(_fmt(row[f"{b}_gpu_s"]) for b in _FLEET_BUCKETS), _pct(row["goodput"]),
            "-" if tokens is None else f"{tokens:.1f}")


def _step_label(row: dict) -> Text | str:
    """The step column: the iteration, marked when the step failed."""
    if row.get("failed"):
        return Text(f"{FAILED_MARK}{row['iteration']}", style="bold red")
    return str(row["iteration"])


def _failed_note(run: RunGoodput) -> list:
    """What the mark on failed steps means, and the time they would otherwise have counted."""
    failed = [r for r in run.steps.to_pylist() if r.get("failed")]
    if not failed:
        return []
    steps = ", ".join(str(r["iteration"]) for r in failed[:10]) + (" ..." if len(failed) > 10 else "")
    was = ", ".join(f"{b} {_fmt(sum(r[f'failed_{b}_s'] or 0.0 for r in failed))} s" for b in BUCKETS
                    if any(r[f"failed_{b}_s"] for r in failed))
    return [Text(f"{FAILED_MARK} failed step(s) {steps}: a span ended in error status, so their bucketed time is "
                 f"counted as wasted ({was or 'none'} before); `check` names the span", style="red")]


# What each rl.efficiency.measurement's seconds are, as the efficiency table labels its columns.
MEASUREMENTS = {"driver_wall_clock": ("driver wall", "the driver's wall clock (sequential waits of the loop)"),
                "collector_wall_clock": ("collector wall", "the collector's wall clock (concurrent with training: "
                                                           "not part of the step's wall)"),
                "thread_seconds": ("thread-s", "seconds summed over worker threads (may exceed the wall)")}
_EFFICIENCY_WIDTH = 10  # a value column: the widest _fmt value, and a label's longest line


def _efficiency_table(run: RunGoodput) -> list:
    """The step's efficiency metrics (rl.efficiency.seconds) beside its span buckets, when recorded:
    each column labelled with its measurement (whose clock), as wide as the terminal allows."""
    columns = [c for c in run.steps.column_names if c.startswith("efficiency/")]
    if not columns or run.ranks is not None:
        return []
    return [_EfficiencyTables(run.steps, columns)]


class _EfficiencyTables:
    """The efficiency table, as wide as the console allows: each column as wide as its category,
    its measurement label and its values when they all fit; else columns of
    ``_EFFICIENCY_WIDTH`` whose headers wrap at ``/`` and ``_``, cut into as many tables of whole
    columns as it takes. A value or a header is never cut; a legend says what each measurement
    label means."""

    def __init__(self, steps, columns: list[str]) -> None:
        self.rows = steps.select(["iteration", *columns]).to_pylist()
        self.columns = columns
        self.measurement = {}
        for column in columns:
            meta = steps.schema.field(column).metadata or {}
            self.measurement[column] = meta.get(b"rl.efficiency.measurement", b"").decode() or None
        self.values = {c: [_fmt(None if v is None or v != v else v) for v in (row[c] for row in self.rows)]
                       for c in columns}

    def _names(self, column: str) -> tuple[str, str]:
        category = column.removeprefix("efficiency/").removesuffix("_s")
        return category, MEASUREMENTS.get(self.measurement[column], (self.measurement[column] or "unlabelled",))[0]

    def _width(self, column: str) -> int:
        return max(len(self._names(column)[0]), len(self._names(column)[1]), *map(len, self.values[column]), 5)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        step_width = max([5, *(len(str(row["iteration"])) for row in self.rows)])
        natural = step_width + sum(self._width(c) + 1 for c in self.columns)
        width = None if natural <= options.max_width else _EFFICIENCY_WIDTH
        per_table = len(self.columns) if width is None else max(1, (options.max_width - step_width - 1) // (width + 1))
        yield Text("efficiency metrics per step (seconds, rl.efficiency.seconds; under each category, whose "
                   "clock measured it)")
        for first in range(0, len(self.columns), per_table):
            chunk = self.columns[first:first + per_table]
            table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0, 0, 1))
            table.add_column("step", justify="right", min_width=step_width, no_wrap=True)
            for column in chunk:
                at = width or self._width(column)
                lines = [line for name in self._names(column) for line in _wrap_name(name, at)]
                table.add_column(Text("\n".join(lines)), justify="right", width=at, overflow="fold")
            for i, row in enumerate(self.rows):
                table.add_row(str(row["iteration"]), *(self.values[c][i] for c in chunk))
            yield table
        used = dict.fromkeys(m for m in self.measurement.values() if m in MEASUREMENTS)
        if used:
            yield Text("; ".join(f"{MEASUREMENTS[m][0]}: {MEASUREMENTS[m][1]}" for m in used), style="dim")


def _wrap_name(name: str, width: int) -> list[str]:
    """``name`` in lines of at most ``width``, broken after ``/``, ``_`` or a space where it can
    be, else folded: every character stays."""
    pieces = re.findall(r"[^/_ ]*[/_ ]?", name)
    lines, line = [], ""
    for piece in (p for p in pieces if p):
        if line and len(line) + len(piece.rstrip()) > width:
            lines.append(line.rstrip())
            line = ""
        while len(piece) > width and not (len(piece) == width + 1 and piece.endswith(" ")):
            lines.append(piece[:width])
            piece = piece[width:]
        line += piece
    if line.strip():
        lines.append(line.rstrip())
    return lines


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
        other = next((b for b in baseline if b.run_id == run.run_id), baseline[0])
        notes.append(_baseline_table(run, other, compare_runs(run, other)))
    return notes


def _baseline_table(run: RunGoodput, other: RunGoodput, diff: dict) -> Table:
    table = Table(title=f"mean step: {run_words(run.run_id)} against baseline {_run_label(other.run_id)}",
                  title_justify="left")
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


def render_report(report: CheckReport) -> Group:
    """A heading line and the message per finding (worst first), then the counts."""
    counts = report.counts
    summary = Text(", ".join(f"{counts[s]} {s}" for s in SEVERITIES), style="bold")
    census = report.census
    if census is not None:  # what was checked: a clean report of an RL run says how much it covered
        named = sum(r.run_id is not None for r in census.runs)
        unnamed = " and spans without a run id" if named < len(census.runs) else ""
        summary = Group(Text(f"checked {census.spans:,} spans: {census.rl_spans:,} with an rl.* attribute, "
                             f"{census.step_spans:,} step spans; {named:,} run(s){unnamed}", style="dim"), summary)
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


# -- waterfall ---------------------------------------------------------------------------------


def format_duration(ns: int) -> str:
    """A duration in the unit a person reads it in: 850ns, 12.3µs, 4.56ms, 7.89s, 3m05s, 1h02m."""
    ns = int(ns)
    if abs(ns) < 1_000:
        return f"{ns}ns"
    for unit, scale, limit in (("µs", 1_000, 1_000), ("ms", 1_000_000, 1_000), ("s", 1_000_000_000, 60)):
        if abs(ns) < scale * limit:
            value = ns / scale
            return f"{value:.3g}{unit}" if abs(value) < 100 else f"{value:.0f}{unit}"
    seconds = ns // 1_000_000_000
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def render_waterfall(shown: Waterfall, *, width: int = 160) -> _Lines:
    """One line per display row: tree, name, time bar against the window, duration, bucket,
    where it ran, and the tags that matter. Rows on the critical path start with ◆."""
    rows = shown.rows.to_pydict()
    n = len(rows["name"])
    out = _Lines()
    out.add(_header(shown, n), "bold")
    out.newline()
    out.add(_legend())
    if n == 0:
        out.newline()
        out.add("no spans to show", "dim")
        return out
    labels = [_clean(_label(rows, i)) for i in range(n)]
    prefixes = [_capped(p, d) for p, d in zip(_tree_prefixes(rows["depth"], rows["parent"]), rows["depth"])]
    name_width = min(max(len(p) + len(label) for p, label in zip(prefixes, labels)), 64)
    bar_width = max(10, min(60, width - name_width - 50))
    t0, span_ns = shown.window_start_ns, max(shown.window_ns, 1)
    last_heading = None
    for i in range(n):
        if rows["depth"][i] == 0 and rows["heading"][i] != last_heading:
            last_heading = rows["heading"][i]
            out.newline()
            out.add(_clean(last_heading), "bold underline")
        style = _bucket_style(rows["bucket"][i])
        out.newline()
        out.add((CRITICAL_MARK if rows["on_critical_path"][i] else " ") + " ", "bold magenta")
        out.add(prefixes[i], "dim")
        label = labels[i]
        room = max(name_width - len(prefixes[i]), 1)  # a very deep row overflows its column
        out.add(label if len(label) <= room else label[: room - 1] + "…", "bold" if rows["is_step"][i] else "")
        out.add(" " * max(room - len(label), 0) + " ")
        out.add(_bar(bar_width, (rows["start_ns"][i] - t0) / span_ns, (rows["end_ns"][i] - t0) / span_ns), style)
        out.add(f" {format_duration(rows['duration_ns'][i]):>7} ")
        out.add(f"{rows['bucket'][i] or 'unbucketed':<10}", style)
        notes = _notes(rows, i, shown.trace_digits)
        where = f" {_clean(_where(rows, i)):<12}"
        out.add(where if notes else where.rstrip())
        for note, note_style in notes:
            out.add(" " + _clean(note), note_style)
    return out


class _Lines:
    """A renderable of styled pieces and line breaks that yields segments directly: for
    thousands of rows this is several times cheaper than one big rich Text, which re-divides
    and re-measures every line."""

    def __init__(self):
        self.pieces: list[tuple[str, str]] = []

    def add(self, piece: str, style: str = "") -> None:
        self.pieces.append((piece, style))

    def newline(self) -> None:
        self.pieces.append(("\n", ""))

    @property
    def plain(self) -> str:
        return "".join(piece for piece, _ in self.pieces)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        styles: dict[str, Style] = {}
        for piece, style in self.pieces:
            if piece == "\n":
                yield Segment.line()
                continue
            if style not in styles:
                styles[style] = Style.parse(style) if style else Style.null()
            yield Segment(piece, styles[style])
        yield Segment.line()


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _clean(text: str) -> str:
    """Span names and attributes come from other processes: no control characters (escape
    sequences, newlines) reach the terminal."""
    return _CONTROL.sub("\ufffd", text) if _CONTROL.search(text) else text


def _header(shown: Waterfall, n: int) -> str:
    step = f" · step {shown.step}" if shown.step is not None else ""
    window = format_duration(shown.window_ns)
    return f"waterfall{step} · window {window} · {shown.total_spans:,} spans in {n:,} rows"


def _legend() -> str:
    return (f"[{CRITICAL_MARK} critical path]  " +
            "  ".join(f"━ {b}" for b in BUCKET_STYLES) + "  ━ unbucketed")


def _label(rows: dict, i: int) -> str:
    name = rows["name"][i]
    return f"{name} ×{rows['count'][i]:,}" if rows["count"][i] > 1 else name


def _where(rows: dict, i: int) -> str:
    service, rank = rows["service_name"][i], rows["rank"][i]
    return f"{service or '?'}" + (f"/{rank}" if rank is not None else "")


def _notes(rows: dict, i: int, digits: int) -> list[tuple[str, str]]:
    """(text, style) pieces after the fixed columns: collapse stats, orphan, error, trace, tags."""
    notes: list[tuple[str, str]] = []
    if rows["count"][i] > 1:
        notes.append((f"Σ {format_duration(rows['total_ns'][i])} p50 {format_duration(rows['p50_ns'][i])} "
                      f"p99 {format_duration(rows['p99_ns'][i])}", "cyan"))
    if rows["is_orphan"][i] and rows["parent_is_remote"][i]:
        notes.append((f"called by {rows['parent_span_id'][i]}, a span not in the data (remote parent)", "yellow"))
    elif rows["is_orphan"][i]:
        notes.append((f"orphan (parent {rows['parent_span_id'][i]} missing)", "bold red"))
    if rows["is_error"][i]:
        notes.append(("error", "bold red"))
    if rows["depth"][i] == 0 and rows["run_id"][i] is not None:  # a tree without a run is headed by its trace
        notes.append((f"trace={rows['trace_id'][i][:digits]}", "dim"))
    iteration, parent = rows["iteration"][i], rows["parent"][i]
    if iteration is not None and (parent < 0 or rows["iteration"][parent] != iteration):
        notes.append((f"rl.iteration={iteration}", ""))
    if rows["tags"][i]:
        notes.append((rows["tags"][i], ""))
    if rows["hidden"][i]:
        notes.append((f"+{rows['hidden'][i]:,} hidden", "dim"))
    return notes


def _bucket_style(bucket: str | None) -> str:
    if bucket is None:
        return UNBUCKETED_STYLE
    return BUCKET_STYLES.get(bucket, "magenta")


def _bar(width: int, begin: float, end: float) -> str:
    """A Gantt row as rich.bar.Bar draws it (━ full cells, ╺ ╸ half cells), never empty."""
    begin = min(max(begin, 0.0), 1.0)
    end = min(max(end, begin), 1.0)
    first = min(int(begin * width * 2), 2 * width - 1)
    last = max(int(end * width * 2), first + 1)
    cell = first // 2
    out = " " * cell
    if first % 2:
        out += "╺"
        cell += 1
    full = max((last - 2 * cell) // 2, 0)
    out += "━" * full
    cell += full
    if cell < width and 2 * cell < last:
        out += "╸"
        cell += 1
    return out + " " * (width - cell)


_MAX_PREFIX = 30


def _capped(prefix: str, depth: int) -> str:
    """Very deep rows keep their last guides, led by their depth, so names stay in view."""
    if len(prefix) <= _MAX_PREFIX:
        return prefix
    lead = f"[{depth}]"
    return lead + prefix[len(prefix) - (_MAX_PREFIX - len(lead)):]


def _tree_prefixes(depths: list[int], parents: list[int]) -> list[str]:
    """├─ └─ │ guides from each row's depth and parent (rows are in tree order)."""
    n = len(depths)
    last_child = [True] * n
    seen_parent: dict[int, int] = {}
    for i in range(n - 1, -1, -1):
        last_child[i] = parents[i] not in seen_parent
        seen_parent.setdefault(parents[i], i)
    prefixes = []
    open_levels: list[bool] = []  # per ancestor depth: does a later sibling follow?
    for i in range(n):
        d = depths[i]
        del open_levels[d:]
        if d == 0:
            prefixes.append("")
        else:
            guides = "".join("│  " if more else "   " for more in open_levels[1:d])
            prefixes.append(guides + ("└─ " if last_child[i] else "├─ "))
        open_levels.extend([False] * (d + 1 - len(open_levels)))
        open_levels[d] = not last_child[i]
    return prefixes


def print_waterfall(shown: Waterfall, out: Console) -> None:
    """Render ``shown`` on ``out`` (notebooks and benchmarks use this too); long lines are
    left to the terminal rather than wrapped mid-row."""
    out.print(render_waterfall(shown, width=out.width), soft_wrap=True)


def render_monitor(view, *, bar_width: int = BAR_WIDTH) -> Group:
    """``monitor``'s live view: per run its last steps with bars, run and rolling goodput; the newest
    findings; spans received and their rate."""
    parts: list = []
    for run in view.runs:
        table = Table(title=f"{run_words(run.run_id)}: {run.steps} steps, goodput {_pct(run.total['goodput'])}, "
                            f"last {run.rolling_steps} steps {_pct(run.rolling_goodput)}",
                      title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0, 0, 1))
        for name in ("step", "wall", *BUCKETS, "unattr", "goodput"):
            table.add_column(_HEADERS.get(name, name), justify="right", style=BUCKET_STYLES.get(name), no_wrap=True)
        table.add_column("", no_wrap=True, overflow="crop")
        steps = view.recent.get(run.run_id, [])
        longest = max([s.figures["wall_s"] for s in steps] or [0.0])
        for step in steps:
            f = step.figures
            table.add_row(_step_label({"iteration": step.iteration, "failed": f.get("failed")}), _fmt(f["wall_s"]), *(_fmt(f[f"{b}_s"]) for b in BUCKETS),
                          _fmt(f["unattributed_s"]), _pct(f["goodput"]), step_bar(f, longest, bar_width))
        parts.append(table)
    if not view.runs:
        parts.append(Text("waiting for the first step ...", style=UNATTRIBUTED_STYLE))
    for finding in view.findings:
        parts.append(Text(f"{finding.severity} {finding.code}: {finding.message}",
                          style=SEVERITY_STYLES.get(finding.severity, "")))
    parts.append(Text(f"{view.spans} spans received, {view.spans_per_s:.0f}/s; {view.pending_spans} waiting "
                      "for an ancestor", style=UNATTRIBUTED_STYLE))
    return Group(*parts)
