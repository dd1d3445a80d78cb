"""``--by fleet``: GPU-seconds per fleet and bucket, as partial -> merge -> finish (docs/goodput.md, "Fleets").

A *fleet* is the processes of a run that carry one ``rl.fleet`` word (``policy``, ``generation``,
``driver`` ...); its GPUs are the sum of their ``nv.dl.gpu.count``. The rules, each once:

- *window*: a sync run's step windows (goodput's own); an async run's job window less its
  ``rl.init.total`` span (the initial buffer fill), with per-step figures that clip it to the
  driver's step windows (no job span: the first step's start to the last step's end);
- *capacity*: a fleet's GPU-seconds are its GPUs times the window. A run whose resource says
  ``rl.generation.colocated`` = true has one physical fleet for training and generation
  (:data:`COLOCATED_FLEET`): its GPUs are the larger of the two declared sums (both sets of
  processes hold the same devices), split by time between their activities;
- *where a span's work runs*: a process that holds GPUs does its spans' work on its own fleet; a
  span of a process without GPUs (the driver, a collector) names work that runs on a GPU fleet by
  its group (:data:`GROUP_FLEETS`: generation and rollout on ``generation``, log-probs, policy
  update and checkpoint staging on ``policy``) or, where its group names no fleet or none was
  recorded, its name (:data:`NAME_FLEETS`); a span counts every GPU of that fleet busy (a fleet's
  phases are lockstep); a fleet that work is put on but no process declares has a row with no GPUs;
- *buckets*: every GPU-second of a window lands in exactly one bucket: the union of the fleet's
  bucketed intervals with priority productive > overhead > wasted > idle, and the time under none
  of them idle, so the buckets sum to the capacity. A retried rollout (``rl.rollout.attempt`` > 0,
  bucketed or not) and a bucketed span that ended in error (a failed trajectory) are wasted;
- *sources*: a fleet uses its spans (``spans``) where its productive or overhead spans cover some
  of the run's window, its processes' ``rl.fleet.busy.seconds`` (``busy_metric``) where they
  record it, both (``spans+busy_metric``) where both hold; else ``spans`` where it has any
  bucketed span (idle), else ``none``: a fleet with GPUs and no signal is *unknown*, never idle.
  The busy metric, per series: the counter's increase between consecutive points (the first from
  its start time) times the process's GPUs, spread uniformly between the two points' times and
  clipped to the window; its activity picks the bucket (:data:`ACTIVITY_BUCKETS`, else
  productive). With spans beside it (:func:`_busy`), an increase counts only its excess over the
  spans' covered time in its interval, spread over the interval's span-free time: a density has
  no exact union with intervals, so the metric is taken to repeat what the spans say as far as it
  fits (never counted twice; a lower bound where the two describe different work). Alone, its
  busy time under the fleet's wasted spans (retries, failures) is wasted. The span buckets come
  first; the metric's are added in priority order up to the capacity, the rest idle;
- *tokens*: where the fleet's processes count tokens (:data:`TOKEN_COUNTERS`), the tokens whose
  increase falls in the window (spread as the busy counter is) per GPU-second.

The three stages, so that every engine gives the same numbers by scheduling them:

1. :func:`fleet_partial` (one batch of spans) gives ``FLEET_SCHEMA`` rows: PROC per process (run,
   service, rank, host, pid) with its fleet, GPUs, span count and the run's placement attributes;
   SPAN, per (run, fleet, level), the coalesced union of the intervals whose work runs there; INIT
   the bounds of ``rl.init.total``. :func:`metric_partial` gives the metric side: PROC rows of the
   processes that recorded points, and POINT rows of the busy and token counters.
2. :func:`merge_fleets` merges them (least word / max / sum / union), in any order and grouping.
3. :func:`fleet_goodput` finishes each run's :class:`FleetGoodput` from the merged rows and
   goodput's own merged partials (step windows, job bounds, async runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.decode import BUCKETS, span_arrays
from nemo_telemetry.analysis.goodput.rules import ASYNC, JOB, STEP, coalesced_union, partial_columns
from nemo_telemetry.analysis.model.grouping import Columns, group_by, string_codes, take
from nemo_telemetry.analysis.model.status import error_rows

__all__ = [
    "FLEET_SCHEMA", "PROC", "SPAN", "INIT", "POINT", "LEVELS", "FLEET_COLUMNS", "COLOCATED_FLEET", "GROUP_FLEETS",
    "NAME_FLEETS", "ACTIVITY_BUCKETS", "BUSY_METRIC", "TOKEN_COUNTERS", "FLEET_READ_COLUMNS", "FleetFinding",
    "FleetGoodput", "fleet_partial", "metric_partial", "merge_fleets", "fleet_goodput", "fleet_document", "attach_fleets",
]

PROC, SPAN, INIT, POINT = 0, 1, 2, 3
LEVELS = ("productive", "overhead", "wasted", "idle")  # priority order: a GPU-second goes to the first that holds it
_LEVEL_OF_BUCKET = {"productive": 0, "overhead": 1, "wasted": 2, "idle": 3}
_WASTED = 2
_NS = 1e9

FLEET_KEY, GPU_COUNT_KEY, DRIVER_FLEET = "rl.fleet", "nv.dl.gpu.count", "driver"  # as instrument writes them
COLOCATED_FLEET = "policy+generation"
"""The one physical fleet of a colocated run (``rl.generation.colocated`` = true)."""
TRAINING_FLEET, GENERATION_FLEET = "policy", "generation"
GROUP_FLEETS = {"generation": GENERATION_FLEET, "rollout": GENERATION_FLEET, "logprob": TRAINING_FLEET,
                "policy_update": TRAINING_FLEET, "checkpoint": TRAINING_FLEET}
"""Span group -> the fleet whose GPUs do the work, for spans of a process that holds no GPUs."""
NAME_FLEETS = ((r"^rl\.vllm\.", GENERATION_FLEET), (r"^rl\.[^.]+\.generation$", GENERATION_FLEET),
               (r"^rl\.sc\.generate_and_push$", GENERATION_FLEET),
               (r"^rl\.[^.]+\.(policy_training|policy_and_reference_logprobs|teacher_logprob_inference)$",
                TRAINING_FLEET),
               (r"^rl\.[^.]+\.checkpointing$", TRAINING_FLEET))
"""The same by span name, for spans whose group names no fleet or that recorded none (hand-built tables)."""
BUSY_METRIC = "rl.fleet.busy.seconds"
ACTIVITY_BUCKETS = {"validation": "overhead", "evaluate": "overhead", "refit": "overhead",
                    "weight_sync": "overhead", "retry": "wasted"}
"""``rl.fleet.activity`` -> bucket of the busy metric's time; any other activity is productive."""
SPANS, BUSY, NO_SIGNAL = "spans", "busy_metric", "none"
"""A fleet row's ``source`` words; ``spans+busy_metric`` where it uses both."""
TOKEN_COUNTERS = ("rl.vllm.generation_tokens",)
"""Cumulative token counters whose increase over a window gives a fleet's tokens/s/GPU."""
INIT_SPAN = r"^rl\.init\.total$"
ATTEMPT = "rl.rollout.attempt"

