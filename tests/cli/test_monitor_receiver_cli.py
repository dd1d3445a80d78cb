"""``nemo-telemetry monitor --port`` as a real process, as a receiver: what it exits with when a
full filesystem (a real tmpfs) left received spans unwritten."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import httpx
import pytest

from nemo_telemetry.analysis import IncompleteDatasetWarning, read_spans
from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf

PROTOBUF = {"Content-Type": "application/x-protobuf"}


def _start_monitor(out, *options: str) -> tuple[subprocess.Popen, str]:
    """A ``nemo-telemetry monitor --port 0`` process and its traces URL (read from its first line)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    command = [sys.executable, "-c", "from nemo_telemetry.cli.app import main; main()",
               "monitor", "--port", "0", "--out", str(out), "--format", "json", *options]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
    line = proc.stderr.readline()
    match = re.search(r"(https?://\S+/v1/traces)", line)
    assert match, line + proc.stderr.read()
    return proc, match.group(1)


def test_monitor_port_stopped_with_spans_unwritten_exits_2_with_the_reason(small_filesystem):
    requests = [to_protobuf(r) for r in synthetic_requests(40, spans_per_request=20, ranks=1)]
    proc, url = _start_monitor(small_filesystem.root / "ds")
    try:
        assert httpx.post(url, content=requests[0], headers=PROTOBUF).status_code == 200
        small_filesystem.fill()
        response = httpx.post(url, content=requests[1], headers=PROTOBUF)
        assert (response.status_code, response.headers["retry-after"]) == (503, "1")
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 2, stderr
    message = " ".join(stderr.split())
    assert "20 received spans were not written" in message and "No space left on device" in message
    small_filesystem.free()
    with pytest.warns(IncompleteDatasetWarning, match="did not finish"):  # its last writer could not close
        assert read_spans(small_filesystem.root / "ds").num_rows == 20


def test_monitor_port_with_every_span_written_exits_0(tmp_path):
    proc, url = _start_monitor(tmp_path / "ds")
    try:
        body = to_protobuf(next(synthetic_requests(20, spans_per_request=20, ranks=1)))
        assert httpx.post(url, content=body, headers=PROTOBUF).status_code == 200
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert read_spans(tmp_path / "ds").num_rows == 20
