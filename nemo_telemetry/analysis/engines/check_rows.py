"""The partitioned check's driver-side table: the few rows its findings quote, in dataset order.

File tasks hand back rows as values (names, runs, buckets as strings; ids; the walk's facts per
row). :class:`Codes` numbers the values as the in-memory read of the whole dataset would, and
:func:`merged_partials` turns the rows and the merged partials into the :class:`checks.Merged`
that :func:`checks.finish` reads, exactly as check_run hands it over for the whole table.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from nemo_telemetry.analysis.findings import checks, rules
from nemo_telemetry.analysis.model._arrays import BUCKETS, NO_BUCKET, UNKNOWN_BUCKET, SpanArrays
from nemo_telemetry.analysis.model.schema import NO_RUN

__all__ = ["SPAN_FLAGS", "Codes", "quoted_arrays", "EMPTY_ROWS", "in_dataset_order", "merged_partials",
           "step_heads"]

SPAN_FLAGS = {code: 1 << i for i, code in enumerate(rules.SPAN_CODES)}  # span-level code -> its bit in "flags"


@dataclass
class Codes:
    """The dataset's value tuples in the order the in-memory read would code them."""

    names: dict = field(default_factory=dict)
    runs: dict = field(default_factory=dict)
    buckets: dict = field(default_factory=dict)
    categories: dict = field(default_factory=dict)

    def add(self, facts: dict) -> None:
        for key in ("names", "runs", "buckets", "categories"):
            values = getattr(self, key)
            for v in facts[key]:
                values.setdefault(v, len(values))

    def code(self, key: str, values) -> np.ndarray:
        lookup = getattr(self, key)
        return np.array([lookup.get(v, -1) if isinstance(v, str) else -1 for v in values], dtype=np.int32)

    def tuple(self, key: str) -> tuple:
        return tuple(getattr(self, key))


def quoted_arrays(rows: pd.DataFrame, codes: Codes) -> SpanArrays:
    """A SpanArrays over ``rows`` (dataset order) with the dataset's codes, as check_run would see them."""
    n = len(rows)
    bucket_values = codes.tuple("buckets")
    lookup = np.array([BUCKETS.index(v) if v in BUCKETS else UNKNOWN_BUCKET for v in bucket_values] + [NO_BUCKET],
                      dtype=np.int8)
    keys = tuple(rows[c].to_numpy(np.uint64) if n else np.zeros(0, np.uint64)
                 for c in ("span_key", "trace_key", "parent_key"))
    columns = {"trace_id": pa.array(rows["trace_id"].tolist() if n else [], pa.string()),
               "span_key": pa.array(keys[0]), "trace_key": pa.array(keys[1]), "parent_key": pa.array(keys[2])}
    bucket_raw = codes.code("buckets", rows["bucket"]) if n else np.zeros(0, np.int32)
    arrays = SpanArrays(
        table=pa.table(columns), name=codes.code("names", rows["name"]), names=codes.tuple("names"),
        run=codes.code("runs", rows["run"]), runs=codes.tuple("runs"), start=rows["start"].to_numpy(np.int64),
        end=rows["end"].to_numpy(np.int64), bucket=lookup[bucket_raw], bucket_raw=bucket_raw,
        bucket_values=bucket_values, iteration=rows["own_iteration"].to_numpy(np.int64),
        has_iteration=rows["has_iteration"].to_numpy(bool))
    arrays.__dict__.update(_keys=keys, orphan=rows["orphan"].to_numpy(bool),
                           _category=(codes.code("categories", rows["category"]), codes.tuple("categories")))
    return arrays


EMPTY_ROWS = pd.DataFrame({c: pd.Series(dtype=t) for c, t in (
    ("file", np.int64), ("row", np.int64), ("name", object), ("run", object), ("start", np.int64), ("end", np.int64),
    ("bucket", object), ("category", object), ("own_iteration", np.int64), ("has_iteration", bool),
    ("iteration", np.int64), ("stamped", bool), ("ancestor", np.int64), ("orphan", bool), ("trace_id", object),
    ("span_key", np.uint64), ("trace_key", np.uint64), ("parent_key", np.uint64), ("step", np.int64),
    ("flags", np.int64), ("part", object), ("walked", bool))})


