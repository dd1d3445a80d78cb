"""``bench/gpu_vllm_check.py`` runs end to end on the CPU and passes its own checks (the session's one run)."""

from __future__ import annotations

CHECKS = ("one llm_request per prompt", "every llm_request under a generate span of its step",
          "requests attributed to steps [1, 2]", "validation generation is overhead",
          "rl.vllm.generation_tokens per step add up",
          "rl.fleet.busy.seconds from the engine's requests lies within the generate calls")


def test_the_gpu_check_runs_on_the_cpu_and_passes(vllm_check):
    report = vllm_check.stdout
    assert vllm_check.returncode == 0, report[-4000:] + vllm_check.stderr[-4000:]
    assert any(line.startswith("vLLM ") and line.endswith(" on cpu") for line in report.splitlines())
    assert "trace path taken: headers" in report
    for check in CHECKS:
        assert any(line.startswith("PASS") and check in line for line in report.splitlines()), check
    assert not [line for line in report.splitlines() if line.startswith("FAIL")]
