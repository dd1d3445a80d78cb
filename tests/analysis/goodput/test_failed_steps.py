"""A step whose reward function raised is failed: its bucketed time is wasted, and check names the span.

The run is written by the instrumentation itself (``managed_span`` records the exception and ends
the span in error status, then re-raises; the loop skips that step's update), through the dump
exporter, and ingested: goodput and check read it through the public API and the CLI on every
local engine (in memory, streamed in batches of a few rows, the partitioned check file by file)
and in the monitor; Ray in tests/integration/test_ray_engine.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nemo_telemetry.analysis import (
    BUCKETS, MonitorState, check_run, check_with_engine, goodput_document, goodput_with_engine, ingest, read_spans,
    run_goodput,
)
from nemo_telemetry.analysis.engines.partitioned_check import stream_check
from nemo_telemetry.analysis.goodput.partials import stream_goodput
from nemo_telemetry.analysis.ingestion._columns import OtlpTables
from nemo_telemetry.analysis.model.schema import EVENTS_SCHEMA, LINKS_SCHEMA
from nemo_telemetry.analysis.store.dataset import DatasetWriter
from nemo_telemetry.cli.app import app
from nemo_telemetry.instrument import (
    RLSpanGroup as G, init_telemetry_driver, iteration_scope, managed_span, shutdown_telemetry, umbrella_span,
)

FAILED = 2  # the step whose reward function raises
MESSAGE = "reward function raised on prompt 7"


def nap(ms: float) -> None:
    time.sleep(ms / 1000)


def run_with_a_failing_reward(dump_dir: Path, steps: int = 3) -> None:
    """A GRPO-shaped loop whose reward function raises at step ``FAILED``: the loop logs it and
    goes on to the next step without an update, as a trainer that skips a bad batch does."""
    init_telemetry_driver({"enabled": True, "span_groups": "per_step", "exporter": "dump",
                           "dump_dir": str(dump_dir)}, algorithm="grpo")
    with umbrella_span(G.U_JOB, "rl.grpo.job"):
        for i in range(1, steps + 1):
            with iteration_scope(i), umbrella_span(G.U_STEP, "rl.grpo.step"):
                with managed_span(G.DATA_PROCESSING, "rl.grpo.data_processing"):
                    nap(2)
                with umbrella_span(G.U_ROLLOUT, "rl.grpo.generation"):
                    with managed_span(G.GENERATION, "rl.vllm.generate"):
                        nap(12)
                try:
                    with managed_span(G.REWARD, "rl.grpo.reward_calculation"):
                        nap(3)
                        if i == FAILED:
                            raise ValueError(MESSAGE)
                except ValueError:
                    continue  # no update from this batch
                with managed_span(G.POLICY_UPDATE, "rl.grpo.policy_training"):
                    nap(8)
    shutdown_telemetry(timeout_s=10)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("failed-steps")
    dumps = base / "dumps"
    run_with_a_failing_reward(dumps)
    ingest([dumps], out=base / "ingested")
    spans = read_spans(base / "ingested")
    return {"dumps": dumps, "dataset": _in_files_of(spans, base / "dataset", 4), "spans": spans}


def _in_files_of(spans, root: Path, rows: int) -> Path:
    """``spans`` as a dataset of files of ``rows`` spans: a step and the span that failed it in different files."""
    writer = DatasetWriter(root)
    for offset in range(0, spans.num_rows, rows):
        writer.write(OtlpTables(spans.slice(offset, rows), EVENTS_SCHEMA.empty_table(), LINKS_SCHEMA.empty_table()))
        writer.commit()
    writer.close()
    return root


def _by_hand(spans) -> dict:
    """Per iteration, the bucket sums of its bucketed spans, from the spans table by plain Python."""
    rows = spans.select(["name", "start_ns", "end_ns", "rl.bucket", "rl.iteration", "status_code",
                         "status_message", "span_id", "trace_id"]).to_pylist()
    sums: dict[int, dict[str, float]] = {}
    for r in rows:
        if r["rl.bucket"] is not None:
            it = sums.setdefault(r["rl.iteration"], dict.fromkeys(BUCKETS, 0.0))
            it[r["rl.bucket"]] += (r["end_ns"] - r["start_ns"]) / 1e9
    errors = [r for r in rows if r["status_code"] == "error"]
    return {"sums": sums, "errors": errors}


def test_the_instrument_ends_the_reward_span_in_error_with_its_message(run):
    errors = _by_hand(run["spans"])["errors"]
    assert [(e["name"], e["rl.iteration"]) for e in errors] == [("rl.grpo.reward_calculation", FAILED)]
    assert MESSAGE in errors[0]["status_message"]


def test_goodput_counts_the_failed_steps_buckets_as_wasted_and_keeps_them_beside(run):
    hand = _by_hand(run["spans"])["sums"]
    (result,) = run_goodput(run["spans"])
    steps = {s["iteration"]: s for s in goodput_document((result,))["runs"][0]["steps"]}
    failed = steps[FAILED]
    assert failed["failed"] is True and failed["goodput"] == 0.0
    assert failed["productive_s"] == failed["overhead_s"] == failed["idle_s"] == 0.0
    assert failed["failed_buckets"] == pytest.approx({f"{b}_s": hand[FAILED][b] for b in BUCKETS}, abs=1e-9)
    assert failed["wasted_s"] == pytest.approx(sum(hand[FAILED].values()), abs=1e-9)
    assert failed["failed_buckets"]["productive_s"] > 0.01  # generation and the reward pass before it raised
    for i in (1, 3):  # the other steps as their spans say
        assert steps[i]["failed"] is False and steps[i]["failed_buckets"] is None
        assert steps[i]["productive_s"] == pytest.approx(hand[i]["productive"], abs=1e-9)
    total = result.total
    assert total["failed_steps"] == 1 and total["steps"] == 3
    assert total["productive_s"] == pytest.approx(hand[1]["productive"] + hand[3]["productive"], abs=1e-9)
    assert total["failed_productive_s"] == pytest.approx(hand[FAILED]["productive"], abs=1e-9)
    assert goodput_document((result,))["runs"][0]["total"] == total
    assert total["goodput"] == pytest.approx(total["productive_s"] / total["wall_s"])


@pytest.mark.parametrize("engine", ["dataset in memory", "streamed in batches of 3 rows", "by rank"])
def test_every_local_engine_gives_the_same_failed_step(run, engine):
    expected = goodput_document(run_goodput(run["spans"], by="rank" if engine == "by rank" else "step"))
    if engine == "dataset in memory":
        got = goodput_with_engine(run["dataset"])
        got = goodput_document(got)
        for r in got["runs"]:  # with_step_metrics: no metrics here, so nothing is added
            r["steps"] = [{k: v for k, v in s.items() if not k.startswith("efficiency/")} for s in r["steps"]]
    elif engine == "by rank":
        got = goodput_document(stream_goodput(run["dataset"], batch_rows=3, by="rank"))
        ranks = got["runs"][0]["ranks"]
        assert len(ranks) == 1 and ranks[0]["wasted_s"] == pytest.approx(
            expected["runs"][0]["steps"][FAILED - 1]["wasted_s"], abs=1e-9)
    else:
        got = goodput_document(stream_goodput(run["dataset"], batch_rows=3))
    assert got == expected


def test_check_warns_of_the_failed_step_naming_the_span_and_its_message(run):
    report = check_run(run["spans"])
    (found,) = [f for f in report.findings if f.code == "failed-step"]
    error = _by_hand(run["spans"])["errors"][0]
    assert found.severity == "warning" and found.iteration == FAILED
    assert found.span_ids == (error["span_id"],) and found.trace_id == error["trace_id"]
    assert "'rl.grpo.reward_calculation'" in found.message and MESSAGE in found.message
    assert error["span_id"] in found.message and error["trace_id"] in found.message
    assert report.counts["by_code"]["failed-step"] == 1 and report.counts["warning"] >= 1
    assert stream_check(run["dataset"]).to_dict() == report.to_dict()
    assert check_with_engine(run["dataset"]).to_dict() == report.to_dict()


def test_the_cli_marks_the_step_and_check_gates_on_it(run):
    runner = CliRunner()
    doc = json.loads(runner.invoke(app, ["goodput", str(run["dataset"]), "--format", "json"]).stdout)
    steps = doc["runs"][0]["steps"]
    assert [s["failed"] for s in steps] == [False, True, False]
    assert doc["runs"][0]["total"]["failed_steps"] == 1 and doc["runs"][0]["caveats"] == []
    table = runner.invoke(app, ["goodput", str(run["dataset"])], env={"COLUMNS": "100"})
    assert table.exit_code == 0, table.output
    assert f"✗{FAILED}" in table.output and "failed step(s) 2" in table.output
    check = runner.invoke(app, ["check", str(run["dataset"])])
    assert check.exit_code == 0, check.output  # a warning: exit 1 only with --fail-on warning
    assert "failed-step" in check.output and MESSAGE in check.output
    gated = runner.invoke(app, ["check", str(run["dataset"]), "--fail-on", "warning", "--format", "json"])
    assert gated.exit_code == 1
    warnings = [f for f in json.loads(gated.stdout)["findings"] if f["severity"] == "warning"]
    assert [(f["code"], f["iteration"]) for f in warnings if f["code"] == "failed-step"] == [("failed-step", FAILED)]


def test_the_monitor_reports_the_failed_step_as_goodput_does(run):
    state = MonitorState(grace_s=0)
    for offset in range(0, run["spans"].num_rows, 5):  # arriving in small batches
        state.add(run["spans"].slice(offset, 5))
    records = {r.iteration: r.to_dict() for r in state.finish()}
    offline = {s["iteration"]: s for s in goodput_document(run_goodput(run["spans"]))["runs"][0]["steps"]}
    for i, record in records.items():
        assert {k: record[k] for k in offline[i]} == offline[i]
    assert records[FAILED]["failed"] is True
    kept = state.failed_spans[(records[FAILED]["run_id"], FAILED)]
    assert kept["name"] == "rl.grpo.reward_calculation" and MESSAGE in kept["message"]


def test_monitor_follow_prints_the_failed_step_and_warns(run):
    result = CliRunner().invoke(app, ["monitor", "--follow", str(run["dumps"]), "--format", "json", "--grace", "0",
                                      "--until-idle", "1"])
    assert result.exit_code == 0, result.output
    steps = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [s["failed"] for s in sorted(steps, key=lambda s: s["iteration"])] == [False, True, False]
    assert "1 failed step(s)" in result.stderr
