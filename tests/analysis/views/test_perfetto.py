"""The Perfetto export is valid trace-event JSON, event by event, and every track nests."""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict

import numpy as np
import pytest

from nemo_telemetry.analysis import spans_table, to_chrome_trace
from nemo_telemetry.analysis.views.perfetto import assign_tracks

S = 1_000_000_000
TRACE, OTHER_TRACE = "a" * 32, "b" * 32

_NS_IN_US = 1e-3  # tolerance: one nanosecond, in microseconds


def span(sid: int, name: str, start: float, end: float, parent: int | None = None, **extra) -> dict:
    return {"trace_id": extra.pop("trace_id", TRACE), "span_id": f"{sid:016x}",
            "parent_span_id": None if parent is None else f"{parent:016x}", "name": name,
            "start_ns": int(start * S), "end_ns": int(end * S), **extra}


@pytest.fixture
def concurrent_run():
    """Driver with a step whose rollouts overlap without nesting, a checkpoint finalize that
    outlives its parent, and two ranks of a worker service."""
    records = [
        span(1, "rl.grpo.job", 0, 100, service_name="driver", rank=0),
        span(2, "rl.grpo.step", 1, 60, 1, iteration=1, service_name="driver", rank=0),
        span(3, "rl.grpo.generation", 2, 30, 2, iteration=1, service_name="driver", rank=0),
        span(10, "rl.gym.run_rollouts", 3, 12, 3, service_name="driver", rank=0),
        span(11, "rl.gym.run_rollouts", 5, 20, 3, service_name="driver", rank=0),  # overlaps 10, not nested
        span(12, "rl.gym.run_rollouts", 8, 29, 3, service_name="driver", rank=0),
        span(13, "rl.vllm.generate", 9, 15, 11, service_name="driver", rank=0, bucket="productive"),
        span(4, "rl.grpo.checkpointing", 40, 45, 2, service_name="driver", rank=0, bucket="overhead",
             attributes={"rl.checkpoint.path": "/ckpt/tmp_step_1"}),
        span(5, "rl.checkpoint.finalize", 44, 70, 4, service_name="driver", rank=0),  # outlives parent
        span(20, "rl.grpo.policy_training", 31, 39, 2, service_name="policy-worker", rank=0, bucket="productive"),
        span(21, "rl.grpo.policy_training", 31, 39.5, 2, service_name="policy-worker", rank=1, bucket="productive"),
        span(22, "rl.policy.load_model", 0, 1, trace_id=OTHER_TRACE, service_name="policy-worker", rank=1),
        span(30, "bad.interval", 50, 49, 2, service_name="driver", rank=0),
    ]
    return spans_table(records)


REQUIRED = {
    "X": {"name": str, "ph": str, "ts": (int, float), "dur": (int, float), "pid": int, "tid": int},
    "M": {"name": str, "ph": str, "pid": int, "tid": int, "args": dict},
    "s": {"name": str, "cat": str, "ph": str, "id": int, "ts": (int, float), "pid": int, "tid": int},
    "f": {"name": str, "cat": str, "ph": str, "id": int, "ts": (int, float), "pid": int, "tid": int, "bp": str},
}


def validate(document: dict) -> list[dict]:
    """Check every event against the trace-event format; return the complete events."""
    assert isinstance(document["traceEvents"], list)
    assert document.get("displayTimeUnit") in ("ms", "ns")
    complete = []
    for event in document["traceEvents"]:
        required = REQUIRED[event["ph"]]  # only phases we can vouch for
        for key, kind in required.items():
            assert key in event, f"{event} lacks {key}"
            assert isinstance(event[key], kind) and not isinstance(event[key], bool), f"{event}: {key}"
        if event["ph"] == "M":
            assert event["name"] in ("process_name", "process_sort_index", "thread_name"), event
            assert set(event["args"]) == ({"sort_index"} if event["name"] == "process_sort_index" else {"name"})
        elif event["ph"] in ("s", "f"):
            assert math.isfinite(event["ts"]) and event["ts"] >= 0, event
            assert event.get("bp", "e") == "e", event
        else:
            assert math.isfinite(event["ts"]) and event["ts"] >= 0, event
            assert math.isfinite(event["dur"]) and event["dur"] >= 0, event
            assert isinstance(event.get("args", {}), dict)
            assert all(isinstance(k, str) for k in event.get("args", {}))
            complete.append(event)
    json.loads(json.dumps(document))  # plain JSON types only
    return complete


def assert_tracks_nest(events: list[dict]) -> None:
    by_track = defaultdict(list)
    for e in events:
        by_track[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"], e["name"]))
    for track, intervals in by_track.items():
        intervals.sort(key=lambda x: (x[0], -x[1]))
        open_ends: list[float] = []
        for start, end, name in intervals:
            while open_ends and open_ends[-1] <= start + _NS_IN_US:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1] + _NS_IN_US, f"{name} overlaps without nesting on {track}"
            open_ends.append(end)


