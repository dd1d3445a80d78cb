"""The two tracing layers against the real vLLM engine (CPU build, tiny random Llama, one engine per session).

Our ``rl.vllm.generate`` spans come from the driver's dump; vLLM's spans from its own tracing,
``otlp_traces_endpoint`` pointed at our receiver on 127.0.0.1. Each test reads the session's one
run (``vllm_run`` in ``conftest.py``; the steps are in ``two_layer.py``).
"""

from __future__ import annotations

from collections import Counter

import pytest

from nemo_telemetry.analysis import attributed_iterations, goodput_by_step, parent_indices
from nemo_telemetry.analysis.views.stitch import STITCHED_KEY
from nemo_telemetry.instrument.vllm import GENERATE_SPAN, GENERATE_TEXT_SPAN, LOAD_MODEL_SPAN, TRACE_PATH_KEY
from tests.vllm_engine.two_layer import PROMPTS_PER_CALL, STEP_SPAN, VALIDATION_PROMPTS

GENERATES = (GENERATE_SPAN, GENERATE_TEXT_SPAN)


class Rows:
    """The joined spans as rows, with parents, attributed iterations and attributes as dicts (values as text)."""

    def __init__(self, spans):
        self.rows = spans.to_pylist()
        self.parents = parent_indices(spans).tolist()
        self.iterations = attributed_iterations(spans).to_pylist()
        self.attributes = [dict(r["attributes"] or []) for r in self.rows]

    def named(self, *names: str) -> list[int]:
        return [i for i, r in enumerate(self.rows) if r["name"] in names]

    def children(self, parent: int, name: str) -> list[int]:
        return [i for i in self.named(name) if self.parents[i] == parent]

    def ancestors(self, i: int) -> list[str]:
        out = []
        while self.parents[i] >= 0:
            i = self.parents[i]
            out.append(self.rows[i]["name"])
        return out


@pytest.fixture(scope="module")
def rows(vllm_run) -> Rows:
    return Rows(vllm_run.spans)


def _generate_spans_in_order(rows: Rows) -> list[int]:
    return sorted(rows.named(*GENERATES), key=lambda i: rows.rows[i]["start_ns"])


def _generates_with_calls(vllm_run, rows: Rows) -> list[tuple[int, object]]:
    """Each generate span with the call that made it; one span per call and at least one call, so
    a test that loops over them cannot pass on none (``zip`` stops at the shorter side)."""
    generates = _generate_spans_in_order(rows)
    assert len(generates) == len(vllm_run.calls) > 0, (len(generates), len(vllm_run.calls))
    return list(zip(generates, vllm_run.calls))


def test_the_headers_path_joins_every_llm_request_with_no_stitching(vllm_run, rows):
    assert vllm_run.trace_path == "headers"
    assert {rows.attributes[i][TRACE_PATH_KEY] for i in rows.named(*GENERATES)} == {"headers"}
    assert vllm_run.spans.schema.metadata[STITCHED_KEY] == b"0"
    assert not any("nemo.stitched" in a for a in rows.attributes)


def test_one_llm_request_per_prompt_under_its_generate_span(vllm_run, rows):
    requests = rows.named("llm_request")
    assert len(requests) == sum(call.prompts for call in vllm_run.calls)
    assert all(rows.parents[i] >= 0 and rows.rows[rows.parents[i]]["name"] in GENERATES for i in requests)
    for g, call in _generates_with_calls(vllm_run, rows):
        assert call.prompts > 0
        assert len(rows.children(g, "llm_request")) == call.prompts == int(rows.attributes[g]["rl.vllm.num_prompts"])
        generate = rows.rows[g]
        for r in rows.children(g, "llm_request"):
            assert generate["start_ns"] <= rows.rows[r]["start_ns"] <= rows.rows[r]["end_ns"] <= generate["end_ns"]


def test_llm_requests_are_attributed_to_the_step_that_generated_them(vllm_run, rows):
    per_step = Counter(rows.iterations[i] for i in rows.named("llm_request"))
    assert vllm_run.steps > 0
    assert per_step == {step: 2 * PROMPTS_PER_CALL + VALIDATION_PROMPTS for step in range(1, vllm_run.steps + 1)}
    for g, call in _generates_with_calls(vllm_run, rows):
        assert rows.iterations[g] == call.step
        assert rows.ancestors(g)[0] == STEP_SPAN


