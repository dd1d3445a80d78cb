"""Fleet identity (issue 31, item 2): which fleet a process serves, how many GPUs it holds, and where
the run config puts generation (NeMo-RL's ``policy.generation.colocated`` and ``vllm_cfg``)."""

from __future__ import annotations

import logging
import sys
import types

import pytest

from nemo_telemetry.analysis import read_spans
from nemo_telemetry.instrument import (
    init_telemetry_driver,
    init_telemetry_worker,
    run_resource_attributes,
    shutdown_telemetry,
    span_cm,
    traced_worker_init,
)
from nemo_telemetry.instrument._resources import resolve_gpu_count

# -- nv.dl.gpu.count: explicit, else CUDA_VISIBLE_DEVICES, else Ray's ids, else 0 --------------


class _Ray(types.ModuleType):
    def __init__(self, ids, initialized=True) -> None:
        super().__init__("ray")
        self._ids, self._initialized = ids, initialized

    def is_initialized(self) -> bool:
        return self._initialized

    def get_gpu_ids(self):
        return list(self._ids)


@pytest.mark.parametrize("visible, count", [("0,1,2", 3), ("3", 1), ("", 0), ("-1", 0), ("0,-1,2", 1),
                                            ("GPU-8e6b1f2a,GPU-19c2d0c1", 2), ("MIG-0a1b", 1)])
