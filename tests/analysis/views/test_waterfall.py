"""The tree rules of the waterfall, pinned on hand-built traces."""

from __future__ import annotations

import random

import numpy as np
import pytest

from nemo_telemetry.analysis import Waterfall, WaterfallError, critical_path, spans_table, waterfall

S = 1_000_000_000
TRACE = "a" * 32
OTHER_TRACE = "b" * 32


def span(sid: int, name: str, start: float, end: float, parent: int | None = None, **extra) -> dict:
    """One span record; ids are small ints written as 16 hex digits, times in seconds."""
    return {
        "trace_id": extra.pop("trace_id", TRACE),
        "span_id": f"{sid:016x}",
        "parent_span_id": None if parent is None else f"{parent:016x}",
        "name": name,
        "start_ns": int(start * S),
        "end_ns": int(end * S),
        **extra,
    }


def names(shown: Waterfall) -> list[str]:
    return shown.rows.column("name").to_pylist()


def row(shown: Waterfall, name: str) -> dict:
    rows = [r for r in shown.rows.to_pylist() if r["name"] == name]
    assert len(rows) == 1, f"{name}: {len(rows)} rows"
    return rows[0]


@pytest.fixture
def grpo_step() -> list[dict]:
    """A job with two steps; step 1 has generation, training, checkpointing whose finalize
    outlives it, and is given out of start order."""
    return [
        span(7, "rl.grpo.step", 51, 90, 1, iteration=2),
        span(4, "rl.grpo.policy_training", 30, 47, 2, iteration=1, bucket="productive"),
        span(3, "rl.vllm.generate", 2, 30, 2, iteration=1, bucket="productive"),
        span(5, "rl.grpo.checkpointing", 47, 49, 2, iteration=1, bucket="overhead"),
        span(6, "rl.checkpoint.finalize", 48, 70, 5, iteration=1),
        span(2, "rl.grpo.step", 1, 50, 1, iteration=1),
        span(1, "rl.grpo.job", 0, 100),
    ]


def test_children_are_ordered_by_start_time_under_their_parent(grpo_step):
    shown = waterfall(spans_table(grpo_step), fold_steps=False)

    assert names(shown) == [
        "rl.grpo.job",
        "rl.grpo.step",
        "rl.vllm.generate",
        "rl.grpo.policy_training",
        "rl.grpo.checkpointing",
        "rl.checkpoint.finalize",
        "rl.grpo.step",
    ]
    assert shown.rows.column("depth").to_pylist() == [0, 1, 2, 2, 2, 3, 1]
    assert shown.rows.column("parent").to_pylist() == [-1, 0, 1, 1, 1, 4, 0]


def test_a_child_may_end_after_its_parent_and_is_not_clipped(grpo_step):
    shown = waterfall(spans_table(grpo_step), step=1)

    finalize = row(shown, "rl.checkpoint.finalize")
    assert (finalize["start_ns"], finalize["end_ns"]) == (48 * S, 70 * S)
    assert finalize["depth"] == 2 and not finalize["is_orphan"]
    assert shown.window_end_ns == 70 * S  # the window follows the late child


def test_a_span_whose_parent_is_missing_is_kept_and_marked_orphan(grpo_step):
    records = grpo_step + [span(9, "rl.vllm.generate", 60, 61, 0xDEAD, iteration=2)]
    shown = waterfall(spans_table(records), fold_steps=False)

    orphan = [r for r in shown.rows.to_pylist() if r["is_orphan"]]
    assert [(r["name"], r["depth"], r["parent_span_id"]) for r in orphan] == [
        ("rl.vllm.generate", 0, f"{0xDEAD:016x}")
    ]
    assert not row(shown, "rl.grpo.job")["is_orphan"]  # a true root is not an orphan


def test_split_traces_of_one_run_are_listed_together():
    # run-a's actor re-rooted its trace (another trace id, no parent) after run-b started.
    records = [
        span(1, "rl.grpo.job", 0, 100, run_id="run-a"),
        span(2, "rl.grpo.job", 5, 100, run_id="run-b", trace_id="c" * 32),
        span(3, "rl.policy.load_model", 10, 20, run_id="run-a", trace_id=OTHER_TRACE),
        span(4, "rl.vllm.load_model", 11, 21, run_id="run-b", trace_id="d" * 32),
    ]
    rows = waterfall(spans_table(records)).rows.to_pylist()

    assert [(r["run_id"], r["name"]) for r in rows] == [
        ("run-a", "rl.grpo.job"),
        ("run-a", "rl.policy.load_model"),
        ("run-b", "rl.grpo.job"),
        ("run-b", "rl.vllm.load_model"),
    ]
    assert [r["trace_id"][0] for r in rows] == ["a", "b", "c", "d"]
    assert not any(r["is_orphan"] for r in rows)


