"""Step spans without ``rl.iteration`` are steps, numbered in start order per run and process.

A NeMo-RL-shaped loop that opens ``rl.grpo.step`` without ``iteration_scope``: goodput has its
steps (and the bucketed spans under them, by the ancestor walk), ``check`` says how they were
numbered and how to stamp them, on every engine (in memory, the partitioned check file by file,
streamed in small batches; Ray in tests/integration). A process that stamps some of its step
spans keeps its numbers: the others are left out and reported at warning.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nemo_telemetry.analysis import check_run, check_with_engine, goodput_with_engine, run_goodput, spans_table
from nemo_telemetry.analysis.engines.choose import CHECK_COLUMNS
from nemo_telemetry.analysis.engines.partitioned_check import stream_check
from nemo_telemetry.analysis.goodput.partials import stream_goodput
from nemo_telemetry.analysis.model.tables import OtlpTables
from nemo_telemetry.analysis.model.schema import EVENTS_SCHEMA, LINKS_SCHEMA
from nemo_telemetry.analysis.model.tree import with_id_keys
from nemo_telemetry.analysis.store.dataset import DatasetWriter
from nemo_telemetry.analysis.ingestion.read import read_for_analysis
from nemo_telemetry.cli.app import app

MS = 1_000_000
T0 = 1_700_000_000_000_000_000


def loop_records(*, run: str = "run-nemo", stamped: tuple[int, ...] = (), steps: int = 4,
                 trace: str = "d" * 32) -> list[dict]:
    """A driver's loop of ``steps`` steps; the steps of ``stamped`` carry rl.iteration, the rest
    none. Each step holds a bucketed generate (stamped by nothing but its step) and training span,
    and an unbucketed worker span in between, so the walk crosses a hop."""
    out: list[dict] = []

    def add(name, start, end, parent, **fields):
        span_id = f"{len(out) + 1:016x}"
        out.append({"trace_id": trace, "span_id": span_id, "parent_span_id": parent, "name": name,
                    "start_ns": start, "end_ns": end, "run_id": run, "service_name": "grpo-driver", "rank": 0,
                    **fields})
        return span_id

    job = add("rl.grpo.job", T0, T0 + (steps + 1) * 200 * MS, None)
    # written out of start order: the numbers follow the start times, not the rows
    for i in sorted(range(1, steps + 1), key=lambda k: (k % 2, k)):
        at = T0 + i * 200 * MS
        fields = {"iteration": 10 * i} if i in stamped else {}
        step = add("rl.grpo.step", at, at + 100 * MS, job, **fields)
        worker = add("rl.policy.worker_call", at, at + 60 * MS, step)
        add("rl.vllm.generate", at, at + 60 * MS, worker, bucket="productive")
        add("rl.grpo.policy_training", at + 60 * MS, at + 100 * MS, step, bucket="productive")
    return out


def write_dataset(records: list[dict], root: Path, per_file: int = 3) -> Path:
    spans = with_id_keys(spans_table(records))
    writer = DatasetWriter(root)
    for offset in range(0, spans.num_rows, per_file):
        writer.write(OtlpTables(spans.slice(offset, per_file), EVENTS_SCHEMA.empty_table(),
                                LINKS_SCHEMA.empty_table()))
        writer.commit()
    writer.close()
    return root


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return write_dataset(loop_records(), tmp_path_factory.mktemp("unstamped") / "ds")


def _steps(runs) -> list[tuple[int, float, float]]:
    return [(r["iteration"], round(r["wall_s"], 6), round(r["productive_s"], 6)) for r in runs[0].steps.to_pylist()]


EXPECTED_STEPS = [(i, 0.1, 0.1) for i in range(1, 5)]


def test_goodput_numbers_the_steps_and_attributes_their_spans_in_memory():
    runs = run_goodput(spans_table(loop_records()))
    assert _steps(runs) == EXPECTED_STEPS  # numbered by start, every bucketed span in its step
    assert runs[0].outside_steps.get("productive_s", 0) == 0
    assert runs[0].total["steps"] == 4 and runs[0].total["goodput"] == pytest.approx(1.0)


@pytest.mark.parametrize("engine", ["goodput_with_engine", "stream_goodput"])
def test_goodput_numbers_them_alike_on_a_dataset(dataset, engine):
    runs = (goodput_with_engine(dataset) if engine == "goodput_with_engine" else stream_goodput(dataset, batch_rows=2))
    assert _steps(runs) == EXPECTED_STEPS
    assert runs[0].outside_steps.get("productive_s", 0) == 0
    assert runs[0].total == run_goodput(spans_table(loop_records()))[0].total


def test_check_says_how_the_steps_were_numbered_on_every_local_engine(dataset):
    report = check_run(read_for_analysis(dataset, columns=CHECK_COLUMNS))  # with the process columns
    found = [f for f in report.findings if f.code == "step-without-iteration"]
    assert len(found) == 1 and found[0].severity == "info" and found[0].run_id == "run-nemo"
    message = found[0].message
    assert "4 rl.grpo.step span(s) of grpo-driver rank 0 carry no rl.iteration" in message
    assert "numbered 1..4 in start order per run and process" in message
    assert "iteration_scope(n)" in message and "start_step_span(n, ...)" in message
    assert len(found[0].span_ids) == 4
    assert not [f for f in report.findings if f.code in ("unstamped-span", "unattributed-step-time")]
    assert report.counts["info"] == 1 and report.counts["by_code"]["step-without-iteration"] == 1
    assert stream_check(dataset).to_dict() == report.to_dict()
    assert check_with_engine(dataset).to_dict() == report.to_dict()
    assert check_run(spans_table(loop_records())).to_dict() == report.to_dict()


def test_the_cli_shows_the_steps_and_no_no_step_spans_message(dataset):
    runner = CliRunner()
    table = runner.invoke(app, ["goodput", str(dataset)])
    assert table.exit_code == 0, table.output
    assert "no step spans" not in table.output.lower()
    doc = json.loads(runner.invoke(app, ["goodput", str(dataset), "--format", "json"]).stdout)
    assert [s["iteration"] for s in doc["runs"][0]["steps"]] == [1, 2, 3, 4]
    assert doc["runs"][0]["total"]["goodput"] == pytest.approx(1.0)
    check = runner.invoke(app, ["check", str(dataset), "--format", "json", "--fail-on", "warning"])
    assert check.exit_code == 0, check.output  # an info finding: no CI gate fails on it
    assert [f["code"] for f in json.loads(check.stdout)["findings"]] == ["step-without-iteration"]


def test_the_no_step_spans_message_remains_when_there_are_none(tmp_path):
    records = [r for r in loop_records() if r["name"] != "rl.grpo.step"]
    table = CliRunner().invoke(app, ["goodput", str(write_dataset(records, tmp_path / "ds"))])
    assert "no step spans" in table.output.lower()


def test_a_process_that_stamps_some_steps_keeps_its_numbers_and_the_rest_are_named():
    """Steps 1 and 3 carry rl.iteration 10 and 30; 2 and 4 none. A number guessed for 2 and 4 could
    coincide with the trainer's own, so they stay out of the steps, named at warning."""
    records = loop_records(stamped=(1, 3))
    runs = run_goodput(spans_table(records))
    assert [r["iteration"] for r in runs[0].steps.to_pylist()] == [10, 30]
    report = check_run(spans_table(records))
    found = [f for f in report.findings if f.code == "step-without-iteration"]
    assert [f.severity for f in found] == ["warning"]
    assert "2 rl.grpo.step span(s) of grpo-driver rank 0 carry no rl.iteration" in found[0].message
    assert "while its other step spans do" in found[0].message
    assert report.counts["by_code"]["step-without-iteration"] == 1


def test_numbers_are_per_run_and_process():
    """Two runs, and a second process of one run: each (run, process) is numbered from 1."""
    first = loop_records(run="run-a", steps=3)
    second = loop_records(run="run-b", steps=2, trace="f" * 32)
    for r in second:
        r["span_id"] = "b" + r["span_id"][1:]
        if r["parent_span_id"]:
            r["parent_span_id"] = "b" + r["parent_span_id"][1:]
    runs = {r.run_id: r for r in run_goodput(spans_table(first + second))}
    assert [s["iteration"] for s in runs["run-a"].steps.to_pylist()] == [1, 2, 3]
    assert [s["iteration"] for s in runs["run-b"].steps.to_pylist()] == [1, 2]
    report = check_run(spans_table(first + second))
    assert sorted(f.run_id for f in report.findings if f.code == "step-without-iteration") == ["run-a", "run-b"]
