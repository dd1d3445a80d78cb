"""vLLM two-layer tracing against the stand-in (tests/instrument/fake_vllm.py): fast, no engine.

The real engine runs in tests/vllm_engine.

Our spans go to the ``exporter`` fixture's provider; the stand-in's ``llm_request`` spans go to a
separate provider, as vLLM's go to its own OTLP pipeline: the layers meet only in the ids.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import subprocess
import sys

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from nemo_telemetry.instrument import (
    Bucket,
    RLSpanGroup,
    bucket_scope,
    managed_span,
    resolve,
    set_enabled_span_groups,
)
from nemo_telemetry.instrument import vllm as nv
from nemo_telemetry.instrument.metrics import VllmCounterDeltas, set_meter_provider
from tests.instrument import fake_vllm as fake

ENDPOINT = "http://127.0.0.1:4318/v1/traces"


@pytest.fixture()
def vllm_spans():
    """The stand-in engine's own span pipeline (vLLM's OTLP exporter in the real thing)."""
    exp = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exp))
    fake.VLLM_TRACER_PROVIDER = provider
    yield exp
    fake.VLLM_TRACER_PROVIDER = None
    provider.shutdown()


@pytest.fixture()
def traced_env(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", ENDPOINT)
    monkeypatch.setenv("NEMO_TELEMETRY_RUN_ID", "run-42")


def _load(**kwargs):
    return nv.load_vllm("tiny-model", llm_class=fake.LLM, engine_args_class=fake.EngineArgs, **kwargs)


def _token_prompts(n: int) -> list[dict]:
    return [{"prompt_token_ids": [1, 2, 3 + i]} for i in range(n)]


def _by_name(spans) -> dict[str, list]:
    out: dict[str, list] = {}
    for span in spans:
        out.setdefault(span.name, []).append(span)
    return out


# -- the headers path ---------------------------------------------------------------------------


def test_llm_request_spans_are_children_of_rl_vllm_generate(exporter, vllm_spans, traced_env):
    llm = _load()
    assert llm.engine_args.otlp_traces_endpoint == ENDPOINT
    outputs = llm.generate(_token_prompts(3), fake.SamplingParams(max_tokens=4, temperature=0.5))
    assert len(outputs) == 3

    ours = _by_name(exporter.get_finished_spans())
    (generate,) = ours["rl.vllm.generate"]
    requests = vllm_spans.get_finished_spans()
    assert [s.name for s in requests] == ["llm_request"] * 3
    for request in requests:
        assert request.context.trace_id == generate.context.trace_id
        assert request.parent.span_id == generate.context.span_id
        assert generate.start_time <= request.start_time and request.end_time <= generate.end_time
    assert llm.llm_engine.received_trace_headers[0]["traceparent"].split("-")[2] == \
        format(generate.context.span_id, "016x")

    attrs = generate.attributes
    assert attrs["rl.bucket"] == "productive"
    assert attrs["rl.vllm.trace_path"] == "headers"
    assert attrs["gen_ai.system"] == "vllm" and attrs["gen_ai.request.model"] == "tiny-model"
    assert attrs["gen_ai.request.max_tokens"] == 4 and attrs["gen_ai.request.temperature"] == 0.5
    assert attrs["rl.vllm.num_prompts"] == 3
    assert attrs["gen_ai.usage.input_tokens"] == 9 and attrs["gen_ai.usage.output_tokens"] == 12


def test_load_model_is_an_unbucketed_model_init_span(exporter, traced_env):
    _load()
    (load,) = _by_name(exporter.get_finished_spans())["rl.vllm.load_model"]
    assert "rl.bucket" not in load.attributes
    assert load.attributes["gen_ai.request.model"] == "tiny-model"


def test_text_prompts_open_generate_text(exporter, vllm_spans, traced_env):
    llm = _load()
    llm.generate(["hello", "world"])
    ours = _by_name(exporter.get_finished_spans())
    assert "rl.vllm.generate" not in ours
    (span,) = ours["rl.vllm.generate_text"]
    assert all(r.parent.span_id == span.context.span_id for r in vllm_spans.get_finished_spans())


def test_validation_generation_is_overhead_inside_a_bucket_scope(exporter, traced_env):
    llm = _load()
    with bucket_scope(Bucket.OVERHEAD):
        llm.generate(_token_prompts(1))
    (span,) = _by_name(exporter.get_finished_spans())["rl.vllm.generate"]
    assert span.attributes["rl.bucket"] == "overhead"


def test_a_caller_s_own_trace_headers_are_kept(exporter, traced_env):
    llm = _load()
    mine = {"traceparent": "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"}
    with managed_span(RLSpanGroup.GENERATION, "rl.vllm.generate"):
        llm.llm_engine.add_request("x", {"prompt_token_ids": [1]}, fake.SamplingParams(), trace_headers=mine)
    assert llm.llm_engine.received_trace_headers == [mine]


def test_instrumenting_twice_opens_one_span_per_call(exporter, traced_env):
    llm = nv.instrument_vllm(_load())
    llm.generate(_token_prompts(1))
    assert len(_by_name(exporter.get_finished_spans())["rl.vllm.generate"]) == 1


def test_a_failing_generate_raises_and_is_recorded(exporter, traced_env):
    llm = _load()
    with pytest.raises(AttributeError):
        llm.generate(_token_prompts(1), "not sampling params")
    (span,) = _by_name(exporter.get_finished_spans())["rl.vllm.generate"]
    assert not span.status.is_ok and span.events[0].name == "exception"


def test_with_generation_disabled_nothing_is_traced_or_routed(exporter, vllm_spans, traced_env):
    llm = _load()
    set_enabled_span_groups(resolve("all") - {"generation"})
    outputs = llm.generate(_token_prompts(2))
    assert len(outputs) == 2
    assert "rl.vllm.generate" not in _by_name(exporter.get_finished_spans())
    assert llm.llm_engine.received_trace_headers == [None, None]
    assert len({s.context.trace_id for s in vllm_spans.get_finished_spans()}) == 2  # roots, as vLLM alone


def test_async_llm_takes_the_headers_directly(exporter, vllm_spans):
    engine = fake.AsyncLLM("tiny-model", otlp_traces_endpoint=ENDPOINT)

    async def one_request():
        with managed_span(RLSpanGroup.GENERATION, "rl.vllm.generate") as span:
            async for _ in engine.generate({"prompt_token_ids": [1]}, fake.SamplingParams(), "r1",
                                           trace_headers=nv.vllm_trace_headers()):
                pass
            return span

    span = asyncio.run(one_request())
    (request,) = vllm_spans.get_finished_spans()
    assert request.parent.span_id == span.context.span_id


def test_vllm_trace_headers_are_empty_outside_any_span(exporter):
    assert nv.vllm_trace_headers() == {}


# -- the stitching path -------------------------------------------------------------------------


def test_an_engine_without_trace_headers_takes_the_stitch_path(exporter, vllm_spans, traced_env):
    llm = _load(engine="no_trace_headers")
    llm.generate(_token_prompts(2))
    (generate,) = _by_name(exporter.get_finished_spans())["rl.vllm.generate"]
    assert generate.attributes["rl.vllm.trace_path"] == "stitch"
    requests = vllm_spans.get_finished_spans()
    assert len(requests) == 2
    assert all(r.parent is None and r.context.trace_id != generate.context.trace_id for r in requests)
    # inside the generate window: what the analysis-side stitch matches on
    assert all(generate.start_time <= r.start_time and r.end_time <= generate.end_time for r in requests)


# -- engine arguments and environment -----------------------------------------------------------


def test_engine_args_follow_the_standard_otel_variables():
    http = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    grpc = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}
    specific = {**http, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:9999/custom"}
    args = lambda environ, **kw: nv.vllm_tracing_engine_args(engine_args_class=fake.EngineArgs,  # noqa: E731
                                                             environ=environ, **kw)
    assert args(http) == {"otlp_traces_endpoint": "http://collector:4318/v1/traces"}
    assert args(grpc) == {"otlp_traces_endpoint": "http://collector:4317"}
    assert args(specific) == {"otlp_traces_endpoint": "http://traces:9999/custom"}
    assert args(http, detailed_traces=["model"])["collect_detailed_traces"] == ["model"]


def test_no_endpoint_means_no_engine_args(caplog):
    nv._warned.clear()
    with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
        assert nv.vllm_tracing_engine_args(engine_args_class=fake.EngineArgs, environ={}) == {}
    assert "collector" in caplog.text


def test_only_engine_arguments_the_installed_vllm_has_are_passed(caplog):
    class OldEngineArgs:
        def __init__(self, model: str, tensor_parallel_size: int = 1) -> None: ...

    nv._warned.clear()
    with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
        assert nv.vllm_tracing_engine_args(endpoint=ENDPOINT, engine_args_class=OldEngineArgs,
                                           detailed_traces=["all"]) == {}
    assert "otlp_traces_endpoint" in caplog.text


def test_without_vllm_installed_no_engine_args_are_invented():
    try:
        import vllm  # noqa: F401
    except ImportError:
        assert nv.vllm_tracing_engine_args(endpoint=ENDPOINT) == {}
    else:
        assert "otlp_traces_endpoint" in nv.vllm_tracing_engine_args(endpoint=ENDPOINT)


def test_tracing_env_adds_the_run_id_and_pins_the_protocol():
    environ = {"NEMO_TELEMETRY_RUN_ID": "r1", "OTEL_RESOURCE_ATTRIBUTES": "team=rl",
               "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}
    assert nv.vllm_tracing_env(environ) == {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
                                            "OTEL_RESOURCE_ATTRIBUTES": "team=rl,nemo.run.id=r1"}
    pinned = {**environ, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
              "OTEL_RESOURCE_ATTRIBUTES": "nemo.run.id=r1"}
    assert nv.vllm_tracing_env(pinned) == {}


# -- engine counters ----------------------------------------------------------------------------


@pytest.fixture()
def reader():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    set_meter_provider(provider)
    yield reader
    set_meter_provider(None)
    provider.shutdown()


def test_engine_counters_are_recorded_as_per_step_deltas(exporter, reader, traced_env):
    llm = _load(disable_log_stats=False)
    deltas = VllmCounterDeltas()
    llm.generate(_token_prompts(2), fake.SamplingParams(max_tokens=5))
    assert nv.record_vllm_engine_counters(llm, deltas)["rl.vllm.generation_tokens"] == 10
    llm.generate(_token_prompts(1), fake.SamplingParams(max_tokens=5))
    step2 = nv.record_vllm_engine_counters(llm, deltas)
    assert step2["rl.vllm.generation_tokens"] == 5 and step2["rl.vllm.requests_finished"] == 1


def test_engine_counters_without_stats_warn_once(reader, caplog, traced_env):
    llm = _load()  # LLM's default: disable_log_stats=True
    nv._warned.clear()
    with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
        assert nv.record_vllm_engine_counters(llm, VllmCounterDeltas()) == {}
        assert nv.record_vllm_engine_counters(llm, VllmCounterDeltas()) == {}
    assert caplog.text.count("disable_log_stats=False") == 1


def test_importing_the_integration_does_not_import_vllm():
    code = ("import sys; sys.modules['vllm'] = None; "  # any 'import vllm' now fails
            "import nemo_telemetry.instrument.vllm as v; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize("surface", sorted(fake.PARAMETERS_WE_USE))
def test_the_parameters_the_contract_checks_are_the_stand_in_s(surface):
    """The contract test checks these names against any installed vLLM; they must be the double's, in order."""
    ours, _ = fake.SURFACES[surface]
    names = list(inspect.signature(ours).parameters)
    used = fake.PARAMETERS_WE_USE[surface]
    assert all(name in names for name in used), f"{surface}: {used} vs the stand-in's {names}"
    assert [names.index(name) for name in used] == sorted(names.index(name) for name in used)
