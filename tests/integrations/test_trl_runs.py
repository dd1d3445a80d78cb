"""Real TRL runs (GRPO, SFT, DPO) traced by ``instrument_trl()``: phases, buckets, windows, and check.

Each run is 5 optimizer steps of a tiny random Qwen2 on the CPU, with evaluation at step 3 (and at the
end, step 5) and a checkpoint at steps 2 and 4 (and the final one at 5), traced with nothing but the one line.
"""

from __future__ import annotations

import pytest
from conftest import goodput_json, run_cli, train_traced

TOLERANCE_S = 0.005  # the bound: per-step bucket sums against the test's own timers

PRODUCTIVE = {
    "grpo": ("generate", "reward_calculation", "forward", "backward", "optimizer_step"),
    "sft": ("forward", "backward", "optimizer_step"),
    "dpo": ("forward", "backward", "optimizer_step"),
}
OVERHEAD = {  # an evaluation is one overhead leaf over its loop; the seams inside it are children
    "grpo": ("data_processing", "logprobs", "checkpointing", "eval:evaluation_loop"),
    "sft": ("data_processing", "checkpointing", "eval:evaluation_loop"),
    "dpo": ("data_processing", "checkpointing", "eval:evaluation_loop"),
}
PHASE_SPANS = {  # phase span -> bucket, in every step
    "grpo": {"data_processing": "overhead", "generate": "productive", "reward_calculation": "productive",
             "policy_and_reference_logprobs": "overhead", "forward": "productive", "backward": "productive",
             "optimizer_step": "productive"},
    "sft": {"data_processing": "overhead", "forward": "productive", "backward": "productive",
            "optimizer_step": "productive"},
    "dpo": {"data_processing": "overhead", "forward": "productive", "backward": "productive",
            "optimizer_step": "productive"},
}


@pytest.fixture(scope="module", params=["grpo", "sft", "dpo"])
def run(request, tiny_model, tmp_path_factory, module_monkeypatch):
    kind = request.param
    traced = train_traced(kind, tiny_model, tmp_path_factory.mktemp(kind), module_monkeypatch)
    assert traced.error is None, traced.error
    module_monkeypatch.undo()
    return traced


def _steps(run) -> dict[int, dict]:
    (only,) = goodput_json(run.dump_dir)["runs"]
    return {s["iteration"]: s for s in only["steps"]}


def test_every_step_has_its_phase_spans_in_their_buckets(run):
    algo = run.kind
    spans = run.spans
    steps = _steps(run)
    assert sorted(steps) == [1, 2, 3, 4, 5]
    for iteration in steps:
        mine = [s for s in spans if s["iteration"] == iteration and s["bucket"] is not None
                and not s["name"].endswith(".evaluate")]
        train_phases = {}
        for span in mine:
            phase = span["name"].removeprefix(f"rl.{algo}.")
            train_phases.setdefault(phase, set()).add(span["bucket"])
        for phase, bucket in PHASE_SPANS[algo].items():
            assert phase in train_phases, (iteration, phase, sorted(train_phases))
            assert bucket in train_phases[phase], (iteration, phase, train_phases[phase])
    (job,) = [s for s in spans if s["name"] == f"rl.{algo}.job"]
    assert job["bucket"] is None
    step_spans = [s for s in spans if s["name"] == f"rl.{algo}.step"]
    assert sorted(s["iteration"] for s in step_spans) == [1, 2, 3, 4, 5]
    assert all(s["bucket"] is None for s in step_spans)
    resource = job["resource"]
    assert resource["rl.algorithm"] == algo
    assert resource["nemo.precision"] == ("bf16" if algo == "grpo" else "fp32")  # as each run's config says
    assert resource["nv.dl.topology.size.world"] == 1
    assert resource["nv.dl.topology.size.gradient_accumulation"] == (1 if algo == "grpo" else 2)
    for package in ("trl", "transformers", "torch", "accelerate"):
        assert resource[f"nv.dl.software.{package}"]
    assert resource["rl.model"] == run.model
    # a Trainer rank trains: the policy fleet, with the devices it drives (none on this CPU run)
    assert resource["rl.fleet"] == "policy" and resource["nv.dl.gpu.count"] == 0


def _span_seconds(run, iteration: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for span in run.spans:
        if span["iteration"] == iteration and span["bucket"] is not None:
            key = span["name"].rsplit(".", 1)[-1] + ":" + span["bucket"]
            out[key] = round(out.get(key, 0.0) + (span["end_ns"] - span["start_ns"]) / 1e9, 4)
    return out


def test_bucket_sums_match_the_tests_own_timers(run):
    steps = _steps(run)
    assert steps, "the goodput table has no step"
    for iteration, step in steps.items():
        timed = run.timers.seconds[iteration]
        productive = sum(timed[p] for p in PRODUCTIVE[run.kind])
        overhead = sum(timed[p] for p in OVERHEAD[run.kind])
        detail = (f"step {iteration}: spans productive {step['productive_s']:.4f} overhead {step['overhead_s']:.4f}; "
                  f"timers productive {productive:.4f} overhead {overhead:.4f}; timers {dict(timed)}; "
                  f"spans {_span_seconds(run, iteration)}")
        assert abs(step["productive_s"] - productive) <= TOLERANCE_S, detail
        assert abs(step["overhead_s"] - overhead) <= TOLERANCE_S, detail
        assert step["productive_s"] > 0


def test_step_windows_hold_evaluation_and_checkpoints(run):
    spans = run.spans
    steps = _steps(run)
    algo = run.kind
    evaluations = [s for s in spans if s["name"] == f"rl.{algo}.evaluate"]
    checkpoints = [s for s in spans if s["name"] == f"rl.{algo}.checkpointing"]
    assert sorted(s["iteration"] for s in evaluations) == [3, 5]  # eval_steps=3, and at the end of training
    assert sorted(s["iteration"] for s in checkpoints) == [2, 4, 5]
    for span in evaluations + checkpoints:
        window = steps[span["iteration"]]
        assert window["start_ns"] <= span["start_ns"] and span["end_ns"] <= window["end_ns"], span["name"]
        assert span["bucket"] in (None, "overhead")
    # The steps tile the training loop: their walls add up to TRL's own train_runtime.
    total_wall = sum(s["wall_s"] for s in steps.values())
    assert total_wall == pytest.approx(run.metrics["train_runtime"], rel=0.02, abs=0.05)


def test_check_passes_on_the_correct_run(run):
    done = run_cli("check", str(run.dump_dir), "--fail-on", "warning")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 error, 0 warning" in done.stdout


def test_each_phase_span_records_the_group_it_was_opened_in(run):
    """``check`` decides a group's presence by the group a span recorded (``rl.span_group``), whatever
    its name: TRL's generation is the generation group's."""
    recorded: dict[str, set] = {}
    for span in run.spans:
        if span["bucket"] is not None:
            recorded.setdefault(span["name"].removeprefix(f"rl.{run.kind}."), set()).add(
                span["attributes"].get("rl.span_group"))
    expected = {"data_processing": {"data_processing"}, "forward": {"policy_update"},
                "backward": {"policy_update"}, "optimizer_step": {"policy_update"}, "checkpointing": {"checkpoint"},
                "evaluation_loop": {"evaluate"}}
    if run.kind == "grpo":
        expected |= {"generate": {"generation"}, "reward_calculation": {"reward"},
                     "policy_and_reference_logprobs": {"logprob"}}
    assert {phase: recorded.get(phase) for phase in expected} == expected
