"""A self-contained HTML waterfall: one file, no network when it is opened.

The page (``templates/waterfall.html``) holds its CSS and JavaScript inline and reads the
spans from a ``<script type="application/json">`` block. Span names and attributes come from
other processes, so they are data, never markup: the JSON is escaped so that no ``<`` can
close the block, and the page writes every name and attribute with ``textContent``. The page
draws only the rows in view (a virtual list over the depth-first rows), so a run of a hundred
thousand spans opens without freezing the browser. Log records (the ``logs`` table) logged
inside a shown span are listed in its tooltip, written with ``textContent`` like everything else.
"""

from __future__ import annotations

import html
import json
from importlib import resources

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.views.waterfall import waterfall

__all__ = ["to_html", "waterfall_json"]

_TEMPLATE = ("nemo_telemetry.analysis.views", "templates/waterfall.html")


def to_html(
    spans: pa.Table,
    *,
    run_id: str | None = None,
    trace_id: str | None = None,
    step: int | None = None,
    title: str | None = None,
    logs: pa.Table | None = None,
) -> str:
    """The HTML page for the spans a waterfall with the same selection shows (and their ``logs``)."""
    data = waterfall_json(spans, run_id=run_id, trace_id=trace_id, step=step, title=title, logs=logs)
    page = resources.files(_TEMPLATE[0]).joinpath(_TEMPLATE[1]).read_text(encoding="utf-8")
    return page.replace("__TITLE__", html.escape(data["title"])).replace("__DATA__", _script_safe_json(data))


def waterfall_json(
    spans: pa.Table,
    *,
    run_id: str | None = None,
    trace_id: str | None = None,
    step: int | None = None,
    title: str | None = None,
    logs: pa.Table | None = None,
) -> dict:
    """What the page reads: depth-first rows as columns (times in µs from the window start)."""
    shown = waterfall(spans, run_id=run_id, trace_id=trace_id, step=step, collapse_threshold=None, fold_steps=False)
    rows = shown.rows
    names, name_codes = _dictionary(rows.column("name"))
    services, service_codes = _dictionary(rows.column("service_name"))
    buckets, bucket_codes = _dictionary(rows.column("bucket"))
    origin = shown.window_start_ns
    runs = sorted({str(r) for r in rows.column("run_id").to_pylist() if r is not None})  # spans without one: no run
    source = spans.take(rows.column("span_row"))
    default_title = "waterfall" + (f" · step {step}" if step is not None else "") + (f" · {runs[0]}" if len(runs) == 1 else "")
    return {
        "title": title or default_title,
        "summary": f"{rows.num_rows:,} spans · {len(runs)} run(s) · window {shown.window_ns / 1e9:.3f} s",
        "origin_unix_ns": str(origin),
        "window_us": shown.window_ns / 1000.0,
        "expand_depth": 1 if rows.num_rows > 200 else 64,
        "names": names,
        "services": services,
        "buckets": buckets,
        "rows": {
            "d": rows.column("depth").to_pylist(),
            "p": rows.column("parent").to_pylist(),
            "n": name_codes,
            "v": service_codes,
            "b": bucket_codes,
            "r": rows.column("rank").to_pylist(),
            "s": _micros(rows.column("start_ns"), origin),
            "e": _micros(rows.column("end_ns"), origin),
            "c": rows.column("on_critical_path").cast(pa.int8()).to_pylist(),
            "o": rows.column("is_orphan").cast(pa.int8()).to_pylist(),
            "id": rows.column("span_id").to_pylist(),
        },
        "attrs": _attributes(rows, source),
        "logs": _span_logs(rows, logs, origin),
    }


def _script_safe_json(data: dict) -> str:
    """JSON that cannot end its <script> block: <, > and & only ever appear escaped."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _dictionary(column: pa.ChunkedArray) -> tuple[list, list[int]]:
    encoded = pc.dictionary_encode(column.combine_chunks())
    values = encoded.dictionary.to_pylist()
    codes = pc.fill_null(encoded.indices, len(values)).to_pylist()
    if encoded.null_count:
        values.append(None)
    return values, codes


def _micros(column: pa.ChunkedArray, origin: int) -> list[float]:
    return ((column.to_numpy() - origin) / 1000.0).tolist()


def _attributes(rows: pa.Table, source: pa.Table) -> list[list[list[str]]]:
    """Per row: [key, value] pairs for the tooltip (ids, promoted columns, then span attributes)."""
    extra = {
        "trace_id": rows.column("trace_id").to_pylist(),
        "parent_span_id": rows.column("parent_span_id").to_pylist(),
        "rl.iteration": rows.column("iteration").to_pylist(),
        "rl.efficiency.category": source.column("rl.efficiency.category").to_pylist(),
        "status": source.column("status_code").to_pylist(),
        "status_message": source.column("status_message").to_pylist(),
    }
    attributes = source.column("attributes").to_pylist()
    out = []
    for i in range(rows.num_rows):
        pairs = [[k, str(v[i])] for k, v in extra.items() if v[i] is not None]
        pairs.extend([k, v] for k, v in (attributes[i] or ()))
        out.append(pairs)
    return out


MAX_LOG_BODY = 2000  # characters of a log record's body shown; the dataset keeps all of it
MAX_LOGS_PER_SPAN = 50  # the rest of a span's records are counted, not listed


def _span_logs(rows: pa.Table, logs: pa.Table | None, origin: int) -> dict:
    """The log records logged inside each shown span, as columns: row, µs, severity, body."""
    empty = {"row": [], "t": [], "sev": [], "body": [], "more": {}}
    if logs is None or not logs.num_rows:
        return empty
    shown = pa.table({
        "trace_id": rows.column("trace_id").cast(pa.string()),
        "span_id": rows.column("span_id").cast(pa.string()),
        "row": pa.array(range(rows.num_rows), pa.int64()),
    })
    records = pa.table({
        "trace_id": logs.column("trace_id").cast(pa.string()),
        "span_id": logs.column("span_id").cast(pa.string()),
        "time_ns": logs.column("time_ns"),
        "severity": logs.column("severity").cast(pa.string()),
        "body": logs.column("body").cast(pa.string()),
    }).filter(pc.is_valid(pc.field("span_id")))
    joined = records.join(shown, keys=["trace_id", "span_id"], join_type="inner")
    if not joined.num_rows:
        return empty
    joined = joined.sort_by([("row", "ascending"), ("time_ns", "ascending")])
    row = joined.column("row").to_numpy()
    rank = _rank_within(row)
    kept = joined.filter(pa.array(rank < MAX_LOGS_PER_SPAN))
    spans_with_logs, sizes = np.unique(row, return_counts=True)
    chatty = sizes > MAX_LOGS_PER_SPAN
    body = pc.utf8_slice_codeunits(pc.fill_null(kept.column("body"), ""), 0, MAX_LOG_BODY)
    return {
        "row": kept.column("row").to_pylist(),
        "t": _micros(kept.column("time_ns"), origin),
        "sev": kept.column("severity").to_pylist(),
        "body": body.to_pylist(),
        "more": {str(int(r)): int(n) - MAX_LOGS_PER_SPAN for r, n in zip(spans_with_logs[chatty], sizes[chatty])},
    }


def _rank_within(groups: np.ndarray) -> np.ndarray:
    """For sorted group labels, each element's position within its group (0, 1, 2 ...)."""
    starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
    sizes = np.diff(np.r_[starts, len(groups)])
    return np.arange(len(groups)) - np.repeat(starts, sizes)
