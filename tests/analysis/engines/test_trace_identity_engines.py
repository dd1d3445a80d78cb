"""Traces whose ids share one half are still separate traces, on every engine.

Jaeger's integration fixtures pad 64-bit trace ids to 128 bits (…0001, …0007) and number spans
1, 2, 3 in every trace; ids that share their low half, or whose halves are swapped, are the same
trap the other way round. Each layout is written as OTLP JSON lines and as length-prefixed
protobuf, ingested with the compiled decoders and with the reference ones, and read by every
local engine: each span's parent, the orphans, the goodput a walk attributes across traces and
the waterfall's trees must be those of the real traces (a plain dict over the hex ids says which).
"""

from __future__ import annotations

import orjson
import pytest

from nemo_telemetry.analysis import (
    check_run, check_with_engine, goodput_with_engine, ingest, parent_indices, read_for_analysis, read_spans,
    run_goodput, waterfall,
)
from nemo_telemetry.analysis.engines.partitioned_check import stream_check
from nemo_telemetry.analysis.findings.checks import check_span_files
from nemo_telemetry.analysis.goodput.partials import stream_goodput
from nemo_telemetry.analysis.store.read import span_source_files
from nemo_telemetry.analysis.synthetic import to_protobuf

S = 1_000_000_000
T0 = 1_700_000_000  # seconds: a timestamp 0 is no start
LAYOUTS = {
    # Jaeger's integration traces: 64-bit ids padded to 128 bits, the high half all zeros
    "high-half-shared": ("0" * 31 + "1", "0" * 31 + "7"),
    "low-half-shared": ("aaaaaaaaaaaaaaaa" + "0" * 15 + "1", "bbbbbbbbbbbbbbbb" + "0" * 15 + "1"),
    "halves-swapped": ("00000000000000ab00000000000000cd", "00000000000000cd00000000000000ab"),
}


def _span(trace: str, span: int, name: str, start: float, end: float, parent: int | None = None, **attrs) -> dict:
    out = {"traceId": trace, "spanId": f"{span:016x}", "name": name, "kind": 1,
           "startTimeUnixNano": str(round((T0 + start) * S)), "endTimeUnixNano": str(round((T0 + end) * S)),
           "attributes": [{"key": k, "value": ({"intValue": str(v)} if isinstance(v, int) else {"stringValue": v})}
                          for k, v in attrs.items()]}
    if parent is not None:
        out["parentSpanId"] = f"{parent:016x}"
    return out


def _requests(first: str, second: str) -> list[dict]:
    """Two traces of one run, spans numbered 1, 2, 3 in each (two requests, as two processes
    export them): a step span, a bucketed child without rl.iteration (it takes its step's from the
    walk), a grandchild, and in each trace a span naming a parent only the other trace holds."""
    spans_a = [_span(first, 1, "rl.grpo.step", 0, 10, **{"rl.iteration": 1}),
               _span(first, 2, "some-operation", 1, 5, 1, **{"rl.bucket": "productive"}),
               _span(first, 3, "leaf-a", 2, 3, 2),
               _span(first, 5, "only-in-first", 6, 7, 1),
               _span(first, 6, "names-a-span-of-the-second", 7, 8, 8)]
    spans_b = [_span(second, 1, "rl.grpo.step", 20, 30, **{"rl.iteration": 2}),
               _span(second, 2, "query07-operation", 21, 29, 1, **{"rl.bucket": "overhead"}),
               _span(second, 3, "leaf-b", 22, 23, 2),
               _span(second, 8, "only-in-second", 24, 25, 1),
               _span(second, 9, "names-a-span-of-the-first", 25, 26, 5)]
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "jaeger"}},
                               {"key": "nemo.run.id", "value": {"stringValue": "run-1"}}]}
    return [{"resourceSpans": [{"resource": resource, "scopeSpans": [{"scope": {"name": "t"}, "spans": spans}]}]}
            for spans in (spans_a, spans_b)]


