"""check_run: one hand-built trace per finding code, and the traces that must raise none."""

from __future__ import annotations

import functools

import pyarrow as pa
import pytest

from nemo_telemetry.analysis import spans_table
from nemo_telemetry.analysis.findings import checks
from nemo_telemetry.analysis.findings.checks import FINDING_CODES, SPAN_GROUPS_ATTRIBUTE
from nemo_telemetry.analysis.model.tree import with_id_keys

from _hand_traces import S, Trace


def healthy_step(t: Trace, parent: str | None, i: int, at: float) -> str:
    """A step fully covered by sequential bucketed leaves."""
    step = t.span("rl.grpo.step", at, at + 10, parent, iteration=i)
    t.span("rl.grpo.data_processing", at, at + 1, step, iteration=i, bucket="overhead")
    t.span("rl.vllm.generate", at + 1, at + 6, step, iteration=i, bucket="productive")
    t.span("rl.grpo.policy_training", at + 6, at + 10, step, iteration=i, bucket="productive")
    return step


# The codes each test declares with @emits, and the codes its check_run calls produce while it runs.
EMITTED_BY: dict[str, list[str]] = {}
_produced: list[set[str]] = []


def check_run(*args, **kwargs):
    """``checks.check_run``, noting the codes of its findings for the running @emits test."""
    report = checks.check_run(*args, **kwargs)
    if _produced:
        _produced[-1].update(f.code for f in report.findings)
    return report


def emits(*declared: str):
    """The test's own checks must produce each code in ``declared``: a test that asserts inside a
    filter (``{... if f.code == code}``) or on a code's absence cannot pass without the finding."""
    def decorate(test):
        for code in declared:
            EMITTED_BY.setdefault(code, []).append(test.__name__)

        @functools.wraps(test)
        def run(*args, **kwargs):
            _produced.append(set())
            try:
                test(*args, **kwargs)
            finally:
                produced = _produced.pop()
            assert set(declared) <= produced, f"{test.__name__} produced {sorted(produced)}, declares {declared}"
        return run
    return decorate


def codes(report) -> list[str]:
    return sorted(f.code for f in report.findings)


def only(report, code: str):
    found = [f for f in report.findings if f.code == code]
    assert len(found) == 1, report.findings
    return found[0]


def test_a_healthy_run_with_a_late_checkpoint_finalize_has_no_findings():
    t = Trace()
    job = t.span("rl.grpo.job", 0, 40)
    s1 = healthy_step(t, job, 1, 0)
    stage = t.span("rl.grpo.checkpointing", 9.5, 10, s1, iteration=1, bucket="overhead")
    t.records[-2]["end_ns"] = int(9.5 * S)  # training ends where staging starts
    t.span("rl.checkpoint.finalize", 9.6, 27, stage, iteration=1)  # ends two steps later
    healthy_step(t, job, 2, 10)
    healthy_step(t, job, 3, 20)
    report = check_run(t.table())
    assert report.findings == ()
    assert report.counts["error"] == report.counts["warning"] == report.counts["info"] == 0
    assert set(report.counts["by_code"]) == set(FINDING_CODES)
    assert not report.has("info")


@emits("bucketed-overlap", "bucket-exceeds-wall")
def test_concurrent_generate_spans_are_a_bucketed_overlap():
    t = Trace()
    step = t.span("rl.grpo.step", 0, 10, iteration=5)
    first = t.span("rl.vllm.generate", 0, 6, step, iteration=5, bucket="productive")
    second = t.span("rl.vllm.generate", 4, 10, step, iteration=5, bucket="productive")
    f = only(check_run(t.table()), "bucketed-overlap")
    assert f.severity == "error" and f.iteration == 5 and f.run_id == "run-1"
    assert set(f.span_ids) == {first, second} and f.trace_id == "a" * 32
    assert "2.000 s is counted twice" in f.message
    assert "bucket-exceeds-wall" in codes(check_run(t.table()))  # 12 s of buckets in a 10 s step