def test_token_usage_on_both_layers_is_what_generate_returned(vllm_run, rows):
    for g, call in _generates_with_calls(vllm_run, rows):
        requests = rows.children(g, "llm_request")
        assert requests and call.generated_tokens > 0
        assert int(rows.attributes[g]["gen_ai.usage.output_tokens"]) == call.generated_tokens
        assert int(rows.attributes[g]["gen_ai.usage.input_tokens"]) == call.prompt_tokens
        assert sum(int(rows.attributes[r]["gen_ai.usage.completion_tokens"]) for r in requests) == call.generated_tokens
        assert sum(int(rows.attributes[r]["gen_ai.usage.prompt_tokens"]) for r in requests) == call.prompt_tokens


def test_validation_generation_is_counted_as_overhead(vllm_run, rows):
    pairs = _generates_with_calls(vllm_run, rows)
    buckets = {call.kind: set() for call in vllm_run.calls}
    for g, call in pairs:
        buckets[call.kind].add(rows.rows[g]["rl.bucket"])
    assert buckets == {"tokens": {"productive"}, "text": {"productive"}, "validation": {"overhead"}}
    steps = {r["iteration"]: r for r in goodput_by_step(vllm_run.spans).to_pylist()}
    assert vllm_run.steps > 0 and sorted(steps) == list(range(1, vllm_run.steps + 1))
    for step, row in steps.items():
        def seconds(kind: str) -> float:
            return sum((rows.rows[g]["end_ns"] - rows.rows[g]["start_ns"]) / 1e9
                       for g, call in pairs if call.step == step and call.kind == kind)
        assert row["overhead_s"] == pytest.approx(seconds("validation"), rel=1e-6)
        assert row["productive_s"] == pytest.approx(seconds("tokens") + seconds("text"), rel=1e-6)


def test_engine_counter_deltas_per_step_are_the_tokens_generated(vllm_run):
    values = {(r["iteration"], r["name"]): r["value"] for r in vllm_run.by_step.to_pylist()}
    assert vllm_run.steps > 0
    for step in range(1, vllm_run.steps + 1):
        calls = [c for c in vllm_run.calls if c.step == step]
        assert calls
        assert values[(step, "rl.vllm.generation_tokens")] == sum(c.generated_tokens for c in calls)
        assert values[(step, "rl.vllm.prompt_tokens")] == sum(c.prompt_tokens for c in calls)
        assert values[(step, "rl.vllm.requests_finished")] == sum(c.prompts for c in calls)


def test_vllm_engine_process_spans_reach_our_receiver_under_load_model(vllm_run, rows):
    """vLLM's own exporter (engine-core and worker processes) sends its start-up spans to our receiver."""
    assert vllm_run.received is not None, "our receiver got no span from vLLM's exporter"
    received = sorted(vllm_run.received.column("name").to_pylist())
    assert "EngineCoreProc init" in received, received
    (engine_init,) = rows.named("EngineCoreProc init")
    assert LOAD_MODEL_SPAN in rows.ancestors(engine_init), rows.ancestors(engine_init)
    assert rows.rows[engine_init]["run_id"] == rows.rows[rows.named(LOAD_MODEL_SPAN)[0]]["run_id"]


def test_driver_side_llm_requests_travel_our_exporter(vllm_run, rows):
    """vLLM 0.32 starts llm_request from OpenTelemetry's global provider, which is ours (module docstring of
    nemo_telemetry/instrument/vllm.py): they are in our dump, with our resource, not at the receiver."""
    assert "llm_request" not in vllm_run.received.column("name").to_pylist()
    (load,) = rows.named(LOAD_MODEL_SPAN)
    assert {(rows.rows[i]["service_name"], rows.rows[i]["run_id"]) for i in rows.named("llm_request")} == {
        (rows.rows[load]["service_name"], rows.rows[load]["run_id"])}
