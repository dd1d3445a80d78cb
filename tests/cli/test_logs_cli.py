"""Logs through the CLI: ``ingest --json`` counts them, ``waterfall --export x.html`` shows them escaped."""

from __future__ import annotations

import json
import logging

from typer.testing import CliRunner

from nemo_telemetry.cli.app import app
from nemo_telemetry.instrument import (
    RLSpanGroup,
    init_telemetry_driver,
    iteration_scope,
    managed_span,
    shutdown_telemetry,
    umbrella_span,
)

BODY = "<b>rollout</b> & done"


def _run_with_logs(dump) -> None:
    init_telemetry_driver({"enabled": True, "span_groups": "per_step", "exporter": "dump", "dump_dir": str(dump),
                           "logs_enabled": True}, algorithm="grpo")
    log = logging.getLogger("trainer.cli_logs")
    log.setLevel(logging.INFO)
    with iteration_scope(1), umbrella_span(RLSpanGroup.U_STEP, "rl.grpo.step"):
        with managed_span(RLSpanGroup.GENERATION, "rl.grpo.generation"):
            log.info(BODY)
    assert shutdown_telemetry(timeout_s=5)


def test_ingest_counts_log_records_and_the_html_export_shows_them(tmp_path):
    dump, dataset, page = tmp_path / "dump", tmp_path / "ds", tmp_path / "run.html"
    _run_with_logs(dump)
    runner = CliRunner()

    result = runner.invoke(app, ["ingest", str(dump), "--out", str(dataset), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert (summary["logs"], summary["spans"], summary["skipped_records"]) == (1, 2, 0)

    result = runner.invoke(app, ["waterfall", str(dataset), "--export", str(page)])
    assert result.exit_code == 0, result.output
    html = page.read_text()
    assert "\\u003cb\\u003erollout\\u003c/b\\u003e \\u0026 done" in html and "<b>rollout" not in html

    result = runner.invoke(app, ["ingest", str(dump), "--out", str(tmp_path / "ds2")])
    assert result.exit_code == 0 and "logs" in result.output  # the table shows the count when there are logs