FLEET_COLUMNS = ("fleet", "gpus", "processes", "source", "gpu_seconds", "productive_gpu_s", "overhead_gpu_s",
                 "wasted_gpu_s", "idle_gpu_s", "unknown_gpu_s", "goodput", "tokens_per_s_per_gpu")
FLEET_READ_COLUMNS = ("status_code", "rl.span_group", "attributes", "resource_attributes")
"""What ``--by fleet`` reads of spans besides goodput's columns and (service, rank)."""

FLEET_SCHEMA = pa.schema([
    pa.field("kind", pa.int8()), pa.field("run", pa.string()),
    # PROC: the process, its fleet and GPUs (null: not recorded), count = its spans, and the run's placement
    pa.field("service", pa.string()), pa.field("rank", pa.int64()), pa.field("host", pa.string()),
    pa.field("pid", pa.string()), pa.field("fleet", pa.string()), pa.field("gpus", pa.int64()),
    pa.field("count", pa.int64()), pa.field("colocated", pa.string()), pa.field("asynchronous", pa.string()),
    pa.field("topology_world", pa.int64()), pa.field("generation_world", pa.int64()),
    # SPAN: fleet, level, [a, b) | INIT: [a, b) | POINT: the process, fleet, gpus, series, level (-1: tokens),
    # a = the point's start time, b = its time, value
    pa.field("series", pa.string()), pa.field("level", pa.int8()), pa.field("a", pa.int64()),
    pa.field("b", pa.int64()), pa.field("value", pa.float64()),
])
_PROCESS = ("run", "service", "rank", "host", "pid")
_PLACEMENT = {"colocated": "rl.generation.colocated", "asynchronous": "rl.async",
              "topology_world": "nv.dl.topology.size.world", "generation_world": "rl.generation.topology.size.world"}


# -- 1. partial -------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _Coded:
    """Strings as codes: each row's code into ``names`` (distinct), -1 for none."""

    codes: np.ndarray
    names: tuple

    def strings(self, rows: np.ndarray | None = None) -> np.ndarray:
        codes = self.codes if rows is None else self.codes[rows]
        return np.array([*self.names, None], dtype=object)[codes]

    def ints(self) -> np.ndarray:
        """Decimal integers as int64, -1 where absent or not a non-negative integer."""
        numbers = np.array([_to_int(n) for n in self.names] + [-1], np.int64)
        return numbers[self.codes]


def _to_int(text) -> int:
    try:
        number = int(text)
    except (TypeError, ValueError):
        return -1
    return number if number >= 0 else -1


def _coded(values) -> _Coded:
    """:class:`_Coded` of an Arrow string (or dictionary) array; equal strings share one code."""
    codes, names = string_codes(values)
    unique = {}
    remap = np.array([unique.setdefault(n, len(unique)) for n in names] + [-1], np.int64)
    return _Coded(remap[codes], tuple(unique))


def _map_values(table: pa.Table, column: str, keys: Sequence[str]) -> dict[str, _Coded]:
    """Per key of ``keys``, each row's value in the map column ``column`` (the last where a key
    repeats). One pass over the maps' entries, whatever the number of keys."""
    n = table.num_rows
    codes = {k: np.full(n, -1, np.int64) for k in keys}
    names: dict[str, dict] = {k: {} for k in keys}
    if column in table.column_names and n:
        offset = 0
        for chunk in table.column(column).chunks:
            bounds = np.asarray(chunk.offsets.to_numpy(), np.int64)  # the slice's, into the whole child
            first, count = int(bounds[0]), int(bounds[-1] - bounds[0])
            parents = np.repeat(np.arange(len(chunk), dtype=np.int64), np.diff(bounds)) + offset
            offset += len(chunk)
            if count == 0:
                continue
            entry_keys = _coded(chunk.keys.slice(first, count))
            entry_values = chunk.items.slice(first, count)
            for key in keys:
                if key not in entry_keys.names:
                    continue
                sel = np.flatnonzero(entry_keys.codes == entry_keys.names.index(key))
                values = _coded(entry_values.take(pa.array(sel)))
                known = names[key]
                remap = np.array([known.setdefault(v, len(known)) for v in values.names] + [-1], np.int64)
                codes[key][parents[sel]] = remap[values.codes]
    return {k: _Coded(codes[k], tuple(names[k])) for k in keys}


def _strings(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=object)


def _rows(kind: int, n: int, **columns) -> pa.Table:
    """``FLEET_SCHEMA`` rows of one ``kind``; int columns take -1 (and level -2) for null."""
    out = []
    for field in FLEET_SCHEMA:
        if field.name == "kind":
            out.append(pa.array(np.full(n, kind, np.int8)))
            continue
        values = columns.get(field.name)
        if pa.types.is_string(field.type):
            out.append(pa.array(np.full(n, None, object) if values is None else _strings(values), pa.string()))
        elif field.name == "value":
            out.append(pa.array(np.zeros(n) if values is None else np.asarray(values, np.float64)))
        elif field.name == "level":
            v = np.full(n, -2) if values is None else np.asarray(values)
            out.append(pa.array(v.astype(np.int8), mask=v == -2))
        elif field.name in ("a", "b"):
            out.append(pa.array(np.zeros(n, np.int64) if values is None else np.asarray(values, np.int64)))
        else:
            v = np.full(n, -1, np.int64) if values is None else np.asarray(values, np.int64)
            out.append(pa.array(v, mask=v < 0))
    return pa.table(out, schema=FLEET_SCHEMA)


def _least_coded(groups, coded: _Coded, rows: np.ndarray) -> np.ndarray:
    """:func:`_least` of coded strings at ``rows``, by their few distinct values, not per row."""
    order = sorted(range(len(coded.names)), key=lambda i: coded.names[i])
    rank = np.empty(len(coded.names) + 1, np.int64)
    rank[order] = np.arange(len(order))
    rank[-1] = len(order)  # none: last
    least = groups.reduce(np.minimum, rank[coded.codes[rows]]) if len(groups) else np.zeros(0, np.int64)
    return np.array([*(coded.names[i] for i in order), None], dtype=object)[least]


