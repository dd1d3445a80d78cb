"""``nemo-telemetry ingest`` and ``collect`` through the CLI: output, exit codes, signals."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import httpx
from typer.testing import CliRunner

from nemo_telemetry.analysis import read_spans
from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf, write_json_lines
from nemo_telemetry.cli.app import app

runner = CliRunner()


def _dump(tmp_path, spans=55):
    return write_json_lines(tmp_path / "traces.jsonl", synthetic_requests(spans, spans_per_request=11, ranks=1))


def test_ingest_prints_a_summary(tmp_path):
    result = runner.invoke(app, ["ingest", str(_dump(tmp_path)), "--out", str(tmp_path / "ds")])
    assert result.exit_code == 0, result.output
    assert re.search(r"spans\s+│\s+55", result.stdout)
    assert re.search(r"runs\s+│\s+1", result.stdout)
    assert read_spans(tmp_path / "ds").num_rows == 55


def test_ingest_json_summary_and_warnings(tmp_path):
    path = _dump(tmp_path)
    path.write_bytes(b"garbage\n" + path.read_bytes())
    result = runner.invoke(app, ["ingest", str(path), "--out", str(tmp_path / "ds"), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["spans"], summary["rejected_records"]) == (55, 1)
    assert summary["warnings"][0].startswith(f"{path}:1: malformed JSON line")


def test_ingest_shows_rejected_records_on_stderr(tmp_path):
    path = _dump(tmp_path)
    path.write_bytes(path.read_bytes()[:-30])
    result = runner.invoke(app, ["ingest", str(path), "--out", str(tmp_path / "ds")])
    assert result.exit_code == 0
    assert f"{path}:5: truncated" in result.stderr.replace("\n", "")


def test_ingest_quiet_prints_nothing(tmp_path):
    result = runner.invoke(app, ["ingest", str(_dump(tmp_path)), "--out", str(tmp_path / "ds"), "--quiet"])
    assert (result.exit_code, result.stdout) == (0, "")


def test_ingest_of_a_file_that_is_not_otlp_exits_2_naming_it(tmp_path):
    path = tmp_path / "notes.csv"
    path.write_text("a,b\n1,2\n")
    result = runner.invoke(app, ["ingest", str(path), "--out", str(tmp_path / "ds")])
    assert result.exit_code == 2
    message = " ".join(result.stderr.split())
    assert "notes.csv" in message and "not an OTLP dump" in message and "length-prefixed protobuf" in message


def test_ingest_help_has_an_example():
    result = runner.invoke(app, ["ingest", "--help"])
    assert result.exit_code == 0 and "nemo-telemetry ingest" in result.stdout


def test_collect_stops_cleanly_on_sigint_and_keeps_what_it_acknowledged(tmp_path):
    request = next(synthetic_requests(11, ranks=1))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    entry_point = "from nemo_telemetry.cli.app import main; main()"
    command = [sys.executable, "-c", entry_point, "collect", "--out", str(tmp_path / "ds"), "--port", "0"]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
    try:
        line = proc.stderr.readline()
        url = re.search(r"(http://\S+/v1/traces)", line).group(1)
        response = httpx.post(url, content=to_protobuf(request), headers={"Content-Type": "application/x-protobuf"})
        assert response.status_code == 200
        proc.send_signal(signal.SIGINT)
        stdout, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert re.search(r"spans\s+│\s+11", stdout)
    assert read_spans(tmp_path / "ds").num_rows == 11


def test_collect_on_a_busy_port_exits_2(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = runner.invoke(app, ["collect", "--out", str(tmp_path / "ds"), "--port", str(port)])
    assert result.exit_code == 2
    assert "choose another --port" in " ".join(result.stderr.split())
