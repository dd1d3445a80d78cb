"""The findings a batch decides alone (what ``monitor`` shows live) are check_run's, code for code."""

from __future__ import annotations

from test_streaming_check import check_records

from nemo_telemetry.analysis.findings.checks import BATCH_FINDING_CODES, check_batch, check_run
from nemo_telemetry.analysis.model.records import spans_table

S = 1_000_000_000


def test_batch_findings_are_check_runs_for_their_codes():
    spans = spans_table(check_records())
    full, batch = check_run(spans), check_batch(spans)
    assert all(batch.counts["by_code"][code] for code in BATCH_FINDING_CODES)  # the scenario raises each
    assert list(batch.findings) == [f for f in full.findings if f.code in BATCH_FINDING_CODES]
    assert {c: batch.counts["by_code"][c] for c in BATCH_FINDING_CODES} == \
        {c: full.counts["by_code"][c] for c in BATCH_FINDING_CODES}
    capped = check_batch(spans, max_findings_per_code=1, max_span_ids=1)
    assert capped.counts["by_code"] == batch.counts["by_code"] and len(capped.findings) == len(BATCH_FINDING_CODES)


def test_an_unstamped_offender_is_named_with_its_stamped_ancestors_iteration():
    trace = "ab" * 16
    spans = spans_table([
        {"trace_id": trace, "span_id": "1" * 16, "name": "rl.grpo.step", "start_ns": 0, "end_ns": 10 * S,
         "iteration": 7, "run_id": "r"},
        {"trace_id": trace, "span_id": "2" * 16, "parent_span_id": "1" * 16, "name": "rl.grpo.policy_training",
         "start_ns": S, "end_ns": 2 * S, "run_id": "r"},
        {"trace_id": trace, "span_id": "3" * 16, "parent_span_id": "2" * 16, "name": "rl.policy.microbatch",
         "start_ns": S, "end_ns": 2 * S, "bucket": "busy", "run_id": "r"},
    ])
    [finding] = check_batch(spans).findings
    assert finding.code == "unknown-bucket" and finding.iteration == 7 and finding.run_id == "r"
    assert finding == next(f for f in check_run(spans).findings if f.code == "unknown-bucket")