def in_dataset_order(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """Rows of many files (each with its ``file``) in dataset order (file, then row)."""
    frames = [p for p in parts if len(p)]
    if not frames:
        return EMPTY_ROWS.copy()
    frame = pd.concat([EMPTY_ROWS] + frames, ignore_index=True)
    frame["flags"] = frame["flags"].fillna(0).astype(np.int64)
    frame["step"] = frame["step"].fillna(-1).astype(np.int64)
    frame["walked"] = frame["walked"].fillna(False).astype(bool)
    return frame.sort_values(["file", "row"], kind="stable", ignore_index=True)


def merged_partials(rows: pd.DataFrame, codes: Codes, analysis, facts: list[dict], overlapping: np.ndarray,
            deep: np.ndarray, detached: pd.DataFrame) -> checks.Merged:
    """The merged partials over the rows they name (``rows``, dataset order, global codes)."""
    arrays = quoted_arrays(rows, codes)
    part, flags = rows["part"].to_numpy(object), rows["flags"].to_numpy(np.int64)
    offender = part == "offender"
    walked = np.flatnonzero(rows["walked"].to_numpy(bool))
    fact = rules.RowFacts(arrays=arrays, keep=np.ones(len(rows), bool), walked=walked,
                          walked_stamped=rows["stamped"].to_numpy(bool)[walked],
                          walked_iteration=rows["iteration"].to_numpy(np.int64)[walked],
                          walked_ancestor=rows["ancestor"].to_numpy(np.int64)[walked],
                          orphan=rows["orphan"].to_numpy(bool))
    step = rows["step"].to_numpy(np.int64)
    heads = np.flatnonzero(part == "head")
    head_of = np.zeros(len(analysis.steps), np.int64)
    head_of[step[heads]] = heads
    steps = dataclasses.replace(analysis.steps, row=head_of)  # each step's first step span, among ``rows``
    overlap_rows = np.flatnonzero(part == "overlap")
    first = pd.concat([f["first_anchor"] for f in facts], ignore_index=True).drop_duplicates("run")
    first_codes = codes.code("runs", first["run"].where(first["run"] != NO_RUN, None))
    presence = ({}, [])
    for f in facts:
        for run, spec in f["span_groups"]:
            presence[0].setdefault(int(codes.code("runs", [run])[0]), set()).update(
                g.strip().lower() for g in spec.split(",") if g.strip())
    if presence[0]:
        pairs = {(int(r), int(n)) for f in facts for r, n in zip(codes.code("runs", [p[0] for p in f["names_present"]]),
                                                                 codes.code("names", [p[1] for p in f["names_present"]]))}
        presence = (presence[0], sorted(pairs))
    return checks.Merged(
        facts=fact, offenders={code: np.flatnonzero(offender & ((flags & bit) != 0)) for code, bit in SPAN_FLAGS.items()},
        steps=steps, table=analysis.table, overlapping=overlapping,
        deep=deep, overlap_rows=overlap_rows, overlap_step=step[overlap_rows], detached=detached,
        detached_rows=np.flatnonzero(part == "detached"),
        anchor_trace={int(c): t for c, t in zip(first_codes, first["trace_id"])}, presence=presence)


def step_heads(facts: list[dict], steps, codes: Codes) -> pd.DataFrame:
    """One row per step (steps' order): its first step span (earliest start, then dataset order)."""
    parts = [f["steps"].assign(file=i) for i, f in enumerate(facts) if len(f["steps"])]
    if not parts:
        return EMPTY_ROWS.iloc[:0]
    frame = pd.concat(parts, ignore_index=True)
    frame = frame.sort_values(["start", "file", "row"], kind="stable").drop_duplicates(["run", "iteration"])
    frame["code"] = codes.code("runs", frame["run"])
    index = pd.MultiIndex.from_arrays([frame["code"].to_numpy(np.int64), frame["iteration"].to_numpy(np.int64)])
    at = index.get_indexer(pd.MultiIndex.from_arrays([steps.run, steps.iteration]))
    heads = frame.iloc[at].reset_index(drop=True)
    n = len(heads)
    return pd.DataFrame({"file": heads["file"].to_numpy(np.int64), "row": heads["row"].to_numpy(np.int64),
                         "name": None, "run": heads["run"].where(heads["run"] != NO_RUN, None).to_numpy(object),
                         "start": heads["start"].to_numpy(np.int64), "end": heads["end"].to_numpy(np.int64),
                         "bucket": None, "category": None, "own_iteration": heads["iteration"].to_numpy(np.int64),
                         "has_iteration": True, "iteration": heads["iteration"].to_numpy(np.int64), "stamped": True,
                         "ancestor": -1, "orphan": False, "trace_id": heads["trace_id"].to_numpy(object),
                         "span_key": heads["span_key"].to_numpy(np.uint64), "trace_key": np.zeros(n, np.uint64),
                         "parent_key": np.zeros(n, np.uint64), "step": np.arange(n), "flags": 0, "part": "head",
                         "walked": False})
