"""The one iteration-attribution walk: in a batch (``climb``) and across batches (``resolve_walks``),
against a recursive walk written out by hand over random forests with cycles and missing parents."""

from __future__ import annotations

import numpy as np

from nemo_telemetry.analysis.model.walk import KeyIndex, climb, resolve_walks


def random_forest(rng: np.random.Generator, n: int):
    parent = np.where(rng.random(n) < 0.85, rng.integers(-1, n, n), -1)  # -1: root; any row: cycles allowed
    has = rng.random(n) < 0.3
    iteration = rng.integers(0, 50, n)
    bucketed = rng.random(n) < 0.3
    return parent, has, iteration, bucketed


def by_hand(row: int, parent, has, iteration, bucketed):
    """(stamped, iteration, nearest bucketed row) from ``row`` itself upwards, a cycle stopping the walk."""
    stamped, value, ancestor, seen = False, 0, -1, set()
    while row >= 0 and row not in seen and not (stamped and ancestor >= 0):
        seen.add(row)
        if not stamped and has[row]:
            stamped, value = True, int(iteration[row])
        if ancestor < 0 and bucketed[row]:
            ancestor = row
        row = int(parent[row])
    return stamped, value, ancestor


def test_climb_meets_the_nearest_stamped_and_bucketed_spans_as_a_recursive_walk_does():
    rng = np.random.default_rng(3)
    for _ in range(40):
        n = int(rng.integers(1, 80))
        parent, has, iteration, bucketed = random_forest(rng, n)
        walked = climb(np.arange(n), parent.__getitem__, has, iteration, bucketed=bucketed, max_depth=n + 1)
        for row in range(n):
            stamped, value, ancestor = by_hand(row, parent, has, iteration, bucketed)
            assert bool(walked.stamped[row]) == stamped, row
            assert walked.iteration[row] == (value if stamped else 0), row
            assert walked.ancestor[row] == ancestor, row


def test_climb_names_the_parent_where_an_unfinished_walk_leaves_the_batch():
    # rows: 0 <- 1 <- 2; row 0's parent (key 77) is in another batch; row 3 is a root
    parent = np.array([-1, 0, 1, -1])
    parent_key = np.array([77, 10, 11, 0], np.uint64)
    has = np.array([False, False, False, False])
    walked = climb(np.array([2, 3, -1]), parent.__getitem__, has, np.zeros(4, np.int64), parent_key=parent_key)
    assert walked.exit.tolist() == [77, 0, 0]
    assert walked.stamped.tolist() == [False, False, False]


def test_resolve_walks_continues_across_batches_until_a_stamped_span_or_a_root():
    # one trace split over three "batches": walk a starts at key 1 -> 2 -> 3 (stamped 9);
    # walk b starts at key 5, found nowhere; walk c loops 6 -> 7 -> 6
    batches = [{1: (2, None)}, {2: (3, None), 6: (7, None)}, {3: (0, 9), 7: (6, None)}]
    rounds = []

    def lookup(wanted: dict) -> dict:
        rounds.append(len(wanted["at"]))
        rows = [(t, k, *batch[k]) for batch in batches for t, k in zip(wanted["trace"], wanted["at"]) if k in batch]
        return {"trace": np.array([r[0] for r in rows], np.uint64),
                "at": np.array([r[1] for r in rows], np.uint64),
                "parent": np.array([r[2] for r in rows], np.uint64),
                "stamped": np.array([r[3] is not None for r in rows], bool),
                "iteration": np.array([r[3] or 0 for r in rows], np.int64)}

    walks = {"trace": np.array([1, 1, 1], np.uint64), "start": np.array([1, 5, 6], np.uint64),
             "at": np.array([1, 5, 6], np.uint64), "stamped": np.zeros(3, bool), "iteration": np.zeros(3, np.int64)}
    out = resolve_walks(walks, lookup)
    by_start = {int(start): (bool(stamped), int(iteration))
                for start, stamped, iteration in zip(out["start"], out["stamped"], out["iteration"])}
    assert by_start[1] == (True, 9)
    assert not by_start[5][0] and not by_start[6][0]
    assert len(out["start"]) == 3 and len(rounds) == 3


def test_key_index_tells_apart_the_same_key_in_two_traces():
    index = KeyIndex.of(np.array([1, 2], np.uint64), np.array([5, 5], np.uint64), np.array([10, 20]))
    assert index.lookup(np.array([2, 1, 3], np.uint64), np.array([5, 5, 5], np.uint64)).tolist() == [20, 10, -1]


def test_walk_rows_finds_what_the_sorted_index_walk_finds():
    """goodput's walk of a few rows over a whole table, finding parents by a pass over the keys per
    level (walk_rows), gives walk_up's iterations: duplicated ids, spans that name themselves,
    cycles, parents found nowhere, the same id in two traces, a parent_span_id column or keys only."""
    import pyarrow as pa

    from nemo_telemetry.analysis.decode import span_arrays
    from nemo_telemetry.analysis.model.walk import walk_rows

    rng = np.random.default_rng(9)
    for trial in range(200):
        n = int(rng.integers(1, 200))
        ids = rng.integers(1, 40 if trial % 3 == 0 else 2**62, n).astype(np.uint64)  # narrow: duplicates
        traces = rng.integers(1, 3, n).astype(np.uint64)
        elsewhere = np.where(rng.random(n) < 0.5, 0, rng.integers(1, 2**62, n)).astype(np.uint64)
        parent = np.where(rng.random(n) < 0.8, ids[rng.integers(0, n, n)], elsewhere)
        itself = rng.random(n) < 0.05
        parent[itself] = ids[itself]
        has = rng.random(n) < 0.3
        columns = {"trace_key": traces, "span_key": ids, "parent_key": parent,
                   "rl.iteration": pa.array(rng.integers(0, 9, n), mask=~has)}
        if trial % 2:
            columns["parent_span_id"] = pa.array([f"{int(p):016x}" for p in parent], mask=parent == 0)
        table = pa.table(columns)
        rows = np.unique(rng.integers(0, n, int(rng.integers(1, n + 1))))
        iteration, found, _ = span_arrays(table).walk_up(rows)
        mine = walk_rows(table, rows)
        assert np.array_equal(mine[1], found), trial
        assert np.array_equal(mine[0], iteration), trial
