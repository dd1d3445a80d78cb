"""A GRPO step whose reward function raises: error status on the spans that failed, no orphan, all flushed."""

from __future__ import annotations

import json

from conftest import run_cli, train_traced

ERROR = 2  # OTLP STATUS_CODE_ERROR


class RewardFailsAtStep:
    """A reward function that raises on its ``fail_at``-th call (one call per training step here)."""

    __name__ = "reward_that_fails"

    def __init__(self, fail_at: int) -> None:
        self.calls = 0
        self.fail_at = fail_at

    def __call__(self, completions, **kwargs):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("the reward server is gone")
        return [float(len(str(c).split())) for c in completions]


def test_a_failing_reward_ends_every_open_span_with_error(tiny_model, tmp_path, monkeypatch):
    run = train_traced("grpo", tiny_model, tmp_path, monkeypatch, reward=RewardFailsAtStep(3))
    assert isinstance(run.error, RuntimeError)
    spans = run.spans
    by_id = {s["span_id"]: s for s in spans}
    # Nothing lost: every parent a span names was exported too (no orphan), and every span ended.
    for span in spans:
        assert span["parent_span_id"] is None or span["parent_span_id"] in by_id, span["name"]
        assert span["end_ns"] >= span["start_ns"]
    steps = {s["iteration"]: s for s in spans if s["name"] == "rl.grpo.step"}
    assert sorted(steps) == [1, 2, 3]
    assert steps[3]["status"] == ERROR and steps[1]["status"] != ERROR and steps[2]["status"] != ERROR
    (job,) = [s for s in spans if s["name"] == "rl.grpo.job"]
    assert job["status"] == ERROR
    failed = [s for s in spans if s["status"] == ERROR]
    assert {s["name"] for s in failed} >= {"rl.grpo.reward_calculation", "rl.grpo.step", "rl.grpo.job"}
    (reward,) = [s for s in failed if s["name"] == "rl.grpo.reward_calculation"]
    assert reward["iteration"] == 3
    assert "the reward server is gone" in reward["status_message"]
    # The analysis reads the failed run whole: no orphan, no detached trace, no span outside a step.
    done = run_cli("check", str(run.dump_dir), "--format", "json")
    assert done.returncode in (0, 1), done.stderr
    counts = json.loads(done.stdout)["counts"]["by_code"]
    assert counts["orphan-span"] == 0 and counts["detached-trace"] == 0 and counts["unstamped-span"] == 0, counts
