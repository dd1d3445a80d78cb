"""One writer at a time on a dataset: two real ``ingest`` processes at once, ``collect`` and
``ingest`` of the same spans, a ``kill -9`` of the writer holding the lock; the second writer gets
exit 2 and a message naming the holder, and no span is ever stored twice. ``repair`` removes the
repeats a dataset written without the lock holds, to the clean dataset's goodput."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from nemo_telemetry.analysis import (DatasetLockedError, goodput_with_engine, ingest, load_traces, read_events,
                                     read_links, read_spans, repair_dataset, verify_dataset)
from nemo_telemetry.analysis.model.tables import OtlpTables
from nemo_telemetry.analysis.store import dataset
from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf, write_length_prefixed
from nemo_telemetry.cli.app import app

CLI = [sys.executable, "-c", "from nemo_telemetry.cli.app import main; main()"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "300"}
runner = CliRunner()


@pytest.fixture(scope="module")
def dump(tmp_path_factory) -> Path:
    """200,000 spans of four ranks: an ingest that takes long enough for a second to meet it."""
    folder = tmp_path_factory.mktemp("dump")
    return write_length_prefixed(folder / "traces.pb", (to_protobuf(r) for r in synthetic_requests(200_000, ranks=4)))


def _ids(table) -> list:
    return list(zip(table.column("trace_id").to_pylist(), table.column("span_id").to_pylist()))


def _each_once(root: Path) -> int:
    ids = _ids(read_spans(root))
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} spans stored twice"
    return len(ids)


def _refused(stderr: str, holder_pid: int | None = None) -> None:
    line = " ".join(stderr.split())
    assert "another writer holds this dataset" in line and "Traceback" not in stderr, stderr
    assert re.search(r"pid \d+ on host \S+ \(.*\), since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", line), line
    if holder_pid is not None:
        assert f"pid {holder_pid} " in line, line


def test_two_ingest_processes_at_once_store_each_span_once(dump, tmp_path):
    root = tmp_path / "ds"
    procs = [subprocess.Popen([*CLI, "ingest", str(dump), "--out", str(root), "--quiet"], env=ENV,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes in ([0, 0], [0, 2]), results
    for code, stderr in results:
        if code == 2:
            _refused(stderr)
            assert "ingest" in stderr
    expected = load_traces(dump).spans.num_rows
    assert _each_once(root) == expected
    again = runner.invoke(app, ["ingest", str(dump), "--out", str(root), "--json"])  # the refused one, run again
    assert again.exit_code == 0, again.output
    assert _each_once(root) == expected  # exactly once, through the commit record


def test_a_second_writer_in_the_same_process_is_refused_by_name(tmp_path):
    root = tmp_path / "ds"
    first = dataset.DatasetWriter(root)
    try:
        with pytest.raises(DatasetLockedError) as raised:
            dataset.DatasetWriter(root)
        assert raised.value.holder["pid"] == os.getpid() and raised.value.holder["host"] == socket.gethostname()
        with pytest.raises(DatasetLockedError):
            repair_dataset(root)
    finally:
        first.close()
    dataset.DatasetWriter(root).close()  # released by close


def _start_collect(out: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([*CLI, "collect", "--out", str(out), "--port", "0"], env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = proc.stderr.readline()
    match = re.search(r"(http://\S+/v1/traces)", line)
    assert match, line + proc.stderr.read()
    return proc, match.group(1)


def test_collect_and_ingest_of_the_same_spans_store_each_once(tmp_path):
    dump = write_length_prefixed(tmp_path / "traces.pb", [to_protobuf(r) for r in synthetic_requests(
        2_200, spans_per_request=110, ranks=2, seed=3)])
    root = tmp_path / "ds"
    proc, url = _start_collect(root)
    try:
        for request in synthetic_requests(2_200, spans_per_request=110, ranks=2, seed=3):
            assert httpx.post(url, content=to_protobuf(request),
                              headers={"Content-Type": "application/x-protobuf"}).status_code == 200
        refused = subprocess.run([*CLI, "ingest", str(dump), "--out", str(root)], env=ENV, capture_output=True,
                                 text=True, timeout=300)
        assert refused.returncode == 2, refused.stderr
        _refused(refused.stderr, proc.pid)
        assert "collect" in refused.stderr
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
    assert proc.returncode == 0
    assert runner.invoke(app, ["ingest", str(dump), "--out", str(root), "--quiet"]).exit_code == 0
    assert _each_once(root) == load_traces(dump).spans.num_rows


def test_kill_9_of_the_writer_holding_the_lock_lets_the_next_writer_in(tmp_path):
    dump = write_length_prefixed(tmp_path / "traces.pb", [to_protobuf(r) for r in synthetic_requests(
        1_100, spans_per_request=110, ranks=2, seed=4)])
    root = tmp_path / "ds"
    proc, _ = _start_collect(root)
    try:
        held = subprocess.run([*CLI, "ingest", str(dump), "--out", str(root)], env=ENV, capture_output=True,
                              text=True, timeout=300)
        assert held.returncode == 2, held.stderr
        _refused(held.stderr, proc.pid)
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    after = subprocess.run([*CLI, "ingest", str(dump), "--out", str(root), "--quiet"], env=ENV, capture_output=True,
                           text=True, timeout=300)
    assert after.returncode == 0, after.stderr
    assert _each_once(root) == load_traces(dump).spans.num_rows


def _goodput(root: Path) -> list:
    return [(r.run_id, r.steps.to_pylist(), r.total) for r in goodput_with_engine(root)]


def test_repair_of_a_dataset_holding_every_span_twice_gives_the_clean_goodput(tmp_path):
    """Two writers that both opened before either committed (what two ingests did without the
    lock: the second was handed the first's lock here) store everything twice; repair keeps each once."""
    dump = write_length_prefixed(tmp_path / "traces.pb", [to_protobuf(r) for r in synthetic_requests(
        5_500, spans_per_request=110, ranks=4, seed=6)])
    clean = tmp_path / "clean"
    ingest([dump], out=clean)
    traces = load_traces(dump)
    tables = OtlpTables(traces.spans, traces.events, traces.links)
    root = tmp_path / "twice"
    first = dataset.DatasetWriter(root)
    second = dataset.DatasetWriter(root, lock=first._dataset_lock)
    for writer in (first, second):
        writer.write(tables)
    first.close()
    second.close()
    spans = traces.spans.num_rows
    assert read_spans(root).num_rows == 2 * spans and _goodput(root) != _goodput(clean)
    assert verify_dataset(root).duplicate_spans == spans
    verified = runner.invoke(app, ["verify", str(root)])
    assert verified.exit_code == 1 and f"{spans} span(s) stored more than once" in verified.output

    result = runner.invoke(app, ["repair", str(root), "--json"])
    assert result.exit_code == 0, result.output
    assert '"duplicates_removed": %d' % spans in result.output
    assert _each_once(root) == spans
    assert _goodput(root) == _goodput(clean)
    assert sorted(_ids(read_spans(root))) == sorted(_ids(read_spans(clean)))
    for read in (read_events, read_links):
        assert read(root).num_rows == read(clean).num_rows
    assert runner.invoke(app, ["verify", str(root)]).exit_code == 0
    again = runner.invoke(app, ["repair", str(root)])
    assert again.exit_code == 0 and "nothing changed" in again.output
    assert runner.invoke(app, ["ingest", str(dump), "--out", str(root), "--quiet"]).exit_code == 0
    assert _each_once(root) == spans  # the repaired dataset still deduplicates a re-ingest


@pytest.mark.parametrize("link", ["spans/run_id=synthetic-run", "spans"])
def test_a_folder_of_the_dataset_linked_outside_it_is_refused_and_nothing_written_there(tmp_path, link):
    dump = write_length_prefixed(tmp_path / "traces.pb", [to_protobuf(r) for r in synthetic_requests(
        550, spans_per_request=55, ranks=2, seed=8)])
    root, outside = tmp_path / "ds", tmp_path / "elsewhere"
    outside.mkdir()
    (root / link).parent.mkdir(parents=True, exist_ok=True)
    (root / link).symlink_to(outside, target_is_directory=True)
    result = runner.invoke(app, ["ingest", str(dump), "--out", str(root)])
    assert result.exit_code == 2, result.output
    error = " ".join(result.stderr.split())
    assert f"leads to {outside}" in error and "outside the dataset" in error and "remove the link" in error, error
    assert not list(outside.rglob("*")), "ingest wrote outside the dataset"


@pytest.mark.parametrize("command", [["collect", "--port", "0"], ["monitor", "--port", "0", "--until-idle", "0.1"],
                                     ["repair"]])
def test_every_writer_is_refused_while_another_holds_the_dataset(tmp_path, command):
    root = tmp_path / "ds"
    holder = dataset.DatasetWriter(root)
    try:
        args = [command[0], str(root)] if command == ["repair"] else [*command, "--out", str(root)]
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        _refused(result.stderr, os.getpid())
    finally:
        holder.close()


def test_a_repair_that_fails_before_its_record_leaves_the_dataset_as_it_was(tmp_path, monkeypatch):
    """With a test double for the record's rename (a full disk): the repair's error comes out, the
    dataset reads as before it (its rewritten files staged only, removed by the next writer), and
    the repair run again succeeds."""
    import errno

    from nemo_telemetry.analysis.store import commits

    dump = write_length_prefixed(tmp_path / "traces.pb", [to_protobuf(r) for r in synthetic_requests(
        1_100, spans_per_request=110, ranks=2, seed=9)])
    traces = load_traces(dump)
    tables = OtlpTables(traces.spans, traces.events, traces.links)
    root = tmp_path / "twice"
    first = dataset.DatasetWriter(root)
    second = dataset.DatasetWriter(root, lock=first._dataset_lock)
    for writer in (first, second):
        writer.write(tables)
    first.close()
    second.close()
    before = sorted(_ids(read_spans(root)))
    real = commits.publish_record

    def disk_full(tmp, final):
        tmp.unlink()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(final))

    monkeypatch.setattr(commits, "publish_record", disk_full)
    result = runner.invoke(app, ["repair", str(root)])
    assert result.exit_code == 2 and "No space left on device" in result.stderr, result.output
    monkeypatch.setattr(commits, "publish_record", real)
    assert sorted(_ids(read_spans(root))) == before and verify_dataset(root).duplicate_spans == traces.spans.num_rows
    assert runner.invoke(app, ["repair", str(root)]).exit_code == 0
    assert _each_once(root) == traces.spans.num_rows
    assert not [p for p in (root / "_staging").rglob("*") if p.is_file()]
