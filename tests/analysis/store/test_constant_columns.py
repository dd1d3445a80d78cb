"""Columns a spans file holds one value in are repeated from the file's declaration instead of
decoded, and only where the file's own statistics agree: a scan gives exactly what a full decode
gives, whatever another tool did to the file."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from nemo_telemetry.analysis import load_traces
from nemo_telemetry.analysis.store.constants import CONSTANTS_KEY, constant_array, declare_constants
from nemo_telemetry.analysis.store.dataset import SPANS_PARQUET_OPTIONS, span_file_table, with_parent_rows
from nemo_telemetry.analysis.store.read import (
    GOODPUT_COLUMNS,
    READ_COLUMNS,
    held_constant,
    scan_file_batches,
    span_projection,
)
from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf, write_length_prefixed


@pytest.fixture(scope="module")
def spans(tmp_path_factory) -> pa.Table:
    """1,200 spans of three ranks (three processes), one of them failed."""
    requests = synthetic_requests(1_200, spans_per_request=60, ranks=3)
    path = write_length_prefixed(tmp_path_factory.mktemp("constants") / "t.pb", [to_protobuf(r) for r in requests])
    return load_traces(path).spans


def _per_rank(spans: pa.Table, folder, write=None) -> list[str]:
    """One spans file per rank, as ingest writes them (``write`` replaces the writer's table)."""
    files = []
    for rank in pc.unique(spans.column("rank")).to_pylist():
        path = folder / f"rank-{rank}.parquet"
        table = spans.filter(pc.equal(spans.column("rank"), rank))
        pq.write_table((write or span_file_table)(table), path, **SPANS_PARQUET_OPTIONS)
        files.append(str(path))
    return files


def _scanned(files: list[str], columns) -> tuple[pa.Table, pa.Table, frozenset]:
    """(the scan's table, a full decode's, the columns the scan repeated)."""
    dataset, read = span_projection(files, tuple(columns))
    held = held_constant(dataset, read).columns
    scan = pa.Table.from_batches([b for _, b in scan_file_batches(dataset, read, 100)])
    return scan, dataset.to_table(columns=read), held


@pytest.mark.parametrize("columns", [READ_COLUMNS, GOODPUT_COLUMNS])
def test_the_columns_each_process_holds_one_value_in_are_repeated_and_read_the_same(spans, tmp_path, columns):
    scan, decoded, held = _scanned(_per_rank(spans, tmp_path), columns)
    assert {"service_name", "run_id", "rank"} <= held or not {"service_name", "rank"} & set(columns)
    assert "start_ns" not in held and "span_key" not in held
    assert scan.schema.equals(decoded.schema)
    for name in decoded.column_names:
        assert scan.column(name).to_pylist() == decoded.column(name).to_pylist(), name


def test_a_column_that_varies_in_one_file_is_decoded_in_every_file(spans, tmp_path):
    failed = spans.column("rank").to_numpy(zero_copy_only=False) == 1
    failed &= np.arange(spans.num_rows) % 7 == 0  # some spans of rank 1 ended in error
    codes = pc.if_else(pa.array(failed), "error", spans.column("status_code").cast(pa.string()))
    mixed = spans.set_column(spans.schema.get_field_index("status_code"), "status_code",
                             codes.dictionary_encode())
    scan, decoded, held = _scanned(_per_rank(mixed, tmp_path), READ_COLUMNS)
    assert "status_code" not in held and "service_name" in held
    assert scan.column("status_code").to_pylist() == decoded.column("status_code").to_pylist()
    assert scan.column("status_code").to_pylist().count("error") == int(failed.sum())


def _rewritten(path: str, column: str, values: pa.Array, **options) -> None:
    """The file as another tool writes it: ``column`` replaced, the schema's metadata (the
    declaration) carried over as pyarrow does."""
    table = pq.read_table(path)
    table = table.set_column(table.schema.get_field_index(column), column, values)
    assert CONSTANTS_KEY in table.schema.metadata
    pq.write_table(table, path, **options)


@pytest.mark.parametrize("change", ["some rows", "every row", "no statistics"])
def test_a_declaration_the_files_statistics_do_not_confirm_is_not_trusted(spans, tmp_path, change):
    files = _per_rank(spans, tmp_path)
    rows = pq.ParquetFile(files[0]).metadata.num_rows
    service = pq.read_table(files[0]).column("service_name").combine_chunks().dictionary[0].as_py()
    if change == "some rows":
        values = pa.array([service if i % 2 else "other" for i in range(rows)]).dictionary_encode()
        _rewritten(files[0], "service_name", values)
    elif change == "every row":
        _rewritten(files[0], "service_name", pa.array(["other"] * rows).dictionary_encode())
    else:
        table = pq.read_table(files[0])
        pq.write_table(table, files[0], write_statistics=False)
    scan, decoded, held = _scanned(files, READ_COLUMNS)
    assert "service_name" not in held
    assert scan.column("service_name").to_pylist() == decoded.column("service_name").to_pylist()
    if change != "no statistics":
        assert "other" in scan.column("service_name").to_pylist()


def test_files_without_a_declaration_are_decoded_whole(spans, tmp_path):
    scan, decoded, held = _scanned(_per_rank(spans, tmp_path, write=with_parent_rows), READ_COLUMNS)
    assert held == frozenset()
    assert scan.equals(decoded)


def test_the_declaration_names_one_value_per_column_exactly():
    top = 2**64 - 5  # a uint64 key above int64's range
    n = 5
    table = pa.table({
        "service_name": pa.array(["svc"] * n).dictionary_encode(),
        "run_id": pa.array(["a", "b", "a", "a", "a"]).dictionary_encode(),
        "status_message": pa.nulls(n, pa.string()),
        "trace_low": pa.array(np.full(n, top, np.uint64)),
        "trace_key": pa.array([1, 2, 3, 4, 5], pa.uint64()),
        "flags": pa.array([0, None, 0, 0, 0], pa.uint32()),
    })
    declared = json.loads(declare_constants(table).schema.metadata[CONSTANTS_KEY])
    assert declared == {"service_name": "svc", "status_message": None, "trace_low": top}
    for name, value in declared.items():
        field = table.schema.field(name)
        assert constant_array(field, value, n).to_pylist() == table.column(name).to_pylist()


def test_a_trace_key_above_int64s_range_is_repeated_exactly(spans, tmp_path):
    """One trace per file (as one run is one trace): its uint64 keys are held, whatever their top bit."""
    one_trace = spans
    for name, value in (("trace_key", 2**64 - 3), ("trace_low", 2**63 + 11)):
        one_trace = one_trace.set_column(one_trace.schema.get_field_index(name), name,
                                         pa.array(np.full(spans.num_rows, value, np.uint64)))
    scan, decoded, held = _scanned(_per_rank(one_trace, tmp_path), READ_COLUMNS)
    assert {"trace_key", "trace_low"} <= held
    assert set(scan.column("trace_key").to_pylist()) == {2**64 - 3}
    assert scan.column("trace_low").to_pylist() == decoded.column("trace_low").to_pylist()


@pytest.mark.parametrize("declaration", [b"{not json", b"[1, 2]", b'{"service_name": ["a"]}', b'{"rank": "0"}'])
def test_a_malformed_declaration_costs_only_itself(spans, tmp_path, declaration):
    """A declaration that is not a JSON object of plain values, or whose value's type is not the
    column's, repeats nothing: the file is decoded, its neighbours still repeat theirs."""
    files = _per_rank(spans, tmp_path)
    table = pq.read_table(files[0])
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, CONSTANTS_KEY: declaration}), files[0],
                   **SPANS_PARQUET_OPTIONS)
    scan, decoded, held = _scanned(files, READ_COLUMNS)
    assert "service_name" not in held and "rank" not in held
    assert scan.equals(decoded)
    _, _, others = _scanned(files[1:], READ_COLUMNS)
    assert {"service_name", "rank"} <= others