_RESOURCE_KEYS = ("host.name", "process.pid", FLEET_KEY, GPU_COUNT_KEY, *_PLACEMENT.values())


def _process_rows(resource: dict[str, _Coded], run: _Coded, service: _Coded, rank: np.ndarray, rows: np.ndarray,
                  count: np.ndarray | None) -> pa.Table:
    """PROC rows of the processes of ``rows`` (``resource``: :func:`_map_values` of the resource
    keys; ``count``: per row, what it adds to the count)."""
    host, pid = resource["host.name"], resource["process.pid"]
    groups = group_by(run.codes[rows], service.codes[rows], rank[rows], host.codes[rows], pid.codes[rows])
    first = rows[groups.first]
    counted = np.ones(len(rows), np.int64) if count is None else count
    columns: dict[str, Any] = {"run": run.strings(first), "service": service.strings(first), "rank": rank[first],
                               "host": host.strings(first), "pid": pid.strings(first),
                               "fleet": _least_coded(groups, resource[FLEET_KEY], rows),
                               "gpus": groups.reduce(np.maximum, resource[GPU_COUNT_KEY].ints()[rows]),
                               "count": groups.reduce(np.add, counted)}
    for name in ("colocated", "asynchronous"):
        columns[name] = _least_coded(groups, resource[_PLACEMENT[name]], rows)
    for name in ("topology_world", "generation_world"):
        columns[name] = groups.reduce(np.maximum, resource[_PLACEMENT[name]].ints()[rows])
    return _rows(PROC, len(first), **columns)


def _target_fleets(arrays, table: pa.Table, rows: np.ndarray, fleet: _Coded, gpus: np.ndarray) -> np.ndarray:
    """The fleet whose GPUs do the work of each of ``rows``: its process's, where that holds GPUs;
    else its group's (:data:`GROUP_FLEETS`), else its name's (:data:`NAME_FLEETS`: a group such as
    ``per_prompt`` names no fleet); else its process's own word (None: none)."""
    target = fleet.strings(rows)
    gpuless = gpus[rows] <= 0
    named = np.full(len(rows), None, object)
    for regex, word in reversed(NAME_FLEETS):  # the first pattern that matches wins
        named[arrays.rows_of_names(regex)[rows]] = word
    mapped = named
    if "rl.span_group" in table.column_names:
        group = _coded(table.column("rl.span_group"))
        by_group = np.array([GROUP_FLEETS.get(g) for g in group.names] + [None], dtype=object)
        grouped = by_group[group.codes[rows]]
        mapped = np.where(grouped != None, grouped, named)  # noqa: E711 (a group that names a fleet decides)
    return np.where(gpuless & (mapped != None), mapped, target)  # noqa: E711 (an object array's elementwise test)


def fleet_partial(batch: pa.Table, *, run_id: str | None = None) -> pa.Table:
    """The fleet partial (``FLEET_SCHEMA``) of one batch of spans (every row of the run asked for)."""
    arrays = span_arrays(batch)
    table = arrays.table
    keep = np.ones(len(arrays), bool) if run_id is None else (
        arrays.run == arrays.runs.index(run_id) if run_id in arrays.runs else np.zeros(len(arrays), bool))
    run = _Coded(arrays.run.astype(np.int64), tuple(arrays.runs))
    service = _Coded(arrays.service.astype(np.int64), tuple(arrays.services))
    rank = np.where(arrays.has_rank, arrays.rank, -1).astype(np.int64)
    kept = np.flatnonzero(keep)
    resource = _map_values(table, "resource_attributes", _RESOURCE_KEYS)
    parts = [_process_rows(resource, run, service, rank, kept, None)]
    gpus = resource[GPU_COUNT_KEY].ints()
    bucketed = (arrays.bucket >= 0) & arrays.valid_interval & keep
    attempt = _map_values(table, "attributes", (ATTEMPT,))[ATTEMPT].ints()
    retried = (attempt > 0) & arrays.valid_interval & keep
    rows = np.flatnonzero(bucketed | retried)
    level = np.full(len(rows), _WASTED, np.int64)
    known = bucketed[rows]
    to_level = np.array([_LEVEL_OF_BUCKET[b] for b in BUCKETS], np.int64)
    level[known] = to_level[arrays.bucket[rows[known]]]
    level[retried[rows] | error_rows(table)[rows]] = _WASTED
    target = _target_fleets(arrays, table, rows, resource[FLEET_KEY], gpus)
    has = target != None  # noqa: E711
    rows, level, target = rows[has], level[has], target[has]
    run_codes, fleet_codes = arrays.run[rows].astype(np.int64), string_codes(target)[0]
    groups = group_by(run_codes, fleet_codes, level)
    head, lo, hi = coalesced_union(groups.codes, arrays.start[rows], arrays.end[rows])
    first = groups.first[head]
    parts.append(_rows(SPAN, len(head), run=run.strings(rows[first]), fleet=target[first], level=level[first],
                       a=lo, b=hi))
    init = np.flatnonzero(arrays.rows_of_names(INIT_SPAN) & arrays.valid_interval & keep)
    by_run = group_by(arrays.run[init].astype(np.int64))
    parts.append(_rows(INIT, len(by_run), run=run.strings(init[by_run.first]),
                       a=by_run.reduce(np.minimum, arrays.start[init]), b=by_run.reduce(np.maximum, arrays.end[init])))
    return pa.concat_tables(parts)


