"""stitch_vllm_spans: llm_request roots re-parented under their rl.vllm.generate by time containment."""

from __future__ import annotations

import pytest

from nemo_telemetry.analysis.model.records import spans_table
from nemo_telemetry.analysis.views.stitch import AMBIGUOUS_KEY, STITCHED_KEY, UNMATCHED_KEY, stitch_vllm_spans
from nemo_telemetry.analysis.model.tree import parent_indices, with_id_keys

T1, TA, TB, TC, TD, TE = ("%032x" % (0x1000 + i) for i in range(6))


def span(trace, sid, name, start, end, *, parent=None, run="run-1", **attributes):
    return {"trace_id": trace, "span_id": "%016x" % sid, "name": name, "start_ns": start, "end_ns": end,
            "parent_span_id": None if parent is None else "%016x" % parent, "run_id": run,
            "attributes": {k.replace("__", "."): str(v) for k, v in attributes.items()}}


@pytest.fixture()
def table():
    return spans_table([
        span(T1, 1, "rl.grpo.step", 0, 100, iteration=None),
        span(T1, 2, "rl.vllm.generate", 10, 20, parent=1),
        span(T1, 3, "rl.vllm.generate_text", 30, 40, parent=1),
        span(TA, 10, "llm_request", 11, 19, gen_ai__request__id="0"),      # in generate 2
        span(TA, 11, "llm_request.detail", 12, 13, parent=10),              # moves with its root
        span(TB, 12, "llm_request", 31, 35),                                # in generate_text 3
        span(TC, 13, "llm_request", 50, 60),                                # in no generate: left alone
        span(TD, 14, "llm_request", 12, 18, run="run-2"),                   # another run: left alone
        span(T1, 15, "llm_request", 12, 18, parent=2),                      # headers path: already parented
    ])


def by_id(table) -> dict[int, dict]:
    return {int(r["span_id"], 16): r for r in table.to_pylist()}


def test_request_roots_move_under_the_generate_span_that_contains_them(table):
    out = by_id(stitch_vllm_spans(table))
    r1, detail, r2 = out[10], out[11], out[12]
    assert (r1["trace_id"], r1["parent_span_id"]) == (T1, "%016x" % 2)
    assert dict(r1["attributes"]) == {"gen_ai.request.id": "0", "nemo.stitched": "true",
                                      "nemo.stitched.original_trace_id": TA}
    assert (detail["trace_id"], detail["parent_span_id"]) == (T1, "%016x" % 10)
    assert "nemo.stitched" not in dict(detail["attributes"])
    assert (r2["trace_id"], r2["parent_span_id"]) == (T1, "%016x" % 3)


def test_unmatched_and_already_parented_requests_are_left_alone(table):
    out = by_id(stitch_vllm_spans(table))
    before = by_id(table)
    for sid in (13, 14, 15):
        assert out[sid] == before[sid]


def test_counts_are_in_the_metadata_and_the_input_is_not_mutated(table):
    original = table.to_pylist()
    out = stitch_vllm_spans(table)
    assert out.schema.metadata[STITCHED_KEY] == b"2"
    assert out.schema.metadata[UNMATCHED_KEY] == b"2"
    assert out.schema.metadata[AMBIGUOUS_KEY] == b"0"
    assert table.to_pylist() == original
    assert out.schema.remove_metadata() == table.schema


def test_id_keys_follow_the_new_parents(table):
    keyed = with_id_keys(table)
    out = stitch_vllm_spans(keyed)
    assert "trace_key" in out.column_names
    parents = parent_indices(out)
    names = out["name"].to_pylist()
    ids = out["span_id"].to_pylist()
    r1 = ids.index("%016x" % 10)
    assert names[parents[r1]] == "rl.vllm.generate"
    assert out["trace_key"][r1] == out["trace_key"][ids.index("%016x" % 2)]


