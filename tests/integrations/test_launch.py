"""Ranks under a real ``torchrun``: every rank exports with its own rank, all share one run id."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from conftest import HERE, read_spans, run_cli


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("rendezvous", ["static", "standalone"])
def test_two_torchrun_ranks_share_one_run_id(tiny_model, tmp_path, rendezvous):
    out = tmp_path / "run"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    launcher += ["--standalone"] if rendezvous == "standalone" else ["--master-addr", "127.0.0.1",
                                                                    "--master-port", str(_free_port())]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEMO_TELEMETRY_", "OTEL_"))}
    done = subprocess.run([*launcher, str(HERE / "torchrun_sft.py"), tiny_model, str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    spans = read_spans(out / "telemetry")
    ranks = {s["resource"]["nv.dl.rank"] for s in spans}
    runs = {s["resource"]["nemo.run.id"] for s in spans}
    assert ranks == {0, 1}
    assert len(runs) == 1, runs
    assert {s["resource"]["nv.dl.world_size"] for s in spans} == {2}
    assert {s["resource"]["nv.dl.topology.size.world"] for s in spans} == {2}
    # goodput --by rank shows both ranks of the one run, each with its three steps.
    shown = run_cli("goodput", str(out / "telemetry"), "--by", "rank", "--format", "json")
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    assert len(document["runs"]) == 1
    text = json.dumps(document)
    assert '"rank": 0' in text and '"rank": 1' in text, text[:2000]
