"""The demo's fleets (issue 31, item 5): each process's fleet and GPUs, the placement the run describes,
and the generation worker's ``rl.fleet.busy.seconds``, read back from the dataset and the metric dumps.

Three runs: sync colocated (the default), sync split (``--placement split``) and async (split), on
the session's Ray cluster; the sync and async runs are shared with ``test_demo.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from _demo_runs import demo_run, spans_frame
from nemo_telemetry.analysis import read_metrics
from nemo_telemetry.cli.app import app
from nemo_telemetry.demo import run_demo
from nemo_telemetry.demo.actors import SERVICE_NAMES
from nemo_telemetry.demo.trainer import DemoSettings, fleet_gpus, run_config
from nemo_telemetry.demo.workload import PhaseTimes
from nemo_telemetry.errors import DemoError
from nemo_telemetry.instrument import BUSY_SECONDS, run_resource_attributes

pytestmark = pytest.mark.slow

STEPS = 4  # as test_demo.py, so its runs are shared


@pytest.fixture(scope="module")
def sync_run(ray_cluster, tmp_path_factory):
    return demo_run(tmp_path_factory.getbasetemp(), mode="sync", steps=STEPS)


@pytest.fixture(scope="module")
def split_run(ray_cluster, tmp_path_factory):
    return demo_run(tmp_path_factory.getbasetemp(), mode="sync", steps=STEPS, placement="split")


@pytest.fixture(scope="module")
def async_run(ray_cluster, tmp_path_factory):
    return demo_run(tmp_path_factory.getbasetemp(), mode="async", steps=STEPS)


RUNS = ["sync_run", "split_run", "async_run"]


def _resources_by_service(result) -> dict[str, dict]:
    spans = spans_frame(result)
    out: dict[str, dict] = {}
    for service, resource in zip(spans["service_name"], spans["resource_attributes"].map(dict)):
        out.setdefault(service, resource)
    return out


def test_the_placements_are_the_default_split_and_async():
    assert DemoSettings().placement == "colocated" and DemoSettings(mode="async").placement == "split"
    with pytest.raises(DemoError, match="--placement split"):
        run_demo(mode="async", placement="colocated", steps=1)
    with pytest.raises(DemoError, match="colocated, split"):
        run_demo(placement="apart", steps=1)


@pytest.mark.parametrize("mode, placement", [("sync", "colocated"), ("sync", "split"), ("async", "split")])
def test_the_run_config_describes_the_fleets_the_processes_declare(mode, placement):
    settings = DemoSettings(mode=mode, placement=placement)
    gpus = fleet_gpus(settings)
    attributes = run_resource_attributes(run_config(settings), algorithm="grpo")
    training = settings.policy_workers * gpus["policy"]
    assert attributes["nv.dl.topology.size.world"] == training
    assert attributes["rl.generation.topology.size.world"] == gpus["generation"]
    assert attributes["rl.generation.colocated"] is (placement == "colocated")
    assert attributes["rl.async"] is (mode == "async")
    assert gpus["generation"] == (training if placement == "colocated" else 1)


def test_the_cli_refuses_a_colocated_async_run_before_starting_anything(tmp_path):
    result = CliRunner().invoke(app, ["demo", "--mode", "async", "--placement", "colocated",
                                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "--placement split" in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fixture", RUNS)
def test_every_process_has_its_fleet_and_gpus_in_the_dataset(fixture, request):
    result = request.getfixturevalue(fixture)
    gpus = fleet_gpus(DemoSettings(mode=result.mode, placement=result.placement))
    resources = _resources_by_service(result)
    fleets = {"driver": "driver", "policy": "policy", "generation": "generation", "collector": "collector"}
    expected = {SERVICE_NAMES[role]: (fleet, str(gpus[fleet])) for role, fleet in fleets.items()
                if role != "collector" or result.mode == "async"}
    assert {s: (r.get("rl.fleet"), r.get("nv.dl.gpu.count")) for s, r in resources.items()} == expected


@pytest.mark.parametrize("fixture, colocated, generation_world", [("sync_run", True, 2), ("split_run", False, 1),
                                                                  ("async_run", False, 1)])
def test_the_run_describes_the_placement_the_demo_ran(fixture, colocated, generation_world, request):
    result = request.getfixturevalue(fixture)
    gpus = fleet_gpus(DemoSettings(mode=result.mode, placement=result.placement))
    for service, resource in _resources_by_service(result).items():  # every process carries the run's
        assert resource["rl.generation.colocated"] == str(colocated).lower(), service
        assert resource["rl.async"] == str(result.mode == "async").lower(), service
        assert resource["nv.dl.topology.size.world"] == "2" and resource["nv.dl.topology.size.dp"] == "2"
        assert resource["rl.generation.topology.size.world"] == str(generation_world)
        assert resource["rl.generation.topology.size.tp"] == str(gpus["generation"])
    assert generation_world == gpus["generation"]  # the config and the processes agree


def _union_s(starts, ends) -> float:
    order = np.argsort(starts)
    starts, ends = np.asarray(starts)[order], np.maximum.accumulate(np.asarray(ends)[order])
    gaps = np.maximum(starts[1:] - ends[:-1], 0)
    return float((ends[-1] - starts[0] - gaps.sum()) / 1e9)


@pytest.mark.parametrize("fixture", RUNS)
def test_the_generation_worker_reports_its_busy_time(fixture, request):
    """One point per batch, cumulative; the time lies within the engine's spans and holds its sleeps."""
    result = request.getfixturevalue(fixture)
    points = [r for r in read_metrics(result.dumps).to_pylist() if r["name"] == BUSY_SECONDS]
    assert points, "no rl.fleet.busy.seconds in the metric dumps"
    assert {tuple(sorted(dict(p["attributes"]).items())) for p in points} == {
        (("rl.fleet", "generation"), ("rl.fleet.activity", "generation"))}
    assert {p["service_name"] for p in points} == {SERVICE_NAMES["generation"]}
    assert {p["run_id"] for p in points} == {result.run_id}
    resource = dict(points[0]["resource_attributes"])
    gpus = fleet_gpus(DemoSettings(mode=result.mode, placement=result.placement))
    assert (resource["rl.fleet"], resource["nv.dl.gpu.count"]) == ("generation", str(gpus["generation"]))
    values = [p["value"] for p in sorted(points, key=lambda p: p["time_ns"])]
    assert values == sorted(values)
    in_dataset = [r["value"] for r in read_metrics(result.dataset).to_pylist() if r["name"] == BUSY_SECONDS]
    assert sorted(in_dataset) == values  # ingest kept every point

    spans = spans_frame(result)
    engine = spans[spans["name"] == "rl.vllm.engine.generate"]
    assert len(points) >= len(engine)  # a flush after every batch, and shutdown's last collection
    times = PhaseTimes()
    slept = sum(times["validate_generate"] if a["rl.num_prompt_groups"] == "1" else times["generate"]
                for a in engine["attributes"])
    # the engine runs one call at a time, each sleep inside its busy scope, each scope inside its span
    assert slept <= values[-1] <= _union_s(engine["start_ns"].to_numpy(), engine["end_ns"].to_numpy())