@emits("nested-bucket")
def test_bucketed_span_under_bucketed_ancestor_is_nested():
    t = Trace()
    step = t.span("rl.grpo.step", 0, 10, iteration=1)
    outer = t.span("rl.grpo.policy_training", 0, 10, step, iteration=1, bucket="productive")
    call = t.span("rl.policy.train", 1, 9, outer, service_name="worker")  # unbucketed in between
    inner = t.span("rl.data_plane.get", 1, 2, call, service_name="worker", bucket="overhead")
    f = only(check_run(t.table()), "nested-bucket")
    assert f.span_ids == (inner,) and f.iteration == 1 and "rl.grpo.policy_training" in f.message


@emits("umbrella-bucket")
def test_bucket_on_an_umbrella_or_declared_unbucketed_name():
    t = Trace()
    step = t.span("rl.grpo.step", 0, 10, iteration=1, bucket="productive")  # step: umbrella group only
    t.span("rl.grpo.policy_training", 0, 10, step, iteration=1)
    t.span("rl.checkpoint.finalize", 5, 20, step, iteration=1, bucket="overhead")  # declared unbucketed
    t.span("rl.idle.wait", 1, 2, step, iteration=1, bucket="idle", efficiency_category="idle/refit_event_wait")
    report = check_run(t.table())
    found = {f.message.split("'")[1]: f for f in report.findings if f.code == "umbrella-bucket"}
    assert set(found) == {"rl.grpo.step", "rl.checkpoint.finalize", "rl.idle.wait"}
    assert "only umbrella groups claim" in found["rl.grpo.step"].message
    assert "declares it unbucketed" in found["rl.checkpoint.finalize"].message
    assert all(f.severity == "error" for f in found.values())


@emits("bucket-exceeds-wall")
def test_bucket_sum_past_the_wall():
    t = Trace()
    step = t.span("rl.grpo.step", 0, 10, iteration=2)
    t.span("rl.grpo.checkpointing", 0, 12, step, iteration=2, bucket="overhead")  # runs past the step
    f = only(check_run(t.table()), "bucket-exceeds-wall")
    assert f.iteration == 2 and f.span_ids == (step,)
    assert "bucketed-overlap" not in codes(check_run(t.table()))


@emits("unknown-bucket")
def test_unknown_bucket_value():
    t = Trace()
    step = t.span("rl.grpo.step", 0, 10, iteration=1)
    t.span("rl.grpo.policy_training", 0, 10, step, iteration=1, bucket="useful")
    f = only(check_run(t.table()), "unknown-bucket")
    assert "'useful'" in f.message and "productive" in f.message and f.severity == "error"


@emits("unstamped-span")
def test_unstamped_bucketed_span():
    t = Trace()
    t.span("rl.grpo.step", 0, 10, iteration=1)
    lone = t.span("rl.vllm.generate", 2, 3, bucket="productive", trace="b" * 32)
    report = check_run(t.table())
    f = only(report, "unstamped-span")
    assert f.span_ids == (lone,) and f.iteration is None and f.severity == "warning"


@emits("orphan-span")
def test_orphan_span_names_a_parent_not_in_the_data():
    t = Trace()
    step = t.span("rl.grpo.step", 0, 10, iteration=1)
    t.span("rl.grpo.policy_training", 0, 10, step, iteration=1, bucket="productive")
    lost = t.span("rl.policy.train", 1, 2, "00000000deadbeef")
    f = only(check_run(t.table()), "orphan-span")
    assert f.span_ids == (lost,) and f.trace_id == "a" * 32