def per_prompt_trace(prompts: int) -> list[dict]:
    """A generation span with ``prompts`` rollouts (i-th lasts i+1 s), each with a verify child."""
    records = [span(1, "rl.grpo.generation", 0, 1000, iteration=3)]
    for i in range(prompts):
        records.append(span(100 + i, "rl.gym.run_rollouts", i, i + 1 + i, 1))
        records.append(span(10_000 + i, "rl.gym.verify", i + 0.5, i + 1, 100 + i, bucket="productive"))
    return records


def test_many_same_name_siblings_collapse_into_one_line_with_count_total_and_percentiles():
    shown = waterfall(spans_table(per_prompt_trace(100)))

    assert names(shown) == ["rl.grpo.generation", "rl.gym.run_rollouts", "rl.gym.verify"]
    rollouts = row(shown, "rl.gym.run_rollouts")
    assert rollouts["count"] == 100
    assert rollouts["total_ns"] == sum(range(1, 101)) * S
    assert rollouts["p50_ns"] == 50 * S  # nearest rank over durations 1..100 s
    assert rollouts["p99_ns"] == 99 * S
    assert (rollouts["start_ns"], rollouts["end_ns"]) == (0, 199 * S)  # first start .. last end
    # The members' children are merged under the collapsed line, and collapse the same way.
    verify = row(shown, "rl.gym.verify")
    assert verify["count"] == 100 and verify["parent"] == 1
    assert verify["bucket"] == "productive"


def test_siblings_up_to_the_threshold_stay_separate_lines():
    shown = waterfall(spans_table(per_prompt_trace(20)))

    assert names(shown).count("rl.gym.run_rollouts") == 20
    assert set(shown.rows.column("count").to_pylist()) == {1}
    assert names(waterfall(spans_table(per_prompt_trace(21)))).count("rl.gym.run_rollouts") == 1
    assert names(waterfall(spans_table(per_prompt_trace(100)), collapse_threshold=None)).count(
        "rl.gym.run_rollouts") == 100


def test_the_default_view_is_one_line_per_step_with_what_it_hides(grpo_step):
    shown = waterfall(spans_table(grpo_step))

    assert names(shown) == ["rl.grpo.job", "rl.grpo.step", "rl.grpo.step"]
    assert shown.rows.column("hidden").to_pylist() == [0, 4, 0]
    assert shown.rows.column("iteration").to_pylist() == [None, 1, 2]
    assert shown.total_spans == 7


def test_a_step_view_shows_that_iterations_trees_only(grpo_step):
    # A worker's trace re-rooted by an actor, stamped with iteration 1: it belongs to step 1.
    records = grpo_step + [
        span(20, "rl.gym.run_rollouts", 3, 9, trace_id=OTHER_TRACE, iteration=1),
        span(21, "rl.gym.verify", 4, 5, 20, trace_id=OTHER_TRACE),
        span(22, "rl.gym.run_rollouts", 52, 60, trace_id=OTHER_TRACE, iteration=2),
    ]
    shown = waterfall(spans_table(records), step=1)

    assert names(shown) == [
        "rl.grpo.step",
        "rl.vllm.generate",
        "rl.grpo.policy_training",
        "rl.grpo.checkpointing",
        "rl.checkpoint.finalize",
        "rl.gym.run_rollouts",
        "rl.gym.verify",
    ]
    assert shown.rows.column("depth").to_pylist() == [0, 1, 1, 1, 2, 0, 1]
    assert not any(shown.rows.column("is_orphan").to_pylist())  # the step's parent exists
    assert shown.step == 1 and shown.total_spans == 7


def test_depth_and_min_duration_hide_rows_and_count_them(grpo_step):
    table = spans_table(grpo_step)

    shallow = waterfall(table, step=1, depth=1)
    assert names(shallow) == ["rl.grpo.step", "rl.vllm.generate", "rl.grpo.policy_training",
                              "rl.grpo.checkpointing"]
    assert row(shallow, "rl.grpo.checkpointing")["hidden"] == 1

    long_only = waterfall(table, step=1, min_duration_ns=20 * S)
    assert names(long_only) == ["rl.grpo.step", "rl.vllm.generate"]
    assert row(long_only, "rl.grpo.step")["hidden"] == 3  # training, checkpointing and its finalize


