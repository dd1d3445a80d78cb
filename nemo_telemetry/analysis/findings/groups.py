"""``missing-group-spans``: span groups a run's processes enabled and none of its spans was opened in.

A span's group is the one it records (``rl.span_group``, which every gated site of the instrument
sets); only a span that records none (an older dump, another instrumenter) is placed by its name,
against the catalogue's span-name patterns. So a TRL ``rl.trl.generate`` opened with
``managed_span(G.GENERATION, ...)`` is generation, whatever its name.

A group is *expected* in a run only when the run contains code of a namespace that registers it:
a namespace is present in a run when a process of the run resolved its span groups in it (the
``nemo.telemetry.namespace`` resource attribute: a NeMo-RL driver and its workers in ``nemo_rl``,
a Gym server in ``nemo_gym``), or when a span of the run belongs to one of the groups only that
namespace registers (``nemo_gym``'s ``server``, ``verify``...; ``nemo_rl``'s ``step``,
``generation``...: what shows the namespace where processes do not say it, an older dump or another
instrumenter). ``span_groups: all`` enables every registered group, Gym's too, in a trainer without
Gym; those groups are not expected there. A group two namespaces share (``job``, ``rollout``) shows
neither namespace's presence.

The partial (:func:`group_presence`, a :class:`GroupPresence`) holds, per run, the processes
(service, rank) and the groups each had enabled, the groups spans recorded, and the names of the
spans that record none; merging is the union of each. Where seed 000 lists a known coverage gap
for the group, or the run's algorithm never opens it, the finding is ``info``; otherwise
``warning``. The finding names the processes that had the group enabled.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.findings.report import Finding
from nemo_telemetry.analysis.goodput.steps import JOB_SPAN_REGEX, STEP_SPAN_REGEX
from nemo_telemetry.analysis.decode import SPAN_GROUPS_ATTRIBUTE as SPAN_GROUPS, SpanArrays
from nemo_telemetry.analysis.model.columns import distinct_codes, filled, int_column, pairs_present
from nemo_telemetry.analysis.model.resources import resource_values
from nemo_telemetry.analysis.model.schema import SPAN_GROUP
from nemo_telemetry.instrument import REGISTRY, span_name_regex

__all__ = ["SPAN_GROUPS_ATTRIBUTE", "GroupPresence", "group_presence", "missing_group_findings"]

SPAN_GROUPS_ATTRIBUTE = SPAN_GROUPS  # the resource attribute every process carries
_SHOWN_PROCESSES = 3  # processes a finding names before "(and N more)"

# Known coverage gaps (seed 000, "Coverage gaps"): an enabled group that is legitimately empty.
_KNOWN_GAPS = {
    "generation": "only vLLM's synchronous generate path emits rl.vllm.generate; async runs (generate_async) "
                  "and SGLang / TRT-LLM / Megatron generation workers have no generation span",
    "per_prompt": "per-prompt spans exist only on the single-controller path (rl.sc.generate_and_push and its "
                  "rl.data_plane.put) and the Gym HTTP hop; the token-capture dispatch opens none",
    "efficiency": "efficiency spans are emitted only by async GRPO and the single controller's rollout pump",
    "data_plane": "data-plane spans come only from a transfer-queue client (single-controller actor, "
                  "TQPolicy / TQValue workers)",
    "model_init": "only vLLM, policy and value workers open rl.*.load_model; other backends are uninstrumented",
    "rollout": "rollout spans come from the driver's sync rollout or the async collector; SyncRolloutActor and "
               "grpo_sync.py emit none",
    "setup": "only some launchers open rl.startup; the others leave rl.setup.ray_init as a lone root, or nothing",
    "server": "a Gym server adopts traceparent only once its app calls instrument_fastapi",
    "http_client": "the aiohttp hop is instrumented by the NemoGym actor only, and gated on per_prompt",
    "checkpoint": "no checkpoint may have been due in the traced range (save_period, or checkpointing off)",
    "evaluate": "no validation may have been due in the traced range (val_period, val_at_start)",
}
# Groups an algorithm's loop never opens (seed 000, "Per-algorithm span names").
_ALGORITHM_GROUPS = {
    "sft": {"job", "step", "data_processing", "policy_update", "checkpoint", "evaluate", "setup", "model_init"},
    "dpo": {"job", "step", "policy_update", "checkpoint", "evaluate", "setup", "model_init"},
    "rm": {"job", "step", "checkpoint", "evaluate", "setup", "model_init"},
}


@dataclass(frozen=True)
class GroupPresence:
    """``missing-group-spans``' partial over some rows (ids, not codes: partials of any batches merge)."""

    processes: frozenset = frozenset()  # (run id, enabled spec, service name, rank, namespace) of each process
    groups: frozenset = frozenset()  # (run id, group) a span recorded
    names: frozenset = frozenset()  # (run id, span name) of every span
    unrecorded: frozenset = frozenset()  # (run id, span name) of the spans that record no group

    @staticmethod
    def union(parts: Iterable["GroupPresence"]) -> "GroupPresence":
        """The merge: each field's union."""
        parts = list(parts)
        return GroupPresence(*(frozenset().union(*(getattr(p, f) for p in parts))
                               for f in ("processes", "groups", "names", "unrecorded")))


