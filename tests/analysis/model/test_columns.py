"""Column validity read from Arrow's bits: the same rows as Arrow's own ``is_valid``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from nemo_telemetry.analysis.model.columns import valid_rows


def _columns(rng: np.random.Generator) -> list[pa.Array | pa.ChunkedArray]:
    n = 200
    mask = rng.random(n) < 0.4
    ints = pa.array(rng.integers(0, 9, n), mask=mask)
    names = pa.array(np.where(mask, None, rng.choice(["a", "b", "c"], n)).tolist()).dictionary_encode()
    maps = pa.array([None if m else [("k", "v")] for m in mask], pa.map_(pa.string(), pa.string()))
    return [ints, ints.slice(13, 101), names, names.slice(7), maps.slice(3), pa.nulls(17, pa.int64()),
            pa.nulls(5), pa.array(np.arange(40)), pa.chunked_array([ints.slice(5, 50), pa.nulls(9, pa.int64()),
                                                                  ints.slice(101)]),
            pa.chunked_array([], pa.int64())]


@pytest.mark.parametrize("seed", range(5))
def test_valid_rows_are_the_rows_arrow_calls_valid(seed):
    for column in _columns(np.random.default_rng(seed)):
        want = np.asarray(pc.is_valid(column).to_numpy(zero_copy_only=False), dtype=bool).reshape(-1)
        got = valid_rows(column)
        assert got.dtype == bool and got.tolist() == want.tolist(), column.type


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64])
def test_code_mask_is_isin_whatever_codes_are_chosen(dtype):
    """Every way ``code_mask`` decides (one code, every code, runs of consecutive codes from 0 or
    not, a table lookup for many runs) selects the rows ``np.isin`` does; null (-1) never."""
    from nemo_telemetry.analysis.model.columns import code_mask

    rng = np.random.default_rng(7)
    size = 20
    codes = rng.integers(-1, size, 5_000).astype(dtype)
    choices = [[0], [5], list(range(size)), [0, 1, 2], [3, 4, 9, 10], [0, 2, 4, 6, 8, 10], [19], [-1, 0, 1],
               [0, 1, 25], [], *(sorted(set(rng.integers(0, size, k).tolist())) for k in (2, 3, 6, 12))]
    for chosen in choices:
        want = np.isin(codes, [c for c in chosen if 0 <= c < size])
        assert code_mask(codes, chosen, size).tolist() == want.tolist(), (dtype, chosen)
