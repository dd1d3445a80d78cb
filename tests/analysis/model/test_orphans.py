"""The orphan test (a span names a parent no span of its trace holds) against a plain Python set,
over layouts where parents sit next to their children, as exported spans do, and where they do not:
the lookups that the neighbouring rows answer must give the same spans as the full search."""

from __future__ import annotations

import numpy as np
import pytest

import pyarrow as pa

from nemo_telemetry.analysis.model import keys as keys_module
from nemo_telemetry.analysis.model.keys import distinct_parents, index_orphans, index_parents, key_index
from nemo_telemetry.analysis.model.tree import mixed_key


def _spans(rng: np.random.Generator, n: int, layout: str) -> pa.Table:
    """Key columns of ``n`` spans in a few traces: trees whose parents are the previous or next
    row (``adjacent``), anywhere (``shuffled``), with made-up parents, self-parents, ids repeated
    in another trace, and roots (parent key 0)."""
    traces = rng.integers(1, 4, n).astype(np.uint64)
    spans = rng.integers(1, 2**63, n, dtype=np.int64).astype(np.uint64)
    spans[rng.random(n) < 0.05] = 7  # the same id in several traces
    if layout == "adjacent":
        near = np.clip(np.arange(n) + rng.choice([-1, 1], n), 0, n - 1)
        traces[near] = traces  # the neighbour named as parent shares the child's trace
        pick = near
    else:
        pick = rng.integers(0, n, n)
    parents = spans[pick].copy()
    parents[traces[pick] != traces] = rng.integers(1, 2**63, int((traces[pick] != traces).sum()),
                                                   dtype=np.int64).astype(np.uint64)
    made_up = rng.random(n) < 0.03
    parents[made_up] = rng.integers(1, 2**63, int(made_up.sum()), dtype=np.int64).astype(np.uint64)
    self_parent = rng.random(n) < 0.02
    parents[self_parent] = spans[self_parent]
    parents[rng.random(n) < 0.1] = 0  # roots
    return pa.table({"trace_key": traces, "span_key": spans, "parent_key": parents})


def _orphans_by_hand(table: pa.Table) -> np.ndarray:
    trace, span, parent = (table.column(c).to_numpy() for c in ("trace_key", "span_key", "parent_key"))
    held = set(zip(trace.tolist(), span.tolist()))
    return np.array([p != 0 and (t, p) not in held for t, p in zip(trace.tolist(), parent.tolist())], dtype=bool)


@pytest.mark.parametrize("block_rows", [7, 1 << 20], ids=["blocks-of-7", "one-block"])
@pytest.mark.parametrize("layout", ["adjacent", "shuffled"])
def test_orphans_are_the_spans_whose_parent_no_span_of_their_trace_holds(layout, block_rows, monkeypatch):
    monkeypatch.setattr(keys_module, "LOOKUP_ROWS", block_rows)  # neighbours across block edges too
    rng = np.random.default_rng(11)
    for n in (1, 2, 3, 17, 1000, 5000):
        table = _spans(rng, n, layout)
        index = key_index(table)
        orphan = index_orphans(index, index_parents(index))["orphan"]
        assert orphan.tolist() == _orphans_by_hand(table).tolist(), (layout, n)


def test_only_references_no_neighbour_holds_are_looked_up():
    """Rows 1 and 2 name the rows beside them, row 3 names row 0 (two rows away): only that
    reference, and the two to a missing parent (taken once), are left for the search."""
    trace = np.ones(6, np.uint64)
    span = np.array([10, 11, 12, 13, 14, 15], np.uint64)
    parent = np.array([0, 10, 13, 10, 99, 99], np.uint64)
    own, wanted = mixed_key(trace, span), mixed_key(trace, parent)
    left = distinct_parents(parent != 0, wanted, own)
    assert sorted(left.tolist()) == sorted(mixed_key(trace[:2], np.array([10, 99], np.uint64)).tolist())
    assert sorted(distinct_parents(parent != 0, wanted).tolist()) == sorted(
        mixed_key(trace[:3], np.array([10, 13, 99], np.uint64)).tolist())