def test_critical_path_follows_the_child_that_ends_last_and_skips_late_children(grpo_step):
    path = critical_path(spans_table(grpo_step), step=1)

    # Step 1 ends at 50: checkpointing (ends 49) decided it; finalize ends at 70, after its
    # parent, so it did not decide checkpointing's end.
    assert path.column("name").to_pylist() == ["rl.grpo.step", "rl.grpo.checkpointing"]
    assert path.column("depth").to_pylist() == [0, 1]
    assert path.column("span_row").to_pylist() == [5, 3]


def test_critical_path_starts_at_the_last_ending_step_span_of_the_iteration():
    records = [
        span(1, "rl.grpo.step", 0, 10, iteration=4, trace_id=TRACE),
        span(2, "rl.grpo.step", 0, 12, iteration=4, trace_id=OTHER_TRACE),
        span(3, "rl.grpo.policy_training", 1, 11, 2, trace_id=OTHER_TRACE),
        span(4, "rl.grpo.policy_training", 1, 9, 1, trace_id=TRACE),
    ]
    path = critical_path(spans_table(records), step=4)

    assert path.column("span_id").to_pylist() == [f"{2:016x}", f"{3:016x}"]


def test_critical_path_is_marked_on_the_waterfall_rows(grpo_step):
    shown = waterfall(spans_table(grpo_step), step=1)

    marked = [r["name"] for r in shown.rows.to_pylist() if r["on_critical_path"]]
    assert marked == ["rl.grpo.step", "rl.grpo.checkpointing"]


def test_asking_for_what_is_not_there_names_what_is(grpo_step):
    table = spans_table(grpo_step)

    with pytest.raises(WaterfallError, match=r"rl.iteration=9; step iterations present: 1, 2"):
        waterfall(table, step=9)
    with pytest.raises(WaterfallError, match=r"no spans of run 'nope'; runs present: run-1"):
        waterfall(table, run_id="nope")
    with pytest.raises(WaterfallError, match="no step span carries rl.iteration=9"):
        critical_path(table, step=9)
    two_traces = spans_table(grpo_step + [span(30, "x", 0, 1, trace_id="a" * 31 + "b")])
    with pytest.raises(WaterfallError, match="matches 2 traces"):
        waterfall(two_traces, trace_id="aaaa")
    assert names(waterfall(two_traces, trace_id="a" * 31 + "B")) == ["x"]


def test_a_parent_cycle_in_bad_input_does_not_hang_and_keeps_the_spans():
    records = [span(1, "a", 0, 1, 2), span(2, "b", 0, 1, 1), span(3, "c", 0, 1, 1)]

    shown = waterfall(spans_table(records))

    assert sorted(names(shown)) == ["a", "b", "c"]


def test_empty_input_gives_an_empty_waterfall():
    shown = waterfall(spans_table([]))

    assert shown.rows.num_rows == 0 and shown.window_ns == 0


def test_tags_carry_the_attributes_that_matter():
    records = [span(1, "rl.idle.buffer_starvation", 0, 1, bucket="idle", efficiency_category="buffer_starvation",
                    attributes={"rl.idle.polls": "12", "rl.weight_version": "3", "other": "x"})]

    (tags,) = waterfall(spans_table(records)).rows.column("tags").to_pylist()

    assert tags == "rl.efficiency.category=buffer_starvation rl.weight_version=3 rl.idle.polls=12"


def test_layout_matches_a_plain_recursive_walk_on_a_random_forest():
    rng = random.Random(7)
    records = []
    for sid in range(1, 3001):
        parent = rng.choice([None, None] + list(range(max(1, sid - 50), sid))) if sid > 1 else None
        start = rng.randrange(0, 10_000)
        trace = "c" * 32 if parent is None and rng.random() < 0.3 else TRACE
        if parent is not None:
            trace = records[parent - 1]["trace_id"]
        records.append(span(sid, f"n{rng.randrange(40)}", start, start + rng.randrange(1, 500), parent,
                            trace_id=trace, run_id="run-1"))
    expected = _recursive_order(records)

    shown = waterfall(spans_table(records), collapse_threshold=None)

    assert shown.rows.column("span_id").to_pylist() == expected


