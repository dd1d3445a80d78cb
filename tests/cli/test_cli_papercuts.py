"""What a new user trips over first in the CLI (issue 19, item 10), through the Typer runner."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from nemo_telemetry.cli.app import app
from test_goodput_cli import records, span, write_dataset

runner = CliRunner()
COMMANDS = [c.name or c.callback.__name__ for c in app.registered_commands]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_flags_without_a_value_and_long_options_whole(command):
    result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0
    assert "<bool>" not in result.stdout
    assert "…" not in result.stdout  # no option name cut to fit a column
    assert re.search(r"^\s+--help\s+Show this message and exit\.", result.stdout, re.M)


def test_check_help_names_the_unattributed_threshold_in_full():
    result = runner.invoke(app, ["check", "--help"], env={"COLUMNS": "80"})
    assert "--unattributed-threshold <float range>" in result.stdout
    assert "--overlap-tolerance" in result.stdout


def test_resolve_json_flag_takes_no_value():
    result = runner.invoke(app, ["resolve", "--help"], env={"COLUMNS": "80"})
    assert re.search(r"^\s+--json\s+Print", result.stdout, re.M)


def test_goodput_without_step_spans_says_why_and_which_group_to_enable(tmp_path):
    # what the default preset emits: job, validation, checkpoint staging; no rl.<algo>.step
    recs = [span(1, "rl.grpo.job", 0, 30, run_id="run-d"),
            span(2, "rl.grpo.evaluate", 0, 4, 1, iteration=0, run_id="run-d"),
            span(3, "rl.grpo.checkpointing", 10, 12, 1, iteration=1, bucket="overhead", run_id="run-d")]
    root = write_dataset(tmp_path / "default-preset", recs)
    result = runner.invoke(app, ["goodput", str(root)], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    assert "no step spans in run run-d" in text
    assert "'step' group" in text and "span_groups: per_step" in text
    assert "goodput per step" not in text  # no empty table
    assert "outside any step: overhead 2.000 s" in text
    doc = json.loads(runner.invoke(app, ["goodput", str(root), "--format", "json"]).stdout)
    assert doc["runs"][0]["steps"] == []  # the JSON contract is unchanged


def test_goodput_by_rank_lists_every_process_with_its_full_name(tmp_path):
    recs = [{**r, "service_name": "demo-grpo-driver", "rank": 0} for r in records()]
    recs.append(span(99, "rl.data_plane.get", 6, 7, 11, service_name="demo-trajectory-collector", rank=2,
                     bucket="overhead"))
    for rank in (0, 1):  # workers whose spans carry no bucket
        recs.append(span(90 + rank, "rl.policy.train", 6, 7, 11, service_name="demo-policy-worker", rank=rank))
    root = write_dataset(tmp_path / "ranks", recs)
    result = runner.invoke(app, ["goodput", str(root), "--by", "rank"], env={"COLUMNS": "80"})
    assert result.exit_code == 0
    for name in ("demo-grpo-driver:0", "demo-policy-worker:0", "demo-policy-worker:1",
                 "demo-trajectory-collector:2"):
        assert name in result.stdout
    assert "…" not in result.stdout
    doc = json.loads(runner.invoke(app, ["goodput", str(root), "--by", "rank", "--format", "json"]).stdout)
    ranks = {(r["service_name"], r["rank"]): r for r in doc["runs"][0]["ranks"]}
    assert ranks[("demo-policy-worker", 1)]["productive_s"] == 0.0
    assert list(ranks) == sorted(ranks)  # by service, then rank


@pytest.mark.parametrize("module", ["nemo_telemetry", "nemo_telemetry.cli.app"])
def test_python_dash_m_runs_the_command_with_its_subcommands(module):
    """``python -m nemo_telemetry`` and ``python -m nemo_telemetry.cli.app`` are the console script:
    every command is there (run as ``__main__``, the app module is a copy no command registered on)."""
    import subprocess
    import sys

    shown = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    for command in ("ingest", "goodput", "check", "waterfall", "monitor", "demo"):
        assert re.search(rf"^\s+{command}\b", shown.stdout, re.MULTILINE), (command, shown.stdout)