@pytest.fixture(params=["json", "protobuf"])
def dataset(request, tmp_path, kernel_path):
    layout = LAYOUTS[request.node.callspec.params["layout"]]
    requests = _requests(*layout)
    dump = tmp_path / "dump"
    dump.mkdir()
    if request.param == "json":
        (dump / "traces.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in requests))
    else:
        payloads = [to_protobuf(r) for r in requests]
        (dump / "traces.binpb").write_bytes(b"".join(len(p).to_bytes(4, "big") + p for p in payloads))
    root = tmp_path / "ds"
    summary = ingest([dump], out=root)
    assert summary.spans == 10
    return root, layout


def _expected(spans) -> tuple[dict, set]:
    """(span -> parent, orphans) by (trace id, span id), from the hex ids."""
    rows = spans.select(["trace_id", "span_id", "parent_span_id"]).to_pylist()
    held = {(r["trace_id"], r["span_id"]) for r in rows}
    parents = {(r["trace_id"], r["span_id"]): (r["trace_id"], r["parent_span_id"]) for r in rows
               if (r["trace_id"], r["parent_span_id"]) in held}
    orphans = {(r["trace_id"], r["span_id"]) for r in rows
               if r["parent_span_id"] is not None and (r["trace_id"], r["parent_span_id"]) not in held}
    return parents, orphans


def _orphans(report) -> set:
    return {(f.trace_id, span) for f in report.findings if f.code == "orphan-span" for span in f.span_ids}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_parents_orphans_goodput_and_waterfall_are_per_real_trace_on_every_engine(dataset, layout):
    root, (first, second) = dataset
    spans = read_spans(root)
    parents, orphans = _expected(spans)
    assert len(parents) == 6 and orphans == {(first, f"{6:016x}"), (second, f"{9:016x}")}
    ids = list(zip(spans.column("trace_id").to_pylist(), spans.column("span_id").to_pylist()))
    found = parent_indices(spans)
    assert {ids[i]: ids[p] for i, p in enumerate(found.tolist()) if p >= 0} == parents

    files = span_source_files(root)[1]
    reports = {"memory": check_run(read_for_analysis(root)), "local": check_with_engine(root),
               "batches": check_span_files(files, batch_rows=3), "partitioned": stream_check(root)}
    for engine, report in reports.items():
        assert _orphans(report) == orphans, engine
        assert report.to_dict() == reports["memory"].to_dict(), engine

    # the bucketed child of each trace's step takes that trace's iteration, whichever engine walks it
    for engine, runs in {"memory": goodput_with_engine(root), "streamed": stream_goodput(root, batch_rows=3),
                         "in-memory table": run_goodput(read_for_analysis(root))}.items():
        steps = {row["iteration"]: row for row in runs[0].steps.to_pylist()}
        assert (steps[1]["productive_s"], steps[1]["overhead_s"]) == (4.0, 0.0), engine
        assert (steps[2]["productive_s"], steps[2]["overhead_s"]) == (0.0, 8.0), engine

    rows = waterfall(spans, fold_steps=False, collapse_threshold=None).rows.to_pylist()
    for row in rows:  # every row sits under a span of its own trace
        assert row["trace_id"] in (first, second)
    by_name = {r["name"]: r for r in rows}
    assert by_name["query07-operation"]["depth"] == by_name["some-operation"]["depth"] == 1
    assert by_name["query07-operation"]["trace_id"] == second
    assert by_name["names-a-span-of-the-first"]["is_orphan"] and by_name["names-a-span-of-the-second"]["is_orphan"]
    assert not by_name["only-in-first"]["is_orphan"] and not by_name["leaf-b"]["is_orphan"]
    for trace in (first, second):  # each trace alone: its own five spans, no other trace's
        alone = waterfall(spans, trace_id=trace, fold_steps=False, collapse_threshold=None).rows.to_pylist()
        assert sorted(r["name"] for r in alone) == sorted(r["name"] for r in rows if r["trace_id"] == trace)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_monitor_attributes_each_trace_to_its_own_step_in_any_arrival_order(tmp_path, layout):
    """The monitor, fed the two traces' spans a few at a time (the child of the second step before
    its parent, the other trace's step span in between), reports what offline goodput does."""
    from nemo_telemetry.analysis import MonitorState, goodput_document, load_traces

    dump = tmp_path / "traces.jsonl"
    dump.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in _requests(*LAYOUTS[layout])))
    spans = load_traces(dump).spans
    offline = {s["iteration"]: s for s in goodput_document(run_goodput(spans))["runs"][0]["steps"]}
    assert (offline[1]["overhead_s"], offline[2]["overhead_s"]) == (0.0, 8.0)
    names = spans.column("name").to_pylist()
    order = [names.index("query07-operation"), *(i for i in range(len(names)) if names[i] != "query07-operation")]
    state, records = MonitorState(grace_s=0), []
    for lo in range(0, len(order), 3):
        state.add(spans.take(order[lo:lo + 3]))
        records += state.finished_steps()
    records += state.finish()
    latest = {r.to_dict()["iteration"]: r.to_dict() for r in records}
    for iteration in (1, 2):
        assert (latest[iteration]["productive_s"], latest[iteration]["overhead_s"]) == (
            offline[iteration]["productive_s"], offline[iteration]["overhead_s"])


