"""The series the seeds export: training scalars teed from ``train``, driver-side gen_ai.*, rl.host.memory.*.

Each test runs a real driver with the dump exporter and reads the values back from the metrics dump.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

from nemo_telemetry.analysis import read_metrics
from nemo_telemetry.instrument import (
    TRAIN_PREFIX,
    TRAINING_METRICS,
    flush_metrics,
    init_telemetry_driver,
    record_generation,
    shutdown_telemetry,
    tee_metrics,
)
from nemo_telemetry.instrument import training_metrics as keys


def _driver(tmp_path, **extra) -> None:
    assert init_telemetry_driver({"enabled": True, "exporter": "dump", "dump_dir": str(tmp_path), **extra},
                                 algorithm="grpo").enabled


def _points(tmp_path, name: str) -> list[dict]:
    return [row for row in read_metrics(tmp_path).to_pylist() if row["name"] == name]


def test_the_train_dict_is_teed_to_the_training_series(tmp_path):
    _driver(tmp_path)
    train = {keys.REWARD_KEY: 0.75, keys.LOSS_KEY: 1.25, keys.GRAD_NORM_KEY: 3.5, keys.LR_KEY: 1e-6,
             keys.TOTAL_NUM_TOKENS_KEY: 8192, keys.MEAN_GEN_TOKENS_PER_SAMPLE_KEY: 180.0, "not_declared": 1.0}
    assert tee_metrics(TRAIN_PREFIX, train) == 6
    assert tee_metrics("validation", {keys.LOSS_KEY: 9.0}) == 0  # a validation loss is not the policy loss
    assert shutdown_telemetry(timeout_s=5)

    got = {name: [r["value"] for r in _points(tmp_path, name)]
           for name in ("rl.reward.mean", "rl.policy.loss", "rl.grad_norm", "rl.learning_rate", "rl.train.tokens",
                        "rl.generation.tokens_per_sample.mean")}
    assert got == {"rl.reward.mean": [0.75], "rl.policy.loss": [1.25], "rl.grad_norm": [3.5],
                   "rl.learning_rate": [1e-6], "rl.train.tokens": [8192.0],
                   "rl.generation.tokens_per_sample.mean": [180.0]}
    assert all(row.logger_key.startswith("train/") for row in TRAINING_METRICS)


def test_each_step_exports_its_own_value(tmp_path):
    _driver(tmp_path)
    for reward in (0.1, 0.2, 0.3):
        tee_metrics(TRAIN_PREFIX, {keys.REWARD_KEY: reward})
        assert flush_metrics()
    shutdown_telemetry(timeout_s=5)
    assert [r["value"] for r in _points(tmp_path, "rl.reward.mean")] == [0.1, 0.2, 0.3]


def test_generation_calls_become_gen_ai_histograms(tmp_path):
    _driver(tmp_path)
    assert record_generation(input_tokens=[10, 30], output_tokens=[100, 300], duration_s=2.5, model="qwen") == 5
    shutdown_telemetry(timeout_s=5)

    usage = {dict(r["attributes"])["gen_ai.token.type"]: r for r in _points(tmp_path, "gen_ai.client.token.usage")}
    assert (usage["input"]["count"], usage["input"]["value"]) == (2, 40.0)
    assert (usage["output"]["count"], usage["output"]["value"]) == (2, 400.0)
    assert dict(usage["input"]["attributes"])["gen_ai.request.model"] == "qwen"
    assert usage["input"]["unit"] == "{token}"
    (duration,) = _points(tmp_path, "gen_ai.client.operation.duration")
    assert (duration["count"], duration["value"], duration["unit"]) == (1, 2.5, "s")


def test_host_memory_is_off_by_default(tmp_path):
    _driver(tmp_path)
    shutdown_telemetry(timeout_s=5)
    assert not [r for r in read_metrics(tmp_path).to_pylist() if r["name"].startswith("rl.host.memory.")]


WORKER = textwrap.dedent("""
    from nemo_telemetry.instrument import init_telemetry_worker, shutdown_telemetry
    assert init_telemetry_worker(rank=1, world_size=2, local_rank=1, service_name="worker-1")
    shutdown_telemetry()
""")


def test_host_memory_is_sampled_once_per_node(tmp_path):
    _driver(tmp_path, host_memory_metrics=True)
    # A worker of the same run on the same node: the driver holds the node's sampler.
    subprocess.run([sys.executable, "-c", WORKER], env=dict(os.environ), check=True, timeout=120)
    shutdown_telemetry(timeout_s=5)

    rows = [r for r in read_metrics(tmp_path).to_pylist() if r["name"].startswith("rl.host.memory.")]
    assert {r["service_name"] for r in rows} == {"nemo_rl-driver"}
    total = [r["value"] for r in rows if r["name"] == "rl.host.memory.total"]
    used = [r["value"] for r in rows if r["name"] == "rl.host.memory.used"]
    assert len(total) >= 1 and 0 < used[0] <= total[0]
    assert all(dict(r["attributes"]) == {"host.name": socket.gethostname()} for r in rows)
    meminfo_kib = int(next(line for line in open("/proc/meminfo") if line.startswith("MemTotal")).split()[1])
    assert total[0] == meminfo_kib * 1024


def test_host_memory_sampler_hands_the_node_to_the_next_run(tmp_path):
    _driver(tmp_path, host_memory_metrics=True)
    shutdown_telemetry(timeout_s=5)
    # A worker started after the driver stopped sampling takes the node over.
    subprocess.run([sys.executable, "-c", WORKER], env=dict(os.environ), check=True, timeout=120)
    rows = [r for r in read_metrics(tmp_path).to_pylist() if r["name"] == "rl.host.memory.total"]
    assert {r["service_name"] for r in rows} == {"nemo_rl-driver", "worker-1"}
