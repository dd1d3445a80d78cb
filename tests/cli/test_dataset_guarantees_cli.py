"""What the commands say about an incomplete dataset, OS errors and stray files: one line on
stderr each, exit 2 for what cannot be done, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from nemo_telemetry.analysis import ingest, read_spans

from nemo_telemetry.analysis.store import dataset
from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf, write_json_lines, write_length_prefixed
from nemo_telemetry.cli.app import app

runner = CliRunner()


@pytest.fixture()
def incomplete(tmp_path):
    """A dataset holding one finished ingest and the start of one that did not finish."""
    first = write_length_prefixed(tmp_path / "first.pb", [to_protobuf(r) for r in synthetic_requests(
        220, spans_per_request=11, ranks=2)])
    root = tmp_path / "ds"
    ingest([first], out=root)
    second = write_length_prefixed(tmp_path / "second.pb", [to_protobuf(r) for r in synthetic_requests(
        110, spans_per_request=11, ranks=2, seed=3)])
    writer = dataset.DatasetWriter(root)
    writer.start([str(second)])
    writer.abort()
    return root, second


@pytest.mark.parametrize("command", [["goodput", "--format", "json"], ["goodput", "--engine", "local", "--by", "rank"],
                                     ["check", "--format", "json"], ["waterfall"]])
def test_every_reading_command_warns_once_that_the_dataset_is_incomplete(incomplete, command):
    root, second = incomplete
    result = runner.invoke(app, [command[0], str(root), *command[1:]], env={"COLUMNS": "400"})
    assert result.exit_code in (0, 1), result.output
    lines = [line for line in result.stderr.splitlines() if "incomplete" in line]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("warning: ") and str(second) in lines[0]
    assert f"nemo-telemetry ingest {second} --out {root.resolve()}" in lines[0]
    assert "Traceback" not in result.output


def test_the_command_the_warning_names_finishes_the_dataset(incomplete):
    root, second = incomplete
    result = runner.invoke(app, ["ingest", str(second), "--out", str(root.resolve()), "--json"])
    assert result.exit_code == 0, result.output
    again = runner.invoke(app, ["goodput", str(root), "--format", "json"])
    assert again.exit_code == 0 and "incomplete" not in again.stderr
    assert read_spans(root).num_rows == 220 + 110


def _one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def older_layout(tmp_path_factory):
    """(a dataset as an earlier version wrote it: spans files without ``parent_row``, records that
    name no format and hold no sizes; its dump)."""
    import pyarrow.parquet as pq

    from nemo_telemetry.analysis.store.commits import COMMITS, committed_files

    base = tmp_path_factory.mktemp("older")
    dump = write_json_lines(base / "traces.jsonl", synthetic_requests(44, spans_per_request=11, ranks=2))
    root = base / "ds"
    ingest([dump], out=root)
    for path in committed_files(root, "spans"):
        pq.write_table(pq.read_table(path).drop_columns(["parent_row"]), path)
    for record in (root / COMMITS).glob("*.json"):
        content = json.loads(record.read_bytes())
        content.pop("dataset_format")
        content.pop("sizes", None)
        record.write_text(json.dumps(content))
    return root, dump


@pytest.mark.parametrize("command", [["goodput"], ["goodput", "--engine", "local", "--by", "rank"], ["check"],
                                     ["check", "--engine", "local"], ["waterfall"], ["verify"], ["repair"],
                                     ["ingest"]])
def test_every_command_refuses_a_dataset_of_an_older_layout_with_the_format_and_the_fix(older_layout, command):
    """A dataset format this version does not read: one error line naming the format, the file and
    the fix (re-run the ingest into a new folder), exit 2; nothing written to it."""
    root, dump = older_layout
    before = sorted(str(p) for p in root.rglob("*") if p.is_file() and "_writers" not in p.parts and p.name != "_lock")
    args = [command[0], str(dump), "--out", str(root)] if command[0] == "ingest" else [command[0], str(root),
                                                                                       *command[1:]]
    line = _one_error_line(runner.invoke(app, args, env={"COLUMNS": "400"}))
    assert "dataset format 0" in line and "has no parent_row column" in line, line
    assert "re-run nemo-telemetry ingest of its dumps into a new folder" in line
    after = sorted(str(p) for p in root.rglob("*") if p.is_file() and "_writers" not in p.parts and p.name != "_lock")
    assert after == before


def test_out_under_a_regular_file_exits_2_naming_the_path(tmp_path):
    dump = write_json_lines(tmp_path / "traces.jsonl", synthetic_requests(22, spans_per_request=11, ranks=1))
    (tmp_path / "file").write_text("x")
    line = _one_error_line(runner.invoke(app, ["ingest", str(dump), "--out", str(tmp_path / "file" / "ds")]))
    assert str(tmp_path / "file" / "ds") in line and "Not a directory" in line


def _without_permission_override() -> None:
    """In the child, before it runs Python: drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from
    the bounding set (``prctl(PR_CAPBSET_DROP)``), so root too is held to the permission bits."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_out_without_permission_exits_2_naming_the_path(tmp_path):
    """In a subprocess held to the permission bits (as root, the suite's user in CI, it drops
    the capability that lets root write anywhere), so the kernel itself refuses."""
    dump = write_json_lines(tmp_path / "traces.jsonl", synthetic_requests(22, spans_per_request=11, ranks=1))
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    cli = [sys.executable, "-c", "from nemo_telemetry.cli.app import main; main()"]
    result = subprocess.run([*cli, "ingest", str(dump), "--out", str(locked / "ds")], capture_output=True, text=True,
                            preexec_fn=_without_permission_override if os.geteuid() == 0 else None, timeout=300)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(locked / "ds") in lines[0] and "Permission denied" in lines[0], result.stderr