def _sharing_trace_key() -> tuple[str, str]:
    """Two trace ids with one trace_key: the key is the high half XOR a bijective mix of the low
    half, so for another low half there is a high half that gives the same key."""
    from nemo_telemetry.analysis.model.tree import trace_key_of
    import numpy as np

    high, low, other_low = 0x1234_5678_9ABC_DEF0, 0x0FED_CBA9_8765_4321, 0x1111_2222_3333_4444
    key = int(trace_key_of(np.array([high], np.uint64), np.array([low], np.uint64))[0])
    other_high = key ^ int(trace_key_of(np.array([0], np.uint64), np.array([other_low], np.uint64))[0])
    first, second = f"{high:016x}{low:016x}", f"{other_high:016x}{other_low:016x}"
    keys = trace_key_of(np.array([high, other_high], np.uint64), np.array([low, other_low], np.uint64))
    assert first != second and keys[0] == keys[1]
    return first, second


def write_sharing_trace_key(tmp_path, fmt: str = "json"):
    """A dataset of a trace anchored by a step span and another whose trace_key is the same but
    whose id is not: each holds an orphan, and the second's root is no root by design.
    Returns (root, anchored trace id, detached trace id)."""
    anchored, detached = _sharing_trace_key()
    spans = [_span(anchored, 1, "rl.grpo.step", 0, 10, **{"rl.iteration": 1}),
             _span(anchored, 2, "some-operation", 1, 5, 1, **{"rl.bucket": "productive"}),
             _span(anchored, 3, "lost-in-anchored", 6, 7, 77),
             _span(detached, 1, "rollout-worker", 2, 8),
             _span(detached, 2, "generate", 3, 4, 1),
             _span(detached, 3, "lost-in-detached", 5, 6, 99)]
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "trainer"}},
                               {"key": "nemo.run.id", "value": {"stringValue": "run-1"}}]}
    request = {"resourceSpans": [{"resource": resource, "scopeSpans": [{"scope": {"name": "t"}, "spans": spans}]}]}
    dump = tmp_path / "dump"
    dump.mkdir()
    if fmt == "json":
        (dump / "traces.jsonl").write_bytes(orjson.dumps(request) + b"\n")
    else:
        payload = to_protobuf(request)
        (dump / "traces.binpb").write_bytes(len(payload).to_bytes(4, "big") + payload)
    root = tmp_path / "ds"
    assert ingest([dump], out=root).spans == 6
    return root, anchored, detached


