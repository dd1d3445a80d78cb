"""The sort-based parent joins goodput and check rely on, against a dictionary built by hand.

Random small tables with repeated span ids (in one trace and across traces), parents in the
other trace, parents missing, and self-parents.
"""

from __future__ import annotations

import numpy as np
import pytest

from nemo_telemetry.analysis import parent_indices, spans_table
from nemo_telemetry.analysis._arrays import span_arrays


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
            for row, parent in enumerate(got):
                options = candidates(row)
                assert (parent in options) if options else parent == -1, (row, parent, options)