def test_a_stray_file_in_an_input_directory_is_skipped_and_named_but_refused_when_named(tmp_path):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    write_json_lines(dumps / "traces.jsonl", synthetic_requests(22, spans_per_request=11, ranks=1))
    (dumps / "README.txt").write_text("These are the run's traces.\n")
    result = runner.invoke(app, ["ingest", str(dumps), "--out", str(tmp_path / "ds"), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["spans"], summary["skipped_files"]) == (22, 1)
    assert any(str(dumps / "README.txt") in w and "Skipped" in w for w in summary["warnings"])
    shown = runner.invoke(app, ["ingest", str(dumps), "--out", str(tmp_path / "ds2")])
    assert shown.exit_code == 0 and str(dumps / "README.txt") in shown.stderr.replace("\n", "")
    on_the_fly = runner.invoke(app, ["goodput", str(dumps), "--format", "json"])
    assert on_the_fly.exit_code == 0 and "README.txt" in on_the_fly.stderr.replace("\n", "")
    line = _one_error_line(runner.invoke(app, ["ingest", str(dumps / "README.txt"), "--out", str(tmp_path / "ds3")]))
    assert str(dumps / "README.txt") in line and "not an OTLP dump" in line


def test_an_unreadable_dump_read_on_the_fly_exits_2_naming_it(tmp_path):
    """``goodput`` ingesting a directory on the fly, one of its files unreadable (held to the
    permission bits as above): one line, the file and the cause."""
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    dump = write_json_lines(dumps / "traces.jsonl", synthetic_requests(22, spans_per_request=11, ranks=1))
    dump.chmod(0)
    cli = [sys.executable, "-c", "from nemo_telemetry.cli.app import main; main()"]
    result = subprocess.run([*cli, "goodput", str(dumps)], capture_output=True, text=True,
                            preexec_fn=_without_permission_override if os.geteuid() == 0 else None, timeout=300)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(dump) in lines[0] and "Permission denied" in lines[0], result.stderr
