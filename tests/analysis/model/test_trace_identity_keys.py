"""A span's identity is its whole 128-bit trace id and 64-bit span id: every key join matches two
spans only when both are equal. Random ids, ids that share either half of the trace id, and pairs
built to collide (the mixed join key is invertible, and so is the trace key for a given low half)
are joined by every lookup the engines use and compared with a plain Python dict on the ids."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from nemo_telemetry.analysis import parent_indices, spans_table
from nemo_telemetry.analysis.decode import span_arrays
from nemo_telemetry.analysis.decode.reference import reference_arrays
from nemo_telemetry.analysis.model import keys as keys_module
from nemo_telemetry.analysis.model.keys import index_orphans, index_parents, key_index, local_parent_rows
from nemo_telemetry.analysis.model.tree import (
    TRACE_LOW, key_column, mixed_key, trace_hex, trace_key_of, trace_keys, unmixed_key, with_id_keys,
)
from nemo_telemetry.analysis.model.walk import KeyIndex, KeyScan, walk_rows

MASK = (1 << 64) - 1


def _fmix(value: int) -> int:
    """MurmurHash3's 64-bit finalizer, written out: what trace_key_of mixes the low half with."""
    value ^= value >> 33
    value = (value * 0xFF51AFD7ED558CCD) & MASK
    value ^= value >> 33
    value = (value * 0xC4CEB9FE1A85EC53) & MASK
    return value ^ (value >> 33)


def _hex(trace: tuple[int, int]) -> str:
    return f"{trace[0]:016x}{trace[1]:016x}"


def _same_trace_key(trace: tuple[int, int], low: int) -> tuple[int, int]:
    """Another trace id, of low half ``low``, whose trace_key is ``trace``'s."""
    key = trace[0] ^ _fmix(trace[1])
    return key ^ _fmix(low), low


def _same_mixed_key(trace: tuple[int, int], span: int, other: tuple[int, int]) -> int:
    """The span id that gives, in trace ``other``, the mixed join key of ``span`` in ``trace``."""
    keys = trace_keys(pa.array([_hex(trace), _hex(other)]))[0]
    mixed = mixed_key(keys[:1], np.array([span], np.uint64))
    return int(unmixed_key(keys[1:], mixed)[0])


