"""``ingest --engine ray`` finishes or fails when a decode worker dies: real kill -9 (and SIGSTOP)
of the worker process running a file's decode task, on the suite's one Ray cluster.

A decode task's process is found by its title (Ray names a worker ``ray::_decode_file`` while it
runs that task, and renames it when the task ends) among this test process's descendants only, so
no other Ray cluster on the machine is touched. It is stopped first and its title read again: a
worker killed while stopped under that title was killed in the middle of its task.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nemo_telemetry.analysis.ingestion.ingest import ingest, read_spans
from nemo_telemetry.analysis.synthetic import synthetic_requests, write_json_lines
from nemo_telemetry.cli.app import app
from nemo_telemetry.errors import IncompleteDatasetWarning, IngestError

pytestmark = pytest.mark.slow

_TITLE = b"ray::_decode_file"


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as stat:
        return int(stat.read().rsplit(b")", 1)[1].split()[1])


def _descends_from_us(pid: int) -> bool:
    ours = os.getpid()
    try:
        while pid > 1:
            pid = _parent(pid)
            if pid == ours:
                return True
    except (OSError, ValueError, IndexError):
        return False
    return False


def decode_workers(title: bytes = _TITLE) -> list[int]:
    """Pids of this cluster's worker processes running a decode task (a task whose title starts
    with ``title``) now."""
    found, prefix = [], title
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                title = cmdline.read()
        except OSError:
            continue
        if title.startswith(prefix) and _descends_from_us(int(entry)):
            found.append(int(entry))
    return found


def _title(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read()
    except OSError:
        return b""


class DecodeWorkerSignaller(threading.Thread):
    """Sends ``signum`` to up to ``limit`` decode workers, each caught in the middle of its task."""

    def __init__(self, signum: int, limit: int | None = None, title: bytes = _TITLE) -> None:
        super().__init__(daemon=True)
        self.signum, self.limit, self.title = signum, limit, title
        self.hit: list[int] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set() and (self.limit is None or len(self.hit) < self.limit):
            for pid in decode_workers(self.title):
                if pid in self.hit or (self.limit is not None and len(self.hit) >= self.limit):
                    continue
                os.kill(pid, signal.SIGSTOP)
                if _title(pid).startswith(self.title):  # still in its task, and it cannot leave it now
                    if self.signum != signal.SIGSTOP:
                        os.kill(pid, self.signum)
                    self.hit.append(pid)
                else:
                    os.kill(pid, signal.SIGCONT)
            time.sleep(0.002)

    def __enter__(self) -> "DecodeWorkerSignaller":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.join()


def _gone(pid: int, timeout_s: float = 30.0) -> bool:
    """Whether ``pid`` exited (or is a zombie) within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                if stat.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    return True
        except OSError:
            return True
        time.sleep(0.01)
    return False


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> Path:
    """Four JSON-lines files of 3,000 spans each: twelve batches of 250 spans per file."""
    folder = tmp_path_factory.mktemp("kill-dumps")
    requests = list(synthetic_requests(12_000, spans_per_request=100, ranks=4))
    for i in range(4):
        write_json_lines(folder / f"traces-{i}.jsonl", requests[i::4])
    return folder


@pytest.fixture(scope="module")
def local(dumps, tmp_path_factory):
    """The local engine's ingest of ``dumps``: its summary and spans."""
    out = tmp_path_factory.mktemp("kill-local") / "ds"
    return ingest(dumps, out=out), _sorted(out)


def _sorted(root: Path) -> list[dict]:
    return read_spans(root).sort_by([("trace_id", "ascending"), ("span_id", "ascending")]).to_pylist()


def test_a_killed_decode_worker_is_decoded_again_and_the_dataset_is_exact(ray_cluster, dumps, local, tmp_path):
    from nemo_telemetry.analysis.engines.ray_engine import ray_ingest

    with DecodeWorkerSignaller(signal.SIGKILL, limit=2) as killer:
        summary = ray_ingest(dumps, out=tmp_path / "ds")
    assert killer.hit and all(_gone(pid) for pid in killer.hit)
    expected_summary, expected_spans = local
    assert expected_summary.spans >= 12_000
    assert summary == expected_summary  # no span lost, none twice: duplicates_dropped stays 0
    assert _sorted(tmp_path / "ds") == expected_spans


def test_a_file_whose_workers_keep_dying_fails_typed_and_the_dataset_stays_as_committed(ray_cluster, dumps, local,
                                                                                      tmp_path):
    from nemo_telemetry.analysis.engines.ray_engine import TASK_ATTEMPTS, ray_ingest

    out = tmp_path / "ds"
    first = ingest(dumps / "traces-3.jsonl", out=out)  # committed before the failing ingest
    committed = _sorted(out)
    with DecodeWorkerSignaller(signal.SIGKILL) as killer:
        with pytest.raises(IngestError, match=f"traces-0.jsonl: the Ray task decoding it failed {TASK_ATTEMPTS} "
                                              "times, its worker or node lost each time"):
            ray_ingest(dumps, out=out)
    assert len(killer.hit) >= TASK_ATTEMPTS
    with pytest.warns(IncompleteDatasetWarning, match="incomplete"):
        assert _sorted(out) == committed and len(committed) == first.spans
    ray_ingest(dumps, out=out)  # re-running it completes it, each span once
    with warnings.catch_warnings():
        warnings.simplefilter("error", IncompleteDatasetWarning)
        assert _sorted(out) == local[1]


