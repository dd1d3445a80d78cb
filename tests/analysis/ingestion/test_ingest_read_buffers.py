"""Length-prefixed protobuf is read in blocks of whole requests, and every block (protobuf and
JSON lines) is read into a buffer the pipeline reuses once the block is decoded: the tables,
record numbers and byte offsets are what request-by-request reading gives, and nothing decoded
earlier changes when its buffer is read into again."""

from __future__ import annotations

import importlib

import orjson
import pytest
import zstandard

from nemo_telemetry.analysis import load_traces

from nemo_telemetry.analysis.ingestion import _detect
from nemo_telemetry.analysis.ingestion._detect import ReadBuffers, iter_records
from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf

from test_ingest_wire import _upb

# Each test on both paths: the compiled kernels and the reference ones (auto's choice on inputs this small).
pytestmark = pytest.mark.usefixtures("kernel_path")

ingest_module = importlib.import_module("nemo_telemetry.analysis.ingestion.ingest")  # the package exports ingest()


@pytest.fixture(scope="module")
def payloads():
    return [to_protobuf(r) for r in synthetic_requests(40 * 11, spans_per_request=11, ranks=2)]


def _framed(payloads) -> bytes:
    return b"".join(len(p).to_bytes(4, "big") + p for p in payloads)


@pytest.mark.parametrize("block_bytes", [100, 3000, 1 << 20])
def test_protobuf_blocks_give_what_upb_gives_request_by_request(payloads, tmp_path, monkeypatch, block_bytes):
    """Blocks smaller than a request, a few requests, or the whole file: each request is
    whole in one block (a longer one gets a bigger buffer), none lost or read twice."""
    monkeypatch.setattr(_detect, "PROTO_BLOCK_BYTES", block_bytes)
    monkeypatch.setattr(ingest_module, "BATCH_PROTOBUF_BYTES", block_bytes // 2)
    path = tmp_path / "t.pb"
    path.write_bytes(_framed(payloads))
    loaded = load_traces(path)
    expected = _upb(payloads)
    assert loaded.summary.rejected_records == 0
    assert sorted(loaded.spans.to_pylist(), key=_key) == sorted(expected.spans.to_pylist(), key=_key)


def _key(span: dict) -> tuple:
    return span["trace_id"], span["span_id"]


def test_blocks_name_each_request_by_number_and_byte(payloads, tmp_path, monkeypatch):
    """A zstd request and a JSON request among plain ones, then a truncated last request:
    every request's number and byte offset in the file is the one reading one by one gives."""
    monkeypatch.setattr(_detect, "PROTO_BLOCK_BYTES", 5000)
    compressed = zstandard.ZstdCompressor().compress(payloads[2])
    as_json = b'{"resourceSpans": []}'
    frames = [payloads[0], payloads[1], compressed, as_json, payloads[3], payloads[4]]
    body = _framed(frames)
    path = tmp_path / "mixed.pb"
    path.write_bytes(body[:-10])
    records = list(iter_records(path))
    wheres = {}
    for record in records:
        if record.kind == "protobuf-frames":
            block = record.payload
            wheres.update({block.where(i): block.payload(i) for i in range(len(block.starts))})
        else:
            wheres[record.where] = record.kind
    offsets = [0]
    for frame in frames:
        offsets.append(offsets[-1] + 4 + len(frame))
    expected = {f"{path}: record {i + 1} (byte {offsets[i]})": frames[i] for i in (0, 1, 4)}
    expected[f"{path}: record 3 (byte {offsets[2]})"] = "traces"  # decompressed: a request of its own
    expected[f"{path}: record 4 (byte {offsets[3]})"] = "traces"
    expected[f"{path}: record 6 (byte {offsets[5]})"] = "rejected"
    assert wheres == expected
    assert records[-1].payload.startswith(f"truncated last record ({len(frames[5]) - 10} of {len(frames[5])} bytes)")


@pytest.mark.parametrize("tail, problem", [
    (b"\x00\x01", "truncated length prefix"),  # the file ends two bytes into a prefix
    (b"\x7f\xff\xff\xff" + b"\x0a" * 100, "implausible length 2147483647"),
])
def test_a_bad_prefix_after_whole_blocks_ends_the_file_and_is_named(payloads, tmp_path, monkeypatch, tail, problem):
    monkeypatch.setattr(_detect, "PROTO_BLOCK_BYTES", 5000)
    path = tmp_path / "bad.pb"
    body = _framed(payloads[:10])
    path.write_bytes(body + tail)
    loaded = load_traces(path)
    assert loaded.spans.num_rows == 110
    assert loaded.summary.rejected_records == 1
    assert loaded.summary.warnings == (f"{path}: record 11 (byte {len(body)}): {problem}; the rest of the file is skipped",)


@pytest.mark.parametrize("fmt", ["proto", "jsonl"])
@pytest.mark.parametrize("ahead", [0, 2])
def test_reused_buffers_leave_earlier_tables_as_they_were(payloads, tmp_path, monkeypatch, fmt, ahead):
    """Many blocks through a few buffers: every batch handed to the sink is kept, then compared
    at the end, after its buffer was read into again, with the same batch decoded from bytes
    nobody reuses (each buffer is overwritten as it is given back). And the pipeline reads the
    whole file through a bounded number of buffers."""
    monkeypatch.setattr(_detect, "PROTO_BLOCK_BYTES", 4000)
    monkeypatch.setattr(_detect, "JSON_BLOCK_BYTES", 4000)
    monkeypatch.setattr(ingest_module, "BATCH_PROTOBUF_BYTES", 2000)
    monkeypatch.setattr(ingest_module, "BATCH_JSON_BYTES", 2000)
    path = tmp_path / f"many.{fmt}"
    if fmt == "proto":
        path.write_bytes(_framed(payloads))
    else:
        requests = list(synthetic_requests(40 * 11, spans_per_request=11, ranks=2))
        path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in requests))
    taken = []

    class CountingBuffers(ReadBuffers):
        def take(self, size):
            buffer = super().take(size)
            taken.append(id(buffer))
            return buffer

        def give(self, buffer):
            memoryview(buffer)[:] = b"\xff" * len(buffer)  # a table still reading it would change now
            super().give(buffer)

    kept = []
    pipeline = ingest_module.IngestPipeline(lambda t: kept.append(t) or t, decode_ahead=ahead, buffers=CountingBuffers())
    pipeline.add_file(path, None)
    summary = pipeline.summary()
    assert summary.spans == 440 and len(kept) > 10
    assert len(set(taken)) <= ahead + 2 < len(taken)
    spans = [row for t in kept for row in t.spans.to_pylist()]
    assert sorted(spans, key=_key) == sorted(load_traces(_fresh_copy(path, tmp_path)).spans.to_pylist(), key=_key)


def _fresh_copy(path, tmp_path):
    """The same file, to be read with the default block size (one block, one fresh buffer)."""
    copy = tmp_path / ("copy" + path.suffix)
    copy.write_bytes(path.read_bytes())
    return copy
