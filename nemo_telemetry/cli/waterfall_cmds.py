"""``waterfall``: a run's span trees in the terminal, or exported for Perfetto or a browser."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment
from rich.style import Style

from nemo_telemetry.analysis import (DEFAULT_COLLAPSE_THRESHOLD, Waterfall, read_logs, read_spans, to_chrome_trace,
                                     to_html, waterfall)
from nemo_telemetry.cli._common import console, fail, library_errors
from nemo_telemetry.cli.app import app

BUCKET_STYLES = {"productive": "green", "overhead": "yellow", "idle": "blue", "wasted": "red"}
UNBUCKETED_STYLE = "grey50"
CRITICAL_MARK = "◆"
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
    with library_errors():
        spans = read_spans(source)
        if export is not None:
            _export(spans, export, run=run, trace=trace, step=step, source=source)
            return
        shown = waterfall(spans, run_id=run, trace_id=trace, step=step, depth=depth, min_duration_ns=min_ns,
                          collapse_threshold=collapse, fold_steps=False if expand else None)
    print_waterfall(shown, console())


def _export(spans, path: Path, *, run, trace, step, source) -> None:
    if path.suffix.lower() == ".json":
        import json  # noqa: PLC0415

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
    name_width = min(max(len(p) + len(l) for p, l in zip(prefixes, labels)), 64)
    bar_width = max(10, min(60, width - name_width - 50))
    t0, span_ns = shown.window_start_ns, max(shown.window_ns, 1)
    last_run = object()
    for i in range(n):
        if rows["depth"][i] == 0 and rows["run_id"][i] != last_run:
            last_run = rows["run_id"][i]
            out.newline()
            out.add(_clean(f"run {last_run}"), "bold underline")
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
        notes = _notes(rows, i)
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


def _notes(rows: dict, i: int) -> list[tuple[str, str]]:
    """(text, style) pieces after the fixed columns: collapse stats, orphan, error, trace, tags."""
    notes: list[tuple[str, str]] = []
    if rows["count"][i] > 1:
        notes.append((f"Σ {format_duration(rows['total_ns'][i])} p50 {format_duration(rows['p50_ns'][i])} "
                      f"p99 {format_duration(rows['p99_ns'][i])}", "cyan"))
    if rows["is_orphan"][i]:
        notes.append((f"orphan (parent {rows['parent_span_id'][i]} missing)", "bold red"))
    if rows["is_error"][i]:
        notes.append(("error", "bold red"))
    if rows["depth"][i] == 0:
        notes.append((f"trace={rows['trace_id'][i][:8]}", "dim"))
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
