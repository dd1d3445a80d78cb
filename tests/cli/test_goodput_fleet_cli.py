"""``nemo-telemetry goodput --by fleet`` (and ``fleet,step``): the table, the JSON document, CSV and the plot,
on the hand-computed async fixture of tests/analysis/goodput/test_fleets.py written as a dataset with its metrics."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nemo_telemetry.cli.app import app

runner = CliRunner()


def _fixtures():
    path = Path(__file__).parents[1] / "analysis" / "goodput" / "test_fleets.py"
    spec = importlib.util.spec_from_file_location("fleet_fixtures", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fixtures = _fixtures()
FLEET_KEYS = ["fleet", "gpus", "processes", "source", "gpu_seconds", "productive_gpu_s", "overhead_gpu_s",
              "wasted_gpu_s", "idle_gpu_s", "unknown_gpu_s", "goodput", "tokens_per_s_per_gpu"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """The async fixture's spans as a dataset, its busy and token points in the dataset's metrics/."""
    return fixtures.write_dataset(tmp_path_factory.mktemp("fleet") / "ds", fixtures.async_spans(),
                                  metrics=fixtures.async_metrics())


def test_json_has_fleets_and_cluster_per_run_and_per_step(dataset):
    result = runner.invoke(app, ["goodput", str(dataset), "--by", "fleet,step", "--format", "json"])
    assert result.exit_code == 0, result.output
    (run,) = json.loads(result.output)["runs"]
    assert [list(f) for f in run["fleets"]] == [FLEET_KEYS] * 4
    generation = next(f for f in run["fleets"] if f["fleet"] == "generation")
    # hand-computed in test_fleets.test_async_fleets_by_hand: 38 of 100 GPU-s productive, 45 tokens/s/GPU
    assert generation["source"] == "busy_metric"
    assert generation["productive_gpu_s"] == pytest.approx(38.0, abs=1e-6)
    assert generation["tokens_per_s_per_gpu"] == pytest.approx(45.0, abs=1e-6)
    assert run["cluster"]["fleet"] == "cluster" and run["cluster"]["gpu_seconds"] == pytest.approx(200.0, abs=1e-6)
    assert run["cluster"]["gpus"] == 8 and run["cluster"]["processes"] == 3  # numbers, as in every fleet row
    assert run["fleet_window"] == "job" and run["fleet_findings"] == []
    assert [s["iteration"] for s in run["fleet_steps"]] == [1, 2]
    assert run["fleet_steps"][1]["cluster"]["gpu_seconds"] == pytest.approx(104.0, abs=1e-6)  # 8 GPUs x 13 s
    plain = json.loads(runner.invoke(app, ["goodput", str(dataset), "--by", "fleet", "--format", "json"]).output)
    assert "fleet_steps" not in plain["runs"][0] and plain["runs"][0]["fleets"] == run["fleets"]


def test_table_has_a_row_per_fleet_and_the_cluster_row(dataset):
    result = runner.invoke(app, ["goodput", str(dataset), "--by", "fleet"])
    assert result.exit_code == 0, result.output
    rows: dict[str, list[str]] = {}
    for line in result.output.splitlines():  # the table's rows come first, the notes under it
        words = line.split()
        if words[:1] and words[0] in ("collector", "generation", "policy", "driver", "cluster"):
            rows.setdefault(words[0], words)
    assert set(rows) == {"collector", "generation", "policy", "driver", "cluster"}
    assert rows["generation"][1:4] == ["4", "2", "busy"] and "38.0%" in rows["generation"]
    assert rows["cluster"][1:3] == ["8", "3"] and "53.0%" in rows["cluster"]


def test_csv_rows_per_fleet_and_step(dataset):
    result = runner.invoke(app, ["goodput", str(dataset), "--by", "fleet,step", "--format", "csv"])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.output)))
    assert [(r["iteration"], r["fleet"]) for r in rows if r["fleet"] in ("policy", "cluster")] == [
        ("1", "policy"), ("1", "cluster"), ("2", "policy"), ("2", "cluster")]
    assert float(rows[2]["productive_gpu_s"]) == pytest.approx(28.0, abs=1e-6)  # step 1, policy: [7,14] x 4 GPUs


def test_plot_draws_a_stacked_bar_per_fleet(dataset, tmp_path):
    out = tmp_path / "fleets.html"
    assert runner.invoke(app, ["goodput", str(dataset), "--by", "fleet", "--plot", str(out)]).exit_code == 0
    page = out.read_text()
    assert "GPU-seconds per fleet" in page and "fleet generation: productive 38.000 GPU-s" in page
    assert "fleet collector" not in page  # no GPUs: no bar


def test_unknown_by_is_a_usage_error(dataset):
    result = runner.invoke(app, ["goodput", str(dataset), "--by", "fleets"])
    assert result.exit_code == 2 and "fleet,step" in result.output


def test_fleets_declared_by_the_instrument_reach_goodput_through_ingest(tmp_path, monkeypatch):
    """init_telemetry_worker(fleet=, gpus=) -> dump files -> ingest -> goodput --by fleet: each
    process's rl.fleet and nv.dl.gpu.count travel as resource attributes, and the driver's spans
    land on the fleet their group names."""
    from nemo_telemetry.analysis import read_spans
    from nemo_telemetry.instrument import (init_telemetry_driver, init_telemetry_worker, iteration_scope,
                                           managed_span, shutdown_telemetry, span_cm)

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    dumps = tmp_path / "dumps"
    init_telemetry_driver({"enabled": True, "span_groups": "all", "exporter": "dump", "dump_dir": str(dumps)})
    with iteration_scope(1), span_cm("rl.grpo.step"):
        with managed_span("generation", "rl.vllm.generate"):
            time.sleep(0.02)
        with managed_span("policy_update", "rl.grpo.policy_training"):
            time.sleep(0.03)
    assert init_telemetry_worker(rank=0, world_size=1, service_name="vllm-worker", fleet="generation", gpus=2)
    with span_cm("rl.vllm.worker"):
        pass
    assert init_telemetry_worker(rank=0, world_size=1, service_name="policy-worker", fleet="policy", gpus=4)
    with span_cm("rl.policy.worker"):
        pass
    shutdown_telemetry(timeout_s=10)

    spans = {r["name"]: r for r in read_spans(dumps).to_pylist()}
    assert spans["rl.vllm.generate"]["rl.span_group"] == "generation"
    assert spans["rl.vllm.generate"]["rl.bucket"] == "productive"
    generate = spans["rl.vllm.generate"]["end_ns"] - spans["rl.vllm.generate"]["start_ns"]
    training = spans["rl.grpo.policy_training"]["end_ns"] - spans["rl.grpo.policy_training"]["start_ns"]
    step = spans["rl.grpo.step"]["end_ns"] - spans["rl.grpo.step"]["start_ns"]
    assert runner.invoke(app, ["ingest", str(dumps), "--out", str(tmp_path / "ds")]).exit_code == 0
    for source in (dumps, tmp_path / "ds"):
        result = runner.invoke(app, ["goodput", str(source), "--by", "fleet", "--format", "json"])
        assert result.exit_code == 0, result.output
        (run,) = json.loads(result.output)["runs"]
        fleets = {f["fleet"]: f for f in run["fleets"]}
        assert list(fleets) == ["generation", "policy", "driver"]
        assert (fleets["generation"]["gpus"], fleets["generation"]["source"]) == (2, "spans")
        assert fleets["generation"]["gpu_seconds"] == pytest.approx(2 * step / 1e9, abs=1e-6)
        assert fleets["generation"]["productive_gpu_s"] == pytest.approx(2 * generate / 1e9, abs=1e-6)
        assert fleets["policy"]["productive_gpu_s"] == pytest.approx(4 * training / 1e9, abs=1e-6)
        assert (fleets["driver"]["gpus"], fleets["driver"]["processes"]) == (0, 1)
        assert run["fleet_findings"] == []


def test_plot_png_per_fleet(dataset, tmp_path):
    out = tmp_path / "fleets.png"
    result = runner.invoke(app, ["goodput", str(dataset), "--by", "fleet", "--plot", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