def assert_each_trace_named(report, anchored: str, detached: str, engine: str) -> None:
    """The detached trace is one finding quoting its own id and the anchored one's; each trace's
    orphan is a finding of its own, quoting its own trace id."""
    found = [f for f in report.findings if f.code == "detached-trace"]
    assert [(f.trace_id, f.span_ids) for f in found] == [(detached, (f"{1:016x}", f"{3:016x}"))], engine
    assert anchored in found[0].message, engine
    orphans = {f.trace_id: f.span_ids for f in report.findings if f.code == "orphan-span"}
    assert orphans == {anchored: (f"{3:016x}",), detached: (f"{3:016x}",)}, engine


@pytest.mark.parametrize("fmt", ["json", "protobuf"])
def test_detached_and_orphan_findings_name_each_trace_that_shares_a_trace_key(tmp_path, kernel_path, fmt):
    """Two trace ids crafted to share a trace_key are two traces to the findings that group spans
    per trace, on every engine: the second is detached (its root is outside every trace holding a
    step) and each trace's orphans are a finding of their own."""
    root, anchored, detached = write_sharing_trace_key(tmp_path, fmt)
    files = span_source_files(root)[1]
    reports = {"memory": check_run(read_for_analysis(root)), "local": check_with_engine(root),
               "batches": check_span_files(files, batch_rows=2), "partitioned": stream_check(root)}
    for engine, report in reports.items():
        assert_each_trace_named(report, anchored, detached, engine)
        assert report.to_dict() == reports["memory"].to_dict(), engine


@pytest.mark.parametrize("others", [0, 5], ids=["few-anchored-traces", "many-anchored-traces"])
def test_rows_in_anchored_traces_match_the_whole_trace_id(others):
    """A row is in an anchored trace only when its (trace_key, trace_low) pair is one of theirs:
    by comparison for a few anchored traces, by hashing for many, and also where two anchored
    traces share a key; the key alone (no low given) keeps matching by key."""
    import numpy as np
    import pyarrow as pa

    from nemo_telemetry.analysis.findings.rules import rows_in_traces

    key = np.array([7, 7, 7, 7, 8, 9, 7], np.uint64)
    low = np.array([1, 2, 3, 1, 1, 1, 2], np.uint64)
    table = pa.table({"trace_key": pa.chunked_array([key[:3], key[3:]]), "trace_low": pa.chunked_array([low[:4], low[4:]])})

    class Rows:  # what rows_in_traces reads of a SpanArrays
        def __init__(self, t):
            self.table = t

        def __len__(self):
            return self.table.num_rows

    traces = np.array([7, 7, 8] + list(range(100, 100 + others)), np.uint64)
    lows = np.array([1, 2, 9] + [0] * others, np.uint64)
    assert rows_in_traces(Rows(table), traces, lows).tolist() == [True, True, False, True, False, False, True]
    assert rows_in_traces(Rows(table), traces).tolist() == [True, True, True, True, True, False, True]


def test_a_chunk_of_one_trace_is_decided_by_its_whole_trace_id():
    """A chunk that holds one trace (a process's spans file of a one-trace run) is in an anchored
    trace only where its key and its low half both are one anchored trace's."""
    import numpy as np
    import pyarrow as pa

    from nemo_telemetry.analysis.findings.rules import rows_in_traces

    key = np.array([7, 7, 8, 8, 7, 7, 7, 7], np.uint64)
    low = np.array([1, 1, 9, 9, 3, 3, 1, 3], np.uint64)  # the last chunk holds two traces of key 7
    table = pa.table({"trace_key": pa.chunked_array([key[0:2], key[2:4], key[4:6], key[6:]]),
                      "trace_low": pa.chunked_array([low])})

    class Rows:  # what rows_in_traces reads of a SpanArrays
        def __init__(self, t):
            self.table = t

        def __len__(self):
            return self.table.num_rows

    traces, lows = np.array([7, 8], np.uint64), np.array([1, 9], np.uint64)
    assert rows_in_traces(Rows(table), traces, lows).tolist() == [True, True, True, True, False, False, True, False]
    assert rows_in_traces(Rows(table), np.array([8], np.uint64), np.array([1], np.uint64)).tolist() == [False] * 8
