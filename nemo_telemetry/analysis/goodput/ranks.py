"""``--by rank``: the per-step rules summed per (service, rank), as partial -> merge -> finish.

Per (service, rank) of a run, over the run's steps: its bucketed spans' duration sums (spans
attributed to a step only), ``steps`` (how many steps it has a bucketed span in), ``covered_s``
(per step, the union of its intervals inside the window, summed), ``double_counted_s`` (sum minus
the per-step unions), and ``wall_s`` the run's whole step wall. Every (service, rank) with a span
in the run has a row, sorted by service name then rank, so a worker whose spans carry no bucket
shows as zeros rather than missing. A failed step's bucketed time is wasted on every rank, as in
the per-step table.

A partial (``RANK_SCHEMA``) has, per batch: WHO rows (a (run, service, rank) present), SUM rows
(per run, iteration, service, rank, bucket: nanoseconds) and UNION rows (per run, iteration,
service, rank: disjoint intervals). The step windows come from goodput's own merged partials.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.goodput.rules import BUCKETS, MergedSteps, batch_attribution, coalesced_union
from nemo_telemetry.analysis.decode import SpanArrays
from nemo_telemetry.analysis.model.grouping import Columns, find_keys, first_rows, group_by, string_codes, take
from nemo_telemetry.analysis.model.walk import KeyIndex

__all__ = ["RANK_SCHEMA", "WHO", "rank_partial", "rank_batch_partial", "merge_ranks", "ranks_tables"]

WHO, SUM, UNION = 0, 1, 2
RANK_SCHEMA = pa.schema([
    pa.field("kind", pa.int8()), pa.field("run", pa.string()), pa.field("service", pa.string()),
    pa.field("rank", pa.int64()), pa.field("iteration", pa.int64()), pa.field("bucket", pa.int8()),
    pa.field("a", pa.int64()), pa.field("b", pa.int64()),
])
_NS = 1e9


def rank_partial(arrays: SpanArrays, keep: np.ndarray, rows: np.ndarray, iteration: np.ndarray,
                 stamped: np.ndarray) -> pa.Table:
    """The rank partial of decoded spans: ``rows`` the bucketed spans (known bucket, valid interval,
    kept) with their attributed ``iteration`` where ``stamped``; ``keep`` the rows of the run asked for."""
    runs = np.array([*arrays.runs, None], dtype=object)
    services = np.array([*arrays.services, None], dtype=object)
    kept = np.flatnonzero(keep)
    rank_of = np.where(arrays.has_rank, arrays.rank, -1).astype(np.int64)  # rank -1: none
    who = kept[first_rows(arrays.run[kept], arrays.service[kept], rank_of[kept])]
    rows, iteration = rows[stamped], np.asarray(iteration[stamped], np.int64)  # an unstamped span is in no step
    run, service, rank, bucket = arrays.run[rows], arrays.service[rows], rank_of[rows], arrays.bucket[rows]
    sums = group_by(run, service, rank, iteration, bucket)
    steps = group_by(run, service, rank, iteration)
    head, lo, hi = coalesced_union(steps.codes, arrays.start[rows], arrays.end[rows])
    first = steps.first[head]
    parts = [
        _rows(WHO, runs[arrays.run[who]], services[arrays.service[who]], rank_of[who]),
        _rows(SUM, runs[sums.key(run)], services[sums.key(service)], sums.key(rank), sums.key(iteration),
              sums.key(bucket), sums.reduce(np.add, (arrays.end[rows] - arrays.start[rows]).astype(np.int64))),
        _rows(UNION, runs[run[first]], services[service[first]], rank[first], iteration[first], a=lo, b=hi),
    ]
    return pa.concat_tables(parts)


def rank_batch_partial(batch: pa.Table, *, attributed: KeyIndex, run_id: str | None = None) -> pa.Table:
    """:func:`rank_partial` of one batch of spans, its walks attributed as :func:`rules.goodput_partial`'s."""
    return rank_partial(*batch_attribution(batch, attributed=attributed, run_id=run_id))


def _rows(kind, run, service, rank, iteration=None, bucket=None, a=None, b=None) -> pa.Table:
    n = len(run)
    zeros = np.zeros(n, np.int64)
    rank = np.asarray(rank, np.int64)

    def ints(values):
        return np.asarray(zeros if values is None else values, np.int64)

    return pa.table([
        pa.array(np.full(n, kind, np.int8)), pa.array(np.asarray(run, object), pa.string()),
        pa.array(np.asarray(service, object), pa.string()), pa.array(rank, mask=rank < 0),
        pa.array(ints(iteration), mask=np.full(n, iteration is None)), pa.array(ints(bucket).astype(np.int8)),
        pa.array(ints(a)), pa.array(ints(b)),
    ], schema=RANK_SCHEMA)


