"""The sort-based parent joins goodput and check rely on, against a dictionary built by hand.

Random small tables with repeated span ids (in one trace and across traces), parents in the
other trace, parents missing, and self-parents. Where a parent's id is held by several rows,
every join picks the lowest other row.
"""

from __future__ import annotations

import numpy as np
import pytest

from nemo_telemetry.analysis import parent_indices, spans_table
from nemo_telemetry.analysis.decode import span_arrays


def random_records(rng: np.random.Generator, narrow_ids: bool) -> list[dict]:
    n = int(rng.integers(1, 60))
    ids = [f"{int(x):016x}" for x in rng.integers(1, 6 if narrow_ids else 2**62, n)]
    records = []
    for i in range(n):
        roll = rng.random()
        parent = (ids[int(rng.integers(0, n))] if roll < 0.7
                  else f"{int(rng.integers(1, 2**62)):016x}" if roll < 0.85 else None)
        records.append({"trace_id": ("a" if rng.random() < 0.5 else "b") * 32, "span_id": ids[i],
                        "parent_span_id": parent, "name": "x", "start_ns": 0, "end_ns": 1})
    return records


@pytest.mark.parametrize("narrow_ids", [False, True], ids=["distinct ids", "repeated ids"])
def test_orphans_parents_and_lookups_match_a_hand_built_index(narrow_ids):
    rng = np.random.default_rng(11 if narrow_ids else 12)
    for _ in range(80):
        records = random_records(rng, narrow_ids)
        arrays = span_arrays(spans_table(records))
        rows_of = {}
        for row, r in enumerate(records):
            rows_of.setdefault((r["trace_id"], r["span_id"]), []).append(row)

        def candidates(row: int) -> list[int]:
            r = records[row]
            if r["parent_span_id"] is None:
                return []
            return [p for p in rows_of.get((r["trace_id"], r["parent_span_id"]), []) if p != row]

        expected_orphan = [r["parent_span_id"] is not None and (r["trace_id"], r["parent_span_id"]) not in rows_of
                           for r in records]
        assert arrays.orphan.tolist() == expected_orphan
        rows = np.arange(len(records))
        for got in (arrays.parent_of(rows), parent_indices(spans_table(records))):
            for row, parent in enumerate(got):  # among copies of the parent's id: the lowest other row
                options = candidates(row)
                assert parent == (min(options) if options else -1), (row, parent, options)


def test_key_index_across_chunks_and_blocks_finds_every_parent_and_orphan():
    """The index is built a block of rows at a time from the Arrow chunks as read: a table of
    several uneven chunks, longer than a few blocks, with parents anywhere in it."""
    import pyarrow as pa

    from nemo_telemetry.analysis.model.keys import BLOCK_ROWS, key_index, sort_index

    rng = np.random.default_rng(5)
    n = 2 * BLOCK_ROWS + 12_345
    traces = rng.integers(1, 2**63, 3, dtype=np.int64).astype(np.uint64)
    trace = traces[rng.integers(0, 3, n)]
    span = rng.integers(1, 2**63, n, dtype=np.int64).astype(np.uint64)
    parent_row = rng.integers(0, n, n)
    parent = span[parent_row]
    trace[rng.random(n) < 0.001] = traces[0]  # some children move to another trace: their parent may be missing
    parent[rng.random(n) < 0.001] = rng.integers(1, 2**63, dtype=np.int64)  # parents that exist nowhere
    parent[rng.random(n) < 0.05] = 0  # roots
    cuts = [0, 1_000, 70_000, 70_001, n]
    table = pa.Table.from_batches([pa.record_batch({"trace_key": pa.array(trace[a:b]), "span_key": pa.array(span[a:b]),
                                                    "parent_key": pa.array(parent[a:b])}) for a, b in zip(cuts, cuts[1:])])
    present = set(zip(trace.tolist(), span.tolist()))
    expected = np.array([p != 0 and (t, p) not in present for t, p in zip(trace.tolist(), parent.tolist())])
    assert 0 < expected.sum() < n

    arrays = span_arrays(table)
    assert arrays.orphan.tolist() == expected.tolist()
    rows = rng.integers(0, n, 2_000)
    found = arrays.parent_of(rows)
    named = parent[rows] != 0
    assert (found[~named | expected[rows]] == -1).all()
    hit = found[named & ~expected[rows]]
    assert (span[hit] == parent[rows][named & ~expected[rows]]).all()
    assert (trace[hit] == trace[rows][named & ~expected[rows]]).all()
    assert np.array_equal(sort_index(key_index(table, sort=False), threads=2)["_sorted_spans"][1],
                          sort_index(key_index(table, sort=False))["_sorted_spans"][1])


