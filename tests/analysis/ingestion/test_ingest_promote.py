"""Attribute promotion (compiled) keeps the rules of the Arrow version: last value wins, an
integer column leaves a non-integer value in the map, nothing is lost."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from nemo_telemetry.analysis.ingestion._promote import promote, promote_arrow
from nemo_telemetry.analysis.model.schema import PROMOTED_SPAN_ATTRIBUTES

# Tests of the compiled kernels: they take them on these small inputs too, as auto would not.
pytestmark = pytest.mark.usefixtures("compiled_kernels")

OWNERS = [
    [],
    [("rl.iteration", "3"), ("a", "x"), ("rl.bucket", "productive")],
    [("rl.iteration", "1"), ("rl.iteration", "2")],  # repeated: the last wins
    [("rl.iteration", "2"), ("rl.iteration", "two")],  # last not an integer: both stay in the map
    [("rl.iteration", None), ("rl.bucket", None)],  # null values: promoted as null
    [("rl.iteration", "-12"), ("rl.efficiency.category", "data_loader"), ("b", None)],
    [("rl.iteration", "1234567890123456789")],  # 19 digits: kept as text
    [("rl.iteration", "+5"), ("rl.iteration ", "5"), ("x", "é")],
]


def test_compiled_promotion_equals_the_arrow_version():
    counts = np.array([len(o) for o in OWNERS], dtype=np.int64)
    keys = pa.array([k for o in OWNERS for k, _ in o], pa.string())
    values = pa.array([v for o in OWNERS for _, v in o], pa.large_string())
    fast_map, fast = promote(counts, keys, values, len(OWNERS), PROMOTED_SPAN_ATTRIBUTES)
    slow_map, slow = promote_arrow(counts, keys, values, len(OWNERS), PROMOTED_SPAN_ATTRIBUTES)
    assert fast_map.to_pylist() == slow_map.to_pylist()
    assert {k: v.to_pylist() for k, v in fast.items()} == {k: v.to_pylist() for k, v in slow.items()}
    assert fast["rl.iteration"].to_pylist() == [None, 3, 2, None, None, -12, None, None]
    assert fast_map.to_pylist()[3] == [("rl.iteration", "2"), ("rl.iteration", "two")]

