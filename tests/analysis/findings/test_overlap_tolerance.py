"""Clock granularity is not double counting: overlaps within the tolerance are info findings.

The OpenTelemetry JS SDK records start times in whole milliseconds, so back-to-back sibling
spans from a JS service overlap by up to 1 ms. Both engines (check_run in memory, the
partitioned check file by file) must give the same report for any tolerance.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nemo_telemetry.analysis import check_run, run_goodput, spans_table
from nemo_telemetry.analysis.ingestion.read import read_for_analysis
from nemo_telemetry.analysis.model.tables import OtlpTables
from nemo_telemetry.analysis.store.dataset import DatasetWriter
from nemo_telemetry.analysis.model.schema import EVENTS_SCHEMA, LINKS_SCHEMA
from nemo_telemetry.analysis.engines.partitioned_check import stream_check
from nemo_telemetry.analysis.model.tree import with_id_keys
from nemo_telemetry.cli.app import app

MS = 1_000_000
T0 = 1_700_000_000_000_000_000
TRACE = "c" * 32
STEPS = range(1, 7)
# step -> what its bucketed spans do besides three back-to-back siblings overlapping by 0.4 ms
REAL_OVERLAP_STEP = 4  # two spans overlapping by 5 ms
AT_TOLERANCE_STEP = 5  # an overlap of exactly 1 ms
NESTED_SHORT_STEP = 6  # a 0.3 ms span entirely inside another


def js_records() -> list[dict]:
    out = [{"trace_id": TRACE, "span_id": f"{1:016x}", "parent_span_id": None, "name": "rl.grpo.job",
            "start_ns": T0, "end_ns": T0 + 1000 * MS, "run_id": "run-js", "rank": 0}]
    sid = 100

    def add(name, start, end, parent, iteration, rank, bucket=None):
        nonlocal sid
        sid += 1
        out.append({"trace_id": TRACE, "span_id": f"{sid:016x}", "parent_span_id": f"{parent:016x}", "name": name,
                    "start_ns": start, "end_ns": end, "run_id": "run-js", "rank": rank, "iteration": iteration,
                    "bucket": bucket, "service_name": f"js-env-{rank}"})
        return sid

    for i in STEPS:
        at = T0 + i * 150 * MS
        step = add("rl.grpo.step", at, at + 120 * MS, 1, i, 0)
        edges = [at, at + 30 * MS, at + 60 * MS, at + 90 * MS]
        for k in range(3):  # each starts 0.4 ms before the previous one ended (JS whole-ms start times)
            add(f"rl.grpo.phase_{k}", edges[k] - (400_000 if k else 0), edges[k + 1], step, i, k, "productive")
        if i == REAL_OVERLAP_STEP:
            add("rl.grpo.reward_calculation", at + 85 * MS, at + 95 * MS, step, i, 1, "overhead")
        if i == AT_TOLERANCE_STEP:
            add("rl.grpo.reward_calculation", at + 89 * MS, at + 95 * MS, step, i, 1, "overhead")
        if i == NESTED_SHORT_STEP:
            add("rl.grpo.advantage_calculation", at + 10 * MS, at + 10 * MS + 300_000, step, i, 2, "overhead")
    return out


def write_js_dataset(root: Path) -> Path:
    """Partitioned by rank and cut into small files: every step's overlaps cross files."""
    spans = with_id_keys(spans_table(js_records()))
    writer = DatasetWriter(root)
    for offset in range(0, spans.num_rows, 5):
        writer.write(OtlpTables(spans.slice(offset, 5), EVENTS_SCHEMA.empty_table(), LINKS_SCHEMA.empty_table()))
        writer.commit()  # one commit per small file, as a receiver writes them
    writer.close()
    return root


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return write_js_dataset(tmp_path_factory.mktemp("js") / "ds")


def _overlaps(report) -> dict[int, str]:
    return {f.iteration: f.severity for f in report.findings if f.code == "bucketed-overlap"}


