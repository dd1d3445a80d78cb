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


# Categories on each of the three clocks, more than 80 columns hold side by side.
CLOCKS = {"idle/buffer_starvation": 0.25, "idle/refit_bubble": 91234.5, "idle/refit_event_wait": 9.87654,
          "idle/generation_limit_pause": 0.5, "wasted/failed_trajectory": 12.25, "idle/buffer_full_backoff": 3.0}


def test_the_efficiency_table_labels_each_clock_and_fits_80_columns_without_cutting(tmp_path):
    import io
    import re

    from rich.console import Console

    from nemo_telemetry.analysis import goodput_with_engine
    from nemo_telemetry.cli.render import MEASUREMENTS, bar_width_for, render_run

    init_telemetry_driver({"enabled": True, "span_groups": "per_step", "exporter": "dump",
                           "dump_dir": str(tmp_path / "dumps")}, algorithm="grpo")
    for step in (1, 2):
        with iteration_scope(step), umbrella_span(RLSpanGroup.U_STEP, "rl.grpo.step"):
            with managed_span(RLSpanGroup.GENERATION, "rl.vllm.generate"):
                time.sleep(0.01)
            tee_metrics("efficiency", {k: v * step for k, v in CLOCKS.items()})
            assert flush_metrics()
    shutdown_telemetry()
    dumps = tmp_path / "dumps"
    (run,) = goodput_with_engine(dumps)
    measured = {f.name: f.metadata[b"rl.efficiency.measurement"].decode() for f in run.steps.schema
                if f.name.startswith("efficiency/")}
    assert sorted(set(measured.values())) == ["collector_wall_clock", "driver_wall_clock", "thread_seconds"]
    words = [w for name in measured for w in re.split(r"[/_]", name.removeprefix("efficiency/").removesuffix("_s"))
             if w]
    labels = [w for m in measured.values() for w in MEASUREMENTS[m][0].split()]
    values = ["0.250", "0.500", "91234", "9.877", "12.25", "3.000", "1.000", "19.75", "24.50", "6.000"]
    buffer = io.StringIO()
    Console(file=buffer, width=80, color_system=None).print(render_run(run, bar_width=bar_width_for(80)))
    table = runner.invoke(app, ["goodput", str(dumps)], env={"COLUMNS": "80"})
    assert table.exit_code == 0, table.output
    for text in (buffer.getvalue(), table.stdout):
        assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
        efficiency = text[text.index("efficiency metrics per step"):]
        assert all(cell in efficiency for cell in words + labels + values), \
            [c for c in words + labels + values if c not in efficiency]
        legend = " ".join(efficiency.split())
        assert all(f"{label}: {meaning}" in legend for label, meaning in MEASUREMENTS.values())