def test_isin_sorted_matches_numpy_on_keys_that_share_their_top_bits():
    from nemo_telemetry.analysis.model.keys import isin_sorted

    rng = np.random.default_rng(9)
    crowded = (np.arange(6, dtype=np.uint64) << np.uint64(48)) | np.uint64(7)  # one slot each
    same_slot = np.uint64(3 << 48) | np.arange(1, 5, dtype=np.uint64)  # four keys in one slot
    edges = np.array([0, 1, 1 << 48, (1 << 48) ^ 1, 2**64 - 1, 2**63], dtype=np.uint64)  # next to empty slots
    pool = np.concatenate([crowded, same_slot, edges, rng.integers(0, 2**63, 40, dtype=np.int64).astype(np.uint64)])
    for _ in range(200):
        values = rng.choice(pool, int(rng.integers(0, 300)))
        chosen = np.unique(rng.choice(pool, int(rng.integers(0, 12))))
        assert isin_sorted(values, chosen).tolist() == np.isin(values, chosen).tolist()


def test_orphan_test_and_isin_sorted_give_the_same_answer_a_block_at_a_time(monkeypatch):
    """Lookups over every span go a block of rows at a time: blocks far smaller than the table
    (so references and values cross block edges) give exactly the one-block answer."""
    import pyarrow as pa

    from nemo_telemetry.analysis.model import keys

    rng = np.random.default_rng(11)
    n = 20_000
    trace = rng.integers(1, 2**63, 4, dtype=np.int64).astype(np.uint64)[rng.integers(0, 4, n)]
    span = rng.integers(1, 2**63, n, dtype=np.int64).astype(np.uint64)
    parent = span[rng.integers(0, n, n)]
    parent[rng.random(n) < 0.01] = rng.integers(1, 2**63, dtype=np.int64)  # parents that exist nowhere
    parent[rng.random(n) < 0.05] = 0
    table = pa.table({"trace_key": trace, "span_key": span, "parent_key": parent})
    wanted = np.sort(rng.choice(span, 300, replace=False))
    one_block = (span_arrays(table).orphan, keys.isin_sorted(span, wanted))
    monkeypatch.setattr(keys, "LOOKUP_ROWS", 777)
    blocked = (span_arrays(table).orphan, keys.isin_sorted(span, wanted))
    assert one_block[0].sum() > 0 and one_block[1].sum() == 300
    assert np.array_equal(one_block[0], blocked[0]) and np.array_equal(one_block[1], blocked[1])


def test_sorted_search_a_stretch_at_a_time_equals_numpy():
    """The orphan test's search of sorted references, a stretch of them within one slice of the
    span index at a time, gives np.searchsorted's positions: repeated values, values past either
    end, stretches that share an answer."""
    from nemo_telemetry.analysis.model.keys import _SEARCH_STRETCH, _search_sorted

    rng = np.random.default_rng(5)
    for n, m, top in [(0, 5000, 10), (10, 5 * _SEARCH_STRETCH, 1000), (100_000, 13 * _SEARCH_STRETCH + 17, 2**40),
                      (5000, 100_000, 1100), (7, 40_000, 50)]:
        values = np.sort(rng.integers(0, top, n).astype(np.uint64))
        queries = np.sort(rng.integers(0, top + top // 10 + 1, m).astype(np.uint64))
        assert np.array_equal(_search_sorted(values, queries), np.searchsorted(values, queries)), (n, m)
