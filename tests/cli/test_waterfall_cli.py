"""``nemo-telemetry waterfall``: the terminal view, the exports and the errors, on a dataset."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from rich.console import Console
from typer.testing import CliRunner

from nemo_telemetry.analysis import spans_table, waterfall
from nemo_telemetry.cli.app import app
from nemo_telemetry.cli.render import format_duration, print_waterfall
from nemo_telemetry.analysis.store.dataset import with_parent_rows

S = 1_000_000_000
TRACE, OTHER_TRACE = "a" * 32, "b" * 32


def span(sid: int, name: str, start: float, end: float, parent: int | None = None, **extra) -> dict:
    return {"trace_id": extra.pop("trace_id", TRACE), "span_id": f"{sid:016x}",
            "parent_span_id": None if parent is None else f"{parent:016x}", "name": name,
            "start_ns": int(start * S), "end_ns": int(end * S), **extra}


def records() -> list[dict]:
    spans = [
        span(1, "rl.grpo.job", 0, 100),
        span(2, "rl.grpo.step", 0, 40, 1, iteration=1),
        span(3, "rl.vllm.generate", 0, 20, 2, iteration=1, bucket="productive"),
        span(4, "rl.grpo.policy_training", 20, 36, 2, iteration=1, bucket="productive"),
        span(5, "rl.grpo.checkpointing", 36, 40, 2, iteration=1, bucket="overhead"),
        span(6, "rl.checkpoint.finalize", 38, 60, 5, iteration=1),
        span(7, "rl.grpo.step", 40, 100, 1, iteration=2),
        span(8, "rl.idle.buffer_starvation", 40, 50, 7, iteration=2, bucket="idle",
             efficiency_category="buffer_starvation", attributes={"rl.idle.polls": "7"}),
        span(9, "rl.vllm.generate", 70, 71, 0xDEAD, trace_id=OTHER_TRACE, iteration=2),
    ]
    spans += [span(100 + i, "rl.gym.run_rollouts", i / 10, 10 + i / 10, 3) for i in range(30)]
    return spans


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dataset")
    (root / "spans").mkdir()
    pq.write_table(with_parent_rows(spans_table(records())), root / "spans" / "part-0.parquet")  # format 1
    return root


def run(*args: object):
    return CliRunner().invoke(app, ["waterfall", *map(str, args)], env={"COLUMNS": "150"})


def render(shown, width: int = 150) -> str:
    out = Console(file=io.StringIO(), width=width, color_system=None)
    print_waterfall(shown, out)
    return out.file.getvalue()


def test_the_step_view_renders_tree_bars_buckets_and_critical_path():
    text = render(waterfall(spans_table(records()), step=1))

    assert text.splitlines() == [
        "waterfall · step 1 · window 1m00s · 35 spans in 6 rows",
        "[◆ critical path]  ━ productive  ━ overhead  ━ idle  ━ wasted  ━ unbucketed",
        "run run-1",
        "◆ rl.grpo.step                  ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━                         40s unbucketed driver/0     trace=aaaaaaaa rl.iteration=1",
        "  ├─ rl.vllm.generate           ━━━━━━━━━━━━━━━━━━━━                                             20s productive driver/0",
        "  │  └─ rl.gym.run_rollouts ×30 ━━━━━━━━━━━━╸                                                  12.9s unbucketed driver/0     Σ 5m00s p50 10s p99 10s",
        "  ├─ rl.grpo.policy_training                        ━━━━━━━━━━━━━━━━                             16s productive driver/0",
        "◆ └─ rl.grpo.checkpointing                                          ━━━━                          4s overhead   driver/0",
        "     └─ rl.checkpoint.finalize                                        ━━━━━━━━━━━━━━━━━━━━━━     22s unbucketed driver/0",
    ]


def test_the_default_view_is_the_jobs_steps_one_line_each(dataset):
    result = run(dataset)

    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "waterfall · window 1m40s · 39 spans in 4 rows"
    assert [line[:17] for line in lines[3:]] == [
        "  rl.grpo.job    ",
        "◆ ├─ rl.grpo.step",
        "◆ └─ rl.grpo.step",
        "  rl.vllm.generat",
    ]
    assert lines[4].endswith("rl.iteration=1 +34 hidden")
    assert "orphan (parent 000000000000dead missing) trace=bbbbbbbb rl.iteration=2" in lines[6]


def test_step_depth_and_min_duration_options(dataset):
    result = run(dataset, "--step", 2, "--min-duration", "5ms")
    assert result.exit_code == 0, result.output
    assert "rl.idle.buffer_starvation" in result.output
    assert "idle" in result.output and "rl.efficiency.category=buffer_starvation rl.idle.polls=7" in result.output
    assert "rl.vllm.generate" in result.output  # the orphan stamped 2 belongs to step 2's trees

    shallow = run(dataset, "--step", 1, "--depth", 0)
    assert shallow.exit_code == 0 and "rl.vllm.generate" not in shallow.output and "+34 hidden" in shallow.output

    long_only = run(dataset, "--step", 1, "--min-duration", "15s")
    assert "rl.grpo.checkpointing" not in long_only.output and "rl.grpo.policy_training" in long_only.output


def test_expand_and_trace_options(dataset):
    expanded = run(dataset, "--expand")
    assert "rl.gym.run_rollouts ×30" in expanded.output and "rl.checkpoint.finalize" in expanded.output

    one_trace = run(dataset, "--trace", "bbbb")
    assert one_trace.exit_code == 0
    assert "rl.vllm.generate" in one_trace.output and "rl.grpo.job" not in one_trace.output


def test_bad_options_exit_2_with_the_fix(dataset, tmp_path):
    no_step = run(dataset, "--step", 9)
    assert no_step.exit_code == 2 and "step iterations present: 1, 2" in no_step.output

    bad_duration = run(dataset, "--min-duration", "5 parsecs")
    assert bad_duration.exit_code == 2 and "e.g. 5ms, 1s" in bad_duration.output

    bad_export = run(dataset, "--export", tmp_path / "out.txt")
    assert bad_export.exit_code == 2 and ".json (Perfetto) or .html" in bad_export.output

    no_run = run(dataset, "--run", "elsewhere")
    assert no_run.exit_code == 2 and "runs present: run-1" in no_run.output


def test_export_json_and_html(dataset, tmp_path):
    perfetto = tmp_path / "trace.json"
    result = run(dataset, "--export", perfetto)
    assert result.exit_code == 0, result.output
    events = json.loads(perfetto.read_text())["traceEvents"]
    assert sum(e["ph"] == "X" for e in events) == len(records())
    assert f"wrote {perfetto}" in result.output.replace("\n", "")

    page = tmp_path / "view.html"
    result = run(dataset, "--export", page, "--step", 1)
    assert result.exit_code == 0, result.output
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and "rl.checkpoint.finalize" in text
    assert "rl.idle.buffer_starvation" not in text  # step 2 only


def test_help_has_an_example():
    result = CliRunner().invoke(app, ["waterfall", "--help"], env={"COLUMNS": "150"})

    assert result.exit_code == 0 and "Example: nemo-telemetry waterfall" in result.output


@pytest.mark.parametrize(("ns", "text"), [(850, "850ns"), (12_300, "12.3µs"), (4_560_000, "4.56ms"),
                                          (7_890_000_000, "7.89s"), (185 * S, "3m05s"), (3720 * S, "1h02m")])
def test_durations_read_in_the_unit_a_person_uses(ns, text):
    assert format_duration(ns) == text


def test_control_characters_in_span_data_never_reach_the_terminal():
    records = [span(1, "evil\x1b[2J\x1b]0;pwned\x07name", 0, 1, attributes={"rl.weight_version": "1\n2"})]

    text = render(waterfall(spans_table(records)))

    assert "\x1b" not in text and "\x07" not in text
    assert "evil\ufffd[2J\ufffd]0;pwned\ufffdname" in text
    assert "rl.weight_version=1\ufffd2" in text


def test_very_deep_rows_keep_their_names_in_view():
    records = [span(i + 1, f"level{i}", i / 100, 1 - i / 100, i if i else None) for i in range(40)]

    lines = render(waterfall(spans_table(records))).splitlines()

    deepest = lines[-1]
    assert deepest.startswith("  [39]") and "└─ level39" in deepest
    assert max(line.index("level") for line in lines[3:]) <= 2 + 30  # the guides are capped