def _generation_by_step(result, *, metrics: bool) -> dict[int, dict]:
    from nemo_telemetry.analysis import read_spans, run_goodput

    (run,) = run_goodput(read_spans(result.dataset), by="fleet,step",
                         metrics=read_metrics(result.dataset) if metrics else None)
    return {i: next(r for r in table.to_pylist() if r["fleet"] == "generation") for i, table, _ in run.fleets.steps}


def test_the_async_generation_fleet_is_busy_most_of_each_step(async_run):
    """Its generation has no span, a few refits do: the busy metric must still count (issue 31, item 5)."""
    steps = _generation_by_step(async_run, metrics=True)
    assert sorted(steps) == list(range(1, STEPS + 1))
    for iteration, row in steps.items():
        assert "busy_metric" in row["source"].split("+"), (iteration, row["source"])
        # the worker sleeps through a generate batch for most of each step; a generous floor
        assert row["productive_gpu_s"] > 0.3 * row["gpu_seconds"], (iteration, row)
        buckets = sum(row[f"{b}_gpu_s"] for b in ("productive", "overhead", "wasted", "idle", "unknown"))
        assert buckets == pytest.approx(row["gpu_seconds"], abs=1e-6)


def test_the_split_generation_fleet_counts_its_busy_metric_once(split_run):
    """Its generate spans hold the engine's busy scopes: the metric adds nothing to what they say."""
    with_metric, spans_only = _generation_by_step(split_run, metrics=True), _generation_by_step(split_run,
                                                                                                 metrics=False)
    assert {r["source"] for r in with_metric.values()} == {"spans+busy_metric"}
    assert {r["source"] for r in spans_only.values()} == {"spans"}
    for iteration, row in with_metric.items():
        for bucket in ("productive", "overhead", "wasted", "idle"):
            key = f"{bucket}_gpu_s"
            assert row[key] == pytest.approx(spans_only[iteration][key], abs=1e-6), (iteration, key)