def test_cuda_visible_devices_counts_the_devices_it_lists(visible, count, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", _Ray([0, 1, 2, 3, 4]))  # CUDA_VISIBLE_DEVICES comes first
    assert resolve_gpu_count(None, {"CUDA_VISIBLE_DEVICES": visible}) == count


def test_resolution_order(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "ray", _Ray([4, 5]))
    assert resolve_gpu_count(8, {"CUDA_VISIBLE_DEVICES": "0"}) == 8  # explicit wins
    assert resolve_gpu_count(0, {"CUDA_VISIBLE_DEVICES": "0"}) == 0
    assert resolve_gpu_count(None, {}) == 2  # a Ray worker: its GPU ids
    monkeypatch.setitem(sys.modules, "ray", _Ray([4, 5], initialized=False))
    assert resolve_gpu_count(None, {}) == 0
    monkeypatch.delitem(sys.modules, "ray")
    assert resolve_gpu_count(None, {}) == 0
    assert "ray" not in sys.modules  # asking imported nothing
    assert resolve_gpu_count(-1, {"CUDA_VISIBLE_DEVICES": "0,1"}) == 2
    assert "gpus=-1 is not a GPU count" in caplog.text


def test_the_process_environment_is_read_when_none_is_given(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert resolve_gpu_count() == 2


# -- rl.fleet and nv.dl.gpu.count on the spans ---------------------------------------------------


def _resources(dump_dir) -> dict[str, dict]:
    """{span name: its resource attributes} from the dump."""
    return {r["name"]: dict(r["resource_attributes"]) for r in read_spans(dump_dir).to_pylist()}


def _driver(dump_dir, **kwargs) -> None:
    init_telemetry_driver({"enabled": True, "span_groups": "all", "exporter": "dump", "dump_dir": str(dump_dir)},
                          resource_attributes={"rl.fleet": "leaked", "nv.dl.gpu.count": 99}, **kwargs)


def test_driver_and_workers_declare_their_fleet_and_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    _driver(tmp_path)
    with span_cm("rl.driver.span"):
        pass
    assert init_telemetry_worker(rank=0, world_size=1, fleet="Generation", gpus=2)
    with span_cm("rl.generation.span"):
        pass
    assert init_telemetry_worker(rank=0, world_size=1, fleet="reward_model")  # a word of the user's own
    with span_cm("rl.custom.span"):
        pass
    shutdown_telemetry(timeout_s=10)
    spans = _resources(tmp_path)
    driver, generation, custom = spans["rl.driver.span"], spans["rl.generation.span"], spans["rl.custom.span"]
    assert (driver["rl.fleet"], driver["nv.dl.gpu.count"]) == ("driver", "0")  # the driver holds no GPU
    assert (generation["rl.fleet"], generation["nv.dl.gpu.count"]) == ("generation", "2")
    assert (custom["rl.fleet"], custom["nv.dl.gpu.count"]) == ("reward_model", "4")  # from CUDA_VISIBLE_DEVICES


def test_a_driver_that_trains_resolves_its_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    _driver(tmp_path, fleet="policy")
    with span_cm("rl.torchrun.rank"):
        pass
    shutdown_telemetry(timeout_s=10)
    resource = _resources(tmp_path)["rl.torchrun.rank"]
    assert (resource["rl.fleet"], resource["nv.dl.gpu.count"]) == ("policy", "1")


def test_traced_worker_init_sets_the_fleet_from_its_role_when_unset(tmp_path):
    _driver(tmp_path)
    assert init_telemetry_worker(rank=0, world_size=1, gpus=1)
    outer = span_cm("rl.before.fleet")
    outer.__enter__()  # open across the change: it still ends and is exported
    with traced_worker_init("vllm", backend="vllm"):
        pass
    outer.__exit__(None, None, None)
    with traced_worker_init("policy", backend="megatron"):  # the fleet is set: it stays generation
        pass
    shutdown_telemetry(timeout_s=10)
    spans = _resources(tmp_path)
    assert "rl.fleet" not in spans["rl.before.fleet"]
    assert spans["rl.vllm.load_model"]["rl.fleet"] == "generation"
    assert spans["rl.policy.load_model"]["rl.fleet"] == "generation"
    assert spans["rl.vllm.load_model"]["nv.dl.gpu.count"] == "1"


def test_an_explicit_fleet_is_not_replaced_by_the_role(tmp_path):
    _driver(tmp_path)
    assert init_telemetry_worker(rank=0, world_size=1, fleet="reference", gpus=1)
    with traced_worker_init("policy", backend="dtensor"):
        pass
    shutdown_telemetry(timeout_s=10)
    assert _resources(tmp_path)["rl.policy.load_model"]["rl.fleet"] == "reference"


# -- the generation placement in the run config -------------------------------------------------


def _config(*, nodes, gpus_per_node, colocated, gen_nodes=None, gen_gpus_per_node=None, vllm_tp=1, vllm_pp=1,
            train_tp=1, asynchronous=None) -> dict:
    grpo: dict = {"num_prompts_per_step": 8}
    if asynchronous is not None:
        grpo["async_grpo"] = {"enabled": asynchronous, "max_trajectory_age_steps": 1}
    return {
        "cluster": {"num_nodes": nodes, "gpus_per_node": gpus_per_node},
        "policy": {
            "dtensor_cfg": {"enabled": True, "tensor_parallel_size": train_tp},
            "generation": {
                "backend": "vllm",
                "vllm_cfg": {"tensor_parallel_size": vllm_tp, "pipeline_parallel_size": vllm_pp},
                "colocated": {"enabled": colocated,
                              "resources": {"num_nodes": gen_nodes, "gpus_per_node": gen_gpus_per_node}},
            },
        },
        "grpo": grpo,
    }


def _sizes(attributes: dict, prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in attributes.items() if k.startswith(prefix)}


def test_generation_on_8_of_16_gpus_not_colocated_tp2():
    """The issue's example: training is the other 8 GPUs (dp 4 at tp 2), generation 8 at vLLM tp 2."""
    for config in (_config(nodes=1, gpus_per_node=16, colocated=False, gen_gpus_per_node=8, vllm_tp=2, train_tp=2),
                   _config(nodes=2, gpus_per_node=8, colocated=False, gen_nodes=1, vllm_tp=2, train_tp=2)):
        got = run_resource_attributes(config, algorithm="grpo", environ={})
        assert _sizes(got, "nv.dl.topology.size.") == {"tp": 2, "pp": 1, "cp": 1, "ep": 1, "world": 8, "dp": 4}
        assert _sizes(got, "rl.generation.topology.size.") == {"world": 8, "tp": 2, "pp": 1, "ep": 1, "dp": 4}
        assert got["rl.generation.colocated"] is False
    single = run_resource_attributes(_config(nodes=1, gpus_per_node=16, colocated=False, gen_gpus_per_node=8),
                                     environ={})
    assert (single["rl.generation.topology.num_nodes"], single["rl.generation.topology.gpus_per_node"]) == (1, 8)
    multi = run_resource_attributes(_config(nodes=4, gpus_per_node=8, colocated=False, gen_nodes=1), environ={})
    assert (multi["rl.generation.topology.num_nodes"], multi["rl.generation.topology.gpus_per_node"]) == (1, 8)
    assert multi["nv.dl.topology.size.world"] == 24


def test_colocated_generation_shares_the_training_gpus():
    got = run_resource_attributes(_config(nodes=2, gpus_per_node=8, colocated=True, vllm_tp=4, vllm_pp=2,
                                          asynchronous=False), algorithm="grpo", environ={})
    assert got["rl.generation.colocated"] is True and got["rl.async"] is False
    assert (got["nv.dl.topology.size.world"], got["nv.dl.topology.size.dp"]) == (16, 16)
    assert _sizes(got, "rl.generation.topology.size.") == {"world": 16, "tp": 4, "pp": 2, "ep": 1, "dp": 2}


def test_async_grpo_is_recorded():
    config = _config(nodes=1, gpus_per_node=8, colocated=False, gen_gpus_per_node=2, asynchronous=True)
    got = run_resource_attributes(config, algorithm="grpo", environ={})
    assert got["rl.async"] is True
    assert (got["nv.dl.topology.size.world"], got["rl.generation.topology.size.world"]) == (6, 2)


@pytest.mark.parametrize("nodes, gen_nodes, gen_gpus_per_node", [(1, None, 8), (1, None, None), (2, 2, None),
                                                                  (2, 1, 4), (2, None, None)])
def test_a_split_that_leaves_training_nothing_is_left_out_and_said(nodes, gen_nodes, gen_gpus_per_node, caplog):
    caplog.set_level(logging.WARNING, logger="nemo_telemetry")
    config = _config(nodes=nodes, gpus_per_node=8, colocated=False, gen_nodes=gen_nodes,
                     gen_gpus_per_node=gen_gpus_per_node)
    got = run_resource_attributes(config, environ={})
    assert not [k for k in got if k.startswith(("rl.generation.", "nv.dl.topology.size.world"))]
    assert "the fleets' topology sizes are left out" in caplog.text


def test_no_generation_block_keeps_the_cluster_as_the_training_world():
    got = run_resource_attributes({"cluster": {"num_nodes": 2, "gpus_per_node": 4}}, environ={})
    assert got["nv.dl.topology.size.world"] == 8
    assert not [k for k in got if k.startswith("rl.generation.") or k == "rl.async"]


def test_a_megatron_generation_backend_has_no_vllm_sizes():
    config = _config(nodes=1, gpus_per_node=8, colocated=True)
    config["policy"]["generation"]["backend"] = "megatron"
    got = run_resource_attributes(config, environ={})
    assert _sizes(got, "rl.generation.topology.size.") == {"world": 8}
