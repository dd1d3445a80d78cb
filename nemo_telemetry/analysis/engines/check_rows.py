"""The partitioned check's driver-side table: the few rows its findings quote, in dataset order.

File tasks hand back rows as values (names, runs, buckets as strings; ids; the walk's facts per
row), as numpy columns (:data:`ROW_COLUMNS`). :class:`Codes` numbers the values as the in-memory
read of the whole dataset would, and :func:`merged_partials` turns the rows and the merged
partials into the :class:`checks.Merged` that :func:`checks.finish` reads, exactly as check_run
hands it over for the whole table.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from nemo_telemetry.analysis.findings import checks, rules
from nemo_telemetry.analysis.decode import RUN_RESOURCES, SPAN_GROUPS_ATTRIBUTE, RunPairs, SpanArrays, rows_arrays
from nemo_telemetry.analysis.findings.groups import GroupPresence
from nemo_telemetry.analysis.model.grouping import Columns, concat, find_keys, first_rows, string_codes, take
from nemo_telemetry.analysis.model.schema import NO_RUN

__all__ = ["SPAN_FLAGS", "Codes", "quoted_arrays", "dataset_pairs", "ROW_COLUMNS", "EMPTY_ROWS", "in_dataset_order",
           "merged_partials", "step_heads", "STEP_FACTS", "FIRST_ANCHOR"]

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


def quoted_arrays(rows: Columns, codes: Codes, pairs: RunPairs | None = None) -> SpanArrays:
    """A SpanArrays over ``rows`` (dataset order) with the dataset's codes, as check_run would see
    them; ``pairs``: the dataset's run pairs (:func:`dataset_pairs`), none given: none."""
    keys = tuple(np.asarray(rows[c], np.uint64) for c in ("span_key", "trace_key", "parent_key", "trace_low"))
    return rows_arrays(
        trace_id=list(rows["trace_id"]), keys=keys, name=(codes.code("names", rows["name"]), codes.tuple("names")),
        run=(codes.code("runs", rows["run"]), codes.tuple("runs")),
        bucket=(codes.code("buckets", rows["bucket"]), codes.tuple("buckets")),
        category=(codes.code("categories", rows["category"]), codes.tuple("categories")),
        start=np.asarray(rows["start"], np.int64), end=np.asarray(rows["end"], np.int64),
        iteration=rows["own_iteration"], has_iteration=rows["has_iteration"], orphan=rows["orphan"],
        pairs=pairs if pairs is not None else RunPairs(frozenset(), {key: frozenset() for key in RUN_RESOURCES}))


def dataset_pairs(facts: list[dict], codes: Codes) -> RunPairs:
    """The dataset's :class:`RunPairs` from the files' facts (their group presence partials), in the
    dataset's codes."""
    presence = GroupPresence.union(f["group_presence"] for f in facts)
    named = sorted(presence.names, key=repr)
    names = {(int(r), int(n)) for r, n in zip(codes.code("runs", [p[0] for p in named]),
                                              codes.code("names", [p[1] for p in named])) if r >= 0 and n >= 0}
    specs = sorted({(run, spec) for run, spec, *_ in presence.processes}, key=repr)
    groups = {(int(codes.code("runs", [run])[0]), spec) for run, spec in specs}
    return RunPairs(frozenset(names), {SPAN_GROUPS_ATTRIBUTE: frozenset(p for p in groups if p[0] >= 0)})


# The columns of the driver-side rows: name, type, and the value of a part that does not give it.
ROW_COLUMNS = (
    ("file", np.int64, 0), ("row", np.int64, 0), ("name", object, None), ("run", object, None),
    ("start", np.int64, 0), ("end", np.int64, 0), ("bucket", object, None), ("category", object, None),
    ("own_iteration", np.int64, 0), ("has_iteration", bool, False), ("iteration", np.int64, -1),
    ("stamped", bool, False), ("ancestor", np.int64, -1), ("orphan", bool, False), ("trace_id", object, None),
    ("span_key", np.uint64, 0), ("trace_key", np.uint64, 0), ("parent_key", np.uint64, 0), ("step", np.int64, -1),
    ("flags", np.int64, 0), ("part", object, None), ("walked", bool, False), ("trace_low", np.uint64, 0))
EMPTY_ROWS = {name: np.zeros(0, kind) for name, kind, _ in ROW_COLUMNS}


def in_dataset_order(parts: list[Columns]) -> Columns:
    """Rows of many files (each with its ``file``) in dataset order (file, then row); a column a
    part does not give takes its :data:`ROW_COLUMNS` default (no flags, no step, not walked)."""
    full = []
    for part in parts:
        n = len(part["row"])
        full.append({name: part[name] if name in part else np.full(n, default, kind)
                     for name, kind, default in ROW_COLUMNS})
    rows = concat(full, EMPTY_ROWS)
    return take(rows, np.lexsort((rows["row"], rows["file"])))