def group_presence(a: SpanArrays, keep: np.ndarray) -> GroupPresence:
    """The :class:`GroupPresence` of the ``keep`` rows (a run filter). The spans of processes that
    recorded no enabled groups count too: they show which groups, and namespaces, are present.

    Read a record batch at a time, on each batch's own dictionary codes (never mapped onto the
    table's): the partial is sets of values, so no code needs to mean the same in two batches. A
    process's spans are stored together (a file per run and rank), so a batch usually holds one
    process, which one pass over each column's indices tells (:func:`_processes`)."""
    processes, groups, unrecorded = set(), set(), set()
    table = a.table.select([c for c in _GROUP_COLUMNS if c in a.table.column_names])
    batches = table.to_batches() if table.num_columns else [None]
    at = 0
    for batch in batches:
        n = len(a) if batch is None else batch.num_rows
        rows = slice(at, at + n)
        at += n
        kept, run = keep[rows], a.run[rows]
        if n == 0 or not kept.any():
            continue
        every = bool(kept.all())
        one_run = _constant(run)
        processes |= _processes(a, batch, kept, run, every and one_run)
        recorded, recorded_values, nulls = _batch_codes(batch, SPAN_GROUP, n)
        groups |= {(_run_id(a, r), recorded_values[g]) for r, g in _pairs(run, recorded, kept, every and one_run,
                                                                          len(recorded_values))}
        if nulls:
            plain = kept & (recorded < 0)
            unrecorded |= {(_run_id(a, r), a.names[n]) for r, n in _pairs(run, a.name[rows], plain, False,
                                                                           len(a.names))}
    names = {(_run_id(a, r), a.names[n]) for r, n in a.run_names(keep)}
    return GroupPresence(frozenset(processes), frozenset(groups), frozenset(names), frozenset(unrecorded))


# What group_presence reads of a SpanArrays' table (those of them it holds).
_GROUP_COLUMNS = (SPAN_GROUP, "span_groups", "resource_attributes", "service_name", "rank", "span_groups_namespace")


def _run_id(a: SpanArrays, code: int) -> str | None:
    return a.runs[code] if code >= 0 else None


def _dictionary(batch: pa.RecordBatch | None, column: str) -> pa.DictionaryArray | None:
    if batch is None or column not in batch.schema.names:
        return None
    chunk = batch.column(column)
    return chunk if pa.types.is_dictionary(chunk.type) else pc.dictionary_encode(chunk)


def _batch_codes(batch: pa.RecordBatch | None, column: str, n: int) -> tuple[np.ndarray, list, bool]:
    """(int32 codes into the values, -1 for null, the values, whether any row is null) of a string
    or dictionary column of one batch: its own dictionary's indices (a dictionary entry that is
    null counts as a null row)."""
    chunk = _dictionary(batch, column)
    if chunk is None:
        return np.full(n, -1, dtype=np.int32), [], n > 0
    values = chunk.dictionary.to_pylist()
    codes = filled(chunk.indices, -1).astype(np.int32, copy=False)
    if None in values:
        local = np.array([i if v is not None else -1 for i, v in enumerate(values)] + [-1], dtype=np.int32)
        codes = local[codes]
        return codes, values, bool((codes < 0).any())
    return codes, values, chunk.null_count > 0