def metric_partial(metrics: pa.Table | None, *, run_id: str | None = None) -> pa.Table:
    """The fleet partial of metric points: PROC rows of the processes that recorded any (count 0:
    a process is not the more present for its points), POINT rows of :data:`BUSY_METRIC` (level by
    activity; the fleet its ``rl.fleet`` attribute names, else its process's) and of
    :data:`TOKEN_COUNTERS` (level -1)."""
    if metrics is None or metrics.num_rows == 0:
        return FLEET_SCHEMA.empty_table()
    run, service = _coded(metrics.column("run_id")), _coded(metrics.column("service_name"))
    keep = np.ones(metrics.num_rows, bool) if run_id is None else (
        run.codes == (run.names.index(run_id) if run_id in run.names else -2))
    rank = np.asarray(pc.fill_null(metrics.column("rank"), -1).to_numpy(), np.int64)
    resource = _map_values(metrics, "resource_attributes", _RESOURCE_KEYS)
    rows = np.flatnonzero(keep)
    parts = [_process_rows(resource, run, service, rank, rows, np.zeros(len(rows), np.int64))]
    name, kind = _coded(metrics.column("name")), _coded(metrics.column("kind"))
    names = np.array([*name.names, None], dtype=object)[name.codes]
    is_sum = kind.codes == (kind.names.index("sum") if "sum" in kind.names else -2)
    busy = keep & (names == BUSY_METRIC) & is_sum
    tokens = keep & np.isin(names, TOKEN_COUNTERS) & is_sum
    rows = np.flatnonzero(busy | tokens)
    point = _map_values(metrics, "attributes", ("rl.fleet.activity", FLEET_KEY))
    activity = point["rl.fleet.activity"].strings(rows)
    named = point[FLEET_KEY].strings(rows)  # fleet_busy(fleet=...) names the fleet the work is for
    fleet = np.where(named == None, resource[FLEET_KEY].strings(rows), named)  # noqa: E711
    level = np.array([_LEVEL_OF_BUCKET[ACTIVITY_BUCKETS.get(a, "productive")] for a in activity.tolist()], np.int64)
    level = np.where(busy[rows], level, -1)
    series = np.array([f"{n}|{a or ''}" for n, a in zip(names[rows].tolist(), activity.tolist())], dtype=object)
    start = np.asarray(pc.fill_null(metrics.column("start_time_ns"), -1).to_numpy(), np.int64)[rows]
    time = np.asarray(metrics.column("time_ns").to_numpy(), np.int64)[rows]
    value = np.asarray(pc.fill_null(metrics.column("value"), 0.0).to_numpy(), np.float64)[rows]
    parts.append(_rows(POINT, len(rows), run=run.strings(rows), service=service.strings(rows), rank=rank[rows],
                       host=resource["host.name"].strings(rows), pid=resource["process.pid"].strings(rows),
                       fleet=fleet, gpus=resource[GPU_COUNT_KEY].ints()[rows], series=series, level=level, a=start,
                       b=time, value=value))
    return pa.concat_tables(parts)


# -- 2. merge ---------------------------------------------------------------------------------


def _columns(table: pa.Table) -> Columns:
    out: Columns = {}
    for field in FLEET_SCHEMA:
        column = table.column(field.name)
        if pa.types.is_string(field.type):
            out[field.name] = np.asarray(column.to_numpy(zero_copy_only=False), dtype=object)
        elif field.name == "value":
            out[field.name] = np.asarray(column.to_numpy(), np.float64)
        else:
            null = -2 if field.name == "level" else -1
            out[field.name] = np.asarray(pc.fill_null(column, null).to_numpy(), np.int64)
    return out


def _codes(*columns: np.ndarray) -> list[np.ndarray]:
    return [string_codes(c)[0] if c.dtype == object else c for c in columns]


def _least(groups, values: np.ndarray) -> np.ndarray:
    """Per group, the least non-null string of ``values`` (None when it has none): one answer
    whatever the order rows and partials come in (a process records one word; should it record
    two, every engine picks the same)."""
    distinct = sorted({v for v in values.tolist() if v is not None})
    order = {v: i for i, v in enumerate(distinct)}
    rank = np.array([order.get(v, len(distinct)) for v in values.tolist()], np.int64) if len(values) else \
        np.zeros(0, np.int64)
    least = groups.reduce(np.minimum, rank) if len(groups) else np.zeros(0, np.int64)
    return np.array([*distinct, None], dtype=object)[least]


def merge_fleets(partials: Sequence[pa.Table]) -> pa.Table:
    """Fleet partials merged: one PROC row per process (its first fleet word, its largest GPU count,
    its span counts summed), the SPAN unions disjoint per (run, fleet, level), one INIT row per run
    (earliest start, latest end), each POINT once."""
    table = pa.concat_tables([p.select(FLEET_SCHEMA.names).cast(FLEET_SCHEMA) for p in partials]) if partials \
        else FLEET_SCHEMA.empty_table()
    rows = _columns(table)
    parts = []
    proc = take(rows, rows["kind"] == PROC)
    groups = group_by(*_codes(*(proc[k] for k in _PROCESS))) if len(proc["kind"]) else None
    if groups is not None:
        columns = {k: groups.key(proc[k]) for k in _PROCESS}
        columns.update(fleet=_least(groups, proc["fleet"]), gpus=groups.reduce(np.maximum, proc["gpus"]),
                       count=groups.reduce(np.add, proc["count"]),
                       colocated=_least(groups, proc["colocated"]),
                       asynchronous=_least(groups, proc["asynchronous"]),
                       topology_world=groups.reduce(np.maximum, proc["topology_world"]),
                       generation_world=groups.reduce(np.maximum, proc["generation_world"]))
        parts.append(_rows(PROC, len(groups), **columns))
    span = take(rows, rows["kind"] == SPAN)
    if len(span["kind"]):
        groups = group_by(*_codes(span["run"], span["fleet"]), span["level"])
        head, lo, hi = coalesced_union(groups.codes, span["a"], span["b"])
        first = groups.first[head]
        parts.append(_rows(SPAN, len(head), run=span["run"][first], fleet=span["fleet"][first],
                           level=span["level"][first], a=lo, b=hi))
    init = take(rows, rows["kind"] == INIT)
    if len(init["kind"]):
        groups = group_by(*_codes(init["run"]))
        parts.append(_rows(INIT, len(groups), run=groups.key(init["run"]), a=groups.reduce(np.minimum, init["a"]),
                           b=groups.reduce(np.maximum, init["b"])))
    point = take(rows, rows["kind"] == POINT)
    if len(point["kind"]):
        keys = ("run", "service", "rank", "host", "pid", "series", "b")
        groups = group_by(*_codes(*(point[k] for k in keys)))
        first = np.sort(groups.first)
        parts.append(_rows(POINT, len(first), **{k: v[first] for k, v in point.items() if k != "kind"}))
    return pa.concat_tables(parts) if parts else FLEET_SCHEMA.empty_table()


# -- 3. finish --------------------------------------------------------------------------------


@dataclass(frozen=True)
class FleetFinding:
    """What would make a fleet's figures lie: ``code`` (``fleet-unknown``, ``fleet-gpus-unknown``,
    ``fleet-no-busy-signal``, ``fleet-overcommitted``, ``fleet-topology-mismatch``), the fleet
    (None: a process without one), and what to do."""

    code: str
    severity: str
    fleet: str | None
    message: str


@dataclass(frozen=True)
class FleetGoodput:
    """One run's GPU-seconds per fleet: ``fleets`` (``FLEET_COLUMNS``, one row per fleet), the
    ``cluster`` row (the sums over fleets with GPUs), ``steps`` (per step: iteration, its fleets
    table, its cluster row; empty unless ``per_step``), and the findings."""

    fleets: pa.Table
    cluster: dict[str, Any]
    steps: tuple[tuple[int, pa.Table, dict[str, Any]], ...]
    findings: tuple[FleetFinding, ...]
    windowing: str  # "steps" (a sync run) or "job" (async: the job less rl.init.total)
    per_step: bool = False  # asked for by="fleet,step": the document and the table show ``steps``


