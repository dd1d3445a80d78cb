"""``nemo-telemetry goodput`` and ``check`` through the Typer runner, on datasets written to disk."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from rich.console import Console
from typer.testing import CliRunner

from nemo_telemetry.analysis import run_goodput, spans_table
from nemo_telemetry.cli.app import app
from nemo_telemetry.cli.render import render_run, step_bar
from nemo_telemetry.analysis.store.dataset import with_parent_rows

S = 1_000_000_000
TRACE = "a" * 32
STEP_KEYS = {"iteration", "wall_s", "productive_s", "overhead_s", "idle_s", "wasted_s", "unattributed_s",
             "double_counted_s", "goodput"}

runner = CliRunner()


def span(sid: int, name: str, start: float, end: float, parent: int | None = None, **extra) -> dict:
    return {"trace_id": extra.pop("trace_id", TRACE), "span_id": f"{sid:016x}",
            "parent_span_id": None if parent is None else f"{parent:016x}", "name": name,
            "start_ns": round(start * S), "end_ns": round(end * S), **extra}


def records(productive: float = 6.0, run_id: str = "run-1") -> list[dict]:
    """Job 0..30 s; validation at iteration 0; steps 1 and 2 (10 s each) with generate, training, staging."""
    out = [span(1, "rl.grpo.job", 0, 30, run_id=run_id),
           span(2, "rl.grpo.evaluate", 0, 4, 1, iteration=0, run_id=run_id),
           span(3, "rl.vllm.generate", 0, 3, 2, iteration=0, bucket="overhead", run_id=run_id)]
    sid = 10
    for i, at in ((1, 5), (2, 15)):
        step = sid
        out.append(span(step, "rl.grpo.step", at, at + 10, 1, iteration=i, run_id=run_id))
        out.append(span(sid + 1, "rl.vllm.generate", at, at + productive / 2, step, iteration=i, bucket="productive",
                        run_id=run_id))
        out.append(span(sid + 2, "rl.grpo.policy_training", at + 5, at + 5 + productive / 2, step, iteration=i,
                        bucket="productive", run_id=run_id))
        out.append(span(sid + 3, "rl.grpo.checkpointing", at + 9, at + 10, step, iteration=i, bucket="overhead",
                        run_id=run_id))
        sid += 10
    return out


def write_dataset(root: Path, recs: list[dict]) -> Path:
    (root / "spans").mkdir(parents=True)
    pq.write_table(with_parent_rows(spans_table(recs)), root / "spans" / "part-0.parquet")  # format 1
    return root


@pytest.fixture
def dataset(tmp_path) -> Path:
    return write_dataset(tmp_path / "run", records())


def test_goodput_json_contract(dataset):
    result = runner.invoke(app, ["goodput", str(dataset), "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    (run,) = doc["runs"]
    assert run["run_id"] == "run-1" and run["job_wall_s"] == 30.0
    assert [s["iteration"] for s in run["steps"]] == [1, 2]
    assert STEP_KEYS <= set(run["steps"][0])
    assert run["steps"][0]["productive_s"] == 6.0 and run["steps"][0]["goodput"] == pytest.approx(0.6)
    assert STEP_KEYS - {"iteration"} <= set(run["total"])
    assert run["total"]["wall_s"] == 20.0 and run["total"]["goodput"] == pytest.approx(0.6)
    assert run["outside_steps"]["overhead_s"] == 3.0 and run["outside_steps"]["iterations"] == [0]


def test_goodput_table_shows_each_step_the_total_and_the_time_outside_steps(dataset):
    result = runner.invoke(app, ["goodput", str(dataset)], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert any(line.split()[:2] == ["1", "10.00"] and "60.0%" in line for line in lines)
    assert any(line.split()[:2] == ["total", "20.00"] for line in lines)
    assert "outside any step: overhead 3.000 s" in result.stdout
    assert "job wall: 30.00 s; steps cover 66.7% of it" in result.stdout
    assert "█" in result.stdout and "░" in result.stdout


def test_rendering_is_stable_on_a_fixed_width_console(dataset):
    (run,) = run_goodput(spans_table(records()))
    out = Console(file=io.StringIO(), width=120, color_system=None)
    out.print(render_run(run))
    text = out.file.getvalue()
    assert "run run-1: goodput per step (seconds)" in text
    row = next(line for line in text.splitlines() if line.split()[:1] == ["1"])
    assert row.split()[1:9] == ["10.00", "6.000", "1.000", "0.000", "0.000", "3.000", "0.000", "60.0%"]


def test_step_bar_lengths_follow_the_wall_and_the_buckets():
    row = {"wall_s": 10.0, "productive_s": 5.0, "overhead_s": 2.5, "idle_s": 0.0, "wasted_s": 0.0,
           "unattributed_s": 2.5}
    assert step_bar(row, 10.0, width=20).plain == "█" * 15 + "░" * 5
    assert len(step_bar(row, 20.0, width=20).plain) == 10


def test_goodput_csv_has_a_row_per_step(dataset):
    result = runner.invoke(app, ["goodput", str(dataset), "--format", "csv"])
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [r["iteration"] for r in rows] == ["1", "2"] and float(rows[0]["goodput"]) == pytest.approx(0.6)


def test_goodput_by_rank(tmp_path):
    recs = records()
    recs.append(span(99, "rl.data_plane.get", 6, 7, 11, service_name="worker", rank=2, bucket="overhead"))
    root = write_dataset(tmp_path / "ranks", recs)
    result = runner.invoke(app, ["goodput", str(root), "--by", "rank", "--format", "json"])
    ranks = {(r["service_name"], r["rank"]): r for r in json.loads(result.stdout)["runs"][0]["ranks"]}
    assert ranks[("worker", 2)]["overhead_s"] == 1.0 and ranks[("driver", 0)]["productive_s"] == 12.0
    table = runner.invoke(app, ["goodput", str(root), "--by", "rank"], env={"COLUMNS": "120"})
    assert "worker:2" in table.stdout


def test_goodput_run_selection_and_several_runs(tmp_path):
    root = write_dataset(tmp_path / "two", records(run_id="a") + [
        {**r, "trace_id": "b" * 32} for r in records(productive=8.0, run_id="b")])
    doc = json.loads(runner.invoke(app, ["goodput", str(root), "--format", "json"]).stdout)
    assert {r["run_id"]: r["total"]["goodput"] for r in doc["runs"]} == pytest.approx({"a": 0.6, "b": 0.8})
    only = json.loads(runner.invoke(app, ["goodput", str(root), "--format", "json", "--run", "b"]).stdout)
    assert [r["run_id"] for r in only["runs"]] == ["b"]
    missing = runner.invoke(app, ["goodput", str(root), "--run", "c"])
    assert missing.exit_code == 2 and "no run 'c'" in missing.stderr


def test_goodput_baseline_compares_mean_steps_bucket_by_bucket(tmp_path, dataset):
    slower = write_dataset(tmp_path / "base", records(productive=4.0))
    doc = json.loads(runner.invoke(app, ["goodput", str(dataset), "--baseline", str(slower),
                                         "--format", "json"]).stdout)
    per_step = doc["runs"][0]["baseline"]["per_step"]
    assert per_step["productive_s"] == {"current": 6.0, "baseline": 4.0, "delta": 2.0}
    assert per_step["goodput"]["delta"] == pytest.approx(0.2)
    table = runner.invoke(app, ["goodput", str(dataset), "--baseline", str(slower)], env={"COLUMNS": "120"})
    assert "mean step: run run-1 against baseline run-1" in table.stdout and "+20.0 pt" in table.stdout


def test_goodput_plot_png(tmp_path, dataset):
    out = tmp_path / "goodput.png"
    result = runner.invoke(app, ["goodput", str(dataset), "--plot", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_usage_and_unreadable_input_exit_2(tmp_path, dataset):
    assert runner.invoke(app, ["goodput", str(dataset), "--format", "xml"]).exit_code == 2
    assert runner.invoke(app, ["goodput", str(dataset), "--plot", "x.svg"]).exit_code == 2
    assert runner.invoke(app, ["check", str(dataset), "--fail-on", "sometimes"]).exit_code == 2
    missing = runner.invoke(app, ["goodput", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "nope" in missing.stderr
    garbage = tmp_path / "garbage.json"
    garbage.write_text("this is not OTLP\n")
    result = runner.invoke(app, ["check", str(garbage)])
    assert result.exit_code == 2 and "garbage.json" in result.stderr


def test_check_json_contract_and_exit_codes(tmp_path, dataset):
    clean = runner.invoke(app, ["check", str(dataset), "--format", "json"])
    assert clean.exit_code == 0, clean.output
    doc = json.loads(clean.stdout)
    assert set(doc) == {"findings", "counts", "data"} and doc["counts"]["error"] == 0  # data: what the source holds
    assert [f["code"] for f in doc["findings"]] == ["unattributed-step-time"] * 2  # 30% of each step
    bad = records()
    bad.append(span(98, "rl.vllm.generate", 6, 8, 10, iteration=1, bucket="productive"))  # overlaps generate 11
    root = write_dataset(tmp_path / "bad", bad)
    result = runner.invoke(app, ["check", str(root), "--format", "json"])
    assert result.exit_code == 1
    finding = next(f for f in json.loads(result.stdout)["findings"] if f["code"] == "bucketed-overlap")
    assert set(finding) >= {"code", "severity", "message", "trace_id", "span_ids", "iteration"}
    assert finding["severity"] == "error" and finding["iteration"] == 1 and finding["trace_id"] == TRACE
    assert sorted(finding["span_ids"]) == [f"{11:016x}", f"{98:016x}"]
    assert runner.invoke(app, ["check", str(root), "--fail-on", "never"]).exit_code == 0
    assert runner.invoke(app, ["check", str(dataset), "--fail-on", "warning"]).exit_code == 1
    assert runner.invoke(app, ["check", str(dataset), "--unattributed-threshold", "0.5",
                               "--fail-on", "warning"]).exit_code == 0


def test_check_table_lists_each_finding_with_what_to_do(tmp_path):
    bad = records()
    bad.append(span(98, "rl.vllm.generate", 6, 8, 10, iteration=1, bucket="productive"))
    root = write_dataset(tmp_path / "bad", bad)
    result = runner.invoke(app, ["check", str(root)], env={"COLUMNS": "120"})
    assert result.exit_code == 1
    assert "error   bucketed-overlap  run run-1, step 1, trace " + TRACE in result.stdout
    assert "counted twice" in result.stdout and "1 error, 2 warning, 0 info" in result.stdout


def test_commands_have_help_with_an_example():
    for command in ("goodput", "check"):
        result = runner.invoke(app, [command, "--help"])
        assert result.exit_code == 0 and "Example: nemo-telemetry " + command in result.stdout


@pytest.mark.slow
def test_goodput_plot_html_renders_escaped_in_a_browser(tmp_path):
    from playwright.sync_api import sync_playwright

    chromium = Path("/usr/bin/chromium")
    if not chromium.exists():
        pytest.fail("/usr/bin/chromium is missing: install Debian's chromium package (`make browser`)")
    evil = "<img src=x onerror=alert(1)>"
    root = write_dataset(tmp_path / "evil", records(run_id=evil))
    out = tmp_path / "goodput.html"
    assert runner.invoke(app, ["goodput", str(root), "--plot", str(out), "--format", "json"]).exit_code == 0
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), args=["--headless", "--no-sandbox"])
        page = browser.new_page()
        dialogs: list[str] = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.goto(out.as_uri())
        assert page.locator("svg rect.productive").count() == 2
        assert page.locator("svg rect.unattributed").count() == 2
        assert evil in page.locator("h2").inner_text()
        assert page.locator("img").count() == 0 and dialogs == []
        browser.close()


def test_table_names_a_slow_step_and_the_bucket_that_grew():
    recs, at = [], 0.0
    for i, idle in enumerate([0, 0, 0, 0, 9], start=1):
        recs.append(span(10 * i, "rl.grpo.step", at, at + 10 + idle, iteration=i))
        recs.append(span(10 * i + 1, "rl.grpo.policy_training", at, at + 10, 10 * i, iteration=i, bucket="productive"))
        recs.append(span(10 * i + 2, "rl.idle.buffer_starvation", at + 10, at + 10 + idle, 10 * i, iteration=i,
                         bucket="idle"))
        at += 10 + idle
    (run,) = run_goodput(spans_table(recs))
    out = Console(file=io.StringIO(), width=120, color_system=None)
    out.print(render_run(run))
    assert "slow step 5: 19.00 s > 10.00 s (median + 3 MAD); idle grew most (+9.000 s)" in out.file.getvalue()