@emits("remote-parent", "orphan-span")
def test_a_server_span_whose_caller_is_not_in_the_data_has_a_remote_parent_not_a_lost_one():
    """A server (or consumer) span's parent is its caller's client span, in another process: missing,
    that caller is outside the data (info, with advice about the caller), not a worker's lost dump
    (orphan-span, whose advice is to flush workers), which an internal span with a missing parent keeps."""
    t = Trace()
    step = t.span("rl.grpo.step", 0, 10, iteration=1)
    t.span("rl.grpo.policy_training", 0, 10, step, iteration=1, bucket="productive")
    served = t.span("POST /v1/responses", 1, 2, "00000000cafef00d", kind="server")
    queued = t.span("rollouts process", 2, 3, "00000000cafef00e", kind="consumer")
    lost = t.span("rl.policy.train", 3, 4, "00000000deadbeef", kind="internal")
    report = check_run(t.table())
    remote = only(report, "remote-parent")
    assert set(remote.span_ids) == {served, queued} and remote.severity == "info" and remote.trace_id == "a" * 32
    assert "flush" not in remote.message and "caller" in remote.message
    orphan = only(report, "orphan-span")
    assert orphan.span_ids == (lost,) and "flush_telemetry" in orphan.message


@emits("remote-parent", "orphan-span")
def test_the_flags_is_remote_bit_decides_where_the_exporter_set_it():
    """OTLP span flags: 0x100 says the exporter knows whether the parent is remote, 0x200 that it is.
    Where set they win over the kind (an internal span continued from a carrier; a server span whose
    parent was in-process); without 0x100 the kind decides."""
    import pyarrow as pa

    t = Trace()
    step = t.span("rl.grpo.step", 0, 10, iteration=1)
    t.span("rl.grpo.policy_training", 0, 10, step, iteration=1, bucket="productive")
    carried = t.span("rl.worker.call", 1, 2, "00000000cafef00d", kind="internal")
    local = t.span("GET /health", 2, 3, "00000000cafef00e", kind="server")
    by_kind = t.span("POST /v1/responses", 3, 4, "00000000cafef00f", kind="server")
    flags = [None, None, 0x300, 0x100, 0x01]
    table = t.table()
    report = check_run(table.set_column(table.schema.get_field_index("flags"), "flags", pa.array(flags, pa.uint32())))
    assert set(only(report, "remote-parent").span_ids) == {carried, by_kind}
    assert only(report, "orphan-span").span_ids == (local,)


@emits("no-spans")
def test_a_source_without_spans_says_so_instead_of_consistent():
    report = check_run(spans_table([]))
    assert [(f.code, f.severity, f.run_id) for f in report.findings] == [("no-spans", "warning", None)]
    assert report.census.found == "no-spans" and report.to_dict()["data"]["spans"] == 0
    assert not report.has("error") and report.has("warning")  # exit 0 by default; --fail-on warning fails


@emits("no-rl-attributes")
def test_spans_without_an_rl_attribute_are_not_an_rl_run():
    t = Trace(run=None)
    root = t.span("GET /cart", 0, 1)
    t.span("SELECT cart", 0.2, 0.5, root, kind="client")
    report = check_run(t.table())
    assert codes(report) == ["no-rl-attributes"]
    f = report.findings[0]
    assert "2 span(s), none carrying an rl.* attribute" in f.message and f.run_id is None
    assert report.to_dict()["data"] | {"notes": None} == {"spans": 2, "rl_spans": 0, "step_spans": 0,
                                                          "found": "no-rl-attributes", "notes": None,
                                                          "runs": [{"run_id": None, "spans": 2, "rl_spans": 0,
                                                                    "step_spans": 0}]}


@emits("no-step-spans")
def test_a_run_with_bucketed_spans_and_no_step_span_says_it_has_no_steps():
    """Bucketed, stamped spans and no step span: goodput puts them outside any step with no other
    finding; the run is named, a run with steps beside it is not."""
    bare = Trace(run="bare")
    bare.span("rl.vllm.generate", 0, 4, iteration=1, bucket="productive")
    bare.span("rl.grpo.policy_training", 4, 9, iteration=1, bucket="productive")
    good = Trace(trace="b" * 32, run="good")
    healthy_step(good, None, 1, 0)
    report = check_run(spans_table(bare.records + good.records))
    assert codes(report) == ["no-step-spans"]
    f = report.findings[0]
    assert f.run_id == "bare" and "run bare: 2 of its 2 span(s)" in f.message and "per_step" in f.message
    assert report.census.found == "steps" and [r.run_id for r in report.census.runs_without_steps()] == ["bare"]
    assert codes(check_run(spans_table(bare.records + good.records), run_id="good")) == []


