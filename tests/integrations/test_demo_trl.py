"""``nemo-telemetry demo --trainer trl``: the main job on a real trainer, with the toy demo's report."""

from __future__ import annotations

from conftest import run_cli


def test_demo_on_trl_prints_the_same_report(tmp_path):
    out = tmp_path / "demo"
    done = run_cli("demo", "--trainer", "trl", "--steps", "3", "--out", str(out), timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = done.stdout
    assert "Hugging Face TRL GRPOTrainer" in text and "traced by instrument_trl()" in text
    assert "goodput per step" in text and " total " in text
    for step in ("1", "2", "3"):
        assert any(line.split()[:1] == [step] for line in text.splitlines()), step
    assert "0 error" in text
    assert "rl.grpo.generate" in text and "rl.grpo.checkpointing" in text  # step 2's waterfall
    assert (out / "dataset").is_dir() and any((out / "dumps").glob("traces-*.jsonl"))


def test_demo_on_trl_refuses_the_async_mode(tmp_path):
    done = run_cli("demo", "--trainer", "trl", "--mode", "async", "--out", str(tmp_path / "demo"))
    assert done.returncode == 2
    assert "--mode sync" in done.stdout + done.stderr