def _one_value(batch: pa.RecordBatch | None, column: str) -> tuple[bool, object]:
    """(True, the value) where every row of the batch holds one value of the column (None: null, or
    no such column), told from its null count and its indices' least and greatest (a file's
    dictionary may list values none of its rows holds); (False, None) where it holds more."""
    chunk = _dictionary(batch, column)
    if chunk is None or chunk.null_count == len(chunk):
        return True, None
    if chunk.null_count:
        return False, None
    if len(chunk.dictionary) == 1:
        return True, chunk.dictionary[0].as_py()
    low, high = (v.as_py() for v in pc.min_max(chunk.indices).values())
    return (True, chunk.dictionary[low].as_py()) if low == high else (False, None)


def _constant(values: np.ndarray) -> bool:
    """Whether every entry is the first."""
    return values.size == 0 or int(values.min()) == int(values.max())


def _pairs(first: np.ndarray, second: np.ndarray, keep: np.ndarray, one: bool, second_size: int) -> list:
    """The distinct (first, second) code pairs (-1 on either side left out) of the ``keep`` rows;
    ``one``: every row is kept and ``first`` holds one value, so the distinct second codes tell."""
    if one:
        return [(int(first[0]), code) for code in distinct_codes(second, second_size)] if first[0] >= 0 else []
    return pairs_present(first[keep], second[keep], second_size)


def _spec_codes(block: pa.RecordBatch | None, n: int) -> tuple[np.ndarray, list]:
    """Each row's enabled-groups spec as a code into the distinct specs (-1: none): from the
    ``span_groups`` column, else (files written before it) the resource map."""
    codes, values, _ = _batch_codes(block, "span_groups", n)
    if block is not None and "resource_attributes" in block.schema.names:
        missing = np.flatnonzero(codes < 0)
        if len(missing):
            mapped, mapped_values = resource_values(pa.Table.from_batches([block]), SPAN_GROUPS_ATTRIBUTE, missing)
            codes = codes.copy()
            codes[missing] = np.where(mapped >= 0, mapped + len(values), -1)
            values = [*values, *mapped_values]
    return codes, values


def _one_process(a: SpanArrays, block: pa.RecordBatch | None, run: int) -> tuple | None | bool:
    """The one (run id, spec, service, rank, namespace) of a batch whose columns each hold one value
    (None: no enabled groups); False where they hold more."""
    found = [_one_value(block, c) for c in ("span_groups", "service_name", "span_groups_namespace")]
    if not all(one for one, _ in found):
        return False
    (_, spec), (_, service), (_, namespace) = found
    if spec is None and block is not None and "resource_attributes" in block.schema.names:
        return False  # a file written before the column: its spec is in the resource map
    rank: int | None = None
    if block is not None and "rank" in block.schema.names:
        chunk = block.column("rank")
        if not pa.types.is_integer(chunk.type) or 0 < chunk.null_count < len(chunk):
            return False
        if chunk.null_count == 0:
            low, high = (v.as_py() for v in pc.min_max(chunk).values())
            if low != high:
                return False
            rank = int(low)
    if spec is None:
        return None
    return (_run_id(a, run), spec, service, rank, namespace)


def _processes(a: SpanArrays, block: pa.RecordBatch | None, keep: np.ndarray, run: np.ndarray,
               one_run: bool) -> set[tuple]:
    """(run id, spec, service, rank, namespace) of the processes of a batch's ``keep`` rows that
    enabled groups (``run``: the batch's run codes; ``one_run``: every row kept, of one run).

    A process's spans are stored together (a file per run and rank; an export batch per process
    in a dump): where each column of the batch holds one value, that is its one process; else
    only the rows where one of them changes are read out of the columns."""
    if one_run:
        one = _one_process(a, block, int(run[0]))
        if one is not False:
            return set() if one is None else {one}
    n = len(run)
    spec, specs = _spec_codes(block, n)
    rows = np.flatnonzero(keep & (spec >= 0))
    if not len(rows):
        return set()
    service, services, _ = _batch_codes(block, "service_name", n)
    namespace, namespaces, _ = _batch_codes(block, "span_groups_namespace", n)
    if block is not None and "rank" in block.schema.names:
        rank, has_rank = int_column(pa.Table.from_batches([block.select(["rank"])]), "rank")
    else:
        rank, has_rank = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
    keys = tuple(k[rows] for k in (run, spec, service, rank, has_rank, namespace))
    change = np.ones(len(rows), dtype=bool)
    change[1:] = np.logical_or.reduce([k[1:] != k[:-1] for k in keys])
    at = rows[change]
    return {(_run_id(a, int(r)), specs[s], services[v] if v >= 0 else None, int(k) if valid else None,
             namespaces[m] if m >= 0 else None)
            for r, s, v, k, valid, m in zip(run[at].tolist(), spec[at].tolist(), service[at].tolist(),
                                            rank[at].tolist(), has_rank[at].tolist(), namespace[at].tolist())}