def test_a_parent_in_another_trace_does_not_count():
    t = Trace()
    step = t.span("rl.grpo.step", 0, 10, iteration=1)
    t.span("rl.grpo.policy_training", 0, 10, step, iteration=1, bucket="productive")
    t.span("rl.policy.train", 1, 2, step, trace="c" * 32)  # right span id, wrong trace
    assert "orphan-span" in codes(check_run(t.table()))


@emits("detached-trace")
def test_async_collector_batch_in_its_own_trace_is_detached():
    t = Trace()
    job = t.span("rl.grpo.job", 0, 30)
    healthy_step(t, job, 1, 0)
    batch = t.span("rl.grpo.generation", 2, 8, trace="c" * 32, service_name="collector")
    t.span("rl.idle.generation_limit_pause", 3, 4, batch, trace="c" * 32, service_name="collector",
           efficiency_category="idle/generation_limit_pause")
    # Startup and worker model loads are separate traces by design: not detached.
    startup = t.span("rl.startup", -10, -1, trace="d" * 32)
    t.span("rl.setup.ray_init", -10, -8, startup, trace="d" * 32)
    t.span("rl.vllm.load_model", -8, -2, trace="e" * 32, service_name="vllm_worker")
    f = only(check_run(t.table()), "detached-trace")
    assert f.trace_id == "c" * 32 and f.span_ids == (batch,)
    assert "current_trace_carrier" in f.message and "a" * 32 in f.message


def test_a_table_in_many_chunks_gives_the_report_of_one_chunk():
    """A dataset is read as many record batches: rows taken across chunk boundaries (trace keys,
    anchored traces, resource attributes) must be the rows of the one-chunk table."""
    t = Trace()
    job = t.span("rl.grpo.job", 0, 30, **resources("job,step,rollout"))
    healthy_step(t, job, 1, 0)
    t.span("rl.policy.train", 1, 2, "f" * 16)  # orphan
    for k in range(6):  # detached traces, one per chunk or so
        trace = f"{k + 1:x}" * 32
        batch = t.span("rl.grpo.generation", 2, 8, trace=trace, service_name="collector")
        t.span("rl.grpo.generation", 3, 4, batch, trace=trace, bucket="productive")
    table = with_id_keys(t.table())  # as a dataset holds them: the uint64 keys chunked like the rest
    chunked = pa.Table.from_batches(table.to_batches(max_chunksize=3))
    assert chunked.column("trace_key").num_chunks > 4
    one, many = check_run(table).to_dict(), check_run(chunked).to_dict()
    assert {"detached-trace", "orphan-span"} <= {f["code"] for f in one["findings"]}
    assert many == one


def test_no_trace_is_detached_when_the_run_has_no_job_or_step_at_all():
    t = Trace()
    t.span("rl.grpo.generation", 2, 8, service_name="collector")
    t.span("rl.grpo.generation", 2, 8, trace="c" * 32, service_name="collector")
    assert "detached-trace" not in codes(check_run(t.table()))


@emits("unattributed-step-time")
def test_unattributed_step_time_past_the_threshold():
    t = Trace()
    step = t.span("rl.grpo.step", 0, 10, iteration=3)
    t.span("rl.grpo.policy_training", 0, 7, step, iteration=3, bucket="productive")
    f = only(check_run(t.table()), "unattributed-step-time")
    assert f.iteration == 3 and "30%" in f.message
    assert "unattributed-step-time" not in codes(check_run(t.table(), unattributed_threshold=0.35))


