"""Column builders of the spans table: shared per-owner maps and empty strings as nulls,
built without copying what they can share."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from nemo_telemetry.analysis.ingestion._columns import _empty_to_null
from nemo_telemetry.analysis.ingestion._promote import per_owner_map


def test_per_owner_maps_repeat_each_owners_entries_for_its_spans():
    """Resource attributes are stored once per resource and repeated per span (compiled, in
    runs of spans of one resource); any order of owners, empty owners and null values."""
    entries = [[(f"k{j}", f"v{r}-{j}") for j in range(r % 4)] for r in range(7)]
    rng = np.random.default_rng(0)
    for trial in range(100):
        index = rng.integers(0, 7, rng.integers(0, 40))
        if trial % 2:
            index = np.sort(index)  # long runs, as spans of one request arrive
        assert per_owner_map(entries, index).to_pylist() == [entries[r] for r in index]
    with_null = [[("a", None), ("b", "x")], []]
    assert per_owner_map(with_null, np.array([1, 0, 0])).to_pylist() == [[], with_null[0], with_null[0]]


@pytest.mark.parametrize("string_type", [pa.string(), pa.large_string()])
def test_empty_strings_become_null_and_the_rest_is_unchanged(string_type):
    """Absent parent ids, trace states and status messages are empty strings on the wire and
    null in the table; slices and arrays that already hold nulls too."""
    a = pa.array(["a", "", "bc", "", "d", "", "", "e", ""], string_type)
    cases = [a, a.slice(1), a.slice(2, 4), pa.array(["", ""], string_type), pa.array(["x"], string_type),
             pa.array(["", None, "y"], string_type), pa.array([], string_type)]
    for arr in cases:
        got = _empty_to_null(arr)
        got.validate(full=True)
        assert got.type == arr.type
        assert got.to_pylist() == [v or None for v in arr.to_pylist()]