def _below(starts: np.ndarray, ends: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Length of the union of disjoint sorted ``[starts, ends)`` below each ``x``."""
    if len(starts) == 0:
        return np.zeros(len(x), np.int64)
    lengths = ends - starts
    before = np.concatenate([[0], np.cumsum(lengths)])
    k = np.searchsorted(starts, x, side="right") - 1
    at = np.clip(k, 0, None)
    inside = np.clip(x - starts[at], 0, lengths[at])
    return np.where(k >= 0, before[at] + inside, 0).astype(np.int64)


def _covered(starts: np.ndarray, ends: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Length of the union of ``[starts, ends)`` inside each ``[lo, hi)``."""
    if len(starts) == 0:
        return np.zeros(len(lo), np.int64)
    _, s, e = coalesced_union(np.zeros(len(starts), np.int64), starts, ends)
    return _below(s, e, hi) - _below(s, e, lo)


def _cumulative(t0: np.ndarray, t1: np.ndarray, amount: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Of one series' increments (disjoint, sorted ``[t0, t1]``, each ``amount`` spread uniformly
    over its interval; one of no duration counts where its time falls), how much lies at or below
    each ``x``."""
    if len(t0) == 0:
        return np.zeros(len(x))
    order = np.argsort(t1, kind="stable")
    t0, t1, amount = t0[order], t1[order], amount[order]
    before = np.concatenate([[0.0], np.cumsum(amount)])
    done = np.searchsorted(t1, x, side="right")  # increments wholly at or below x
    at = np.clip(done, 0, len(t1) - 1)
    width = (t1[at] - t0[at]).astype(np.float64)
    part = np.where((done < len(t1)) & (width > 0),
                    amount[at] * np.clip((x - t0[at]) / np.where(width > 0, width, 1), 0, 1), 0.0)
    return before[done] + part


def _spread(series: np.ndarray, t0: np.ndarray, t1: np.ndarray, amount: np.ndarray, lo: np.ndarray,
            hi: np.ndarray) -> np.ndarray:
    """Per window piece ``[lo, hi]``, the share of each ``amount`` spread uniformly over its
    ``[t0, t1]`` that falls inside it, summed over the ``series`` (each series' increments are
    disjoint: consecutive points of one counter)."""
    total = np.zeros(len(lo))
    for code in np.unique(series):  # a loop over the counters (processes x activities), not the points
        mine = series == code
        total += _cumulative(t0[mine], t1[mine], amount[mine], hi) - _cumulative(t0[mine], t1[mine], amount[mine], lo)
    return total


def _increments(points: Columns) -> Columns:
    """Per series (process, metric and activity), each point's increase over the one before it
    (a counter that went down started over: its value) and the interval it is spread over."""
    order = np.lexsort((points["b"], *_codes(*(points[k] for k in ("series", "pid", "host", "rank", "service",
                                                                      "run")))[::-1]))
    p = take(points, order)
    key = group_by(*_codes(*(p[k] for k in ("run", "service", "rank", "host", "pid", "series")))).codes
    n = len(key)
    first = np.ones(n, bool)
    first[1:] = key[1:] != key[:-1]
    previous_value = np.concatenate([[0.0], p["value"][:-1]])
    previous_time = np.concatenate([[0], p["b"][:-1]])
    restart = ~first & (p["value"] < previous_value)
    increase = np.where(first | restart, p["value"], p["value"] - previous_value)
    t0 = np.where(first | restart, np.where(p["a"] >= 0, p["a"], p["b"]), previous_time)
    return {**p, "t0": t0.astype(np.int64), "increase": increase, "series_code": key}


def _windows(code: int, run: str | None, steps, jobs: Columns, inits: Columns, asynchronous: bool):
    """The run's windows as pieces: (window of each piece, lo, hi, the iteration of each window
    after the first). Window 0 is the run's (its step windows, or async: the job less
    rl.init.total); window i > 0 is step i's (async: clipped to the run's)."""
    mine = steps.run == code
    iteration, s_lo, s_hi = steps.iteration[mine], steps.start[mine], steps.end[mine]
    n = len(iteration)
    if not asynchronous:
        window = np.concatenate([np.zeros(n, np.int64), np.arange(1, n + 1)])
        return window, np.concatenate([s_lo, s_lo]), np.concatenate([s_hi, s_hi]), iteration
    job = take(jobs, (jobs["run"] == code) & (jobs["bucket"] > 0))
    if len(job["a"]):
        lo, hi = int(job["a"].min()), int(job["b"].max())
    elif n:
        lo, hi = int(s_lo.min()), int(s_hi.max())
    else:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), iteration
    pieces = [(lo, hi)]
    init = take(inits, inits["run"] == run)
    if len(init["a"]):
        a, b = int(init["a"][0]), int(init["b"][0])
        pieces = [(x, y) for x, y in ((lo, min(hi, a)), (max(lo, b), hi)) if y > x]
    run_lo = np.array([p[0] for p in pieces], np.int64)
    run_hi = np.array([p[1] for p in pieces], np.int64)
    # each step against each piece of the run's window: a step and a few pieces, not spans
    step_of = np.repeat(np.arange(n), len(pieces))
    clipped_lo = np.maximum(np.tile(run_lo, n), s_lo[step_of])
    clipped_hi = np.minimum(np.tile(run_hi, n), s_hi[step_of])
    some = clipped_hi > clipped_lo
    window = np.concatenate([np.zeros(len(pieces), np.int64), step_of[some] + 1])
    return (window, np.concatenate([run_lo, clipped_lo[some]]), np.concatenate([run_hi, clipped_hi[some]]),
            iteration)


def _fleet_of(words: np.ndarray, colocated: bool) -> np.ndarray:
    if not colocated:
        return words
    out = words.copy()
    out[(words == TRAINING_FLEET) | (words == GENERATION_FLEET)] = COLOCATED_FLEET
    return out


def _window_rows(window: np.ndarray, lo: np.ndarray, hi: np.ndarray, windows: int, fleets: list[dict],
                 spans: Columns, increments: Columns) -> tuple[dict[str, np.ndarray], list]:
    """Every window's fleet rows (pieces ``window``, ``lo``, ``hi``) as columns of shape (windows,
    fleets), GPU-nanoseconds; and the (fleet, busy, capacity) of each window whose busy metric
    holds more than its GPUs."""
    length = np.bincount(window, weights=(hi - lo).astype(np.float64), minlength=windows)
    shape = (windows, len(fleets))
    out = {"capacity": np.zeros(shape), "levels": np.zeros((*shape, 4)), "unknown": np.zeros(shape),
           "tokens": np.full(shape, np.nan)}
    over = []
    for j, f in enumerate(fleets):
        gpus = f["gpus"]
        capacity = gpus * length
        out["capacity"][:, j] = capacity
        levels = out["levels"][:, j]
        signals = _signals(f["source"])
        if signals:
            mine = take(spans, spans["fleet"] == f["fleet"]) if SPANS in signals else take(
                spans, np.zeros(len(spans["fleet"]), bool))
            union = [np.zeros(windows)]
            for level in range(3):  # productive, then with overhead, then with wasted
                held = mine["level"] <= level
                covered = _covered(mine["a"][held], mine["b"][held], lo, hi)
                union.append(np.bincount(window, weights=covered.astype(np.float64), minlength=windows))
            for level in range(3):
                levels[:, level] = gpus * (union[level + 1] - union[level])
            left = capacity - gpus * union[3]  # the GPU-seconds no span holds
            if BUSY in signals:
                busy = _busy(f["fleet"], window, lo, hi, windows, mine, spans, increments)
                total = gpus * union[3] + busy.sum(axis=1)
                for w in np.flatnonzero(total > capacity * (1 + 1e-12) + 1):
                    over.append((f["fleet"], total[w] / _NS, capacity[w] / _NS))
                for level in range(3):  # in priority order, up to the capacity
                    added = np.minimum(busy[:, level], left)
                    levels[:, level] += added
                    left = left - added
            levels[:, 3] = left
        else:
            out["unknown"][:, j] = capacity
        tokens = take(increments, (increments["fleet"] == f["fleet"]) & (increments["level"] == -1))
        if len(tokens["b"]):
            counted = np.bincount(window, weights=_spread(tokens["series_code"], tokens["t0"], tokens["b"],
                                                          tokens["increase"], lo, hi), minlength=windows)
            out["tokens"][:, j] = np.where(capacity > 0, counted / np.where(capacity > 0, capacity, 1) * _NS, np.nan)
    return out, over


def _busy(word: str, window: np.ndarray, lo: np.ndarray, hi: np.ndarray, windows: int, held: Columns,
          spans: Columns, increments: Columns) -> np.ndarray:
    """Per window and level, the GPU-nanoseconds the fleet's busy metric adds to what its spans
    ``held`` (the row's span signal; none where the row uses the metric alone) say, shape
    (windows, 4).

    A density cannot be united with intervals exactly, so the rule is the conservative one: an
    increment's busy time is taken to be the same work as the spans held in its interval, whatever
    their bucket, as far as it fits (a vLLM engine's generate spans and its busy counter see one
    batch twice); only its excess over their covered time counts, spread uniformly over the
    interval's span-free time (none: left out). Its own bucket comes from its activity; of the
    busy time under the fleet's wasted spans that the row does not hold (retries, failures of a
    metric-only fleet), the productive and overhead move to wasted. The time no span holds is the
    *free clock*: uniform spreading over it is :func:`_spread` of the clock's readings."""
    mine = take(increments, (increments["fleet"] == word) & (increments["level"] >= 0))
    if len(held["a"]):
        _, s, e = coalesced_union(np.zeros(len(held["a"]), np.int64), held["a"], held["b"])
    else:
        s = e = np.zeros(0, np.int64)

    def clock(x: np.ndarray) -> np.ndarray:  # the span-free time up to x (x itself without spans)
        return x - _below(s, e, x)

    t0, t1 = mine["t0"], mine["b"]
    free0, free1 = clock(t0), clock(t1)
    hidden = (t1 - t0) - (free1 - free0)  # the held spans' covered time inside [t0, t1]
    seconds = np.where((free1 > free0) | (t1 == t0), np.maximum(mine["increase"] * _NS - hidden, 0.0), 0.0)
    amount = seconds * np.maximum(mine["gpus"], 0)
    wasted = take(spans, (spans["fleet"] == word) & (spans["level"] == _WASTED))
    in_window, in_lo, in_hi = _intersect(window, lo, hi, wasted["a"], wasted["b"])
    c_lo, c_hi, c_in_lo, c_in_hi = clock(lo), clock(hi), clock(in_lo), clock(in_hi)
    busy = np.zeros((windows, 4))
    moved = np.zeros(windows)
    for level in range(4):
        at = mine["level"] == level
        args = (mine["series_code"][at], free0[at], free1[at], amount[at])
        busy[:, level] = np.bincount(window, weights=_spread(*args, c_lo, c_hi), minlength=windows)
        if level < _WASTED:  # busy under a retried rollout or a failed trajectory: wasted
            under = np.bincount(in_window, weights=_spread(*args, c_in_lo, c_in_hi), minlength=windows)
            busy[:, level] -= under
            moved += under
    busy[:, _WASTED] += moved
    return busy


