"""``--threads`` and ``--memory-budget`` on ``goodput`` and ``check`` (and their environment
variables): a budget below the dataset streams it with the same result; a value that cannot be
read is one line and exit 2."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from nemo_telemetry.analysis.engines import choose
from nemo_telemetry.cli.app import app
from nemo_telemetry.environment_variables import NEMO_TELEMETRY_MEMORY_BUDGET, NEMO_TELEMETRY_THREADS

from tests.cli.test_startup import STEPS, _dumps

runner = CliRunner()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A dataset as ingest writes it (what the streaming engine reads) of a three-step run."""
    from nemo_telemetry.analysis import ingest

    root = tmp_path_factory.mktemp("knobs")
    ingest([_dumps(root / "dumps", metrics=False)], out=root / "dataset")
    return root / "dataset"


@pytest.fixture
def streams(monkeypatch):
    """The calls of the streaming engine (the in-memory path makes none)."""
    monkeypatch.delenv(NEMO_TELEMETRY_THREADS, raising=False)
    monkeypatch.delenv(NEMO_TELEMETRY_MEMORY_BUDGET, raising=False)
    calls = []
    real = choose.stream_goodput
    monkeypatch.setattr(choose, "stream_goodput", lambda *a, **k: calls.append(a) or real(*a, **k))
    return calls


def _json(args):
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_goodput_memory_budget_below_the_dataset_streams_it_with_the_same_result(dataset, streams):
    whole = _json(["goodput", str(dataset), "--format", "json"])
    assert streams == []
    streamed = _json(["goodput", str(dataset), "--format", "json", "--memory-budget", "1", "--threads", "1"])
    assert len(streams) == 1
    assert streamed == whole and [s["iteration"] for s in whole["runs"][0]["steps"]] == list(STEPS)
    assert _json(["goodput", str(dataset), "--format", "json", "--memory-budget", "4G"]) == whole
    assert len(streams) == 1


def test_the_environment_variables_are_the_same_knobs(dataset, streams, monkeypatch):
    whole = _json(["goodput", str(dataset), "--format", "json"])
    monkeypatch.setenv(NEMO_TELEMETRY_MEMORY_BUDGET, "1")
    monkeypatch.setenv(NEMO_TELEMETRY_THREADS, "1")
    assert _json(["goodput", str(dataset), "--format", "json"]) == whole
    assert len(streams) == 1
    # the option wins over the variable
    assert _json(["goodput", str(dataset), "--format", "json", "--memory-budget", "1G"]) == whole
    assert len(streams) == 1


def test_check_takes_the_knobs_with_the_same_report(dataset, streams):
    report = _json(["check", str(dataset), "--format", "json"])
    assert _json(["check", str(dataset), "--format", "json", "--threads", "1", "--memory-budget", "64M"]) == report


@pytest.mark.parametrize("command", ["goodput", "check"])
@pytest.mark.parametrize("args, env, says", [
    (["--memory-budget", "lots"], {}, "memory budget 'lots'"),
    (["--threads", "0"], {}, "--threads"),
    ([], {NEMO_TELEMETRY_THREADS: "many"}, NEMO_TELEMETRY_THREADS),
    ([], {NEMO_TELEMETRY_MEMORY_BUDGET: "-1G"}, "memory budget"),
], ids=["budget", "threads", "threads-env", "budget-env"])
def test_a_value_that_cannot_be_read_is_exit_2(dataset, streams, monkeypatch, command, args, env, says):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = runner.invoke(app, [command, str(dataset), *args])
    assert result.exit_code == 2
    assert says in result.output