def test_a_stopped_decode_worker_is_given_up_after_the_stall_timeout(ray_cluster, dumps, tmp_path):
    """A task that never sends again (its worker stopped, as a hung one would be) ends the ingest
    within the bound, naming the file, instead of waiting forever."""
    from nemo_telemetry.analysis.engines.ray_engine import ray_ingest

    ray_ingest(dumps, out=tmp_path / "warm")  # workers started: the bound is not spent starting them
    started = time.monotonic()
    with DecodeWorkerSignaller(signal.SIGSTOP) as stopper:
        try:
            with pytest.raises(IngestError, match=r"traces-\d.jsonl: the Ray task decoding it sent nothing for 15 s"):
                ray_ingest(dumps, out=tmp_path / "ds", stall_timeout_s=15)
        finally:
            stopper.done.set()
            for pid in stopper.hit:  # the cluster's CPUs back for the tests after this one
                os.kill(pid, signal.SIGKILL)
    assert time.monotonic() - started < 60
    assert stopper.hit and all(_gone(pid) for pid in stopper.hit)


def test_cli_ingest_on_ray_exits_2_naming_the_file_when_its_workers_keep_dying(ray_cluster, dumps, tmp_path):
    """Through the CLI (on the Ray cluster this process is connected to)."""
    with DecodeWorkerSignaller(signal.SIGKILL) as killer:
        result = CliRunner().invoke(app, ["ingest", str(dumps), "--out", str(tmp_path / "ds"), "--engine", "ray",
                                          "--json"])
    assert result.exit_code == 2, result.output
    assert "traces-0.jsonl: the Ray task decoding it failed" in result.stderr
    assert "Traceback" not in result.output
    assert killer.hit


def test_cli_ingest_on_ray_gives_up_a_stopped_worker_after_stall_timeout_s(ray_cluster, dumps, tmp_path):
    from nemo_telemetry.analysis.engines.ray_engine import ray_ingest

    ray_ingest(dumps, out=tmp_path / "warm")  # workers started: the bound is not spent starting them
    with DecodeWorkerSignaller(signal.SIGSTOP) as stopper:
        try:
            result = CliRunner().invoke(app, ["ingest", str(dumps), "--out", str(tmp_path / "ds"), "--engine", "ray",
                                              "--stall-timeout-s", "15"])
        finally:
            stopper.done.set()
            for pid in stopper.hit:
                os.kill(pid, signal.SIGKILL)
    assert result.exit_code == 2, result.output
    assert "the Ray task decoding it sent nothing for 15 s" in "".join(result.stderr.split("\n"))
    assert stopper.hit


def test_cli_ingest_refuses_a_stall_timeout_that_is_not_positive(tmp_path):
    result = CliRunner().invoke(app, ["ingest", str(tmp_path), "--out", str(tmp_path / "ds"), "--engine", "ray",
                                      "--stall-timeout-s", "0"])
    assert result.exit_code == 2 and "--stall-timeout-s must be positive" in result.stderr


def test_a_cluster_that_cannot_be_joined_is_exit_2_not_a_traceback(dumps, tmp_path):
    """A fresh process (this one may be connected already): ``RAY_ADDRESS`` that is no address."""
    import subprocess
    import sys

    code = "import sys; from nemo_telemetry.cli.app import app; sys.argv[0] = 'nemo-telemetry'; app()"
    environ = {**os.environ, "RAY_ADDRESS": "not-an-address"}
    done = subprocess.run([sys.executable, "-c", code, "ingest", str(dumps), "--out", str(tmp_path / "ds"),
                           "--engine", "ray", "--json"], capture_output=True, text=True, timeout=120, env=environ)
    assert done.returncode == 2, done.stderr
    assert "--engine ray could not start or join the Ray cluster at RAY_ADDRESS=not-an-address" in done.stderr
    assert "Traceback" not in done.stderr


def test_cli_ingest_on_ray_with_a_killed_worker_prints_the_summary_alone_on_stdout(ray_cluster, dumps, local, tmp_path):
    """Ray prints its raylet's note about the dead worker on stdout; ``--json`` stays one document."""
    with DecodeWorkerSignaller(signal.SIGKILL, limit=1) as killer:
        result = CliRunner().invoke(app, ["ingest", str(dumps), "--out", str(tmp_path / "ds"), "--engine", "ray",
                                          "--json"])
    assert result.exit_code == 0, result.output
    assert killer.hit
    expected = local[0]
    assert json.loads(result.stdout) == {name: list(v) if isinstance(v, tuple) else v
                                         for name, v in vars(expected).items()}
    assert _sorted(tmp_path / "ds") == local[1]


@pytest.mark.parametrize("command", ["goodput", "check"])
def test_cli_goodput_and_check_on_ray_with_a_killed_worker_print_the_document_alone_on_stdout(
        ray_cluster, dumps, local, tmp_path, command):
    """A task of goodput's or check's (``ray::_scan_group``, ``ray::_partials_by_step`` ...) killed in
    the middle: Ray runs it again, and its raylet's note about the dead worker goes to stderr, so
    ``--format json`` parses and equals the local engine's document."""
    root = tmp_path / "ds"
    ingest(dumps, out=root)
    runner = CliRunner()
    args = [command, str(root), "--format", "json", *(["--fail-on", "never"] if command == "check" else [])]
    expected = runner.invoke(app, args)
    assert expected.exit_code == 0, expected.output
    for _ in range(5):  # the tasks are short: until one is caught in the middle
        with DecodeWorkerSignaller(signal.SIGKILL, limit=1, title=b"ray::_") as killer:
            result = runner.invoke(app, [*args, "--engine", "ray"])
        if killer.hit:
            break
    assert killer.hit and all(_gone(pid) for pid in killer.hit)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == json.loads(expected.stdout)
