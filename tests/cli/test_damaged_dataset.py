"""A spans file damaged on disk is a clear error from goodput and check, not a traceback."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from test_goodput_cli import records

from nemo_telemetry.analysis import spans_table
from nemo_telemetry.analysis.model.tree import with_id_keys
from nemo_telemetry.cli.app import app

runner = CliRunner()


def damaged_dataset(root: Path) -> Path:
    """A dataset with the id keys (so the local engine reads it batch by batch) whose one file has
    its data pages overwritten between the header and the footer."""
    (root / "spans").mkdir(parents=True)
    path = root / "spans" / "part-0.parquet"
    pq.write_table(with_id_keys(spans_table(records() * 200)), path, row_group_size=64)
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
