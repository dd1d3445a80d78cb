"""The data-plane client wrapper and per_prompt_scope (seed 000, "Per-prompt spans").

Spans are read back from the dump files a real driver writes. The inner transfer-queue client
is a small in-process stand-in (a dict of partitions), the one test double here.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from nemo_telemetry.analysis import read_spans
from nemo_telemetry.instrument import (
    DATA_PLANE_OPS,
    RLSpanGroup as G,
    TracedDataPlaneClient,
    in_per_prompt_scope,
    init_telemetry_driver,
    managed_span,
    per_prompt_scope,
    shutdown_telemetry,
    umbrella_span,
)


class InProcessQueue:
    """Test double of a transfer-queue client: partitions of samples in a dict."""

    def __init__(self) -> None:
        self.partitions: dict[str, dict[str, object]] = {}

    def register(self, partition):
        self.partitions.setdefault(partition, {})

    def put(self, samples, partition="default"):
        self.partitions.setdefault(partition, {}).update(samples)
        return len(samples)

    def get(self, keys, partition="default"):
        return {k: self.partitions[partition][k] for k in keys}

    def get_data(self, keys, partition="default"):
        return self.get(keys, partition=partition)

    def claim_meta(self, partition="default"):
        return list(self.partitions.get(partition, {}))

    def check_consumption_status(self, partition="default"):
        return True

    def list_sample_ids(self, partition="default"):
        return sorted(self.partitions.get(partition, {}))

    def clear(self, partition="default"):
        self.partitions.pop(partition, None)

    def save_checkpoint(self, path):
        return path

    def load_checkpoint(self, path):
        return path

    def close(self):
        return None

    def slow_put(self, samples, partition="default"):
        raise TimeoutError("transfer queue did not answer within 5 s")


class AsyncQueue(InProcessQueue):
    async def put(self, samples, partition="default"):
        await asyncio.sleep(0)
        return super().put(samples, partition=partition)


def _start(dump_dir, span_groups: str) -> None:
    init_telemetry_driver({"enabled": True, "span_groups": span_groups, "exporter": "dump",
                           "dump_dir": str(dump_dir)})


def _spans(dump_dir) -> list[dict]:
    shutdown_telemetry(timeout_s=10)
    return sorted(read_spans(dump_dir).to_pylist(), key=lambda r: r["start_ns"])


def _attrs(row: dict) -> dict:
    return dict(row["attributes"] or [])


def test_each_of_the_eleven_ops_is_one_span_with_op_partition_keys_bytes_and_status(tmp_path):
    _start(tmp_path, "per_step")
    client = TracedDataPlaneClient(InProcessQueue())
    payload = {"a": np.zeros(4, np.float32), "b": b"12345678"}
    client.register(partition="train")
    client.put(payload, partition="train")
    client.get(["a"], partition="train")
    client.get_data(["a", "b"], partition="train")
    client.claim_meta(partition="train")
    client.check_consumption_status(partition="train")
    client.list_sample_ids(partition="train")
    client.save_checkpoint("/ckpt")
    client.load_checkpoint("/ckpt")
    client.clear(partition="train")
    client.close()
    rows = _spans(tmp_path)
    assert [r["name"] for r in rows] == [f"rl.data_plane.{op}" for op in (
        "register", "put", "get", "get_data", "claim_meta", "check_consumption_status", "list_sample_ids",
        "save_checkpoint", "load_checkpoint", "clear", "close")]
    assert {r["name"].removeprefix("rl.data_plane.") for r in rows} == set(DATA_PLANE_OPS)
    by_op = {_attrs(r)["rl.data_plane.op"]: r for r in rows}
    put = by_op["put"]
    assert put["rl.bucket"] == "overhead"
    assert _attrs(put)["rl.data_plane.partition"] == "train"
    assert _attrs(put)["rl.data_plane.keys"] == "2"
    assert _attrs(put)["rl.data_plane.bytes"] == "24"  # 4 float32 + 8 bytes
    assert _attrs(by_op["get"])["rl.data_plane.keys"] == "1"
    assert _attrs(by_op["get_data"])["rl.data_plane.bytes"] == "24"
    assert "rl.data_plane.partition" not in _attrs(by_op["close"])
    assert {_attrs(r)["rl.data_plane.status"] for r in rows} == {"ok"}


def test_a_timeout_and_an_error_are_told_apart_and_reraised(tmp_path):
    _start(tmp_path, "data_plane")
    inner = InProcessQueue()
    inner.put = inner.slow_put  # the put times out
    client = TracedDataPlaneClient(inner)
    with pytest.raises(TimeoutError):
        client.put({"a": b"x"})
    with pytest.raises(KeyError):
        client.get(["missing"], partition="nowhere")
    timeout, error = _spans(tmp_path)
    assert _attrs(timeout)["rl.data_plane.status"] == "timeout"
    assert _attrs(error)["rl.data_plane.status"] == "error"
    assert "rl.data_plane.keys" not in _attrs(error)
    assert timeout["status_code"] == error["status_code"] == "error"


def test_gated_on_data_plane_outside_and_on_per_prompt_inside_the_scope(tmp_path):
    _start(tmp_path, "data_plane")  # per_prompt off
    client = TracedDataPlaneClient(InProcessQueue())
    client.put({"batch": b"x"})
    with per_prompt_scope():
        assert in_per_prompt_scope()
        assert client.put({"rollout": b"y"}) == 1  # the op runs, unspanned
    rows = _spans(tmp_path)
    assert [_attrs(r)["rl.data_plane.keys"] for r in rows] == ["1"]

    _start(tmp_path / "b", "per_prompt")  # data_plane off
    client.put({"batch": b"x"})
    with per_prompt_scope():
        client.put({"rollout": b"y"})
    (rollout_put,) = _spans(tmp_path / "b")
    assert rollout_put["name"] == "rl.data_plane.put"
    assert rollout_put["rl.bucket"] is None  # per_prompt is an umbrella: rollouts overlap


def test_the_scope_reaches_an_async_put_in_a_task_created_inside_it(tmp_path):
    _start(tmp_path, "per_step,per_prompt")
    client = TracedDataPlaneClient(AsyncQueue())

    async def main():
        with per_prompt_scope():
            task = asyncio.create_task(client.put({"a": b"xy"}, partition="rollout"))
        await task
        await client.put({"b": b"z"})

    asyncio.run(main())
    rollout, batch = _spans(tmp_path)
    assert rollout["rl.bucket"] is None and batch["rl.bucket"] == "overhead"
    assert _attrs(rollout)["rl.data_plane.bytes"] == "2"


@pytest.mark.parametrize("span_groups", ["per_step", "all"])
def test_per_prompt_scope_leaves_every_other_span_its_group_and_bucket(tmp_path, span_groups):
    _start(tmp_path, span_groups)
    with per_prompt_scope():
        with managed_span(G.GENERATION, "rl.vllm.generate"):
            pass
        with umbrella_span(G.U_ROLLOUT, "rl.grpo.generation"):
            pass
    rows = {r["name"]: r for r in _spans(tmp_path)}
    assert rows["rl.vllm.generate"]["rl.bucket"] == "productive"
    assert rows["rl.grpo.generation"]["rl.bucket"] is None
