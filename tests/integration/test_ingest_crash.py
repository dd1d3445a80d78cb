"""``kill -9`` of a real ``nemo-telemetry ingest`` of a million spans, and ingest on a full disk:
every reader then reads exactly what was committed before, with a warning that the dataset is
incomplete naming the command that finishes it (or, killed after its final commit, the whole
data without one); that command then completes the dataset, each span once, no leftovers."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nemo_telemetry.analysis import (IncompleteDatasetWarning, ingest, load_traces, read_events, read_links,
                                     read_spans)
from nemo_telemetry.analysis.ingestion.read import read_for_analysis
from nemo_telemetry.analysis.store.commits import COMMITS
from nemo_telemetry.analysis.ingestion.metrics import metrics_for_source
from nemo_telemetry.analysis.goodput.partials import stream_goodput
from nemo_telemetry.analysis.engines.partitioned_check import stream_check
from nemo_telemetry.analysis.engines.choose import check_with_engine, goodput_with_engine
from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf, write_length_prefixed
from nemo_telemetry.cli.app import app

MILLION = 1_000_000
CLI = [sys.executable, "-c", "from nemo_telemetry.cli.app import main; main()"]
runner = CliRunner()


@pytest.fixture(scope="session")
def million_spans(tmp_path_factory) -> Path:
    """A million spans (and the few more that finish the last step) of eight ranks as
    length-prefixed protobuf (about 150 MB), made once per session."""
    path = tmp_path_factory.mktemp("million") / "traces.pb"
    return write_length_prefixed(path, (to_protobuf(r) for r in synthetic_requests(MILLION, ranks=8)))


SPANS = -(-MILLION // 11) * 11  # synthetic steps are 11 spans: the last one is finished


@pytest.fixture(scope="module")
def committed(tmp_path_factory) -> Path:
    """A dataset with one finished ingest (another run), the state every crash must fall back to."""
    folder = tmp_path_factory.mktemp("committed")
    first = write_length_prefixed(folder / "first.pb", [to_protobuf(r) for r in synthetic_requests(
        2_200, spans_per_request=110, ranks=2, run_id="earlier-run", seed=11)])
    ingest([first], out=folder / "ds")
    return folder / "ds"


def _readers(root: Path) -> dict:
    """What each reader returns, in a form to compare (ids as sets: readers need not agree on order)."""
    def ids(table):
        return set(zip(table.column("trace_id").to_pylist(), table.column("span_id").to_pylist()))

    return {
        "read_spans": ids(read_spans(root)),
        "read_events": read_events(root).num_rows,
        "read_links": read_links(root).num_rows,
        "load_traces": ids(load_traces(root).spans),
        "read_for_analysis": read_for_analysis(root).num_rows,
        "metrics": metrics_for_source(root) is None,
        "stream_goodput": [(r.run_id, r.steps.num_rows, r.total["wall_s"]) for r in stream_goodput(root)],
        "stream_check": stream_check(root).to_dict()["counts"],
        # the local engine's batch-by-batch reads (goodput's rows and walk columns, check's decode)
        "local_goodput": [(r.run_id, r.steps.num_rows, r.total["wall_s"]) for r in goodput_with_engine(root)],
        "local_check": check_with_engine(root).to_dict()["counts"],
    }


def _read_all(root: Path) -> tuple[dict, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        values = _readers(root)
    return values, [str(w.message) for w in caught if issubclass(w.category, IncompleteDatasetWarning)]


def _files(root: Path) -> set[str]:
    """Every file under ``root``, read while a writer may be renaming and removing folders there
    (``os.walk`` skips a folder that vanished between listing and entering it; ``rglob`` raises)."""
    return {str((Path(folder) / name).relative_to(root)) for folder, _, names in os.walk(root) for name in names}


def _reached(moment: str, root: Path, before: set[str]) -> bool:
    """Whether the running ingest is at ``moment``: its start recorded (early), several files
    staged (middle), a file renamed into place before the commit record (final)."""
    new = _files(root) - before
    if moment == "early":
        return any(f.startswith(COMMITS) and f.endswith(".json") for f in new)
    if moment == "middle":
        return sum(f.endswith(".tmp") for f in new) >= 3
    return any(f.startswith("spans/") and f.endswith(".parquet") for f in new)


@pytest.mark.parametrize("moment", ["early", "middle", "final"])
def test_kill_9_of_ingest_leaves_the_committed_state_and_the_same_ingest_completes_it(
        moment, million_spans, committed, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(committed, root)
    before_files = _files(root)
    expected, said = _read_all(root)
    assert not said
    proc = subprocess.Popen([*CLI, "ingest", str(million_spans), "--out", str(root), "--quiet"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline and not _reached(moment, root, before_files):
            time.sleep(0.0005)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
        proc.stderr.close()
    killed = proc.returncode == -signal.SIGKILL
    assert killed or moment == "final", f"ingest finished before the {moment} moment: {proc.returncode}"

    values, said = _read_all(root)
    if said:  # interrupted: exactly the state committed before, and how to finish
        assert values == expected
        assert all("incomplete" in m and str(million_spans) in m for m in said)
        assert len(set(said)) == 1
        command = said[0].rsplit("run: ", 1)[1]
        assert command == f"nemo-telemetry ingest {million_spans} --out {root.resolve()}"
        cli = runner.invoke(app, ["goodput", str(root), "--format", "json"])
        assert cli.exit_code == 0 and sum("incomplete" in line for line in cli.stderr.splitlines()) == 1
    else:  # killed after the final commit: all of it, as if not killed
        assert moment == "final" and len(values["read_spans"]) == len(expected["read_spans"]) + SPANS
        command = f"nemo-telemetry ingest {million_spans} --out {root.resolve()}"
    assert moment != "early" or said, "killed early, the dataset must say it is incomplete"

    again = runner.invoke(app, shlex.split(command)[1:] + ["--json"])
    assert again.exit_code == 0, again.output
    spans = read_spans(root)
    ids = set(zip(spans.column("trace_id").to_pylist(), spans.column("span_id").to_pylist()))
    assert spans.num_rows == len(ids) == len(expected["read_spans"]) + SPANS  # each span once
    assert expected["read_spans"] <= ids
    left = _files(root) - before_files
    assert not [f for f in left if f.endswith(".tmp")], "temporary files of the killed ingest remain"
    from nemo_telemetry.analysis.store.commits import dataset_state

    state = dataset_state(root, warn=False)
    assert not state.unfinished
    stray = [f for f in left if f.endswith(".parquet") and f not in state.committed]
    assert not stray, "files the killed ingest renamed but never committed remain"


@pytest.fixture()
def small_disk(tmpfs):
    """An 8 MiB tmpfs this test mounts (root only, as in CI) and unmounts at the end."""
    return tmpfs("8m")


def test_ingest_on_a_full_disk_exits_2_and_leaves_the_committed_state(small_disk, million_spans, tmp_path):
    first = write_length_prefixed(tmp_path / "first.pb", [to_protobuf(r) for r in synthetic_requests(
        2_200, spans_per_request=110, ranks=2, run_id="earlier-run", seed=11)])
    root = small_disk / "ds"
    assert runner.invoke(app, ["ingest", str(first), "--out", str(root), "--quiet"]).exit_code == 0
    expected, said = _read_all(root)
    assert not said and len(expected["read_spans"]) == 2_200

    full = runner.invoke(app, ["ingest", str(million_spans), "--out", str(root)])
    assert full.exit_code == 2, full.output
    lines = full.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in full.output, full.stderr
    assert lines[0].startswith(f"error: {small_disk}") and "No space left on device" in lines[0]

    values, said = _read_all(root)
    assert values == expected and len(said) >= 1 and "incomplete" in said[0]
    assert not [f for f in _files(root) if f.endswith(".tmp")]  # the failed ingest's staged files are gone
    cli = runner.invoke(app, ["check", str(root), "--format", "json"])
    assert sum("incomplete" in line for line in cli.stderr.splitlines()) == 1

    subprocess.run(["mount", "-o", "remount,size=512m", str(small_disk)], check=True)  # space again
    command = said[0].rsplit("run: ", 1)[1]
    again = runner.invoke(app, shlex.split(command)[1:] + ["--quiet"])
    assert again.exit_code == 0, again.output
    spans = read_spans(root)
    assert spans.num_rows == len(expected["read_spans"]) + SPANS


def _inside_the_commit(moment: str, root: Path, before: set[str]) -> bool:
    """``commit``: the final record staged, not yet in place (the files staged beside it);
    ``renaming``: the record in place, the first file renamed to its name."""
    new = _files(root) - before
    if moment == "commit":
        return (any(f.startswith(f"{COMMITS}/.") and f.endswith(".tmp") for f in new)
                and any(f.startswith("_staging/") for f in new))
    return any(f.startswith("spans/") and f.endswith(".parquet") for f in new)


def _plain_reads(root: Path) -> tuple[set[str], set]:
    """What a plain pyarrow read of DATASET/spans lists, and the span ids DuckDB's read_parquet('spans/**') reads."""
    import duckdb
    import pyarrow.dataset as ds

    files = {str(Path(f).relative_to(root)) for f in ds.dataset(root / "spans", format="parquet").files}
    rows = duckdb.sql(f"SELECT trace_id, span_id FROM read_parquet('{root}/spans/**')").fetchall()
    return files, set(rows)


@pytest.mark.parametrize("moment", ["commit", "renaming"])
def test_kill_9_inside_the_commit_leaves_plain_reads_of_the_folders_the_committed_files(
        moment, million_spans, committed, tmp_path):
    from nemo_telemetry.analysis.store.commits import dataset_state

    root = tmp_path / "ds"
    shutil.copytree(committed, root)
    before = _files(root)
    proc = subprocess.Popen([*CLI, "ingest", str(million_spans), "--out", str(root), "--quiet"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline and not _inside_the_commit(moment, root, before):
            time.sleep(0.0005)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, f"ingest finished before the {moment} moment"
    state = dataset_state(root, warn=False)
    files, ids = _plain_reads(root)
    assert files <= state.committed, f"a plain read lists uncommitted files: {sorted(files - state.committed)[:3]}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IncompleteDatasetWarning)
        ours = set(zip(*(read_spans(root).column(c).to_pylist() for c in ("trace_id", "span_id"))))
    assert ids <= ours  # DuckDB's plain read: committed spans only
    if moment == "commit":  # killed before the record: the state before, to the file
        assert files == {f for f in before if f.startswith("spans/") and f.endswith(".parquet")} and ids == ours
    again = runner.invoke(app, ["ingest", str(million_spans), "--out", str(root), "--quiet"])
    assert again.exit_code == 0, again.output
    files, ids = _plain_reads(root)
    state = dataset_state(root, warn=False)
    assert files == {f for f in state.committed if f.startswith("spans/")}  # every committed file in place
    spans = read_spans(root)
    assert ids == set(zip(*(spans.column(c).to_pylist() for c in ("trace_id", "span_id"))))
    assert len(ids) == spans.num_rows
    assert not [f for f in _files(root) if f.startswith("_staging/")], "a staging area remains"