def test_overlapping_generates_pick_the_latest_container_and_say_it_is_ambiguous():
    table = spans_table([
        span(T1, 1, "rl.vllm.generate", 10, 30),
        span(TE, 2, "rl.vllm.generate", 15, 25),  # a second generation worker of the same run
        span(TA, 10, "llm_request", 16, 24),      # inside both: the later-starting one
        span(TB, 11, "llm_request", 26, 29),      # the latest-starting generate ended: the earlier one
    ])
    out = stitch_vllm_spans(table)
    got = by_id(out)
    assert got[10]["parent_span_id"] == "%016x" % 2 and got[10]["trace_id"] == TE
    assert got[11]["parent_span_id"] == "%016x" % 1 and got[11]["trace_id"] == T1
    assert all(dict(got[s]["attributes"])["nemo.stitch.ambiguous"] == "true" for s in (10, 11))
    assert out.schema.metadata[AMBIGUOUS_KEY] == b"2"


def test_tolerance_covers_clock_skew():
    table = spans_table([span(T1, 1, "rl.vllm.generate", 100, 200), span(TA, 10, "llm_request", 95, 150)])
    assert by_id(stitch_vllm_spans(table))[10]["parent_span_id"] is None
    assert by_id(stitch_vllm_spans(table, tolerance_ns=10))[10]["parent_span_id"] == "%016x" % 1


def test_nothing_to_stitch_returns_the_spans_unchanged():
    table = spans_table([span(T1, 1, "rl.grpo.step", 0, 10)])
    out = stitch_vllm_spans(table)
    assert out.to_pylist() == table.to_pylist() and out.schema.metadata[STITCHED_KEY] == b"0"
    empty = spans_table([])
    assert stitch_vllm_spans(empty).num_rows == 0


def test_the_stand_in_s_stitch_path_is_joined_end_to_end():
    """Spans from tests/instrument/fake_vllm.py's engine without trace_headers, as exported."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from nemo_telemetry.instrument import resolve, set_enabled_span_groups, set_tracer_provider
    from nemo_telemetry.instrument.vllm import load_vllm
    from tests.instrument import fake_vllm as fake

    exporter = InMemorySpanExporter()
    ours = TracerProvider()
    ours.add_span_processor(SimpleSpanProcessor(exporter))
    set_tracer_provider(ours)
    set_enabled_span_groups(resolve("all"))
    vllm_exporter = InMemorySpanExporter()
    fake.VLLM_TRACER_PROVIDER = TracerProvider()
    fake.VLLM_TRACER_PROVIDER.add_span_processor(SimpleSpanProcessor(vllm_exporter))
    try:
        llm = load_vllm("tiny", llm_class=fake.LLM, engine_args_class=fake.EngineArgs, engine="no_trace_headers",
                        otlp_traces_endpoint="http://127.0.0.1:4318/v1/traces")
        llm.generate([{"prompt_token_ids": [1, 2]}] * 3)
        llm.generate([{"prompt_token_ids": [3]}] * 2)
    finally:
        fake.VLLM_TRACER_PROVIDER = None
    records = [{"trace_id": "%032x" % s.context.trace_id, "span_id": "%016x" % s.context.span_id,
                "parent_span_id": "%016x" % s.parent.span_id if s.parent else None, "name": s.name,
                "start_ns": s.start_time, "end_ns": s.end_time}
               for s in [*exporter.get_finished_spans(), *vllm_exporter.get_finished_spans()]]
    out = stitch_vllm_spans(spans_table(records))
    assert out.schema.metadata[STITCHED_KEY] == b"5" and out.schema.metadata[UNMATCHED_KEY] == b"0"
    rows = out.to_pylist()
    generates = [r for r in rows if r["name"] == "rl.vllm.generate"]
    children = {g["span_id"]: sum(r["parent_span_id"] == g["span_id"] for r in rows) for g in generates}
    assert sorted(children.values()) == [2, 3]