def _intersect(window: np.ndarray, lo: np.ndarray, hi: np.ndarray, starts: np.ndarray,
               ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pieces of each window piece ``[lo, hi)`` that the union of ``[starts, ends)`` covers:
    (window, lo, hi) of each."""
    if len(starts) == 0 or len(lo) == 0:
        none = np.zeros(0, np.int64)
        return none, none, none
    _, s, e = coalesced_union(np.zeros(len(starts), np.int64), starts, ends)
    first = np.searchsorted(e, lo, side="right")  # the first interval ending after the piece starts
    last = np.searchsorted(s, hi, side="left")  # past the last starting before it ends
    count = np.clip(last - first, 0, None)
    piece = np.repeat(np.arange(len(lo)), count)
    k = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count) + first[piece]
    a, b = np.maximum(s[k], lo[piece]), np.minimum(e[k], hi[piece])
    some = b > a
    return window[piece][some], a[some], b[some]


def _fleet_tables(fleets: list[dict], columns: dict[str, np.ndarray]) -> tuple[pa.Table, list[dict]]:
    """One ``FLEET_COLUMNS`` table of every window's fleets (window-major: window w is rows
    ``w * len(fleets)`` on) and each window's cluster row."""
    windows, n = columns["capacity"].shape
    capacity, levels, unknown = columns["capacity"], columns["levels"], columns["unknown"]
    known = np.array([f["source"] != NO_SIGNAL for f in fleets], bool)
    goodput = np.where((capacity > 0) & known[None, :], levels[:, :, 0] / np.where(capacity > 0, capacity, 1),
                       np.nan)
    table = {"fleet": np.tile(np.array([f["fleet"] for f in fleets], dtype=object), windows),
             "gpus": np.tile(np.array([f["gpus"] for f in fleets], np.int64), windows),
             "processes": np.tile(np.array([f["processes"] for f in fleets], np.int64), windows),
             "source": np.tile(np.array([f["source"] for f in fleets], dtype=object), windows),
             "gpu_seconds": (capacity / _NS).ravel()}
    for level, name in enumerate(LEVELS):
        table[f"{name}_gpu_s"] = (levels[:, :, level] / _NS).ravel()
    table["unknown_gpu_s"] = (unknown / _NS).ravel()
    table["goodput"] = goodput.ravel()
    table["tokens_per_s_per_gpu"] = columns["tokens"].ravel()
    arrays = [pa.array(table[c], _FLEETS_SCHEMA.field(c).type,
                       mask=np.isnan(table[c]) if c in ("goodput", "tokens_per_s_per_gpu") else None)
              for c in FLEET_COLUMNS]
    with_gpus = np.array([f["gpus"] > 0 for f in fleets], bool)
    gpus = int(sum(int(f["gpus"]) for f in fleets if f["gpus"] > 0))  # plain ints: the JSON document's numbers
    processes = int(sum(int(f["processes"]) for f in fleets if f["gpus"] > 0))
    sums = {"gpu_seconds": capacity, **{f"{name}_gpu_s": levels[:, :, i] for i, name in enumerate(LEVELS)},
            "unknown_gpu_s": unknown}
    totals = {k: (v[:, with_gpus].sum(axis=1) / _NS).tolist() for k, v in sums.items()}
    clusters = []
    for w in range(windows):
        row: dict[str, Any] = {"fleet": "cluster", "gpus": gpus, "processes": processes, "source": None}
        row.update({k: totals[k][w] for k in FLEET_COLUMNS[4:10]})
        row["goodput"] = row["productive_gpu_s"] / row["gpu_seconds"] if row["gpu_seconds"] > 0 else None
        row["tokens_per_s_per_gpu"] = None
        clusters.append(row)
    return pa.Table.from_arrays(arrays, schema=_FLEETS_SCHEMA), clusters


