"""A run written by the instrumentation core through the dump exporter gives the goodput computed by hand.

The "by hand" side reads the raw OTLP JSON lines with ``json`` and plain Python, so the two
sides share nothing but the dump files.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nemo_telemetry.analysis import check_run, ingest, read_spans, run_goodput
from nemo_telemetry.cli.app import app
from nemo_telemetry.instrument import (
    RLSpanGroup as G,
    begin_checkpoint_finalize,
    bucket_scope,
    checkpoint_span,
    efficiency_span,
    init_telemetry_driver,
    iteration_scope,
    managed_span,
    shutdown_telemetry,
    umbrella_span,
)


def nap(ms: float) -> None:
    time.sleep(ms / 1000)


def run_instrumented_loop(dump_dir: Path, checkpoint_root: Path) -> None:
    """A GRPO-shaped loop: validation at iteration 0, two steps, a checkpoint whose finalize ends late."""
    init_telemetry_driver({"enabled": True, "span_groups": "per_step", "exporter": "dump",
                           "dump_dir": str(dump_dir)}, algorithm="grpo")
    finalize = None
    with umbrella_span(G.U_JOB, "rl.grpo.job"):
        with bucket_scope("overhead"), umbrella_span(G.U_EVALUATE, "rl.grpo.evaluate", **{"rl.iteration": 0}):
            with managed_span(G.GENERATION, "rl.vllm.generate"):
                nap(8)
        for i in (1, 2):
            with iteration_scope(i), umbrella_span(G.U_STEP, "rl.grpo.step"):
                with managed_span(G.DATA_PROCESSING, "rl.grpo.data_processing"):
                    nap(3)
                with umbrella_span(G.U_ROLLOUT, "rl.grpo.generation"):
                    with managed_span(G.GENERATION, "rl.vllm.generate"):
                        nap(15)
                with efficiency_span("idle/buffer_starvation"):
                    nap(4)
                with managed_span(G.POLICY_UPDATE, "rl.grpo.policy_training"):
                    nap(10)
                nap(5)  # under no bucketed span
                if i == 1:
                    with checkpoint_span("grpo"):
                        nap(3)
                        finalize = begin_checkpoint_finalize(checkpoint_root / "tmp_step_1")
        if finalize is not None:
            nap(2)
            finalize.end()  # the durable rename lands during step 2... or after it
    shutdown_telemetry(timeout_s=10)


def spans_by_hand(dump_dir: Path) -> list[dict]:
    out = []
    for path in sorted(dump_dir.rglob("*")):
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            for rs in json.loads(line).get("resourceSpans", []):
                for ss in rs["scopeSpans"]:
                    for s in ss["spans"]:
                        attrs = {a["key"]: next(iter(a["value"].values())) for a in s.get("attributes", [])}
                        out.append({"name": s["name"], "start": int(s["startTimeUnixNano"]),
                                    "end": int(s["endTimeUnixNano"]), "bucket": attrs.get("rl.bucket"),
                                    "iteration": int(attrs["rl.iteration"]) if "rl.iteration" in attrs else None})
    return out


def goodput_by_hand(spans: list[dict]) -> dict:
    """Every bucketed span here is stamped and sequential, so sums and unions are simple."""
    windows = {s["iteration"]: (s["start"], s["end"]) for s in spans if s["name"] == "rl.grpo.step"}
    steps: dict[int, dict] = {}
    outside: dict[str, int] = defaultdict(int)
    for it, (lo, hi) in windows.items():
        steps[it] = {"wall": hi - lo, "covered": 0, **{b: 0 for b in ("productive", "overhead", "idle", "wasted")}}
    for s in spans:
        if s["bucket"] is None:
            continue
        if s["iteration"] not in windows:
            outside[s["bucket"]] += s["end"] - s["start"]
            continue
        row, (lo, hi) = steps[s["iteration"]], windows[s["iteration"]]
        row[s["bucket"]] += s["end"] - s["start"]
        row["covered"] += max(0, min(s["end"], hi) - max(s["start"], lo))
    job = next(s for s in spans if s["name"] == "rl.grpo.job")
    return {"steps": steps, "outside": dict(outside), "job_wall": job["end"] - job["start"]}


@pytest.fixture(scope="module")
def dumped(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dump_run")
    run_instrumented_loop(root / "dump", root / "checkpoints")
    return root / "dump"


def test_dumped_run_gives_the_goodput_computed_by_hand(dumped):
    raw = spans_by_hand(dumped)
    hand = goodput_by_hand(raw)
    (run,) = run_goodput(read_spans(dumped))
    rows = {r["iteration"]: r for r in run.steps.to_pylist()}
    assert set(rows) == {1, 2}
    for it, expected in hand["steps"].items():
        row = rows[it]
        assert row["wall_s"] == pytest.approx(expected["wall"] / 1e9, abs=1e-9)
        for bucket in ("productive", "overhead", "idle", "wasted"):
            assert row[f"{bucket}_s"] == pytest.approx(expected[bucket] / 1e9, abs=1e-9)
        assert row["unattributed_s"] == pytest.approx((expected["wall"] - expected["covered"]) / 1e9, abs=1e-9)
        assert row["double_counted_s"] == pytest.approx(0.0, abs=1e-9)
        assert row["goodput"] == pytest.approx(expected["productive"] / expected["wall"])
        assert row["productive_s"] > 0.02 and row["idle_s"] > 0.003 and row["unattributed_s"] > 0.004
    (staging,) = [s for s in raw if s["name"] == "rl.grpo.checkpointing"]
    (finalize,) = [s for s in raw if s["name"] == "rl.checkpoint.finalize"]
    assert staging["iteration"] == finalize["iteration"] == 1 and finalize["bucket"] is None
    assert finalize["end"] > hand["steps"][1]["wall"] + min(s["start"] for s in raw if s["name"] == "rl.grpo.step")
    assert rows[1]["overhead_s"] >= (staging["end"] - staging["start"]) / 1e9  # staging counts in step 1
    assert run.outside_steps["overhead_s"] == pytest.approx(hand["outside"]["overhead"] / 1e9, abs=1e-9)
    assert run.outside_steps["iterations"] == [0]
    assert run.job_wall_s == pytest.approx(hand["job_wall"] / 1e9, abs=1e-9)


def test_dumped_run_has_no_error_findings_and_its_gaps_are_named(dumped):
    report = check_run(read_spans(dumped))
    assert report.counts["error"] == 0, report.findings
    missing = {f.message.split("'")[1] for f in report.findings if f.code == "missing-group-spans"}
    # per_step turned these on and this loop never opened them
    assert missing == {"advantage", "data_plane", "logprob", "model_init", "reward", "setup"}


def test_cli_goodput_on_the_ingested_dataset_matches_the_library(dumped, tmp_path):
    dataset = tmp_path / "dataset"
    ingest([dumped], out=dataset)
    doc = json.loads(CliRunner().invoke(app, ["goodput", str(dataset), "--format", "json"]).stdout)
    (run,) = run_goodput(read_spans(dumped))
    assert doc["runs"][0]["total"] == pytest.approx(run.total)
    assert doc["runs"][0]["run_id"] == run.run_id
