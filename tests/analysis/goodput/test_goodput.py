"""Goodput per step: each rule of DESIGN.md "analysis: semantics" pinned on a hand-built trace."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

from nemo_telemetry.analysis import spans_table
from nemo_telemetry.analysis.goodput.steps import STEP_COLUMNS, goodput_by_step, run_goodput
from nemo_telemetry.errors import NemoTelemetryError

from _hand_traces import S, Trace


def one_run(spans: pa.Table, **kw):
    (run,) = run_goodput(spans, **kw)
    return run


def steps(spans: pa.Table, **kw) -> dict[int, dict]:
    return {row["iteration"]: row for row in goodput_by_step(spans, **kw).to_pylist()}


def test_plain_sums_wall_covered_unattributed_and_goodput():
    t = Trace()
    job = t.span("rl.grpo.job", 0, 100)
    step = t.span("rl.grpo.step", 10, 20, job, iteration=1)
    t.span("rl.grpo.data_processing", 10, 11, step, iteration=1, bucket="overhead")
    t.span("rl.vllm.generate", 11, 15, step, iteration=1, bucket="productive")
    t.span("rl.idle.buffer_starvation", 15, 16, step, iteration=1, bucket="idle")
    t.span("rl.grpo.policy_training", 17, 20, step, iteration=1, bucket="productive")
    row = steps(t.table())[1]
    assert list(goodput_by_step(t.table()).column_names) == list(STEP_COLUMNS)
    assert row["wall_s"] == 10.0
    assert (row["productive_s"], row["overhead_s"], row["idle_s"], row["wasted_s"]) == (7.0, 1.0, 1.0, 0.0)
    assert row["covered_s"] == 9.0
    assert row["unattributed_s"] == 1.0  # 16..17 is under no bucketed span
    assert row["double_counted_s"] == 0.0
    assert row["goodput"] == pytest.approx(0.7)
    assert (row["start_ns"], row["end_ns"]) == (10 * S, 20 * S)


def test_several_step_spans_of_one_iteration_make_one_window_from_earliest_start_to_latest_end():
    t = Trace()
    a = t.span("rl.grpo.step", 10, 15, iteration=3, service_name="driver")
    b = t.span("rl.grpo.step", 12, 19, iteration=3, service_name="controller")
    t.span("rl.grpo.policy_training", 12, 18, b, bucket="productive")
    t.span("rl.grpo.reward_calculation", 10, 11, a, bucket="productive")
    row = steps(t.table())[3]
    assert row["wall_s"] == 9.0 and row["productive_s"] == 7.0 and row["unattributed_s"] == 2.0


def test_a_step_span_without_rl_iteration_is_numbered_in_start_order():
    """DESIGN.md: step spans without rl.iteration are numbered in start order per run and process."""
    t = Trace()
    step = t.span("rl.grpo.step", 0, 10)
    t.span("rl.vllm.generate", 0, 5, step, bucket="productive")
    rows = goodput_by_step(t.table()).to_pylist()
    assert [(r["iteration"], r["wall_s"], r["productive_s"]) for r in rows] == [(1, 10.0, 5.0)]
    assert one_run(t.table()).outside_steps.get("unstamped_spans", 0) == 0


def test_worker_span_without_iteration_is_attributed_by_walking_up_across_processes():
    t = Trace()
    step = t.span("rl.grpo.step", 0, 10, iteration=4, service_name="driver")
    train = t.span("rl.grpo.policy_training", 1, 9, step, iteration=4, service_name="driver")
    # The worker's own umbrella carries no iteration and no bucket; its bucketed leaf is two levels down.
    call = t.span("rl.policy.train", 1, 9, train, service_name="policy_worker", rank=3)
    t.span("rl.data_plane.get", 1, 2, call, service_name="policy_worker", rank=3, bucket="overhead")
    row = steps(t.table())[4]
    assert row["overhead_s"] == 1.0 and row["covered_s"] == 1.0
    assert one_run(t.table()).outside_steps["spans"] == 0


def test_checkpoint_finalize_that_ends_after_its_step_adds_nothing_and_staging_counts_whole():
    t = Trace()
    s7 = t.span("rl.grpo.step", 0, 10, iteration=7)
    t.span("rl.grpo.policy_training", 0, 8, s7, iteration=7, bucket="productive")
    stage = t.span("rl.grpo.checkpointing", 8, 11, s7, iteration=7, bucket="overhead")
    t.span("rl.checkpoint.finalize", 9, 30, stage, iteration=7)  # unbucketed tail, open during steps 8 and 9
    s8 = t.span("rl.grpo.step", 11, 21, iteration=8)
    t.span("rl.grpo.policy_training", 11, 21, s8, iteration=8, bucket="productive")
    by = steps(t.table())
    assert by[7]["overhead_s"] == 3.0  # plain sum: the staging span counts whole...
    assert by[7]["covered_s"] == 10.0  # ...but only its part inside the window is covered
    assert by[7]["unattributed_s"] == 0.0 and by[7]["double_counted_s"] == 0.0
    assert by[8]["overhead_s"] == 0.0 and by[8]["productive_s"] == 10.0
    assert one_run(t.table()).outside_steps["spans"] == 0


def test_validation_at_iteration_zero_is_outside_the_steps():
    t = Trace()
    job = t.span("rl.grpo.job", 0, 30)
    val = t.span("rl.grpo.evaluate", 1, 5, job, iteration=0)
    t.span("rl.vllm.generate", 1, 4, val, iteration=0, bucket="overhead")  # bucket_scope(OVERHEAD)
    step = t.span("rl.grpo.step", 10, 20, job, iteration=1)
    t.span("rl.vllm.generate", 10, 18, step, iteration=1, bucket="productive")
    run = one_run(t.table())
    assert [r["iteration"] for r in run.steps.to_pylist()] == [1]
    assert run.outside_steps == {"productive_s": 0.0, "overhead_s": 3.0, "idle_s": 0.0, "wasted_s": 0.0,
                                 "spans": 1, "unstamped_spans": 0, "iterations": [0]}
    assert run.total["overhead_s"] == 0.0 and run.total["wall_s"] == 10.0
    assert run.job_wall_s == 30.0


def test_concurrent_generate_spans_are_double_counted():
    t = Trace()
    step = t.span("rl.grpo.step", 0, 10, iteration=1)
    t.span("rl.vllm.generate", 0, 6, step, iteration=1, bucket="productive")
    t.span("rl.vllm.generate", 2, 8, step, iteration=1, bucket="productive")
    t.span("rl.vllm.generate", 3, 4, step, iteration=1, bucket="productive")
    row = steps(t.table())[1]
    assert row["productive_s"] == 13.0  # plain sum, no clipping
    assert row["covered_s"] == 8.0
    assert row["double_counted_s"] == 5.0  # 13 summed - 8 of union
    assert row["goodput"] == pytest.approx(1.3)  # the number lies; check_run says so


def test_double_counted_uses_the_whole_union_covered_only_the_window():
    t = Trace()
    step = t.span("rl.grpo.step", 0, 10, iteration=1)
    t.span("rl.grpo.checkpointing", 8, 14, step, iteration=1, bucket="overhead")
    row = steps(t.table())[1]
    assert (row["overhead_s"], row["covered_s"], row["double_counted_s"], row["unattributed_s"]) == (6, 2, 0, 8)


def test_touching_spans_are_not_double_counted():
    t = Trace()
    step = t.span("rl.grpo.step", 0, 10, iteration=1)
    for a in range(10):
        t.span("rl.grpo.policy_training", a, a + 1, step, iteration=1, bucket="productive")
    row = steps(t.table())[1]
    assert row["double_counted_s"] == 0.0 and row["covered_s"] == 10.0


def test_run_total_sums_the_steps_and_goodput_is_a_ratio_of_sums():
    t = Trace()
    job = t.span("rl.grpo.job", 0, 40)
    for i, (a, prod) in enumerate([(0, 8), (10, 2), (20, 5)], start=1):
        step = t.span("rl.grpo.step", a, a + 10, job, iteration=i)
        t.span("rl.grpo.policy_training", a, a + prod, step, iteration=i, bucket="productive")
    run = one_run(t.table())
    assert run.total["wall_s"] == 30.0 and run.total["productive_s"] == 15.0
    assert run.total["goodput"] == pytest.approx(0.5) and run.total["steps"] == 3
    assert run.total["unattributed_s"] == 15.0
    assert set(run.total) >= {"wall_s", "productive_s", "overhead_s", "idle_s", "wasted_s", "unattributed_s",
                              "double_counted_s", "goodput"}
    assert run.job_wall_s == 40.0


def test_several_runs_in_one_dataset_are_reported_separately_and_can_be_selected():
    a, b = Trace(trace="a" * 32, run="run-a"), Trace(trace="b" * 32, run="run-b")
    for t, prod in ((a, 2), (b, 6)):
        step = t.span("rl.grpo.step", 0, 10, iteration=1)
        t.span("rl.grpo.policy_training", 0, prod, step, iteration=1, bucket="productive")
    both = spans_table(a.records + b.records)
    runs = {r.run_id: r for r in run_goodput(both)}
    assert runs["run-a"].total["goodput"] == pytest.approx(0.2)
    assert runs["run-b"].total["goodput"] == pytest.approx(0.6)
    (only,) = run_goodput(both, run_id="run-b")
    assert only.run_id == "run-b"
    assert goodput_by_step(both, run_id="run-a").column("productive_s").to_pylist() == [2.0]
    with pytest.raises(NemoTelemetryError, match="run-a"):
        run_goodput(both, run_id="nope")


def test_by_rank_sums_each_process_over_the_runs_steps():
    t = Trace()
    step = t.span("rl.grpo.step", 0, 10, iteration=1)
    train = t.span("rl.grpo.policy_training", 0, 10, step, iteration=1)
    for rank, busy in ((0, 6), (1, 9)):
        t.span("rl.policy.microbatch", 0, busy, train, service_name="policy_worker", rank=rank, bucket="productive")
    run = one_run(t.table(), by="rank")
    rows = {r["rank"]: r for r in run.ranks.to_pylist()}
    assert rows[0]["productive_s"] == 6.0 and rows[0]["goodput"] == pytest.approx(0.6)
    assert rows[1]["unattributed_s"] == 1.0 and rows[1]["double_counted_s"] == 0.0
    assert rows[0]["service_name"] == "policy_worker" and rows[0]["steps"] == 1
    assert run.steps.column("double_counted_s").to_pylist() == [6.0]  # the ranks overlap on the driver's clock
    assert one_run(t.table()).ranks is None


def test_step_time_outlier_is_median_plus_three_mad_and_names_the_bucket_that_grew():
    t = Trace()
    walls = [10, 10.5, 9.5, 10, 10.2, 25, 9.8]
    start = 0.0
    for i, wall in enumerate(walls, start=1):
        step = t.span("rl.grpo.step", start, start + wall, iteration=i)
        t.span("rl.grpo.policy_training", start, start + 6, step, iteration=i, bucket="productive")
        t.span("rl.grpo.checkpointing", start + 6, start + wall - 1, step, iteration=i, bucket="overhead")
        start += wall
    (outlier,) = one_run(t.table()).outliers
    assert outlier.iteration == 6 and outlier.bucket == "overhead"
    assert outlier.median_s == 10.0 and outlier.threshold_s == pytest.approx(10.0 + 3 * 0.2)
    assert outlier.grew_by_s == pytest.approx(15.0)


def test_zero_wall_step_has_no_goodput_and_empty_input_gives_nothing():
    t = Trace()
    t.span("rl.grpo.step", 5, 5, iteration=1)
    row = steps(t.table())[1]
    assert row["wall_s"] == 0.0 and row["goodput"] is None
    assert run_goodput(spans_table([])) == ()
    assert goodput_by_step(spans_table([])).num_rows == 0


def test_unknown_and_invalid_spans_stay_out_of_the_sums():
    t = Trace()
    step = t.span("rl.grpo.step", 0, 10, iteration=1)
    t.span("rl.vllm.generate", 0, 4, step, iteration=1, bucket="productive")
    t.span("rl.vllm.generate", 6, 5, step, iteration=1, bucket="productive")  # ends before it starts
    t.span("rl.grpo.reward_calculation", 4, 5, step, iteration=1, bucket="useful")  # not a bucket
    row = steps(t.table())[1]
    assert row["productive_s"] == 4.0 and row["covered_s"] == 4.0


def test_input_table_is_not_reordered_or_changed():
    t = Trace()
    step = t.span("rl.grpo.step", 0, 10, iteration=1)
    t.span("rl.vllm.generate", 5, 9, step, iteration=1, bucket="productive")
    t.span("rl.vllm.generate", 0, 6, step, iteration=1, bucket="productive")
    table = t.table()
    before = table.to_pylist()
    run_goodput(table, by="rank")
    assert table.to_pylist() == before


def test_goodput_without_hex_id_columns_matches_the_full_table():
    # What the CLI reads from a dataset: the uint64 keys, no span / parent hex strings.
    t = Trace()
    step = t.span("rl.grpo.step", 0, 10, iteration=2)
    call = t.span("rl.policy.train", 1, 9, step, service_name="worker")
    t.span("rl.grpo.policy_training", 1, 7, call, bucket="productive", service_name="worker")
    from nemo_telemetry.analysis import with_id_keys

    full = with_id_keys(t.table())
    keys_only = full.drop_columns(["span_id", "parent_span_id"])
    assert goodput_by_step(keys_only).equals(goodput_by_step(full))
    assert math.isclose(goodput_by_step(keys_only).column("goodput")[0].as_py(), 0.6)


def test_docstring_examples_run():
    import doctest

    from nemo_telemetry.analysis.goodput import steps as goodput

    assert doctest.testmod(goodput).failed == 0
