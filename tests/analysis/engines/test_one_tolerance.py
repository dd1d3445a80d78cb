"""One overlap tolerance for every finding that compares bucketed intervals, on every engine.

``bucketed-overlap``, ``bucket-exceeds-wall`` and ``nested-bucket`` are ``info`` for a case within
``--overlap-tolerance`` (clock granularity) and their usual severity (error) past it: in memory,
file by file (the partitioned check) and in small batches; Ray in tests/integration.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nemo_telemetry.analysis import check_run, spans_table
from nemo_telemetry.analysis.engines.partitioned_check import stream_check
from nemo_telemetry.analysis.findings.checks import check_span_files
from nemo_telemetry.analysis.model.tables import OtlpTables
from nemo_telemetry.analysis.model.schema import EVENTS_SCHEMA, LINKS_SCHEMA
from nemo_telemetry.analysis.model.tree import with_id_keys
from nemo_telemetry.analysis.store.dataset import DatasetWriter
from nemo_telemetry.analysis.ingestion.read import read_for_analysis
from nemo_telemetry.cli.app import app

MS = 1_000_000
T0 = 1_700_000_000_000_000_000
TRACE = "e" * 32
# step -> what its bucketed spans do; every step's buckets cover its wall, so an overlap or a
# nested span makes them sum past it
CLOCK_STEP = 1  # two siblings overlapping by 0.4 ms (a JS SDK's whole-ms start)
SHORT_NESTED_STEP = 2  # a 0.3 ms bucketed span under a bucketed span
REAL_OVERLAP_STEP = 3  # siblings overlapping by 5 ms
LONG_NESTED_STEP = 4  # a 5 ms bucketed span under a bucketed span
CLEAN_STEP = 5


def records() -> list[dict]:
    out = [{"trace_id": TRACE, "span_id": f"{1:016x}", "parent_span_id": None, "name": "rl.grpo.job",
            "start_ns": T0, "end_ns": T0 + 1000 * MS, "run_id": "run-tol"}]

    def add(name, start, end, parent, iteration=None, bucket=None):
        span_id = f"{len(out) + 1:016x}"
        out.append({"trace_id": TRACE, "span_id": span_id, "parent_span_id": f"{parent:016x}", "name": name,
                    "start_ns": start, "end_ns": end, "run_id": "run-tol", "iteration": iteration, "bucket": bucket})
        return len(out)

    for i in range(1, 6):
        at = T0 + i * 150 * MS
        step = add("rl.grpo.step", at, at + 100 * MS, 1, i)
        overlap = {CLOCK_STEP: 400_000, REAL_OVERLAP_STEP: 5 * MS}.get(i, 0)
        generate = add("rl.vllm.generate", at, at + 50 * MS, step, i, "productive")
        add("rl.grpo.policy_training", at + 50 * MS - overlap, at + 100 * MS, step, i, "productive")
        inner = {SHORT_NESTED_STEP: 300_000, LONG_NESTED_STEP: 5 * MS}.get(i)
        if inner:
            name = "rl.vllm.detokenize" if i == SHORT_NESTED_STEP else "rl.vllm.sample"  # a group per step
            add(name, at + 10 * MS, at + 10 * MS + inner, generate, None, "productive")
    return out


def write_dataset(root: Path) -> Path:
    """Cut into files of three spans: a step's spans, and a nested span and its ancestor, cross files."""
    spans = with_id_keys(spans_table(records()))
    writer = DatasetWriter(root)
    for offset in range(0, spans.num_rows, 3):
        writer.write(OtlpTables(spans.slice(offset, 3), EVENTS_SCHEMA.empty_table(), LINKS_SCHEMA.empty_table()))
        writer.commit()
    writer.close()
    return root


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("tol") / "ds")


CODES = ("bucketed-overlap", "bucket-exceeds-wall", "nested-bucket")


def severities(report) -> dict[tuple[str, int], str]:
    findings = report["findings"] if isinstance(report, dict) else [f.to_dict() for f in report.findings]
    return {(f["code"], f["iteration"]): f["severity"] for f in findings if f["code"] in CODES}


WITHIN_DEFAULT = {
    ("bucketed-overlap", CLOCK_STEP): "info", ("bucket-exceeds-wall", CLOCK_STEP): "info",
    ("bucketed-overlap", SHORT_NESTED_STEP): "info", ("bucket-exceeds-wall", SHORT_NESTED_STEP): "info",
    ("nested-bucket", SHORT_NESTED_STEP): "info",
    ("bucketed-overlap", REAL_OVERLAP_STEP): "error", ("bucket-exceeds-wall", REAL_OVERLAP_STEP): "error",
    ("bucketed-overlap", LONG_NESTED_STEP): "error", ("bucket-exceeds-wall", LONG_NESTED_STEP): "error",
    ("nested-bucket", LONG_NESTED_STEP): "error",
}


@pytest.mark.parametrize("tolerance_s, expected", [
    (0.001, WITHIN_DEFAULT),
    (0.0, {key: "error" for key in WITHIN_DEFAULT}),
    (0.0002, {key: "error" for key in WITHIN_DEFAULT}),  # 0.3 ms and 0.4 ms are past it
    (0.01, {key: "info" for key in WITHIN_DEFAULT}),
])
def test_each_code_follows_the_tolerance_identically_on_every_local_engine(dataset, tolerance_s, expected):
    in_memory = check_run(read_for_analysis(dataset), overlap_tolerance_s=tolerance_s)
    assert severities(in_memory) == expected
    assert stream_check(dataset, overlap_tolerance_s=tolerance_s).to_dict() == in_memory.to_dict()
    files = sorted(str(p) for p in (dataset / "spans").rglob("*.parquet"))
    assert check_span_files(files, overlap_tolerance_s=tolerance_s, batch_rows=2).to_dict() == in_memory.to_dict()
    errors = sum(severity == "error" for severity in expected.values())
    assert in_memory.counts["error"] == errors
    assert in_memory.counts["info"] == len(expected) - errors


def test_the_cli_exits_by_the_tolerance(dataset):
    """A run whose only findings of these codes are within the tolerance is not an error."""
    runner = CliRunner()
    wide = runner.invoke(app, ["check", str(dataset), "--overlap-tolerance", "10ms", "--format", "json"])
    assert wide.exit_code == 0, wide.output
    assert set(severities(json.loads(wide.stdout)).values()) == {"info"}
    default = runner.invoke(app, ["check", str(dataset), "--format", "json"])
    assert default.exit_code == 1
    assert severities(json.loads(default.stdout)) == WITHIN_DEFAULT
    info = {(f["code"], f["iteration"]): f["message"] for f in json.loads(default.stdout)["findings"]}
    assert "1 ms overlap tolerance" in info[("bucket-exceeds-wall", CLOCK_STEP)]
    assert "1 ms overlap tolerance" in info[("nested-bucket", SHORT_NESTED_STEP)]