def _recursive_order(records: list[dict]) -> list[str]:
    """Depth-first, children by (start, input order), roots by (start, input order)."""
    by_id = {(r["trace_id"], r["span_id"]): i for i, r in enumerate(records)}
    children: dict[int, list[int]] = {}
    roots = []
    for i, r in enumerate(records):
        parent = by_id.get((r["trace_id"], r["parent_span_id"]))
        (children.setdefault(parent, []) if parent is not None else roots).append(i)
    out: list[str] = []

    def visit(i: int) -> None:
        out.append(records[i]["span_id"])
        for c in sorted(children.get(i, []), key=lambda c: (records[c]["start_ns"], c)):
            visit(c)

    for i in sorted(roots, key=lambda i: (records[i]["start_ns"], i)):
        visit(i)
    return out


def test_collapse_on_a_large_fan_out_keeps_every_span_accounted_for():
    steps, prompts = 3, 5000
    records, sid = [span(1, "rl.grpo.job", 0, 10_000)], 2
    for k in range(steps):
        step_id = sid
        records.append(span(step_id, "rl.grpo.step", k * 100, k * 100 + 99, 1, iteration=k))
        sid += 1
        for i in range(prompts):
            records.append(span(sid, "rl.gym.run_rollouts", k * 100 + i / 100, k * 100 + i / 100 + 1, step_id))
            sid += 1
    shown = waterfall(spans_table(records), fold_steps=False)

    rows = shown.rows
    assert names(shown) == ["rl.grpo.job"] + ["rl.grpo.step", "rl.gym.run_rollouts"] * steps
    assert int(np.sum(rows.column("count").to_numpy()) + np.sum(rows.column("hidden").to_numpy())) == len(records)


def test_step_spans_never_collapse_however_many_there_are():
    records = [span(1, "rl.grpo.job", 0, 1000)]
    records += [span(10 + k, "rl.grpo.step", k * 10, k * 10 + 9, 1, iteration=k) for k in range(50)]

    shown = waterfall(spans_table(records))

    assert names(shown) == ["rl.grpo.job"] + ["rl.grpo.step"] * 50
    assert shown.rows.column("iteration").to_pylist()[1:] == list(range(50))


def test_collapsed_percentiles_hold_for_huge_and_negative_durations():
    # One span claims to last ~73 years, one ends before it starts: both are kept and counted.
    durations = [i * S for i in range(1, 24)] + [2**61, -5 * S]
    records = [span(1, "rl.grpo.generation", 0, 10)]
    records += [{**span(100 + i, "rl.gym.run_rollouts", 1, 2, 1), "end_ns": S + d} for i, d in enumerate(durations)]

    rollouts = row(waterfall(spans_table(records)), "rl.gym.run_rollouts")

    ordered = sorted(durations)
    assert rollouts["count"] == 25
    assert rollouts["p50_ns"] == ordered[12]  # nearest rank: ceil(0.5 * 25) = 13th
    assert rollouts["p99_ns"] == ordered[24] == 2**61


def test_trace_digits_is_the_shortest_prefix_that_tells_the_traces_apart():
    """Over random id sets with long shared prefixes (padded 64-bit ids, ids equal but for one
    digit): the prefixes of the length given are distinct, one digit fewer are not (above 8)."""
    import random

    import pyarrow as pa

    from nemo_telemetry.analysis.views.waterfall import trace_digits

    rng = random.Random(7)
    for _ in range(200):
        shared = rng.choice([0, 4, 8, 16, 24, 31])
        head = "".join(rng.choice("0123456789abcdef") for _ in range(shared))
        ids = {head + "".join(rng.choice("0123456789abcdef") for _ in range(32 - shared))
               for _ in range(rng.randint(1, 6))}
        ids |= {i.upper() for i in list(ids)[:1]}  # one id in capitals: the same trace
        digits = trace_digits(pa.array(sorted(ids)))
        lower = {i.lower() for i in ids}
        assert len({i[:digits] for i in lower}) == len(lower) and digits >= 8
        if digits > 8:
            assert len({i[:digits - 1] for i in lower}) < len(lower)
    assert trace_digits(pa.array(["0" * 16 + "1" * 16, "0" * 16 + "7" * 16])) == 17
    assert trace_digits(pa.array(["a" * 32], pa.string()).dictionary_encode()) == 8
