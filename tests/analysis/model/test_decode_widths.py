"""The decode keeps codes and iterations in narrow integers only while the values fit.

Names, runs and buckets decode to int16 codes and ``rl.iteration`` to int32 (100 MB less to write
at 10M spans); a batch that could overflow them widens the whole array first, the rows decoded
before it copied. What a user relies on: every value comes back exact, never a wrapped number,
whichever batch brings the wide value.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nemo_telemetry.analysis.decode import SpanReader, span_arrays
from nemo_telemetry.analysis.model.schema import SPANS_SCHEMA
from nemo_telemetry.analysis.store.dataset import with_parent_rows


def spans_batch(names: list[str], iterations: list[int | None], first_id: int) -> pa.RecordBatch:
    n = len(names)
    return pa.record_batch({
        "trace_id": pa.array(["0af7651916cd43dd8448eb211c80319c"] * n),
        "span_id": pa.array([f"{first_id + i:016x}" for i in range(n)]),
        "parent_span_id": pa.array([None] * n, pa.string()),
        "name": pa.array(names).dictionary_encode(),
        "start_ns": pa.array(np.arange(n, dtype=np.int64)),
        "end_ns": pa.array(np.arange(n, dtype=np.int64) + 10),
        "run_id": pa.array(["run-a"] * n).dictionary_encode(),
        "rl.bucket": pa.array(["productive"] * n).dictionary_encode(),
        "rl.iteration": pa.array(iterations, pa.int64()),
    })


def wide_batches() -> list[pa.RecordBatch]:
    """A first batch whose values fit the narrow widths, then one whose names and iterations do not."""
    first = spans_batch(["rl.grpo.step", "rl.grpo.job"] * 50, [1, None] * 50, 1)
    many = [f"span-{i}" for i in range(40_000)]  # past int16's 32,767 codes
    iterations = [2**40, -(2**40), 2**31, None] * 10_000  # past int32
    return [first, spans_batch(many, iterations, 1_000)]


def expected(batches) -> tuple[list[str], list[int | None]]:
    table = pa.Table.from_batches(batches)
    return ([str(v) for v in table.column("name").cast(pa.string()).to_pylist()],
            table.column("rl.iteration").to_pylist())


def decoded(arrays) -> tuple[list[str], list[int | None]]:
    names = [arrays.names[c] for c in arrays.name]
    iterations = [int(v) if has else None for v, has in zip(arrays.iteration, arrays.has_iteration)]
    return names, iterations


def test_names_and_iterations_past_the_narrow_widths_decode_exactly():
    batches = wide_batches()
    arrays = span_arrays(pa.Table.from_batches(batches))
    assert decoded(arrays) == expected(batches)
    assert arrays.iteration.dtype == np.int64 and np.iinfo(arrays.name.dtype).max >= 40_002


def test_values_that_fit_stay_narrow_and_exact():
    batches = wide_batches()[:1]
    arrays = span_arrays(pa.Table.from_batches(batches))
    assert decoded(arrays) == expected(batches)
    assert arrays.name.dtype == np.int16 and arrays.iteration.dtype == np.int32


@pytest.mark.parametrize("order", ["narrow-first", "wide-first"])
def test_spans_files_widen_as_the_batch_that_needs_it_is_read(tmp_path, order):
    batches = wide_batches() if order == "narrow-first" else wide_batches()[::-1]
    files = []
    for i, batch in enumerate(batches):  # a file each, read in this order
        table = pa.Table.from_batches([batch])
        path = tmp_path / f"part-{i}.parquet"
        for field in SPANS_SCHEMA:  # a spans file of dataset format 1: every column, the others null
            if field.name not in table.column_names:
                table = table.append_column(field.with_nullable(True), pa.nulls(table.num_rows, field.type))
        pq.write_table(with_parent_rows(table), path)
        files.append(str(path))
    with SpanReader() as read:
        arrays = read.files(files, batch_rows=4_096)
    assert decoded(arrays) == expected(batches)


def _with_garbage_at_nulls(values: list, valid: list[bool], dictionary: list, dtype=pa.int32()) -> pa.Array:
    """A dictionary array whose null slots hold an out-of-range index, as a writer may leave them."""
    raw = np.array([v if ok else 99 for v, ok in zip(values, valid)], dtype=dtype.to_pandas_dtype())
    bits = np.packbits(np.array(valid, dtype=bool), bitorder="little")
    indices = pa.Array.from_buffers(dtype, len(raw), [pa.py_buffer(bits), pa.py_buffer(raw)], null_count=valid.count(False))
    return pa.DictionaryArray.from_arrays(indices, pa.array(dictionary))


@pytest.mark.parametrize("offset", [0, 3, 11])
@pytest.mark.parametrize("share", [0.1, 0.3, 0.8, 1.0])
def test_string_codes_read_nulls_from_their_validity_whatever_a_null_slot_holds(offset, share):
    """Codes come from the indices' buffers; a null is -1 whatever its slot holds, at any offset into
    the buffers, mostly null or mostly not, and each chunk's dictionary maps onto the values the
    earlier chunks numbered; a chunk of one value (a column held constant) is that value's code."""
    from nemo_telemetry.analysis.model.columns import codes_into

    rng = np.random.default_rng(offset)
    valid = (rng.random(64) < share).tolist()
    first = _with_garbage_at_nulls(rng.integers(0, 3, 64).tolist(), valid, ["idle", "overhead", "productive"])
    second = _with_garbage_at_nulls(rng.integers(0, 2, 64).tolist(), valid[::-1], ["productive", "lost"],
                                    pa.int8())
    values: dict = {}
    got = []
    held = pa.DictionaryArray.from_arrays(pa.array(np.zeros(9, np.int32)), pa.array(["overhead"]))
    chunks = (first.slice(offset), second.slice(offset), pa.nulls(5, first.type), held)
    for chunk in chunks:
        into = np.full(len(chunk), 7, dtype=np.int16)
        codes_into(chunk, values, into)
        got.extend(into.tolist())
    expected = [list(values).index(v) if v is not None else -1 for chunk in chunks for v in chunk.to_pylist()]
    assert list(values)[:3] == ["idle", "overhead", "productive"] and got[-9:] == [1] * 9
    assert got == expected and 7 not in got


@pytest.mark.parametrize("offset", [0, 5])
@pytest.mark.parametrize("share", [0.1, 0.5, 0.9])
def test_integers_read_nulls_from_their_validity_whatever_a_null_slot_holds(offset, share):
    """An integer column (rl.iteration) comes back exact where set and 0, not set, at its nulls,
    whatever a null's slot holds, mostly null or mostly not, narrowed where the caller asks."""
    from nemo_telemetry.analysis.model.columns import ints_into

    rng = np.random.default_rng(offset)
    valid = rng.random(80) < share
    stored = np.where(valid, rng.integers(-5, 1000, 80), 123_456)
    bits = np.packbits(valid, bitorder="little")
    column = pa.Array.from_buffers(pa.int64(), 80, [pa.py_buffer(bits), pa.py_buffer(stored)],
                                   null_count=int((~valid).sum())).slice(offset)
    values, got_valid = np.full(len(column), 7, np.int32), np.zeros(len(column), bool)
    ints_into(column, values, got_valid)
    assert got_valid.tolist() == valid[offset:].tolist()
    assert values.tolist() == [v if v is not None else 0 for v in column.to_pylist()]