def test_every_event_is_valid_and_every_track_nests(concurrent_run):
    events = validate(to_chrome_trace(concurrent_run))

    assert len(events) == concurrent_run.num_rows  # no span dropped
    assert_tracks_nest(events)


def test_one_process_per_service_and_rank_with_its_name(concurrent_run):
    document = to_chrome_trace(concurrent_run)
    names = {e["pid"]: e["args"]["name"] for e in document["traceEvents"] if e["name"] == "process_name"}
    spans_by_pid = defaultdict(set)
    for e in document["traceEvents"]:
        if e["ph"] == "X":
            spans_by_pid[names[e["pid"]]].add(e["name"])

    assert sorted(names.values()) == ["driver rank 0", "policy-worker rank 0", "policy-worker rank 1"]
    assert spans_by_pid["policy-worker rank 1"] == {"rl.grpo.policy_training", "rl.policy.load_model"}
    thread_names = {(e["pid"], e["tid"]) for e in document["traceEvents"] if e["name"] == "thread_name"}
    assert thread_names == {(e["pid"], e["tid"]) for e in document["traceEvents"] if e["ph"] == "X"}


def test_overlapping_rollouts_and_a_late_child_go_on_other_tracks(concurrent_run):
    by_name = defaultdict(list)
    for e in validate(to_chrome_trace(concurrent_run)):
        by_name[e["name"]].append(e)

    rollout_tracks = {e["tid"] for e in by_name["rl.gym.run_rollouts"]}
    assert len(rollout_tracks) == 3  # each overlaps the next without nesting
    (checkpoint,), (finalize,) = by_name["rl.grpo.checkpointing"], by_name["rl.checkpoint.finalize"]
    assert finalize["tid"] != checkpoint["tid"]
    assert finalize["ts"] + finalize["dur"] == pytest.approx(70 * S / 1000)  # not clipped to its parent


def test_times_are_microseconds_from_the_first_span_and_attributes_are_args(concurrent_run):
    document = to_chrome_trace(concurrent_run)
    events = {e["name"]: e for e in validate(document) if e["name"] != "rl.gym.run_rollouts"}

    assert document["otherData"]["origin_unix_ns"] == "0"
    assert events["rl.grpo.step"]["ts"] == pytest.approx(1 * S / 1000)
    assert events["rl.grpo.step"]["dur"] == pytest.approx(59 * S / 1000)
    args = events["rl.grpo.checkpointing"]["args"]
    assert args["rl.checkpoint.path"] == "/ckpt/tmp_step_1"
    assert args["rl.bucket"] == "overhead" and args["span_id"] == f"{4:016x}"
    assert events["rl.grpo.checkpointing"]["cat"] == "overhead"
    assert events["rl.grpo.step"]["args"]["rl.iteration"] == 1
    bad = events["bad.interval"]
    assert bad["dur"] == 0 and bad["args"]["invalid_interval"] is True


def test_a_step_export_holds_that_step_only(concurrent_run):
    names = {e["name"] for e in validate(to_chrome_trace(concurrent_run, step=1))}

    assert "rl.grpo.job" not in names and "rl.policy.load_model" not in names
    assert {"rl.grpo.step", "rl.checkpoint.finalize", "rl.gym.run_rollouts"} <= names


def test_track_packing_nests_on_random_intervals():
    rng = random.Random(3)
    starts = [rng.randrange(0, 1000) for _ in range(2000)]
    ends = [s + rng.randrange(0, 200) for s in starts]
    tracks = assign_tracks(np.zeros(2000, dtype=np.int64), np.array(starts), np.array(ends),
                           np.full(2000, -1, dtype=np.int64))

    events = [{"pid": 1, "tid": int(t), "ts": float(s), "dur": float(e - s), "name": str(i)}
              for i, (s, e, t) in enumerate(zip(starts, ends, tracks))]
    assert_tracks_nest(events)
    assert tracks.min() == 1


def test_a_child_in_another_process_is_joined_to_its_parent_by_a_flow(concurrent_run):
    document = to_chrome_trace(concurrent_run)
    complete = validate(document)
    flows = defaultdict(dict)
    for e in document["traceEvents"]:
        if e["ph"] in ("s", "f"):
            flows[e["id"]][e["ph"]] = e

    def enclosing(event, name):
        return [x for x in complete if (x["pid"], x["tid"]) == (event["pid"], event["tid"]) and x["name"] == name
                and x["ts"] - _NS_IN_US <= event["ts"] <= x["ts"] + x["dur"] + _NS_IN_US]

    assert len(flows) == 2  # the two policy-worker ranks' training under the driver's step
    for flow in flows.values():
        assert set(flow) == {"s", "f"}
        assert enclosing(flow["s"], "rl.grpo.step")  # starts inside the parent, on its track
        (child,) = enclosing(flow["f"], "rl.grpo.policy_training")
        assert child["ts"] == pytest.approx(flow["f"]["ts"])  # ends where the child starts
        assert flow["s"]["pid"] != flow["f"]["pid"]
