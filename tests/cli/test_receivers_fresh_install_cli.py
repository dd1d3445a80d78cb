"""A fresh install (an empty kernel cache, as after a plain ``pip install``): ``collect`` and
``monitor --port`` serve while the kernels compile, the real SDK exporter's spans are all stored,
and SIGINT / SIGTERM stop them cleanly at any moment of start-up, compile or serving. Real
processes, real signals; the compile is a real numba compile into a temporary cache."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult

from nemo_telemetry.analysis import read_spans

RECEIVERS = {
    "collect": ["collect"],
    "monitor": ["monitor", "--format", "json"],
}


def _fresh_env(cache: Path) -> dict[str, str]:
    """A user's environment on a fresh install: the compiled paths on ``auto``, an empty cache."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200", "NEMO_TELEMETRY_KERNEL_CACHE_DIR": str(cache)}
    env.pop("NEMO_TELEMETRY_COMPILED", None)
    return env


def _start(receiver: str, out: Path, cache: Path, port: int = 0) -> subprocess.Popen:
    command = [sys.executable, "-c", "from nemo_telemetry.cli.app import main; main()", *RECEIVERS[receiver],
               "--out", str(out), "--port", str(port)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_fresh_env(cache), text=True)


def _traces_url(proc: subprocess.Popen) -> str:
    line = proc.stderr.readline()
    match = re.search(r"(http://\S+/v1/traces)", line)
    assert match, line + proc.stderr.read()
    return match.group(1)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return children


def _compiling_child(pid: int, wait_s: float = 10.0) -> int | None:
    """The child compiling the kernels (started just after the receiver listens)."""
    deadline = time.monotonic() + wait_s
    while True:
        for child in _children(pid):
            try:
                if b"load_kernels" in Path(f"/proc/{child}/cmdline").read_bytes() and _alive(child):
                    return child
            except OSError:
                continue
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class _RecordingExporter(OTLPSpanExporter):
    """The real SDK exporter; remembers the ids of every batch the receiver answered 200."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(endpoint=endpoint)  # the SDK's own timeout (10 s), retries included
        self.acknowledged: set[tuple[str, str]] = set()
        self.failed = 0

    def export(self, spans):
        result = super().export(spans)
        if result is SpanExportResult.SUCCESS:
            self.acknowledged |= {(f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}") for s in spans}
        else:
            self.failed += len(spans)
        return result


@pytest.mark.parametrize("receiver", sorted(RECEIVERS))
def test_an_empty_kernel_cache_serves_at_once_stores_every_span_and_sigint_during_the_compile_stops_it(
        tmp_path, receiver):
    cache, out = tmp_path / "kernels", tmp_path / "ds"
    cache.mkdir()
    port = _free_port()
    proc = _start(receiver, out, cache, port)
    try:
        # The trainer starts with the receiver: its first batch meets a port not yet open, and the
        # SDK's retries (within its 10 s timeout) must find it listening, not compiling.
        exporter = _RecordingExporter(f"http://127.0.0.1:{port}/v1/traces")
        provider = TracerProvider(resource=Resource.create({"service.name": "trainer", "nemo.run.id": "fresh"}))
        provider.add_span_processor(BatchSpanProcessor(exporter, max_export_batch_size=256, schedule_delay_millis=20))
        tracer = provider.get_tracer("test")
        for step in range(1000):
            with tracer.start_as_current_span("rl.grpo.step", attributes={"rl.iteration": step}):
                with tracer.start_as_current_span("rl.generation.generate", attributes={"rl.bucket": "productive"}):
                    pass
        assert provider.force_flush(60_000)
        provider.shutdown()
        assert f":{port}/v1/traces" in _traces_url(proc)
        compiler = _compiling_child(proc.pid, wait_s=0)
        assert compiler is not None, "no kernel compile in flight: the cache was not empty, or it ended already"
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
        stopped_in = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert stopped_in < 10, stopped_in  # promptly: the compile is killed, not waited for
    assert not _alive(compiler)
    assert "Traceback" not in stderr
    assert (len(exporter.acknowledged), exporter.failed) == (2000, 0)
    spans = read_spans(out)
    stored = set(zip(spans.column("trace_id").to_pylist(), spans.column("span_id").to_pylist()))
    assert exporter.acknowledged == stored


def _signals_caught(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return int(line.split()[1], 16)
    return 0


def _wait_for_the_command(proc: subprocess.Popen, began: float) -> None:
    """Until the command runs: it catches SIGTERM from its first line (the interpreter does not),
    seconds after the process starts, not once a compile is done."""
    while not _signals_caught(proc.pid) & (1 << (signal.SIGTERM - 1)):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - began < 15, "SIGTERM is not caught 15 s after the start"
        time.sleep(0.005)


@pytest.mark.parametrize("receiver", sorted(RECEIVERS))
@pytest.mark.parametrize(("sig", "after_s"), [(signal.SIGTERM, 0.0), (signal.SIGINT, 0.3), (signal.SIGTERM, 1.0),
                                               (signal.SIGINT, 2.5)],
                         ids=["sigterm-at-once", "sigint-0.3s", "sigterm-1s", "sigint-2.5s"])
def test_a_signal_at_any_moment_of_start_up_stops_it_cleanly(tmp_path, receiver, sig, after_s):
    cache, out = tmp_path / "kernels", tmp_path / "ds"
    cache.mkdir()
    began = time.monotonic()
    proc = _start(receiver, out, cache)
    try:
        _wait_for_the_command(proc, began)
        time.sleep(after_s)  # loading the analysis, opening the dataset, binding, compiling
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr and "Aborted" not in stderr
