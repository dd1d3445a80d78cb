"""``ingest`` writes Parquet on background threads while the next batches decode: every batch
still lands in the dataset, and a write that fails fails the ingest (no summary that claims
spans it did not write)."""

from __future__ import annotations

import importlib

import pytest

from nemo_telemetry.analysis import _detect, dataset, load_traces, read_spans
from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf, write_length_prefixed

ingest_module = importlib.import_module("nemo_telemetry.analysis.ingest")  # the package exports ingest()


@pytest.fixture()
def many_batches(tmp_path, monkeypatch):
    """A protobuf file that decodes in a dozen small batches of two ranks each."""
    monkeypatch.setattr(_detect, "PROTO_BLOCK_BYTES", 4000)
    monkeypatch.setattr(ingest_module, "BATCH_PROTOBUF_BYTES", 2000)
    requests = list(synthetic_requests(22 * 30, spans_per_request=11, ranks=2))
    return write_length_prefixed(tmp_path / "t.pb", [to_protobuf(r) for r in requests])


def _key(span: dict) -> tuple:
    return span["trace_id"], span["span_id"]


def test_every_batch_written_in_the_background_is_in_the_dataset(many_batches, tmp_path):
    summary = ingest_module.ingest([many_batches], out=tmp_path / "ds")
    files = list((tmp_path / "ds" / "spans").rglob("*.parquet"))
    assert summary.spans == 660 and len(files) > 12
    written = sorted(read_spans(tmp_path / "ds").to_pylist(), key=_key)
    assert written == sorted(load_traces(many_batches).spans.to_pylist(), key=_key)


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