def resources(groups: str, **extra) -> dict:
    return {"resource_attributes": {SPAN_GROUPS_ATTRIBUTE: groups, "rl.algorithm": "grpo", **extra}}


@emits("missing-group-spans")
def test_missing_group_spans_takes_the_union_over_the_runs_processes():
    t = Trace()
    driver = resources("step,generation,reward,policy_update")
    step = t.span("rl.grpo.step", 0, 10, iteration=1, **driver)
    t.span("rl.grpo.policy_training", 0, 10, step, iteration=1, bucket="productive", **driver)
    # A worker that emits only its own leaves is not a gap: its groups are part of the union.
    t.span("rl.grpo.reward_calculation", 1, 2, step, service_name="reward_worker", **resources("reward"))
    report = check_run(t.table())
    missing = {f.message.split("'")[1]: f for f in report.findings if f.code == "missing-group-spans"}
    assert set(missing) == {"generation"}
    assert missing["generation"].severity == "info" and "known coverage gap" in missing["generation"].message
    assert missing["generation"].run_id == "run-1" and missing["generation"].span_ids == ()


def test_missing_group_without_a_known_gap_is_a_warning_and_sft_never_opens_logprob():
    t = Trace()
    res = resources("step,advantage,logprob")
    t.span("rl.grpo.step", 0, 10, iteration=1, **res)
    report = check_run(t.table())
    missing = {f.message.split("'")[1]: f.severity for f in report.findings if f.code == "missing-group-spans"}
    assert missing == {"advantage": "warning", "logprob": "warning"}
    sft = Trace()
    sft.span("rl.sft.step", 0, 10, iteration=1, **resources("step,logprob"))
    f = only(check_run(sft.table()), "missing-group-spans")
    assert f.severity == "info" and "rl.sft runs never open logprob" in f.message


@emits("invalid-interval")
def test_invalid_interval():
    t = Trace()
    step = t.span("rl.grpo.step", 0, 10, iteration=1)
    t.span("rl.grpo.policy_training", 0, 10, step, iteration=1, bucket="productive")
    bad = t.span("rl.grpo.reward_calculation", 5, 4, step, iteration=1)
    f = only(check_run(t.table()), "invalid-interval")
    assert f.span_ids == (bad,) and f.severity == "error" and f.iteration == 1


@emits("step-time-outlier")
def test_step_time_outlier_is_info_and_names_the_bucket():
    t = Trace()
    at = 0.0
    for i, idle in enumerate([0, 0, 0, 0, 12], start=1):
        step = t.span("rl.grpo.step", at, at + 10 + idle, iteration=i)
        t.span("rl.grpo.policy_training", at, at + 10, step, iteration=i, bucket="productive")
        t.span("rl.idle.buffer_starvation", at + 10, at + 10 + idle, step, iteration=i, bucket="idle")
        at += 10 + idle
    report = check_run(t.table())
    f = only(report, "step-time-outlier")
    assert f.severity == "info" and f.iteration == 5 and "idle grew most" in f.message
    assert report.has("info") and not report.has("warning")


def test_span_ids_are_capped_and_findings_beyond_the_cap_still_count():
    t = Trace()
    for i in range(1, 6):
        step = t.span("rl.grpo.step", 10 * i, 10 * i + 10, iteration=i)
        for k in range(30):
            t.span("rl.vllm.generate", 10 * i, 10 * i + 5, step, iteration=i, bucket="productive")
    report = check_run(t.table(), max_span_ids=4, max_findings_per_code=2)
    overlaps = [f for f in report.findings if f.code == "bucketed-overlap"]
    assert len(overlaps) == 2 and all(len(f.span_ids) == 4 for f in overlaps)
    assert "(and 26 more)" in overlaps[0].message
    assert report.counts["by_code"]["bucketed-overlap"] == 5
    assert report.counts["error"] == 10  # 5 overlaps + 5 steps over their wall