def _records(rng: np.random.Generator, n: int) -> list[dict]:
    """Spans in a few traces: random ids, ids sharing the high half (64-bit ids padded) or the low
    half, span ids repeated across traces, made-up parents, and crafted pairs: a decoy with the
    mixed key (or the trace key and span id) of a real parent, in another trace, stored before it."""
    base = [(0, 1), (0, 7), (int(rng.integers(1, 2**63)), 1), (0xAB, 0xCD), (0xCD, 0xAB)]
    traces = base + [(int(rng.integers(0, 2**63)), int(rng.integers(1, 2**63))) for _ in range(3)]
    records: list[dict] = []
    for i in range(n):
        trace = traces[int(rng.integers(len(traces)))]
        span = int(rng.integers(1, 4)) if rng.random() < 0.5 else int(rng.integers(1, 2**63))
        records.append({"trace_id": _hex(trace), "span_id": f"{span:016x}", "parent_span_id": None,
                        "name": f"s{i}", "start_ns": i, "end_ns": i + 1})
    for record in records:
        pick = rng.random()
        if pick < 0.6 and records:
            other = records[int(rng.integers(len(records)))]
            record["parent_span_id"] = other["span_id"]  # of its trace or, often, of another one
        elif pick < 0.7:
            record["parent_span_id"] = f"{int(rng.integers(1, 2**63)):016x}"
    crafted = []
    for _ in range(max(1, n // 20)):
        trace = traces[int(rng.integers(len(traces)))]
        other = traces[int(rng.integers(len(traces)))]
        if other == trace:
            other = _same_trace_key(trace, (trace[1] + 1) & MASK or 1)
        parent = int(rng.integers(1, 2**63))
        # decoys stored first: the lowest row holding a mixed key is one of them
        decoys = [(other, _same_mixed_key(trace, parent, other)),
                  (_same_trace_key(trace, (trace[1] ^ 0x5A5A) or 3), parent)]
        for decoy_trace, decoy_span in decoys:
            crafted.append({"trace_id": _hex(decoy_trace), "span_id": f"{decoy_span:016x}", "parent_span_id": None,
                            "name": "decoy", "start_ns": 0, "end_ns": 1})
        real = rng.random() < 0.5  # half the time the parent exists; else the decoys are all there is
        if real:
            crafted.append({"trace_id": _hex(trace), "span_id": f"{parent:016x}", "parent_span_id": None,
                            "name": "parent", "start_ns": 0, "end_ns": 1})
        crafted.append({"trace_id": _hex(trace), "span_id": f"{int(rng.integers(1, 2**63)):016x}",
                        "parent_span_id": f"{parent:016x}", "name": "child", "start_ns": 0, "end_ns": 1})
    out = crafted + records
    order = rng.permutation(len(out)) if rng.random() < 0.5 else np.arange(len(out))
    return [out[i] for i in order]


def _by_hand(records: list[dict]) -> tuple[list[int], list[bool]]:
    """Each span's parent row (the lowest other row of the same trace id and span id) and
    whether it is an orphan (no row holds its parent, not even itself), from the hex ids."""
    holders: dict[tuple[str, str], list[int]] = {}
    for i, r in enumerate(records):
        holders.setdefault((r["trace_id"], r["span_id"]), []).append(i)
    parents, orphans = [], []
    for i, r in enumerate(records):
        if r["parent_span_id"] is None:
            parents.append(-1)
            orphans.append(False)
            continue
        held = holders.get((r["trace_id"], r["parent_span_id"]), [])
        others = [j for j in held if j != i]
        parents.append(min(others) if others else -1)
        orphans.append(not held)
    return parents, orphans


def _same_spans(records: list[dict], found, expected: list[int]) -> None:
    """``found`` names, for each span, another row of its expected parent's identity (or none)."""
    for i, (got, want) in enumerate(zip(np.asarray(found).tolist(), expected)):
        assert (got >= 0) == (want >= 0), i
        if got >= 0:
            assert got != i and (records[got]["trace_id"], records[got]["span_id"]) == (
                records[want]["trace_id"], records[want]["span_id"]), i


def test_trace_key_and_low_half_are_the_trace_id_and_both_halves_change_the_key():
    rng = np.random.default_rng(5)
    high = rng.integers(0, 2**63, 10_000, dtype=np.int64).astype(np.uint64)
    low = rng.integers(0, 2**63, 10_000, dtype=np.int64).astype(np.uint64)
    high[:5000] = 0  # 64-bit ids padded to 128 bits
    low[5000:7000] = 1  # ids sharing their low half
    ids = pa.array([_hex((int(h), int(lo))) for h, lo in zip(high, low)])
    key, got_low = trace_keys(ids)
    assert got_low.tolist() == low.tolist()
    assert np.array_equal(key, trace_key_of(high, low))
    assert [int(k) for k in key[:50]] == [int(h) ^ _fmix(int(lo)) for h, lo in zip(high[:50], low[:50])]
    distinct = {(int(h), int(lo)) for h, lo in zip(high, low)}
    assert len(set(zip(key.tolist(), got_low.tolist()))) == len(distinct)  # (key, low) is the id
    assert len(set(key.tolist())) == len(distinct)  # and no two of these ids share a key
    assert trace_hex(key, got_low) == ids.to_pylist()  # what a message quotes where only the keys were read
    # shorter ids are the low half (W3C and OTLP pad 64-bit ids on the left); malformed ones are none
    short, _ = trace_keys(pa.array(["1", "0" * 31 + "1", "xyz", None]))
    assert short[0] == short[1] != 0 and short[2] == short[3] == 0


@pytest.mark.parametrize("seed", range(6))
def test_every_join_matches_only_equal_trace_ids_and_span_ids(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    monkeypatch.setattr(keys_module, "LOOKUP_ROWS", int(rng.choice([3, 1 << 20])))
    records = _records(rng, int(rng.choice([40, 400, 3000])))
    expected_parent, expected_orphan = _by_hand(records)
    table = with_id_keys(spans_table(records))
    for found in (parent_indices(table), parent_indices(table.drop_columns(["trace_key", TRACE_LOW]))):
        _same_spans(records, found, expected_parent)  # the sort-merge join picks any copy of a repeated id
    index = key_index(table)
    assert index_orphans(index, index_parents(index))["orphan"].tolist() == expected_orphan
    for arrays in (span_arrays(table), reference_arrays(table)):
        assert arrays.parents.tolist() == expected_parent
        assert arrays.orphan.tolist() == expected_orphan
    keys = [key_column(table, c) for c in ("span_key", "trace_key", "parent_key", TRACE_LOW)]
    local = local_parent_rows(*keys)
    assert np.where(local >= 0, local, -1).tolist() == expected_parent
    named = np.array([r["parent_span_id"] is not None for r in records])
    assert ((local == keys_module.PARENT_ELSEWHERE) == (named & (np.array(expected_parent) < 0))).all()
    rows = np.arange(table.num_rows)
    assert KeyScan(table).parent_of(rows).tolist() == expected_parent
    assert KeyScan(table.drop_columns(["parent_span_id"])).parent_of(rows).tolist() == [
        p if records[i]["parent_span_id"] is not None else -1 for i, p in enumerate(expected_parent)]
    index = KeyIndex.of(keys[1], keys[0], rows, keys[3])
    found = index.lookup(keys[1], keys[2], low=keys[3])
    holders = {(r["trace_id"], r["span_id"]) for r in records}
    assert (found[named] >= 0).tolist() == [(r["trace_id"], r["parent_span_id"]) in holders
                                           for r in records if r["parent_span_id"] is not None]
    hit = np.flatnonzero(named & (found >= 0))
    assert all(records[int(found[i])]["trace_id"] == records[i]["trace_id"] and
               records[int(found[i])]["span_id"] == records[i]["parent_span_id"] for i in hit)


def test_a_walk_takes_its_iteration_from_its_own_traces_parent_not_from_a_colliding_one():
    """Two step spans of span id 1, stamped 1 and 2, in traces that share their high half; a
    child in the second trace, and a decoy with the child's parent's mixed key stored first:
    every walk gives the child iteration 2."""
    first, second = (0, 1), (0, 7)
    decoy = _same_mixed_key(second, 1, (0, 3))
    records = [
        {"trace_id": _hex((0, 3)), "span_id": f"{decoy:016x}", "name": "decoy", "start_ns": 0, "end_ns": 1,
         "iteration": 9},
        {"trace_id": _hex(first), "span_id": f"{1:016x}", "name": "rl.grpo.step", "start_ns": 0, "end_ns": 10,
         "iteration": 1},
        {"trace_id": _hex(second), "span_id": f"{1:016x}", "name": "rl.grpo.step", "start_ns": 20, "end_ns": 30,
         "iteration": 2},
        {"trace_id": _hex(second), "span_id": f"{2:016x}", "parent_span_id": f"{1:016x}", "name": "work",
         "start_ns": 21, "end_ns": 29, "bucket": "productive"},
    ]
    table = with_id_keys(spans_table(records))
    iteration, found = walk_rows(table, np.array([3]))
    assert found.tolist() == [True] and iteration.tolist() == [2]
    assert span_arrays(table).walk_up(np.array([3]))[0].tolist() == [2]
    assert reference_arrays(table).walk_up(np.array([3]))[0].tolist() == [2]


@pytest.mark.parametrize("shared_low_bits", [False, True])
def test_the_key_scan_finds_every_parent_whatever_low_bits_the_span_ids_share(shared_low_bits):
    """The scan's first test looks at the span ids' low bits only: ids that all share them (every
    one passes it) are found exactly as ids that differ there."""
    from nemo_telemetry.analysis.model.keys import LowBitsFilter

    rng = np.random.default_rng(3)
    ids = rng.choice(np.arange(1, 1 << 20, dtype=np.int64), 5_000, replace=False)
    if shared_low_bits:
        ids = (ids << 40) | 0x5A5A5  # the low 40 bits alike
    records = [{"trace_id": "ab" * 16, "span_id": f"{int(s):016x}", "name": f"s{i}", "start_ns": i, "end_ns": i + 1,
                "parent_span_id": f"{int(ids[i - 1 - i % 7]):016x}" if i >= 7 else None}
               for i, s in enumerate(ids)]
    records.append({"trace_id": "ab" * 16, "span_id": f"{(1 << 62) | 0x5A5A5:016x}", "name": "lost",
                    "start_ns": 0, "end_ns": 1, "parent_span_id": f"{(3 << 61) | 0x5A5A5:016x}"})  # no such span
    table = with_id_keys(spans_table(records))
    expected, _ = _by_hand(records)
    assert KeyScan(table).parent_of(np.arange(table.num_rows)).tolist() == expected
    members = np.unique(ids.astype(np.uint64))
    first = LowBitsFilter(members)
    others = rng.integers(1, 2**63, 100_000, dtype=np.int64).astype(np.uint64)
    block = np.concatenate([members, others])
    passing = first.passing(block, low=np.empty(len(block), np.uint64), flags=np.empty(len(block), bool))
    assert set(range(len(members))) <= set(passing.tolist())  # every member passes
    if not shared_low_bits:
        assert len(passing) - len(members) < 0.05 * len(others)  # and few of the others