_FLEETS_SCHEMA = pa.schema([
    pa.field("fleet", pa.string()), pa.field("gpus", pa.int64()), pa.field("processes", pa.int64()),
    pa.field("source", pa.string()), *(pa.field(c, pa.float64()) for c in FLEET_COLUMNS[4:]),
])


def fleet_goodput(merged: pa.Table, goodput_merged: pa.Table, run_order: Sequence[str | None], steps, *,
                  per_step: bool = False) -> dict[str | None, FleetGoodput]:
    """Each run's :class:`FleetGoodput` from merged fleet partials and goodput's merged partials
    (``steps``: their :class:`~nemo_telemetry.analysis.goodput.rules.Steps`, runs coded by
    ``run_order``); with ``per_step``, each step's rows too."""
    rows = _columns(merged)
    rules_rows, _ = partial_columns(goodput_merged, run_order)
    jobs = take(rules_rows, rules_rows["kind"] == JOB)
    asynchronous_codes = set(rules_rows["run"][(rules_rows["kind"] == ASYNC) & (rules_rows["count"] > 0)].tolist())
    present = set(rules_rows["run"][np.isin(rules_rows["kind"], (STEP, JOB))].tolist())
    procs = take(rows, rows["kind"] == PROC)
    inits = take(rows, rows["kind"] == INIT)
    out: dict[str | None, FleetGoodput] = {}
    for code in sorted(present | {run_order.index(r) for r in set(procs["run"].tolist()) if r in run_order}):
        run = run_order[code] if code >= 0 else None
        mine = take(procs, procs["run"] == run)
        colocated = "true" in {str(v).lower() for v in mine["colocated"].tolist() if v is not None}
        asynchronous = code in asynchronous_codes or "true" in {
            str(v).lower() for v in mine["asynchronous"].tolist() if v is not None}
        spans = take(rows, (rows["kind"] == SPAN) & (rows["run"] == run))
        spans["fleet"] = _fleet_of(spans["fleet"], colocated)
        points = take(rows, (rows["kind"] == POINT) & (rows["run"] == run))
        points["fleet"] = _fleet_of(points["fleet"], colocated)
        increments = _increments(points) if len(points["b"]) else {
            **points, "t0": points["a"], "increase": points["value"], "series_code": points["a"]}
        window, lo, hi, iterations = _windows(code, run, steps, jobs, inits, asynchronous)
        fleets, findings = _fleets_of(mine, colocated, spans, increments, (lo[window == 0], hi[window == 0]))
        columns, over = _window_rows(window, lo, hi, len(iterations) + 1, fleets, spans, increments)
        if not per_step:  # the findings read every window's numbers; the rows are the run's alone
            columns = {k: v[:1] for k, v in columns.items()}
        every, clusters = _fleet_tables(fleets, columns)
        n = len(fleets)
        table, cluster = every.slice(0, n), clusters[0]
        step_rows = [(int(i), every.slice((w + 1) * n, n), clusters[w + 1])
                     for w, i in enumerate(iterations.tolist())] if per_step else []
        for fleet in dict.fromkeys(f for f, _, _ in over):
            worst = max((o for o in over if o[0] == fleet), key=lambda o: o[1] - o[2])
            findings.append(FleetFinding(
                "fleet-overcommitted", "warning", fleet,
                f"fleet {fleet}: its processes' {BUSY_METRIC} add up to {worst[1]:.6g} busy GPU-seconds in a window "
                f"of {worst[2]:.6g} GPU-seconds (its GPUs x the window): the excess is left out, so the buckets sum "
                "to the capacity. A process's nv.dl.gpu.count is too high, or its busy counter counts more than its "
                "wall clock (it must count seconds with at least one unit of work in flight, not per unit)"))
        out[run] = FleetGoodput(table, cluster, tuple(step_rows), tuple(findings), "job" if asynchronous else "steps",
                                per_step)
    return out


def _label(row: dict) -> str:
    return f"{row['service'] or '?'}" + (f":{row['rank']}" if row["rank"] >= 0 else "")


def _signals(source: str) -> tuple[str, ...]:
    """The signals a row's ``source`` names (none for ``none``)."""
    return () if source == NO_SIGNAL else tuple(source.split("+"))


