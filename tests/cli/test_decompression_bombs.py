"""Decompression bombs against ``ingest`` and ``monitor --follow`` in processes whose address space is
capped (``RLIMIT_AS``) far below what the bombs inflate to: each bomb is rejected and named, the
process finishes with exit 0, and the other inputs' spans are all kept."""

from __future__ import annotations

import gzip
import json
import os
import resource
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard

from nemo_telemetry.analysis import goodput_document, load_traces, run_goodput
from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf, write_json_lines

INFLATED = 4 << 30  # what each bomb inflates to
CAP = 1 << 30  # the address space the commands get: a quarter of one bomb
BOUND = 64 << 20  # the default bound, collect's
_CHUNK = 16 << 20


def _zstd_frame(prefix: bytes, filler: bytes) -> bytes:
    """One zstd frame of ``prefix`` then ``INFLATED`` bytes of ``filler`` (about 131 KB)."""
    compressor = zstandard.ZstdCompressor(level=1).compressobj()
    parts = [compressor.compress(prefix)]
    block = filler * (_CHUNK // len(filler))
    parts += [compressor.compress(block) for _ in range(INFLATED // _CHUNK)]
    return b"".join(parts) + compressor.flush()


@pytest.fixture(scope="module")
def bombs(tmp_path_factory) -> tuple[Path, dict, list]:
    return make_bombs(tmp_path_factory.mktemp("bombs"))


def make_bombs(folder: Path) -> tuple[Path, dict, list]:
    """A zstd JSON line (of zeros, and of one span repeated), a gzip JSON line, a zstd JSON document and
    a zstd protobuf record, each inflating to ``INFLATED``, beside a good dump (and a good record after
    the bomb record)."""
    member = gzip.compress(b"\0" * _CHUNK, 9)
    (folder / "line.jsonl.gz").write_bytes(gzip.compress(b'{"resourceSpans": [', 1) + member * (INFLATED // _CHUNK))
    (folder / "line.jsonl.zst").write_bytes(_zstd_frame(b'{"resourceSpans": [{"scopeSpans": [', b"\0"))
    (folder / "doc.json.zst").write_bytes(_zstd_frame(b'{\n  "resourceSpans": [\n', b" "))
    requests = list(synthetic_requests(400, ranks=1, spans_per_request=20, seed=11))
    span = json.dumps(requests[0]["resourceSpans"][0]["scopeSpans"][0]["spans"][0]).encode() + b","
    (folder / "spans.jsonl.zst").write_bytes(_zstd_frame(b'{"resourceSpans": [{"scopeSpans": [{"spans": [', span))
    bomb = _zstd_frame(b"", b"\0")
    good = to_protobuf(requests[-1])
    (folder / "frame.pb").write_bytes(struct.pack(">I", len(bomb)) + bomb + struct.pack(">I", len(good)) + good)
    write_json_lines(folder / "good.jsonl", requests[:-1])
    expected = {
        "line.jsonl.gz": f"{folder / 'line.jsonl.gz'}:1: line longer than {BOUND} bytes",
        "line.jsonl.zst": f"{folder / 'line.jsonl.zst'}:1: line longer than {BOUND} bytes",
        "spans.jsonl.zst": f"{folder / 'spans.jsonl.zst'}:1: line longer than {BOUND} bytes",
        "doc.json.zst": f"{folder / 'doc.json.zst'}: JSON document longer than {BOUND} bytes",
        "frame.pb": f"{folder / 'frame.pb'}: record 1 (byte 0): zstd record longer than {BOUND} bytes",
    }
    assert max(p.stat().st_size for p in folder.iterdir()) < 5 << 20
    return folder, expected, requests


def _capped(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))

    command = [sys.executable, "-c", "from nemo_telemetry.cli.app import main; main()", *args]
    # The compiled kernels, whatever the input's size: the reference decoders' peak address space on
    # these inputs leaves no room under the cap for the writer's threads (docs/limitations.md).
    env = {**os.environ, "COLUMNS": "400", "NEMO_TELEMETRY_COMPILED": "1"}
    return subprocess.run(command, preexec_fn=cap, capture_output=True, text=True, timeout=timeout, env=env)


def _spans_in(requests: list[dict]) -> int:
    return sum(len(scope["spans"]) for r in requests for rs in r["resourceSpans"] for scope in rs["scopeSpans"])


def test_ingest_rejects_and_names_each_bomb_and_keeps_every_other_span(tmp_path, bombs):
    folder, expected, requests = bombs
    result = _capped("ingest", str(folder), "--out", str(tmp_path / "ds"), "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout)
    assert summary["spans"] == _spans_in(requests) >= 400  # good.jsonl, and the frame after the bomb
    assert summary["rejected_records"] == len(expected)
    for name, start in expected.items():
        assert any(w.startswith(start) for w in summary["warnings"]), (name, summary["warnings"])


def test_monitor_follow_rejects_and_names_each_bomb_and_reports_the_other_spans_steps(bombs):
    folder, expected, requests = bombs
    result = _capped("monitor", "--follow", str(folder), "--until-idle", "2", "--format", "json", "--grace", "0")
    assert result.returncode == 0, result.stderr[-2000:]
    for name, start in expected.items():
        assert start in result.stderr.replace("\n", ""), (name, result.stderr[-3000:])
    steps = {}
    for line in result.stdout.splitlines():
        doc = json.loads(line)
        doc.pop("revised", None)
        steps[(doc.pop("run_id"), doc["iteration"])] = doc
    good = load_traces([folder / "good.jsonl", folder / "frame.pb"]).spans
    offline = {(run["run_id"], step["iteration"]): step for run in goodput_document(run_goodput(good))["runs"]
               for step in run["steps"]}
    assert good.num_rows == _spans_in(requests) and steps == offline


_RESOURCE = {"attributes": [{"key": "service.name", "value": {"stringValue": "svc"}},
                            {"key": "nemo.run.id", "value": {"stringValue": "run-1"}}]}


def _metrics_line(i: int) -> bytes:
    points = [{"timeUnixNano": str(1_000 + 2 * i + p), "asDouble": float(p)} for p in range(2)]
    return json.dumps({"resourceMetrics": [{"resource": _RESOURCE, "scopeMetrics": [
        {"scope": {"name": "t"}, "metrics": [{"name": "rl.efficiency.seconds", "gauge": {"dataPoints": points}}]}]}]}
    ).encode() + b"\n"


def _logs_line(i: int) -> bytes:
    records = [{"timeUnixNano": str(2_000 + i), "severityText": "INFO", "body": {"stringValue": f"line {i}"}}]
    request = {"resourceLogs": [{"resource": _RESOURCE, "scopeLogs": [{"logRecords": records}]}]}
    return json.dumps(request).encode() + b"\n"


def _metrics_record(i: int) -> bytes:
    from google.protobuf.json_format import ParseDict
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    payload = ParseDict(json.loads(_metrics_line(i)), ExportMetricsServiceRequest()).SerializeToString()
    return struct.pack(">I", len(payload)) + payload


@pytest.fixture(scope="module")
def signal_bombs(tmp_path_factory) -> tuple[Path, dict, list]:
    return make_signal_bombs(tmp_path_factory.mktemp("signal_bombs"))


def make_signal_bombs(folder: Path) -> tuple[Path, dict, list]:
    """Metrics and log dumps each holding a bomb inflating to ``INFLATED`` among good lines or records:
    a zstd and a gzip metrics JSON line, a zstd log JSON line, a zstd protobuf metrics record; beside a
    good spans dump. The good lines after a bomb line come in a frame (or member) of their own."""
    ahead, after = b"".join(_metrics_line(i) for i in range(3)), b"".join(_metrics_line(i) for i in range(3, 6))
    (folder / "metrics-line.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress(ahead) + _zstd_frame(b'{"resourceMetrics": [', b"\0")
        + zstandard.ZstdCompressor().compress(b"\n" + after))
    member = gzip.compress(b"\0" * _CHUNK, 9)
    (folder / "metrics-line.jsonl.gz").write_bytes(
        gzip.compress(ahead + b'{"resourceMetrics": [') + member * (INFLATED // _CHUNK) + gzip.compress(b"\n" + after))
    logs_ahead, logs_after = b"".join(_logs_line(i) for i in range(4)), b"".join(_logs_line(i) for i in range(4, 7))
    (folder / "logs-line.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress(logs_ahead) + _zstd_frame(b'{"resourceLogs": [', b" ")
        + zstandard.ZstdCompressor().compress(b"\n" + logs_after))
    bomb = _zstd_frame(b"", b"\0")
    (folder / "metrics-frame.pb").write_bytes(_metrics_record(0) + struct.pack(">I", len(bomb)) + bomb
                                              + _metrics_record(1))
    requests = list(synthetic_requests(200, ranks=1, spans_per_request=20, seed=12))
    write_json_lines(folder / "traces.jsonl", requests)
    expected = {
        "metrics-line.jsonl.zst": f"{folder / 'metrics-line.jsonl.zst'}:4: line longer than {BOUND} bytes",
        "metrics-line.jsonl.gz": f"{folder / 'metrics-line.jsonl.gz'}:4: line longer than {BOUND} bytes",
        "logs-line.jsonl.zst": f"{folder / 'logs-line.jsonl.zst'}:5: line longer than {BOUND} bytes",
        "metrics-frame.pb": f"{folder / 'metrics-frame.pb'}: record 2 (byte {len(_metrics_record(0))}): "
                            f"zstd record longer than {BOUND} bytes",
    }
    assert max(p.stat().st_size for p in folder.iterdir()) < 5 << 20
    return folder, expected, requests


def test_ingest_bounds_metrics_and_log_dumps_and_keeps_every_other_point_record_and_span(tmp_path, signal_bombs):
    folder, expected, requests = signal_bombs
    result = _capped("ingest", str(folder), "--out", str(tmp_path / "ds"), "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout)
    assert summary["spans"] == _spans_in(requests)
    assert summary["metric_points"] == 2 * 6 * 2 + 2 * 2  # two JSON dumps of 6 lines, the two records
    assert summary["logs"] == 7
    for name, start in expected.items():  # named once: by the span reader, not again by the metrics or logs one
        assert sum(w.startswith(start) for w in summary["warnings"]) == 1, (name, summary["warnings"])
    # the bombs alone: the protobuf metrics records are told as metrics, never decoded as trace requests
    assert summary["rejected_records"] == len(expected), summary["warnings"]
    from nemo_telemetry.analysis import read_logs
    from nemo_telemetry.analysis.ingestion.metrics import metrics_for_source

    assert sorted(read_logs(tmp_path / "ds").column("body").to_pylist()) == sorted(f"line {i}" for i in range(7))
    assert metrics_for_source(tmp_path / "ds").num_rows == summary["metric_points"]


def test_read_metrics_alone_names_the_bomb_and_keeps_the_other_points(signal_bombs):
    """The Python reader of raw metrics dumps (what goodput reads beside raw spans) under the same cap."""
    folder, expected, _ = signal_bombs
    code = ("import sys; from nemo_telemetry.analysis import read_metrics; from nemo_telemetry.analysis.ingestion."
            "metrics import FIRST_PROBLEM_KEY, MALFORMED_KEY; t = read_metrics(sys.argv[1]); "
            "meta = t.schema.metadata; print(t.num_rows, meta[MALFORMED_KEY].decode(), meta[FIRST_PROBLEM_KEY].decode())")

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))

    path = folder / "metrics-line.jsonl.gz"
    result = subprocess.run([sys.executable, "-c", code, str(path)], preexec_fn=cap, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows, malformed, first = result.stdout.split(" ", 2)
    assert (int(rows), int(malformed)) == (12, 1) and first.startswith(expected[path.name]), result.stdout
