"""``ingest`` gathers each (run, rank) partition's spans into files of ``FILE_ROWS`` and writes
them on background threads while the next batches decode: every span still lands in the
dataset, in order, and a write that fails fails the ingest (no summary that claims spans it
did not write)."""

from __future__ import annotations

import importlib
import json

import pyarrow.parquet as pq
import pytest

from nemo_telemetry.analysis import load_traces, read_spans

from nemo_telemetry.analysis.ingestion import _detect

from nemo_telemetry.analysis.store import dataset
from nemo_telemetry.analysis.store.constants import CONSTANTS_KEY
from nemo_telemetry.analysis.model.tables import OtlpTables
from nemo_telemetry.analysis.model.schema import EVENTS_SCHEMA, LINKS_SCHEMA
from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf, write_length_prefixed

ingest_module = importlib.import_module("nemo_telemetry.analysis.ingestion.ingest")  # the package exports ingest()


@pytest.fixture()
def many_batches(tmp_path, monkeypatch):
    """A protobuf file that decodes in dozens of small batches of two ranks each, written in
    files of 50 spans or so."""
    monkeypatch.setattr(_detect, "PROTO_BLOCK_BYTES", 4000)
    monkeypatch.setattr(ingest_module, "BATCH_PROTOBUF_BYTES", 2000)
    monkeypatch.setattr(ingest_module, "FILE_ROWS", 50)
    requests = list(synthetic_requests(22 * 30, spans_per_request=11, ranks=2))
    return write_length_prefixed(tmp_path / "t.pb", [to_protobuf(r) for r in requests])


def _key(span: dict) -> tuple:
    return span["trace_id"], span["span_id"]


def test_every_span_lands_in_files_of_about_file_rows_in_order(many_batches, tmp_path):
    summary = ingest_module.ingest([many_batches], out=tmp_path / "ds")
    for rank in (0, 1):
        files = sorted((tmp_path / "ds" / "spans" / "run_id=synthetic-run" / f"rank={rank}").glob("*.parquet"))
        rows = [pq.read_metadata(f).num_rows for f in files]
        assert len(rows) > 3 and all(50 <= n < 50 + 30 for n in rows[:-1]) and sum(rows) == 330
    written = read_spans(tmp_path / "ds").to_pylist()
    by_rank = sorted(load_traces(many_batches).spans.to_pylist(), key=lambda span: span["rank"])  # stable
    assert summary.spans == 660 and written == by_rank


def test_held_spans_are_bounded_when_partitions_are_many(tmp_path):
    """Eight ranks, files of 200 spans, at most four files' worth held: partitions are written
    before they fill (largest first), so what is not on disk yet stays bounded; nothing is lost."""
    requests = list(synthetic_requests(11 * 8 * 20, spans_per_request=11, ranks=8))
    spans = load_traces(write_length_prefixed(tmp_path / "t.pb", [to_protobuf(r) for r in requests])).spans
    writer = dataset.DatasetWriter(tmp_path / "ds", file_rows=200)
    not_on_disk = []
    for start in range(0, spans.num_rows, 88):
        batch = spans.slice(start, 88)
        writer.write(OtlpTables(batch, EVENTS_SCHEMA.empty_table(), LINKS_SCHEMA.empty_table()))
        staged = [f for f in (tmp_path / "ds" / "_staging").rglob("*") if f.is_file()]  # staged until close
        on_disk = sum(pq.read_metadata(f).num_rows for f in staged)
        not_on_disk.append(start + batch.num_rows - on_disk)
    writer.close()
    assert 200 < max(not_on_disk) <= dataset._HELD_FILES * 200
    assert read_spans(tmp_path / "ds").num_rows == spans.num_rows


@pytest.mark.parametrize("failing", ["fifth", "last"])
def test_a_failed_background_write_fails_the_ingest(many_batches, tmp_path, monkeypatch, failing):
    """A full disk on a middle file, or on the last one (still being written when the input
    ends): either way ``ingest`` raises instead of returning a summary."""
    ingest_module.ingest([many_batches], out=tmp_path / "whole")
    files = len(list((tmp_path / "whole").rglob("*.parquet")))
    fail_at = 5 if failing == "fifth" else files
    calls = []
    real_write = dataset.pq.write_table

    def disk_full(table, where, **options):
        calls.append(where)
        if len(calls) == fail_at:
            raise OSError(28, "No space left on device", str(where))
        real_write(table, where, **options)

    monkeypatch.setattr(dataset.pq, "write_table", disk_full)
    with pytest.raises(OSError, match="No space left on device"):
        ingest_module.ingest([many_batches], out=tmp_path / "ds")


def test_trace_ids_are_written_as_a_dictionary_and_span_ids_plain(many_batches, tmp_path):
    """A run's trace ids repeat on every span: the spans files hold them (and their keys) as a
    dictionary, which reads back as the same ids at a fraction of the cost; span ids, all distinct,
    stay plain; times
    and parent rows are deltas. Every span reads back as it was."""
    ingest_module.ingest([many_batches], out=tmp_path / "ds")
    files = sorted((tmp_path / "ds" / "spans").rglob("*.parquet"))
    for path in files:
        group = pq.read_metadata(path).row_group(0)
        encodings = {group.column(i).path_in_schema: group.column(i).encodings for i in range(group.num_columns)}
        for trace in ("trace_id", "trace_key", "trace_low"):
            assert "RLE_DICTIONARY" in encodings[trace], (path, trace)
        for distinct in ("span_id", "span_key"):
            assert "RLE_DICTIONARY" not in encodings[distinct], (path, distinct)
        for deltas in ("start_ns", "end_ns", "parent_row"):  # stored as they end: small steps, bit-packed
            assert "DELTA_BINARY_PACKED" in encodings[deltas], (path, deltas)
        declared = json.loads(pq.read_schema(path).metadata[CONSTANTS_KEY])  # one process's file
        assert {"service_name", "run_id", "rank"} <= declared.keys(), (path, declared)
    written = sorted(_key(span) for span in read_spans(tmp_path / "ds").to_pylist())
    assert written == sorted(_key(span) for span in load_traces(many_batches).spans.to_pylist())
