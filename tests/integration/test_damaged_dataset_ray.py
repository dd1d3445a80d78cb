"""The Ray engine on a dataset with a damaged committed file (deleted, truncated, zeroed, or another
program's Parquet file): ``goodput``, ``check`` and ``ingest`` with ``--engine ray`` name the file and
exit 2 before any task reads it, never a traceback or a partial answer (the suite's one Ray cluster);
a page that fails its checksum in a task is named the same way."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from nemo_telemetry.analysis import ingest
from nemo_telemetry.analysis.store.partitions import span_files
from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf, write_length_prefixed
from nemo_telemetry.cli.app import app

runner = CliRunner()


def _damage(path: Path, how: str) -> None:
    if how == "deleted":
        path.unlink()
    elif how == "truncated":
        with open(path, "r+b") as handle:
            handle.truncate(path.stat().st_size // 2)
    elif how == "zeroed":
        path.write_bytes(bytes(path.stat().st_size))
    elif how == "page":  # one byte of a page both engines read: size and footer as committed
        chunk = next(c for c in (pq.ParquetFile(path).metadata.row_group(0).column(i) for i in range(20))
                     if c.path_in_schema == "start_ns")
        data = bytearray(path.read_bytes())
        data[chunk.data_page_offset + chunk.total_compressed_size // 2] ^= 0x10
        path.write_bytes(bytes(data))
    else:
        pq.write_table(pa.table({"x": list(range(1_000))}), path)


@pytest.fixture(scope="module")
def dump(tmp_path_factory) -> Path:
    return write_length_prefixed(tmp_path_factory.mktemp("dump") / "traces.pb", [to_protobuf(r) for r in
                                 synthetic_requests(4_400, spans_per_request=110, ranks=4, seed=5)])


@pytest.fixture(scope="module")
def clean(dump, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("clean") / "ds"
    ingest([dump], out=root)
    return root


# ingest reads the ids of the dataset it opens, not the page the "page" damage is in
CASES = [(command, how) for command in ("goodput", "check", "ingest")
         for how in ("deleted", "truncated", "zeroed", "foreign", "page") if (command, how) != ("ingest", "page")]


@pytest.mark.parametrize(("command", "how"), CASES)
def test_the_ray_engine_names_the_damaged_file_and_exits_2(ray_cluster, clean, dump, tmp_path, how, command):
    root = tmp_path / "ds"
    shutil.copytree(clean, root)
    target = span_files(root)[-1]
    rel = str(target.relative_to(root))
    _damage(target, how)
    args = [command, str(dump), "--out", str(root)] if command == "ingest" else [command, str(root)]
    result = runner.invoke(app, [*args, "--engine", "ray"])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    error = " ".join(result.stderr.split())
    assert "Traceback" not in result.output and f"{rel} (" in error and "damaged" in error, error


@pytest.mark.parametrize("function", ["ray_goodput", "ray_check"])
def test_the_ray_engines_own_functions_name_a_damaged_page(ray_cluster, clean, tmp_path, function):
    """Called from Python, not through the CLI or ``*_with_engine``: the page that fails its read in a
    task is a ``DamagedDatasetError`` naming the file, not Ray's error."""
    from nemo_telemetry.analysis.engines import ray_engine
    from nemo_telemetry.errors import DamagedDatasetError

    root = tmp_path / "ds"
    shutil.copytree(clean, root)
    target = span_files(root)[-1]
    _damage(target, "page")
    with pytest.raises(DamagedDatasetError) as raised:
        getattr(ray_engine, function)(root)
    assert f"{target.relative_to(root)} (" in str(raised.value) and "damaged" in str(raised.value)
