"""The bound on one decompressed line, record or document in ``ingest`` (``max_request_bytes``, collect's
bound by default): past it the input is rejected and named, read past, and the rest kept."""

from __future__ import annotations

import gzip
import struct

import orjson
import pytest
import zstandard
from typer.testing import CliRunner

from nemo_telemetry.analysis import DEFAULT_MAX_REQUEST_BYTES, DumpFollower, ingest
from nemo_telemetry.analysis.settings.choices import DEFAULT_MAX_REQUEST_BYTES as CHOICES_BOUND
from nemo_telemetry.analysis.ingestion.collect import CollectorServer
from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf
from nemo_telemetry.cli.app import app

# Each test on both paths: the compiled kernels and the reference ones (auto's choice on inputs this small).
pytestmark = pytest.mark.usefixtures("kernel_path")

LIMIT = 1 << 16


@pytest.fixture(scope="module")
def requests() -> list[dict]:
    return list(synthetic_requests(200, ranks=1, spans_per_request=20, seed=2))  # 10 requests


def _count(requests: list[dict]) -> int:
    return sum(len(r["resourceSpans"][0]["scopeSpans"][0]["spans"]) for r in requests)


def _big_request(requests: list[dict]) -> dict:
    """A request longer than LIMIT: the spans of every request in one."""
    spans = [s for r in requests for s in r["resourceSpans"][0]["scopeSpans"][0]["spans"]] * 4
    big = orjson.loads(orjson.dumps(requests[0]))
    big["resourceSpans"][0]["scopeSpans"][0]["spans"] = spans
    return big


def test_the_bound_is_collects(requests):
    assert DEFAULT_MAX_REQUEST_BYTES == CHOICES_BOUND == CollectorServer.max_request_bytes == 64 << 20


@pytest.mark.parametrize("compress", [None, "gzip", "zstd"])
def test_a_json_line_over_the_bound_is_rejected_alone_inside_a_block_and_across_blocks(tmp_path, requests, compress):
    big = orjson.dumps(_big_request(requests)) + b"\n"
    assert len(big) > LIMIT
    data = b"".join(orjson.dumps(r) + b"\n" for r in requests[:5]) + big + b"".join(
        orjson.dumps(r) + b"\n" for r in requests[5:])
    data += b'{"resourceSpans": [' + b"\0" * (LIMIT * 3)  # a last line, unterminated, over the bound
    if compress == "gzip":
        data = gzip.compress(data)
    elif compress == "zstd":
        data = zstandard.ZstdCompressor().compress(data)
    path = tmp_path / "traces.jsonl"
    path.write_bytes(data)
    summary = ingest(path, out=tmp_path / "ds", max_request_bytes=LIMIT)
    assert summary.spans == _count(requests)
    assert [w.split(": ", 1)[0] for w in summary.warnings] == [f"{path}:6", f"{path}:{len(requests) + 2}"]
    assert all(f"line longer than {LIMIT} bytes (decompressed)" in w for w in summary.warnings)
    unbounded = ingest(path, out=tmp_path / "ds2")  # the long line read: its spans are repeats
    assert (unbounded.spans, unbounded.duplicates_dropped, unbounded.rejected_records) == (
        _count(requests), 4 * _count(requests), 1)


def test_a_json_document_over_the_bound_is_rejected_and_named(tmp_path, requests):
    path = tmp_path / "doc.json.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(orjson.dumps(_big_request(requests),
                                                                      option=orjson.OPT_INDENT_2)))
    small = tmp_path / "small.json"
    small.write_bytes(orjson.dumps(requests[0], option=orjson.OPT_INDENT_2))
    summary = ingest([path, small], out=tmp_path / "ds", max_request_bytes=LIMIT)
    assert summary.spans == _count(requests[:1]) and summary.rejected_records == 1
    assert summary.warnings[0].startswith(f"{path}: JSON document longer than {LIMIT} bytes")


def test_a_zstd_record_inflating_past_the_bound_is_rejected_and_the_next_record_read(tmp_path, requests):
    bomb = zstandard.ZstdCompressor().compress(b"\0" * (LIMIT * 8))
    frames = [to_protobuf(requests[0]), bomb, to_protobuf(requests[1])]
    (tmp_path / "dumps").mkdir()
    path = tmp_path / "dumps" / "traces.pb"
    path.write_bytes(b"".join(struct.pack(">I", len(f)) + f for f in frames))
    summary = ingest(path, out=tmp_path / "ds", max_request_bytes=LIMIT)
    assert summary.spans == _count(requests[:2])
    assert summary.warnings == (f"{path}: record 2 (byte {4 + len(frames[0])}): zstd record longer than {LIMIT} "
                                "bytes (decompressed), the bound on one request (--max-request-mib, as collect's); "
                                "the rest of the file is read on",)
    follower = DumpFollower(tmp_path / "dumps", max_record_bytes=LIMIT)
    got = follower.poll()
    assert follower.close() is None and got.num_rows == summary.spans and follower.counts().warnings == summary.warnings


def test_ingest_cli_takes_max_request_mib_and_refuses_a_bad_one(tmp_path, requests):
    path = tmp_path / "traces.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in requests[:2]) + orjson.dumps(_big_request(requests))
                     + b"\n")
    runner = CliRunner()
    result = runner.invoke(app, ["ingest", str(path), "--out", str(tmp_path / "ds"), "--json",
                                 "--max-request-mib", str(LIMIT / (1 << 20))])
    assert result.exit_code == 0, result.output
    summary = orjson.loads(result.stdout)
    assert summary["spans"] == _count(requests[:2]) and summary["rejected_records"] == 1
    assert f"{path}:3: line longer than {LIMIT} bytes" in summary["warnings"][0]
    bad = runner.invoke(app, ["ingest", str(path), "--out", str(tmp_path / "ds2"), "--max-request-mib", "0"])
    assert bad.exit_code == 2 and "--max-request-mib" in bad.output
    # --engine ray takes the bound too: tests/integration/test_ray_ingest_bound.py