def _parse(spec: str) -> set[str]:
    return {g.strip().lower() for g in spec.split(",") if g.strip()}


def _process_name(service: str | None, rank: int | None) -> str:
    return f"{service or '(no service.name)'} rank {'?' if rank is None else rank}"


def missing_group_findings(presence: GroupPresence, limit: int) -> tuple[dict[str, int], list[Finding]]:
    """``missing-group-spans`` from the merged presence: how many (run, group) pairs at each
    severity, and the first ``limit`` findings."""
    counts: dict[str, int] = {}
    if not presence.processes:
        return counts, []
    catalogue = {info.name: info for info in REGISTRY.catalogue()}
    regexes = {g: re.compile("|".join(span_name_regex(p) for p in info.spans)) for g, info in catalogue.items()
               if info.spans}
    out = []
    runs = sorted({p[0] for p in presence.processes}, key=lambda r: (r is not None, r or ""))
    for run in runs:
        enabled_by: dict[str, list[str]] = {}
        processes = [p for p in presence.processes if p[0] == run]
        for _, spec, service, rank, _ in sorted(processes, key=lambda p: (p[2] or "", -1 if p[3] is None else p[3],
                                                                          p[1], p[4] or "")):
            for group_name in _parse(spec):
                named = enabled_by.setdefault(group_name, [])
                if _process_name(service, rank) not in named:
                    named.append(_process_name(service, rank))
        unrecorded = [n for r, n in presence.unrecorded if r == run and n is not None]
        present = {g for r, g in presence.groups if r == run} | {
            g for g, rx in regexes.items() if any(rx.match(n) for n in unrecorded)}
        namespaces = {catalogue[g].namespaces[0] for g in present if g in catalogue
                      and len(catalogue[g].namespaces) == 1} | {p[4] for p in processes if p[4]}
        expected = {g for g in enabled_by.keys() & catalogue.keys() if namespaces & set(catalogue[g].namespaces)}
        names = [n for r, n in presence.names if r == run and n]
        algorithms = {n.split(".")[1] for n in names if re.match(f"{STEP_SPAN_REGEX}|{JOB_SPAN_REGEX}", n)}
        for group_name in sorted(expected - present):
            severity, note = _note(group_name, algorithms)
            counts[severity] = counts.get(severity, 0) + 1
            if len(out) >= limit:
                continue
            out.append(Finding(
                code="missing-group-spans", severity=severity,
                message=_message(group_name, enabled_by[group_name], catalogue[group_name].spans, note),
                trace_id=None, span_ids=(), iteration=None, run_id=run))
    return counts, out


def _note(group_name: str, algorithms: set[str]) -> tuple[str, str]:
    never = sorted(alg for alg in algorithms if alg in _ALGORITHM_GROUPS and group_name not in _ALGORITHM_GROUPS[alg])
    if never:
        return "info", f"rl.{never[0]} runs never open {group_name} spans (per-algorithm span names)"
    if group_name in _KNOWN_GAPS:
        return "info", f"known coverage gap: {_KNOWN_GAPS[group_name]}"
    return "warning", ("check that the code path that opens them ran in those processes and that they flushed "
                       "telemetry before exit")


def _message(group_name: str, processes: list[str], patterns: tuple[str, ...], note: str) -> str:
    shown = ", ".join(processes[:_SHOWN_PROCESSES])
    more = f" (and {len(processes) - _SHOWN_PROCESSES} more)" if len(processes) > _SHOWN_PROCESSES else ""
    return (f"group {group_name!r} was enabled in {shown}{more}, but no span of the run was opened in it "
            f"(its spans: {', '.join(patterns)}); {note}")