def _source(word: str, spans: Columns, increments: Columns, run_window) -> str:
    """``spans+busy_metric`` where the fleet's productive or overhead spans cover some of the run's
    window and its processes record the busy metric (:func:`_busy` adds what the spans do not hold);
    ``spans`` where only the former; ``busy_metric`` where only the latter (retries and failures
    among its spans then move the busy time under them to wasted); else ``spans`` where it has any
    bucketed span; else ``none``."""
    mine = (spans["fleet"] == word)
    work = mine & (spans["level"] <= 1)
    worked = _covered(spans["a"][work], spans["b"][work], *run_window).sum() > 0
    busy = bool(((increments["fleet"] == word) & (increments["level"] >= 0)).any())
    if worked and busy:
        return f"{SPANS}+{BUSY}"
    if worked:
        return SPANS
    if busy:
        return BUSY
    return SPANS if mine.any() else NO_SIGNAL


def _fleets_of(procs: Columns, colocated: bool, spans: Columns, increments: Columns,
               run_window) -> tuple[list[dict], list]:
    """The run's fleets (sorted: GPU fleets by word, the driver last), their GPUs, processes and
    source (:func:`_source`), and the findings about processes and placement."""
    findings: list[FleetFinding] = []
    words = _fleet_of(procs["fleet"], colocated)
    rows = [{k: procs[k][i] for k in procs} for i in range(len(words))]
    unfleeted = [r for r in rows if r["fleet"] is None and r["count"] > 0]
    if unfleeted:
        names = ", ".join(sorted({_label(r) for r in unfleeted})[:10])
        findings.append(FleetFinding(
            "fleet-unknown", "warning", None,
            f"{len(unfleeted)} process(es) with spans record no rl.fleet ({names}): their GPUs are in no fleet. "
            "Pass fleet= to init_telemetry_worker (traced_worker_init sets it from the role; the driver is 'driver')"))
    fleets: list[dict] = []
    declared = {w for w in words.tolist() if w is not None}
    named = {w for w in (*spans["fleet"].tolist(), *increments["fleet"].tolist()) if w is not None}
    for word in sorted(declared | named, key=lambda w: (w == DRIVER_FLEET, w)):
        members = [r for r, w in zip(rows, words.tolist()) if w == word]
        unknown = [r for r in members if r["gpus"] < 0]
        if not members and word != DRIVER_FLEET:  # work placed on a fleet that no process declares
            findings.append(FleetFinding(
                "fleet-gpus-unknown", "warning", word,
                f"fleet {word}: spans or busy points put work on it, but no process declares rl.fleet={word}: its "
                "GPUs are unknown and count 0 (its workers record nothing, or declare another word). Call "
                f"init_telemetry_worker(fleet='{word}', gpus=...) in them"))
        elif unknown and word != DRIVER_FLEET:
            findings.append(FleetFinding(
                "fleet-gpus-unknown", "warning", word,
                f"fleet {word}: {len(unknown)} of its {len(members)} process(es) record no nv.dl.gpu.count "
                f"({', '.join(sorted({_label(r) for r in unknown})[:10])}): they count 0 GPUs. Pass gpus= to "
                "init_telemetry_worker, or run the worker where CUDA_VISIBLE_DEVICES or ray.get_gpu_ids() says"))
        if colocated and word == COLOCATED_FLEET:  # one set of devices, declared by both sets of processes
            sums = {w: sum(max(r["gpus"], 0) for r, o in zip(rows, procs["fleet"].tolist()) if o == w)
                    for w in (TRAINING_FLEET, GENERATION_FLEET)}
            gpus = max(sums.values())
        else:
            gpus = sum(max(r["gpus"], 0) for r in members)
        source = _source(word, spans, increments, run_window)
        if source == NO_SIGNAL and gpus > 0:
            findings.append(FleetFinding(
                "fleet-no-busy-signal", "warning", word,
                f"fleet {word}: {gpus} GPU(s) and no bucketed span nor {BUSY_METRIC} point: its GPU-seconds are "
                "unknown, not idle. Coverage gap: work with no span (async generate_async, engines other than vLLM) "
                f"needs the busy metric; record {BUSY_METRIC} in its workers, or open bucketed spans there"))
        fleets.append({"fleet": word, "gpus": gpus, "processes": len(members), "source": source})
        expected = _expected_world(word, procs, colocated)
        if expected is not None and gpus != expected[1]:
            findings.append(FleetFinding(
                "fleet-topology-mismatch", "warning", word,
                f"fleet {word}: its processes record {gpus} GPU(s), the run config's {expected[0]} says "
                f"{expected[1]}: a process is missing from the data, or records the wrong nv.dl.gpu.count"))
    return fleets, findings


def _expected_world(word: str, procs: Columns, colocated: bool) -> tuple[str, int] | None:
    key = {TRAINING_FLEET: "topology_world", COLOCATED_FLEET: "topology_world",
           GENERATION_FLEET: "generation_world"}.get(word)
    if key is None or (colocated and word == GENERATION_FLEET):
        return None
    values = procs[key][procs[key] >= 0]
    if not len(values):
        return None
    name = "nv.dl.topology.size.world" if key == "topology_world" else "rl.generation.topology.size.world"
    return name, int(values.max())


def _clean(value: Any) -> Any:
    return None if isinstance(value, float) and value != value else value


def fleet_document(fleets: FleetGoodput) -> dict[str, Any]:
    """The run's ``fleets``, ``cluster``, ``fleet_window``, ``fleet_findings`` (and per step,
    ``fleet_steps``) keys of the goodput JSON document (docs/goodput.md, "Fleets")."""
    out: dict[str, Any] = {
        "fleets": [{k: _clean(v) for k, v in row.items()} for row in fleets.fleets.to_pylist()],
        "cluster": {k: _clean(v) for k, v in fleets.cluster.items()},
        "fleet_window": fleets.windowing,
        "fleet_findings": [vars(f) for f in fleets.findings],
    }
    if fleets.per_step:
        out["fleet_steps"] = [{"iteration": i, "fleets": [{k: _clean(v) for k, v in r.items()} for r in t.to_pylist()],
                               "cluster": {k: _clean(v) for k, v in c.items()}} for i, t, c in fleets.steps]
    return out


def attach_fleets(runs: tuple, fleet_merged: pa.Table, goodput_merged: pa.Table,
                  run_order: Sequence[str | None], *, by: str = "fleet") -> tuple:
    """``runs`` (goodput's) with their ``fleets``: the finish of merged fleet partials over the
    windows of goodput's merged partials (per step too where ``by`` is ``"fleet,step"``)."""
    from dataclasses import replace

    from nemo_telemetry.analysis.goodput.rules import merged_steps

    steps = merged_steps(goodput_merged, run_order).steps
    done = fleet_goodput(fleet_merged, goodput_merged, run_order, steps, per_step=by == "fleet,step")
    return tuple(replace(run, fleets=done.get(run.run_id)) for run in runs)