def test_overlaps_within_the_default_tolerance_are_info_and_still_counted(dataset):
    spans = read_for_analysis(dataset)
    report = check_run(spans)
    assert _overlaps(report) == {1: "info", 2: "info", 3: "info", 4: "error", 5: "info", 6: "info"}
    assert report.counts["by_code"]["bucketed-overlap"] == 6
    info = next(f for f in report.findings if f.code == "bucketed-overlap" and f.iteration == 1)
    assert "clock granularity" in info.message and "1 ms" in info.message
    steps = {r["iteration"]: r for r in run_goodput(spans)[0].steps.to_pylist()}
    assert steps[1]["double_counted_s"] == pytest.approx(0.0008, abs=1e-12)  # counted exactly
    assert steps[5]["double_counted_s"] == pytest.approx(0.0018, abs=1e-12)
    assert steps[6]["double_counted_s"] == pytest.approx(0.0011, abs=1e-12)
    assert steps[4]["double_counted_s"] == pytest.approx(0.0058, abs=1e-12)  # 0.8 ms + the real 5 ms


@pytest.mark.parametrize("tolerance_s, expected", [
    (0.0, {i: "error" for i in STEPS}),
    (0.0003, {i: "error" for i in STEPS}),  # the 0.4 ms sibling overlaps are past it
    (0.0005, {1: "info", 2: "info", 3: "info", 4: "error", 5: "error", 6: "info"}),
    (0.001, {1: "info", 2: "info", 3: "info", 4: "error", 5: "info", 6: "info"}),
    (0.01, {i: "info" for i in STEPS}),
])
def test_both_engines_give_the_same_report_for_any_tolerance(dataset, tolerance_s, expected):
    in_memory = check_run(read_for_analysis(dataset), overlap_tolerance_s=tolerance_s)
    assert _overlaps(in_memory) == expected
    assert stream_check(dataset, overlap_tolerance_s=tolerance_s).to_dict() == in_memory.to_dict()


def test_counts_past_the_cap_keep_each_findings_severity(dataset):
    capped = check_run(read_for_analysis(dataset), max_findings_per_code=2)
    assert len([f for f in capped.findings if f.code == "bucketed-overlap"]) == 2
    full = check_run(read_for_analysis(dataset))
    assert capped.counts["error"] == full.counts["error"] and capped.counts["info"] == full.counts["info"]
    assert stream_check(dataset, max_findings_per_code=2).to_dict() == capped.to_dict()


def test_a_negative_tolerance_is_refused(dataset):
    with pytest.raises(Exception, match="overlap tolerance"):
        check_run(read_for_analysis(dataset), overlap_tolerance_s=-0.001)


def test_check_cli_overlap_tolerance(dataset):
    runner = CliRunner()
    default = runner.invoke(app, ["check", str(dataset), "--format", "json", "--fail-on", "error"])
    doc = json.loads(default.stdout)
    severities = {f["iteration"]: f["severity"] for f in doc["findings"] if f["code"] == "bucketed-overlap"}
    assert severities[1] == "info" and severities[4] == "error"
    assert default.exit_code == 1  # step 4's 5 ms overlap is real
    wide = runner.invoke(app, ["check", str(dataset), "--overlap-tolerance", "10ms", "--format", "json"])
    assert wide.exit_code == 0, wide.output
    assert json.loads(wide.stdout)["counts"]["error"] == 0
    strict = runner.invoke(app, ["check", str(dataset), "--overlap-tolerance", "0", "--format", "json"])
    assert json.loads(strict.stdout)["counts"]["by_code"]["bucketed-overlap"] == 6
    assert sum(f["severity"] == "error" for f in json.loads(strict.stdout)["findings"]
               if f["code"] == "bucketed-overlap") == 6
    bad = runner.invoke(app, ["check", str(dataset), "--overlap-tolerance", "-1ms"])
    assert bad.exit_code == 2 and "--overlap-tolerance -1ms" in bad.stderr
