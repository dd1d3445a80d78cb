"""``--by rank``: the per-step rules summed per (service, rank), as partial -> merge -> finish.

Per (service, rank) of a run, over the run's steps: its bucketed spans' duration sums (spans
attributed to a step only), ``steps`` (how many steps it has a bucketed span in), ``covered_s``
(per step, the union of its intervals inside the window, summed), ``double_counted_s`` (sum minus
the per-step unions), and ``wall_s`` the run's whole step wall. Every (service, rank) with a span
in the run has a row, sorted by service name then rank, so a worker whose spans carry no bucket
shows as zeros rather than missing.

A partial (``RANK_SCHEMA``) has, per batch: WHO rows (a (run, service, rank) present), SUM rows
(per run, iteration, service, rank, bucket: nanoseconds) and UNION rows (per run, iteration,
service, rank: disjoint intervals). The step windows come from goodput's own merged partials.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from nemo_telemetry.analysis.goodput.rules import BUCKETS, MergedSteps, batch_attribution, coalesced_union
from nemo_telemetry.analysis.model._arrays import SpanArrays
from nemo_telemetry.analysis.model.walk import KeyIndex

__all__ = ["RANK_SCHEMA", "WHO", "rank_partial", "rank_batch_partial", "merge_ranks", "ranks_tables"]

WHO, SUM, UNION = 0, 1, 2
RANK_SCHEMA = pa.schema([
    pa.field("kind", pa.int8()), pa.field("run", pa.string()), pa.field("service", pa.string()),
    pa.field("rank", pa.int64()), pa.field("iteration", pa.int64()), pa.field("bucket", pa.int8()),
    pa.field("a", pa.int64()), pa.field("b", pa.int64()),
])
_NS = 1e9
_KEYS = ["run", "service", "rank"]  # rank -1: none; service and run None: none
_NONE = "\x00"


def rank_partial(arrays: SpanArrays, keep: np.ndarray, rows: np.ndarray, iteration: np.ndarray,
                 stamped: np.ndarray) -> pa.Table:
    """The rank partial of decoded spans: ``rows`` the bucketed spans (known bucket, valid interval,
    kept) with their attributed ``iteration`` where ``stamped``; ``keep`` the rows of the run asked for."""
    runs = np.array([*arrays.runs, None], dtype=object)
    services = np.array([*arrays.services, None], dtype=object)
    kept = np.flatnonzero(keep)
    who = pd.DataFrame({"run": arrays.run[kept], "service": arrays.service[kept],
                        "rank": np.where(arrays.has_rank[kept], arrays.rank[kept], -1)}).drop_duplicates()
    rows, iteration = rows[stamped], iteration[stamped]  # an unstamped span is in no step
    spans = pd.DataFrame({"run": arrays.run[rows], "service": arrays.service[rows],
                          "rank": np.where(arrays.has_rank[rows], arrays.rank[rows], -1), "iteration": iteration,
                          "bucket": arrays.bucket[rows], "a": arrays.end[rows] - arrays.start[rows]})
    sums = spans.groupby([*_KEYS, "iteration", "bucket"], sort=False).agg(a=("a", "sum")).reset_index()
    group = spans.groupby([*_KEYS, "iteration"], sort=False).ngroup().to_numpy(np.int64)
    keys = spans.drop_duplicates([*_KEYS, "iteration"])  # ngroup numbers the groups in this order
    head, lo, hi = coalesced_union(group, arrays.start[rows], arrays.end[rows])
    unions = keys.iloc[head]
    parts = [
        _rows(WHO, runs[who["run"]], services[who["service"]], who["rank"]),
        _rows(SUM, runs[sums["run"]], services[sums["service"]], sums["rank"], sums["iteration"], sums["bucket"],
              sums["a"]),
        _rows(UNION, runs[unions["run"]], services[unions["service"]], unions["rank"], unions["iteration"], a=lo, b=hi),
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
        pa.array(np.full(n, kind, np.int8)), pa.array(np.asarray(run, object), pa.string(), from_pandas=True),
        pa.array(np.asarray(service, object), pa.string(), from_pandas=True), pa.array(rank, mask=rank < 0),
        pa.array(ints(iteration), mask=np.full(n, iteration is None)), pa.array(ints(bucket).astype(np.int8)),
        pa.array(ints(a)), pa.array(ints(b)),
    ], schema=RANK_SCHEMA)


def merge_ranks(partials: list[pa.Table]) -> pd.DataFrame:
    """Rank partials merged: one WHO row per (run, service, rank), one SUM row per key, disjoint UNIONs."""
    table = pa.concat_tables(partials) if partials else RANK_SCHEMA.empty_table()
    frame = table.to_pandas()
    frame["rank"] = frame["rank"].fillna(-1).astype(np.int64)
    frame["iteration"] = frame["iteration"].fillna(-1).astype(np.int64)
    for column in ("run", "service"):  # a stand-in while grouping: groups of None are numbered alike then
        frame[column] = frame[column].astype(object).fillna(_NONE)
    keys = [*_KEYS, "iteration"]
    who = frame[frame["kind"] == WHO].drop_duplicates(_KEYS)
    sums = frame[frame["kind"] == SUM].groupby([*keys, "bucket"], sort=False, dropna=False).agg(
        a=("a", "sum")).reset_index().assign(kind=SUM, b=0)  # every column present: concat keeps int64
    unions = frame[frame["kind"] == UNION]
    group = unions.groupby(keys, sort=False, dropna=False).ngroup().to_numpy(np.int64)
    head, lo, hi = coalesced_union(group, unions["a"].to_numpy(np.int64), unions["b"].to_numpy(np.int64))
    first = unions.drop_duplicates(keys)
    merged_unions = first.iloc[head].assign(a=lo, b=hi)
    out = pd.concat([who, sums, merged_unions], ignore_index=True)
    for column in ("run", "service"):
        out[column] = out[column].astype(object).where(out[column] != _NONE, None)
    return out


def ranks_tables(merged: pd.DataFrame, steps: MergedSteps, run_order) -> dict[str | None, pa.Table]:
    """Per run of ``run_order`` (and None), its ranks table (``RANK_COLUMNS``) from merged rank
    partials and goodput's merged steps (their windows; ``run_order[i]`` is step run code i)."""
    windows = steps.steps
    runs = merged["run"].to_numpy(object)
    merged = merged.assign(code=pd.Index(list(run_order), dtype=object).get_indexer(runs),  # no run: -1
                           name=merged["service"].fillna(""))  # no service sorts first
    step = windows.index_of(merged["code"].to_numpy(np.int64), merged["iteration"].to_numpy(np.int64),
                            merged["iteration"].to_numpy(np.int64) >= 0)
    merged = merged.assign(step=np.where(merged["kind"] == WHO, -1, step))
    codes = {(run_order[c] if c >= 0 else None): int(c) for c in np.unique(merged["code"])}
    return {run: _run_ranks(merged[merged["code"] == code], windows, code, run) for run, code in codes.items()}


