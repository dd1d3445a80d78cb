"""`goodput` shows a step's efficiency metrics beside its span buckets (issue 8), from raw dumps
and from a dataset that `ingest` wrote (metrics go to DATASET/metrics, once per input file)."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from nemo_telemetry.analysis import ingest
from nemo_telemetry.cli.app import app
from nemo_telemetry.instrument import (
    RLSpanGroup,
    flush_metrics,
    init_telemetry_driver,
    iteration_scope,
    managed_span,
    shutdown_telemetry,
    tee_metrics,
    umbrella_span,
)

runner = CliRunner()
STARVATION = {1: 0.25, 2: 0.5, 3: 1.5}  # seconds the "driver" reports per step


@pytest.fixture()
def dumps(tmp_path):
    init_telemetry_driver({"enabled": True, "span_groups": "per_step", "exporter": "dump",
                           "dump_dir": str(tmp_path / "dumps")}, algorithm="grpo")
    for step, seconds in STARVATION.items():
        with iteration_scope(step), umbrella_span(RLSpanGroup.U_STEP, "rl.grpo.step"):
            with managed_span(RLSpanGroup.GENERATION, "rl.vllm.generate"):
                time.sleep(0.01)
            tee_metrics("efficiency", {"idle/buffer_starvation": seconds})
            assert flush_metrics()  # points carry their collection time: inside this step
    shutdown_telemetry()
    return tmp_path / "dumps"


def _efficiency(result) -> dict[int, float]:
    assert result.exit_code == 0, result.output
    (run,) = json.loads(result.stdout)["runs"]
    return {s["iteration"]: s["efficiency/idle/buffer_starvation_s"] for s in run["steps"]}


def test_goodput_on_raw_dumps_shows_each_steps_efficiency_seconds(dumps):
    assert _efficiency(runner.invoke(app, ["goodput", str(dumps), "--format", "json"])) == STARVATION
    table = runner.invoke(app, ["goodput", str(dumps)], env={"COLUMNS": "160"})
    assert "efficiency metrics per step" in table.stdout
    assert "idle/buffer_starvation" in table.stdout and "1.500" in table.stdout


def test_ingest_keeps_the_metrics_once_and_goodput_reads_them_from_the_dataset(dumps, tmp_path):
    first = ingest([dumps], out=tmp_path / "ds")
    again = ingest([dumps], out=tmp_path / "ds")
    assert first.metric_points > 0 and again.metric_points == first.metric_points
    assert len(list((tmp_path / "ds" / "metrics").glob("*.parquet"))) == len(list(dumps.glob("metrics-*")))
    assert _efficiency(runner.invoke(app, ["goodput", str(tmp_path / "ds"), "--format", "json"])) == STARVATION


def test_goodput_without_metrics_has_no_efficiency_columns(dumps):
    for path in dumps.glob("metrics-*"):
        path.unlink()
    result = runner.invoke(app, ["goodput", str(dumps), "--format", "json"])
    (run,) = json.loads(result.stdout)["runs"]
    assert not [k for k in run["steps"][0] if k.startswith("efficiency/")]
