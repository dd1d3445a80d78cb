"""A run with spans only an async run opens carries the caveat that its goodput has no productive
generation term (seed 000), on every engine and in JSON; a sync run carries none."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from nemo_telemetry.analysis import goodput_with_engine, run_goodput, spans_table
from nemo_telemetry.analysis.goodput.partials import stream_goodput
from nemo_telemetry.cli.app import app

from test_steps_without_iteration import MS, T0, write_dataset


def records() -> list[dict]:
    """Two runs of two stamped steps; in run-async the collector's waits (unbucketed, in a process
    of their own) are its only sign of being async."""
    out: list[dict] = []

    def add(name, start, end, parent=None, **fields):
        span_id = f"{len(out) + 1:016x}"
        out.append({"trace_id": fields.pop("trace"), "span_id": span_id, "parent_span_id": parent, "name": name,
                    "start_ns": T0 + start * MS, "end_ns": T0 + end * MS, **fields})
        return span_id

    for run, trace in (("run-sync", "a" * 32), ("run-async", "b" * 32)):
        job = add("rl.grpo.job", 0, 500, run_id=run, trace=trace)
        for i in (1, 2):
            step = add("rl.grpo.step", i * 200, i * 200 + 100, job, run_id=run, trace=trace, iteration=i)
            add("rl.grpo.policy_training", i * 200, i * 200 + 60, step, run_id=run, trace=trace, iteration=i,
                bucket="productive")
    add("rl.idle.refit_event_wait", 210, 230, None, run_id="run-async", trace="c" * 32, service_name="collector")
    return out


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_dataset(records(), tmp_path_factory.mktemp("async") / "ds", per_file=2)


def _caveats(runs) -> dict:
    return {r.run_id: r.caveats for r in runs}


def test_every_engine_gives_the_async_run_its_caveat_and_the_sync_run_none(dataset):
    expected = _caveats(run_goodput(spans_table(records())))
    assert expected["run-sync"] == ()
    (caveat,) = expected["run-async"]
    assert "no productive generation term" in caveat and "'generation contributed nothing'" in caveat
    assert _caveats(goodput_with_engine(dataset)) == expected  # the rows goodput reads include the waits
    assert _caveats(stream_goodput(dataset, batch_rows=2)) == expected
    assert _caveats(goodput_with_engine(dataset, by="rank")) == expected


def test_json_carries_the_caveats_and_the_table_prints_them_under_the_total(dataset):
    runner = CliRunner()
    doc = json.loads(runner.invoke(app, ["goodput", str(dataset), "--format", "json"]).stdout)
    caveats = {r["run_id"]: r["caveats"] for r in doc["runs"]}
    assert caveats["run-sync"] == [] and len(caveats["run-async"]) == 1
    table = runner.invoke(app, ["goodput", str(dataset), "--run", "run-async"], env={"COLUMNS": "100"})
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    total = next(i for i, line in enumerate(lines) if line.strip().startswith("total"))
    first = next(i for i, line in enumerate(lines) if line.startswith("async run:"))
    assert first > total and all(not line.strip() for line in lines[total + 1:first])
    sync = runner.invoke(app, ["goodput", str(dataset), "--run", "run-sync"], env={"COLUMNS": "100"})
    assert "async run" not in sync.output
