"""``collect`` and ``monitor --port`` offered beyond loopback, as a user runs them: a non-loopback
``--host`` without ``--token-file`` is refused (exit 2, saying what to give) unless ``--insecure``,
a token file or TLS files that cannot be used are refused naming them, and the guarded receiver
takes a request that carries the token."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import httpx
import pytest
from typer.testing import CliRunner

from nemo_telemetry.analysis import read_spans
from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf
from nemo_telemetry.cli.app import app

runner = CliRunner()
RECEIVERS = {"collect": ["collect"], "monitor": ["monitor", "--format", "json"]}


@pytest.mark.parametrize("receiver", sorted(RECEIVERS))
@pytest.mark.parametrize("host", ["0.0.0.0", "", "::"])
def test_a_host_beyond_loopback_without_a_token_exits_2_saying_what_to_give(tmp_path, receiver, host):
    result = runner.invoke(app, [*RECEIVERS[receiver], "--out", str(tmp_path / "ds"), "--port", "0", "--host", host])
    assert result.exit_code == 2
    message = " ".join(result.stderr.split())
    assert "refusing to listen" in message and "--token-file" in message and "--insecure" in message
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize("receiver", sorted(RECEIVERS))
def test_unusable_token_or_tls_files_exit_2_naming_them(tmp_path, receiver):
    empty = tmp_path / "empty-token"
    empty.write_text("\n")
    base = [*RECEIVERS[receiver], "--out", str(tmp_path / "ds"), "--port", "0"]
    for options, words in ((["--token-file", str(empty)], [str(empty), "empty"]),
                           (["--token-file", str(tmp_path / "missing")], ["missing", "cannot read"]),
                           (["--tls-cert", str(empty)], ["--tls-cert and --tls-key together"]),
                           (["--tls-cert", str(empty), "--tls-key", str(empty)], ["cannot load", str(empty)])):
        result = runner.invoke(app, [*base, *options])
        assert result.exit_code == 2, (options, result.output)
        message = " ".join(result.stderr.split())
        assert all(word in message for word in words), (options, message)


def test_monitor_follow_with_a_token_file_is_bad_usage(tmp_path):
    token = tmp_path / "token"
    token.write_text("abc\n")
    result = runner.invoke(app, ["monitor", "--follow", str(tmp_path), "--token-file", str(token)])
    assert result.exit_code == 2
    assert "use them with --port" in " ".join(result.stderr.split())


def _span_count(request: dict) -> int:
    return sum(len(scope["spans"]) for resource in request["resourceSpans"] for scope in resource["scopeSpans"])


def _start(receiver: str, out, *options: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    command = [sys.executable, "-c", "from nemo_telemetry.cli.app import main; main()", *RECEIVERS[receiver],
               "--out", str(out), "--port", "0", *options]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    first = proc.stderr.readline()
    match = re.search(r"(https?://\S+/v1/traces)", first)
    assert match, first + proc.stderr.read()
    return proc, match.group(1)


@pytest.mark.parametrize("receiver", sorted(RECEIVERS))
def test_insecure_listens_beyond_loopback_with_a_warning(tmp_path, receiver):
    proc, url = _start(receiver, tmp_path / "ds", "--host", "0.0.0.0", "--insecure")
    try:
        warning = proc.stderr.readline()
        assert url.startswith("http://0.0.0.0:")
        assert "--insecure: anyone who reaches" in warning
        local = url.replace("0.0.0.0", "127.0.0.1")
        request = next(synthetic_requests(5, ranks=1))
        body = to_protobuf(request)
        assert httpx.post(local, content=body, headers={"Content-Type": "application/x-protobuf"}).status_code == 200
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert read_spans(tmp_path / "ds").num_rows == _span_count(request)


@pytest.mark.parametrize("receiver", sorted(RECEIVERS))
def test_a_token_file_guards_the_receiver_beyond_loopback(tmp_path, receiver):
    token = tmp_path / "token"
    token.write_text("0123456789abcdef0123456789abcdef\n")
    proc, url = _start(receiver, tmp_path / "ds", "--host", "0.0.0.0", "--token-file", str(token))
    try:
        local = url.replace("0.0.0.0", "127.0.0.1")
        request = next(synthetic_requests(5, ranks=1))
        body = to_protobuf(request)
        headers = {"Content-Type": "application/x-protobuf"}
        assert httpx.post(local, content=body, headers=headers).status_code == 401
        authorized = {**headers, "Authorization": "Bearer 0123456789abcdef0123456789abcdef"}
        assert httpx.post(local, content=body, headers=authorized).status_code == 200
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert "--insecure" not in stderr
    assert read_spans(tmp_path / "ds").num_rows == _span_count(request)