def _run_ranks(rows: pd.DataFrame, windows, code: int, run: str | None) -> pa.Table:
    who = rows[rows["kind"] == WHO].sort_values(["name", "rank"], kind="stable")
    index = pd.MultiIndex.from_frame(who[["name", "rank"]])
    n = len(who)
    inside = rows[(rows["kind"] != WHO) & (rows["step"] >= 0)]
    at = index.get_indexer(pd.MultiIndex.from_frame(inside[["name", "rank"]]))
    sums_rows, union_rows = inside["kind"].to_numpy() == SUM, inside["kind"].to_numpy() == UNION
    sums = np.zeros((n, len(BUCKETS)), np.int64)
    np.add.at(sums, (at[sums_rows], inside["bucket"].to_numpy(np.int64)[sums_rows]),
              inside["a"].to_numpy(np.int64)[sums_rows])
    step = inside["step"].to_numpy(np.int64)
    a, b = inside["a"].to_numpy(np.int64), inside["b"].to_numpy(np.int64)
    clipped = np.clip(np.minimum(b, windows.end[step]) - np.maximum(a, windows.start[step]), 0, None)
    union = np.bincount(at[union_rows], weights=(b - a)[union_rows].astype(np.float64), minlength=n)
    covered = np.bincount(at[union_rows], weights=clipped[union_rows].astype(np.float64), minlength=n)
    present = np.bincount(pd.unique(pd.Series(at[sums_rows] * len(windows) + step[sums_rows])) // max(len(windows), 1),
                          minlength=n) if n else np.zeros(0, np.int64)
    run_wall = float((windows.end - windows.start)[windows.run == code].sum())
    columns: dict[str, Any] = {
        "run_id": pa.array([run] * n, pa.string()), "service_name": pa.array(who["service"].tolist(), pa.string()),
        "rank": pa.array([int(r) if r >= 0 else None for r in who["rank"]], pa.int64()),
        "steps": pa.array(present[:n], pa.int64()), "wall_s": pa.array([run_wall / _NS] * n, pa.float64())}
    for i, bucket in enumerate(BUCKETS):
        columns[f"{bucket}_s"] = pa.array(sums[:, i] / _NS, pa.float64())
    columns["covered_s"] = pa.array(covered / _NS, pa.float64())
    columns["unattributed_s"] = pa.array((run_wall - covered) / _NS, pa.float64())
    columns["double_counted_s"] = pa.array((sums.sum(axis=1) - union) / _NS, pa.float64())
    columns["goodput"] = pa.array(sums[:, 0] / run_wall if run_wall > 0 else [None] * n, pa.float64())
    return pa.table(columns)
