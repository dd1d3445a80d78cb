"""The run's resource attributes: derived from the trainer's config by the driver, inherited by workers."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
from importlib import metadata

import pytest

from nemo_telemetry.instrument import (
    RLSpanGroup,
    init_telemetry_driver,
    run_resource_attributes,
    shutdown_telemetry,
    umbrella_span,
)
from nemo_telemetry.instrument import environment_variables as env

GRPO_CONFIG = {
    "policy": {
        "model_name": "Qwen/Qwen2.5-1.5B",
        "precision": "bfloat16",
        "train_global_batch_size": 512,
        "train_micro_batch_size": 4,
        "max_total_sequence_length": 4096,
        "dtensor_cfg": {"enabled": False, "tensor_parallel_size": 8},
        "megatron_cfg": {"enabled": True, "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2,
                         "context_parallel_size": 1, "expert_model_parallel_size": 4},
    },
    "cluster": {"num_nodes": 4, "gpus_per_node": 8},
    "grpo": {"num_prompts_per_step": 32, "num_generations_per_prompt": 16, "max_num_steps": 500, "seed": 42},
}


def _resources_by_span(directory) -> dict[str, dict]:
    """{span name: its resource attributes as typed values} from every traces dump under ``directory``."""
    out = {}
    for name in sorted(os.listdir(directory)):
        if not name.startswith("traces-"):
            continue
        for line in open(os.path.join(directory, name)):
            for rs in json.loads(line)["resourceSpans"]:
                resource = {a["key"]: next(iter(a["value"].values())) for a in rs["resource"]["attributes"]}
                for ss in rs["scopeSpans"]:
                    out.update({s["name"]: resource for s in ss["spans"]})
    return out


def test_attributes_from_a_nemo_rl_grpo_config():
    got = run_resource_attributes(GRPO_CONFIG, algorithm="grpo", environ={})
    assert got == {
        "nv.dl.provider.name": "local",
        "nv.dl.campaign.stage": "RL",
        "rl.model": "Qwen/Qwen2.5-1.5B",
        "nemo.precision": "bfloat16",
        # Megatron is the enabled backend: its sizes, not DTensor's
        "nv.dl.topology.size.tp": 2, "nv.dl.topology.size.pp": 2, "nv.dl.topology.size.cp": 1,
        "nv.dl.topology.size.ep": 4, "nv.dl.topology.size.world": 32, "nv.dl.topology.size.dp": 8,
        "nv.dl.training.config.global_batch_size": 512,
        "nv.dl.training.config.micro_batch_size": 4,
        "nv.dl.training.config.max_sequence_length": 4096,
        "nv.dl.training.config.num_prompts_per_step": 32,
        "nv.dl.training.config.num_generations_per_prompt": 16,
        "nv.dl.training.config.seed": 42,
        "nv.dl.training.target.max_steps": 500,
    }


@pytest.mark.parametrize("algorithm, stage", [("sft", "SFT"), ("sft_v2", "SFT"), ("rm", "RM"), ("dpo", "RL"),
                                              ("grpo", "RL"), ("distillation", "RL")])
def test_campaign_stage_follows_the_algorithm(algorithm, stage):
    assert run_resource_attributes({}, algorithm=algorithm, environ={})["nv.dl.campaign.stage"] == stage


def test_sft_v2_reads_the_sft_section_and_dtensor_sizes():
    config = {"policy": {"dtensor_cfg": {"enabled": True, "tensor_parallel_size": 4, "context_parallel_size": 2}},
              "cluster": {"num_nodes": 1, "gpus_per_node": 8}, "sft": {"max_num_epochs": 3, "max_num_steps": 90}}
    got = run_resource_attributes(config, algorithm="sft_v2", environ={})
    assert (got["nv.dl.topology.size.tp"], got["nv.dl.topology.size.cp"], got["nv.dl.topology.size.dp"]) == (4, 2, 1)
    assert (got["nv.dl.training.target.max_epochs"], got["nv.dl.training.target.max_steps"]) == (3, 90)


def test_a_world_size_that_does_not_divide_leaves_dp_out_and_says_why(caplog):
    config = {"policy": {"dtensor_cfg": {"tensor_parallel_size": 3}}, "cluster": {"num_nodes": 1, "gpus_per_node": 8}}
    got = run_resource_attributes(config, algorithm="grpo", environ={})
    assert got["nv.dl.topology.size.world"] == 8 and "nv.dl.topology.size.dp" not in got
    assert "not a multiple of tp*pp*cp = 3" in caplog.text


def test_provider_name_comes_from_the_scheduler_found_in_the_environment():
    assert run_resource_attributes({}, environ={"SLURM_JOB_ID": "77"})["nv.dl.provider.name"] == "slurm"
    assert run_resource_attributes({}, environ={"KUBERNETES_SERVICE_HOST": "10.0.0.1"})["nv.dl.provider.name"] \
        == "kubernetes"


WORKER = textwrap.dedent("""
    from nemo_telemetry.instrument import RLSpanGroup, init_telemetry_worker, managed_span
    assert init_telemetry_worker(rank=3, world_size=32, local_rank=3)
    with managed_span(RLSpanGroup.POLICY_UPDATE, "rl.grpo.policy_training"):
        pass
