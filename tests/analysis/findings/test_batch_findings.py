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


def _kv(key: str, value) -> dict:
    return {"key": key, "value": {"intValue": str(value)} if isinstance(value, int) else {"stringValue": value}}


def test_the_monitor_reports_check_runs_findings_of_the_codes_it_keeps(tmp_path):
    """``monitor --follow`` on a dump: its findings (counts and the newest) are ``check``'s for the
    codes a batch decides alone."""
    import json
    import threading

    from nemo_telemetry.analysis import read_spans, run_monitor
    from nemo_telemetry.analysis.monitor.run import LOCAL_FINDING_CODES

    trace, T0 = "cd" * 16, 1_700_000_000 * S
    spans = [  # (span id, parent, name, start s, end s, attributes)
        ("1" * 16, None, "rl.grpo.step", 0, 10, {"rl.iteration": 7}),
        ("2" * 16, "1" * 16, "rl.grpo.policy_training", 1, 2, {"rl.bucket": "busy"}),  # unknown-bucket
        ("3" * 16, "1" * 16, "rl.grpo.job", 2, 3, {"rl.bucket": "overhead"}),  # umbrella-bucket
        ("4" * 16, "1" * 16, "rl.grpo.reward_calculation", 5, 4, {"rl.bucket": "productive"}),  # invalid-interval
    ]
    request = {"resourceSpans": [{"resource": {"attributes": [_kv("nemo.run.id", "r"), _kv("service.name", "d")]},
                                  "scopeSpans": [{"scope": {"name": "t"}, "spans": [
                                      {"traceId": trace, "spanId": sid, **({"parentSpanId": parent} if parent else {}),
                                       "name": name, "kind": 1, "startTimeUnixNano": str(T0 + start * S),
                                       "endTimeUnixNano": str(T0 + end * S),
                                       "attributes": [_kv(k, v) for k, v in attributes.items()]}
                                      for sid, parent, name, start, end, attributes in spans]}]}]}
    (tmp_path / "dumps").mkdir()
    (tmp_path / "dumps" / "traces.jsonl").write_text(json.dumps(request) + "\n")
    expected = check_run(read_spans(tmp_path / "dumps"))
    kept = [f for f in expected.findings if f.code in LOCAL_FINDING_CODES]
    assert {f.code for f in kept} == set(LOCAL_FINDING_CODES)
    views, stop = [], threading.Event()
    guard = threading.Timer(60, stop.set)
    guard.start()
    try:
        summary = run_monitor(follow=tmp_path / "dumps", until_idle_s=0.5, poll_s=0.05, grace_s=0,
                              on_view=views.append, stop=stop)
    finally:
        guard.cancel()
    assert summary.findings_by_code == {c: expected.counts["by_code"][c] for c in LOCAL_FINDING_CODES}
    assert list(views[-1].findings) == kept