def merge_ranks(partials: list[pa.Table]) -> Columns:
    """Rank partials merged: one WHO row per (run, service, rank), one SUM row per key, disjoint UNIONs.

    Columns ``kind``, ``run`` and ``service`` (names, None for none), ``rank`` and ``iteration``
    (-1 for none), ``bucket``, ``a``, ``b``; WHO rows in the order they first appear."""
    table = pa.concat_tables(partials) if partials else RANK_SCHEMA.empty_table()
    run, runs = string_codes(table.column("run"))
    service, services = string_codes(table.column("service"))
    frame = {"kind": np.asarray(table.column("kind").to_numpy(), np.int8), "run": run, "service": service,
             "rank": np.asarray(pc.fill_null(table.column("rank"), -1).to_numpy(), np.int64),
             "iteration": np.asarray(pc.fill_null(table.column("iteration"), -1).to_numpy(), np.int64),
             "bucket": np.asarray(table.column("bucket").to_numpy(), np.int8),
             "a": np.asarray(table.column("a").to_numpy(), np.int64),
             "b": np.asarray(table.column("b").to_numpy(), np.int64)}
    who = take(frame, frame["kind"] == WHO)
    who = take(who, first_rows(who["run"], who["service"], who["rank"]))
    spans = take(frame, frame["kind"] == SUM)
    sums = group_by(spans["run"], spans["service"], spans["rank"], spans["iteration"], spans["bucket"])
    summed = {**take(spans, sums.first), "a": sums.reduce(np.add, spans["a"]), "b": np.zeros(len(sums), np.int64)}
    unions = take(frame, frame["kind"] == UNION)
    steps = group_by(unions["run"], unions["service"], unions["rank"], unions["iteration"])
    head, lo, hi = coalesced_union(steps.codes, unions["a"], unions["b"])
    merged_unions = {**take(unions, steps.first[head]), "a": lo, "b": hi}
    parts = [who, summed, merged_unions]
    out = {name: np.concatenate([p[name] for p in parts]) for name in frame}
    out["run"] = np.array([*runs, None], dtype=object)[out["run"]]
    out["service"] = np.array([*services, None], dtype=object)[out["service"]]
    return out


def ranks_tables(merged: Columns, steps: MergedSteps, run_order) -> dict[str | None, pa.Table]:
    """Per run of ``run_order`` (and None), its ranks table (``RANK_COLUMNS``) from merged rank
    partials (:func:`merge_ranks`) and goodput's merged steps (their windows; ``run_order[i]`` is
    step run code i)."""
    windows = steps.steps
    code, _ = string_codes(merged["run"], run_order)  # no run: -1
    step = windows.index_of(code, merged["iteration"], merged["iteration"] >= 0)
    merged = {**merged, "code": code, "step": np.where(merged["kind"] == WHO, -1, step)}
    codes = {(run_order[c] if c >= 0 else None): int(c) for c in np.unique(code)}
    failed = np.asarray(steps.table["failed"], bool)
    return {run: _run_ranks(take(merged, merged["code"] == c), windows, c, run, failed) for run, c in codes.items()}


def _run_ranks(rows: Columns, windows, code: int, run: str | None, failed: np.ndarray) -> pa.Table:
    who = take(rows, rows["kind"] == WHO)
    name = ["" if s is None else s for s in who["service"]]  # no service sorts first
    who = take(who, np.array(sorted(range(len(name)), key=lambda i: (name[i], who["rank"][i])), np.int64))
    n = len(who["rank"])
    inside = take(rows, (rows["kind"] != WHO) & (rows["step"] >= 0))
    service, services = string_codes(np.concatenate([who["service"], inside["service"]]))
    at = find_keys((service[:n], who["rank"]), (service[n:], inside["rank"]))
    sums_rows, union_rows = inside["kind"] == SUM, inside["kind"] == UNION
    step = inside["step"]
    bucket = np.where(failed[step], BUCKETS.index("wasted"), inside["bucket"].astype(np.int64))  # failed: wasted
    sums = np.zeros((n, len(BUCKETS)), np.int64)
    np.add.at(sums, (at[sums_rows], bucket[sums_rows]), inside["a"][sums_rows])
    a, b = inside["a"], inside["b"]
    clipped = np.clip(np.minimum(b, windows.end[step]) - np.maximum(a, windows.start[step]), 0, None)
    union = np.bincount(at[union_rows], weights=(b - a)[union_rows].astype(np.float64), minlength=n)
    covered = np.bincount(at[union_rows], weights=clipped[union_rows].astype(np.float64), minlength=n)
    present = np.bincount(np.unique(at[sums_rows] * len(windows) + step[sums_rows]) // max(len(windows), 1),
                          minlength=n) if n else np.zeros(0, np.int64)
    run_wall = float((windows.end - windows.start)[windows.run == code].sum())
    columns: dict[str, Any] = {
        "run_id": pa.array([run] * n, pa.string()), "service_name": pa.array(list(who["service"]), pa.string()),
        "rank": pa.array([int(r) if r >= 0 else None for r in who["rank"]], pa.int64()),
        "steps": pa.array(present[:n], pa.int64()), "wall_s": pa.array([run_wall / _NS] * n, pa.float64())}
    for i, bucket in enumerate(BUCKETS):
        columns[f"{bucket}_s"] = pa.array(sums[:, i] / _NS, pa.float64())
    columns["covered_s"] = pa.array(covered / _NS, pa.float64())
    columns["unattributed_s"] = pa.array((run_wall - covered) / _NS, pa.float64())
    columns["double_counted_s"] = pa.array((sums.sum(axis=1) - union) / _NS, pa.float64())
    columns["goodput"] = pa.array(sums[:, 0] / run_wall if run_wall > 0 else [None] * n, pa.float64())
    return pa.table(columns)
