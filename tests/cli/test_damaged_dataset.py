"""A committed file damaged on disk is a clear error naming it from every command and engine, never a
traceback or a partial answer; ``verify`` names it and ``repair`` makes the dataset consistent again."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from test_goodput_cli import records

from nemo_telemetry.analysis import DamagedDatasetError, goodput_with_engine, ingest, read_spans, spans_table
from nemo_telemetry.analysis.engines.partitioned_check import stream_check
from nemo_telemetry.analysis.goodput.partials import stream_goodput
from nemo_telemetry.analysis.store.partitions import span_files
from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf, write_length_prefixed
from nemo_telemetry.cli.app import app
from nemo_telemetry.analysis.store.dataset import with_parent_rows

runner = CliRunner()


def damaged_dataset(root: Path) -> Path:
    """A dataset with the id keys (so the local engine reads it batch by batch) whose one file has
    its data pages overwritten between the header and the footer."""
    (root / "spans").mkdir(parents=True)
    path = root / "spans" / "part-0.parquet"
    pq.write_table(with_parent_rows(spans_table(records() * 200)), path, row_group_size=64)
    data = bytearray(path.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little") + 8
    data[4:len(data) - footer] = b"\xff" * (len(data) - footer - 4)
    path.write_bytes(bytes(data))
    return root


@pytest.mark.parametrize("command", ["goodput", "check"])
def test_a_damaged_spans_file_is_named_and_exits_2(tmp_path, command):
    root = damaged_dataset(tmp_path / "run")
    result = runner.invoke(app, [command, str(root)])
    assert result.exit_code == 2, result.output
    assert "cannot read the spans table" in result.output and str(root) in result.output.replace("\n", "")
    assert "Traceback" not in result.output


# The whole matrix: each of four damages to a committed file of a dataset `ingest` wrote, read by
# every command (and the streamed engine through the library): exit 2 naming the file, never a
# traceback, never a partial answer; `verify` names it; `repair` makes the dataset consistent again
# and the ingest it names restores the spans.

DAMAGES = ("deleted", "truncated", "zeroed", "foreign")


def damage(path: Path, how: str) -> None:
    """Damage one committed file in place, as a disk, a person or another program might."""
    if how == "deleted":
        path.unlink()
    elif how == "truncated":
        with open(path, "r+b") as handle:
            handle.truncate(path.stat().st_size // 2)
    elif how == "zeroed":
        path.write_bytes(bytes(path.stat().st_size))
    else:  # another program's Parquet file under the same name
        pq.write_table(pa.table({"x": list(range(1_000))}), path)


@pytest.fixture(scope="module")
def dump(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("dump")
    return write_length_prefixed(folder / "traces.pb", [to_protobuf(r) for r in synthetic_requests(
        4_400, spans_per_request=110, ranks=4, seed=5)])


@pytest.fixture(scope="module")
def clean(dump, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("clean") / "ds"
    ingest([dump], out=root)
    return root


def damaged_copy(clean: Path, tmp_path: Path, how: str) -> tuple[Path, str]:
    """A copy of ``clean`` with its first committed spans file damaged ``how``; (root, that file)."""
    root = tmp_path / "ds"
    shutil.copytree(clean, root)
    target = span_files(root)[0]
    damage(target, how)
    return root, str(target.relative_to(root))


def _json(result) -> dict | list:
    return json.loads(result.stdout)


READERS = {
    "goodput": ["goodput", "{root}", "--format", "json"],
    "check": ["check", "{root}", "--format", "json"],
    "waterfall": ["waterfall", "{root}"],
    "monitor --port": ["monitor", "--port", "0", "--out", "{root}", "--until-idle", "0.2", "--format", "json"],
}


@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("command", READERS)
def test_every_command_names_the_damaged_file_and_exits_2(clean, tmp_path, how, command):
    root, rel = damaged_copy(clean, tmp_path, how)
    result = runner.invoke(app, [a.format(root=root) for a in READERS[command]])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
    error = " ".join(result.stderr.split())
    assert f"{rel} (" in error and "damaged" in error and f"nemo-telemetry repair {root}" in error, error


@pytest.mark.parametrize("how", DAMAGES)
def test_the_streamed_engines_refuse_a_damaged_file_by_name(clean, tmp_path, how):
    root, rel = damaged_copy(clean, tmp_path, how)
    for read in (lambda: stream_goodput(root), lambda: stream_check(root),
                 lambda: goodput_with_engine(root, memory_budget=1), lambda: read_spans(root)):
        with pytest.raises(DamagedDatasetError) as raised:
            read()
        assert [path for path, _ in raised.value.damaged] == [rel]


@pytest.mark.parametrize("how", DAMAGES)
def test_verify_names_it_repair_drops_it_and_the_ingest_it_names_restores_the_spans(clean, dump, tmp_path, how):
    root, rel = damaged_copy(clean, tmp_path, how)
    verified = runner.invoke(app, ["verify", str(root), "--json"])
    assert verified.exit_code == 2, verified.output
    report = _json(verified)
    assert [d["path"] for d in report["damaged"]] == [rel] and not report["ok"]
    lost = report["damaged"][0]["rows"]
    assert lost > 0

    repaired = runner.invoke(app, ["repair", str(root), "--json"])
    assert repaired.exit_code == 0, repaired.output
    done = _json(repaired)
    assert [d["path"] for d in done["dropped"]] == [rel] and done["spans_lost"] == lost
    assert done["restore"] == [f"nemo-telemetry ingest {dump} --out {root}"]
    assert not (root / rel).exists() and ((root / "_damaged" / rel).exists() or how == "deleted")

    assert runner.invoke(app, ["verify", str(root)]).exit_code == 0  # consistent: every committed file intact
    after = runner.invoke(app, ["goodput", str(root), "--format", "json"])
    assert after.exit_code == 0, after.output
    assert read_spans(root).num_rows == read_spans(clean).num_rows - lost  # what is lost is said, exactly

    again = runner.invoke(app, shlex.split(done["restore"][0])[1:] + ["--json"])
    assert again.exit_code == 0, again.output
    assert _json(again)["spans"] == lost  # only the lost spans are stored again
    assert _goodput(root) == _goodput(clean)
    assert runner.invoke(app, ["verify", str(root)]).exit_code == 0


def test_a_page_overwritten_in_a_committed_file_is_named_by_a_whole_read(clean, tmp_path):
    """Size and footer as committed, a data page overwritten: the cheap check passes, the read
    fails, and the error names the file found by reading each whole."""
    root = tmp_path / "ds"
    shutil.copytree(clean, root)
    target = span_files(root)[1]
    chunk = next(c for c in (pq.ParquetFile(target).metadata.row_group(0).column(i) for i in range(20))
                 if c.path_in_schema == "start_ns")  # a column goodput and check both read
    data = bytearray(target.read_bytes())
    at = chunk.data_page_offset + chunk.total_compressed_size // 2  # one byte of the values, mid-page:
    data[at] ^= 0x10  # it decodes, to another time; only the page's checksum tells
    target.write_bytes(bytes(data))
    for command in ("goodput", "check"):
        result = runner.invoke(app, [command, str(root)])
        assert result.exit_code == 2 and str(target.relative_to(root)) in " ".join(result.stderr.split()), command
    for streamed in (lambda: goodput_with_engine(root, memory_budget=1), lambda: stream_check(root)):
        with pytest.raises(DamagedDatasetError) as raised:
            streamed()
        assert [path for path, _ in raised.value.damaged] == [str(target.relative_to(root))]
    verified = _json(runner.invoke(app, ["verify", str(root), "--json"]))
    assert [d["path"] for d in verified["damaged"]] == [str(target.relative_to(root))]


def _goodput(root: Path) -> list:
    return [(r.run_id, r.steps.to_pylist(), r.total) for r in goodput_with_engine(root)]