def merged_partials(rows: Columns, codes: Codes, analysis, facts: list[dict], overlapping: np.ndarray,
                    deep: np.ndarray, detached: Columns) -> checks.Merged:
    """The merged partials over the rows they name (``rows``, dataset order, global codes)."""
    arrays = quoted_arrays(rows, codes, dataset_pairs(facts, codes))
    part, flags = rows["part"], rows["flags"]
    offender = part == "offender"
    walked = np.flatnonzero(rows["walked"])
    fact = rules.RowFacts(arrays=arrays, keep=np.ones(len(part), bool), walked=walked,
                          walked_stamped=rows["stamped"][walked], walked_iteration=rows["iteration"][walked],
                          walked_ancestor=rows["ancestor"][walked], orphan=rows["orphan"])
    step = rows["step"]
    heads = np.flatnonzero(part == "head")
    head_of = np.zeros(len(analysis.steps), np.int64)
    head_of[step[heads]] = heads
    steps = dataclasses.replace(analysis.steps, row=head_of)  # each step's first step span, among ``rows``
    overlap_rows = np.flatnonzero(part == "overlap")
    anchors = concat([f["first_anchor"] for f in facts], FIRST_ANCHOR)
    first = take(anchors, first_rows(string_codes(anchors["run"])[0]))
    first_codes = codes.code("runs", [None if r == NO_RUN else r for r in first["run"]])
    presence = GroupPresence.union(f["group_presence"] for f in facts)
    return checks.Merged(
        facts=fact, offenders={code: np.flatnonzero(offender & ((flags & bit) != 0)) for code, bit in SPAN_FLAGS.items()},
        steps=steps, table=analysis.table, overlapping=overlapping,
        deep=deep, overlap_rows=overlap_rows, overlap_step=step[overlap_rows], detached=detached,
        detached_rows=np.flatnonzero(part == "detached"),
        anchor_trace={int(c): t for c, t in zip(first_codes, first["trace_id"])}, presence=presence)


def step_heads(facts: list[dict], steps, codes: Codes) -> Columns:
    """One row per step (steps' order): its first step span (earliest start, then dataset order)."""
    parts = [{**f["steps"], "file": np.full(len(f["steps"]["row"]), i, np.int64)} for i, f in enumerate(facts)]
    frame = concat(parts, {**STEP_FACTS, "file": np.zeros(0, np.int64)})
    if len(frame["row"]) == 0:
        return take(EMPTY_ROWS, slice(0, 0))
    frame = take(frame, np.lexsort((frame["row"], frame["file"], frame["start"])))
    code = codes.code("runs", frame["run"]).astype(np.int64)
    first = first_rows(code, frame["iteration"], string_codes(frame["run"])[0])
    frame, code = take(frame, first), code[first]
    heads = take(frame, find_keys((code, frame["iteration"]), (steps.run, steps.iteration)))
    n = len(heads["row"])
    return {"file": heads["file"], "row": heads["row"], "name": np.full(n, None, object),
            "run": np.array([None if r == NO_RUN else r for r in heads["run"]], object),
            "start": heads["start"], "end": heads["end"], "bucket": np.full(n, None, object),
            "category": np.full(n, None, object), "own_iteration": heads["iteration"],
            "has_iteration": np.ones(n, bool), "iteration": heads["iteration"], "stamped": np.ones(n, bool),
            "ancestor": np.full(n, -1, np.int64), "orphan": np.zeros(n, bool), "trace_id": heads["trace_id"],
            "span_key": heads["span_key"], "trace_key": np.zeros(n, np.uint64), "parent_key": np.zeros(n, np.uint64),
            "trace_low": np.zeros(n, np.uint64),
            "step": np.arange(n, dtype=np.int64), "flags": np.zeros(n, np.int64), "part": np.full(n, "head", object),
            "walked": np.zeros(n, bool)}


# What each file's facts hold about its step windows and its runs' first anchor spans.
STEP_FACTS = {"run": np.zeros(0, object), "iteration": np.zeros(0, np.int64), "start": np.zeros(0, np.int64),
              "end": np.zeros(0, np.int64), "row": np.zeros(0, np.int64), "span_key": np.zeros(0, np.uint64),
              "trace_id": np.zeros(0, object)}
FIRST_ANCHOR = {"run": np.zeros(0, object), "row": np.zeros(0, np.int64), "name": np.zeros(0, object),
                "trace_id": np.zeros(0, object)}