""")


def test_driver_and_worker_spans_carry_the_run_attributes(tmp_path):
    config = {"telemetry": {"enabled": True, "span_groups": "per_step", "exporter": "dump",
                            "dump_dir": str(tmp_path)}, **GRPO_CONFIG}
    init_telemetry_driver(config, algorithm="grpo")  # a whole config: it is also the run config
    with umbrella_span(RLSpanGroup.U_STEP, "rl.grpo.step"):
        pass
    assert shutdown_telemetry(timeout_s=5)
    subprocess.run([sys.executable, "-c", WORKER], env=dict(os.environ), check=True, timeout=120)

    spans = _resources_by_span(tmp_path)
    driver, worker = spans["rl.grpo.step"], spans["rl.grpo.policy_training"]
    for resource in (driver, worker):
        assert resource["rl.model"] == "Qwen/Qwen2.5-1.5B"
        assert resource["nemo.precision"] == "bfloat16"
        assert resource["nv.dl.campaign.stage"] == "RL"
        assert (resource["nv.dl.topology.size.tp"], resource["nv.dl.topology.size.dp"]) == ("2", "8")
        assert resource["nv.dl.training.config.num_generations_per_prompt"] == "16"
        assert resource["nv.dl.training.target.max_steps"] == "500"
        assert resource["nv.dl.provider.name"] in ("local", "slurm", "kubernetes")
        assert resource["nv.dl.software.python"] == platform.python_version()
        assert resource["nv.dl.software.opentelemetry_sdk"] == metadata.version("opentelemetry-sdk")
        assert resource["nv.dl.software.nemo_telemetry"] == metadata.version("nemo-telemetry")
    assert (worker["nv.dl.rank"], worker["nv.dl.world_size"]) == ("3", "32")
    assert driver["process.pid"] != worker["process.pid"]


def test_an_explicit_run_config_and_a_yaml_path(tmp_path):
    import yaml  # a dependency: the driver reads YAML configs with it

    path = tmp_path / "grpo.yaml"
    dump = tmp_path / "dump"
    path.write_text(yaml.safe_dump({"telemetry": {"enabled": True, "exporter": "dump", "dump_dir": str(dump)},
                                    **GRPO_CONFIG}))
    init_telemetry_driver(str(path), algorithm="grpo")
    assert json.loads(os.environ[env.NEMO_TELEMETRY_RESOURCE_ATTRIBUTES])["rl.model"] == "Qwen/Qwen2.5-1.5B"
    init_telemetry_driver({"enabled": True, "exporter": "dump", "dump_dir": str(dump)}, algorithm="sft",
                          run_config={"policy": {"model_name": "llama"}})
    written = json.loads(os.environ[env.NEMO_TELEMETRY_RESOURCE_ATTRIBUTES])
    assert (written["rl.model"], written["nv.dl.campaign.stage"]) == ("llama", "SFT")
    shutdown_telemetry()


def test_a_bad_inherited_value_warns_and_telemetry_still_starts(tmp_path, monkeypatch, caplog):
    from nemo_telemetry.instrument import init_telemetry_worker

    monkeypatch.setenv(env.NEMO_TELEMETRY_ENABLED, "1")
    monkeypatch.setenv(env.NEMO_TELEMETRY_EXPORTER, "dump")
    monkeypatch.setenv(env.NEMO_TELEMETRY_DUMP_DIR, str(tmp_path))
    monkeypatch.setenv(env.NEMO_TELEMETRY_RESOURCE_ATTRIBUTES, "{not json")
    assert init_telemetry_worker(rank=0, world_size=1)
    assert "NEMO_TELEMETRY_RESOURCE_ATTRIBUTES is not usable" in caplog.text
    shutdown_telemetry()