def test_run_id_limits_the_findings_to_one_run():
    a, b = Trace(trace="a" * 32, run="good"), Trace(trace="b" * 32, run="bad")
    healthy_step(a, None, 1, 0)
    step = b.span("rl.grpo.step", 0, 10, iteration=1)
    b.span("rl.grpo.policy_training", 0, 10, step, iteration=1, bucket="bogus")
    both = spans_table(a.records + b.records)
    assert check_run(both, run_id="good").findings == ()
    assert {f.run_id for f in check_run(both).findings} == {"bad"}


def test_finding_dict_has_the_contract_keys():
    t = Trace()
    step = t.span("rl.grpo.step", 0, 10, iteration=1)
    t.span("rl.grpo.policy_training", 0, 10, step, iteration=1, bucket="bogus")
    data = check_run(t.table()).to_dict()
    assert set(data) == {"findings", "counts", "data"}  # data: what the source holds (the census)
    assert {"code", "severity", "message", "trace_id", "span_ids", "iteration"} <= set(data["findings"][0])
    assert data["data"]["found"] == "steps" and (data["data"]["spans"], data["data"]["step_spans"]) == (2, 1)


@emits("step-without-iteration")
def test_step_spans_without_iteration_are_numbered_with_an_info_finding():
    t = Trace()
    job = t.span("rl.grpo.job", 0, 30)
    for k in (2, 1):  # written in reverse: numbered by start
        step = t.span("rl.grpo.step", k * 10, k * 10 + 10, job)
        t.span("rl.vllm.generate", k * 10, k * 10 + 10, step, bucket="productive")
    report = check_run(t.table())
    f = only(report, "step-without-iteration")
    assert f.severity == "info" and "numbered 1..2 in start order" in f.message
    assert f.span_ids == (f"{4:016x}", f"{2:016x}")  # the step starting at 10 s is step 1
    assert "unstamped-span" not in codes(report)


@emits("failed-step")
def test_a_step_whose_span_ended_in_error_is_a_failed_step_naming_the_span_and_its_message():
    t = Trace()
    job = t.span("rl.grpo.job", 0, 40)
    healthy_step(t, job, 1, 0)
    step = t.span("rl.grpo.step", 10, 20, job, iteration=2)
    t.span("rl.grpo.data_processing", 10, 11, step, iteration=2, bucket="overhead")
    t.span("rl.vllm.generate", 11, 16, step, iteration=2, bucket="productive")
    reward = t.span("rl.grpo.reward_calculation", 16, 17, step, bucket="productive", status_code="error",
                    status_message="ValueError: reward function raised")  # stamped only through its step
    t.span("rl.grpo.policy_training", 17, 20, step, iteration=2, bucket="productive")
    t.span("rl.grpo.step", 30, 35, job, iteration=3, status_code="error")  # the step span itself, no message
    report = check_run(t.table())
    found = sorted((f for f in report.findings if f.code == "failed-step"), key=lambda f: f.iteration)
    assert [(f.iteration, f.severity) for f in found] == [(2, "warning"), (3, "warning")]
    assert found[0].span_ids == (reward,) and found[0].trace_id == "a" * 32 and found[0].run_id == "run-1"
    assert "'rl.grpo.reward_calculation'" in found[0].message and "ValueError: reward function raised" in found[0].message
    assert "productive 9.000 s, overhead 1.000 s" in found[0].message and "wasted_s" in found[0].message
    assert "'rl.grpo.step'" in found[1].message and "no status message" in found[1].message
    assert report.counts["by_code"]["failed-step"] == 2 and report.has("warning") and not report.has("error")


@pytest.mark.parametrize("code", sorted(FINDING_CODES))
def test_every_code_has_a_test_that_produces_it(code):
    """Each code is declared by an @emits test above, which fails unless its checks produce the code."""
    assert EMITTED_BY.get(code), f"no test declares @emits({code!r})"
