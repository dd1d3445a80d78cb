"""A stand-in for the parts of vLLM that ``nemo_telemetry.instrument.vllm`` calls. Not vLLM.

A test double for the fast unit tests (``tests/instrument/test_vllm.py``, the stitching tests):
they need no engine start and no 3.5 GB install, and they reach cases the real engine does not
offer on demand (an engine without ``trace_headers``). The real engine runs in ``tests/vllm_engine``
(vLLM's CPU build, in ``.venv-vllm``). Every method we call has the exact signature of vLLM 0.33.0
and 0.32.0 (checked against its source: ``vllm/entrypoints/llm.py``,
``vllm/entrypoints/common/offline.py``, ``vllm/v1/engine/llm_engine.py``,
``vllm/v1/engine/async_llm.py``, ``vllm/engine/arg_utils.py``,
``vllm/v1/engine/output_processor.py``, ``vllm/tracing/``), and ``tests/vllm_engine/test_vllm_contract.py``
compares them with the installed vLLM. What the double reproduces, because our instrumentation
depends on it:

- ``LLM.generate`` adds one engine request per prompt through ``self.llm_engine.add_request``
  *without* ``trace_headers`` (vLLM issue 32177), then steps the engine until every request is done;
- the engine emits one ``llm_request`` span (kind SERVER, vLLM's ``gen_ai.*`` attributes) per
  finished request when ``otlp_traces_endpoint`` is set: a child of the ``traceparent`` it was
  given, else in a trace of its own (the engine side has no access to the caller's context);
- vLLM's spans go through a tracer provider that is not the one our spans use
  (:data:`VLLM_TRACER_PROVIDER` here), so the join is tested on the exported ids alone (the real
  engine's processes export through vLLM's own OTLP pipeline; see ``nemo_telemetry/instrument/vllm.py``
  for its driver-side ``llm_request`` spans);
- ``LLM.get_metrics()`` returns Prometheus-style ``Counter`` objects (``vllm:generation_tokens``...).

``engine="no_trace_headers"`` gives an engine whose ``add_request`` has no ``trace_headers``
parameter, the case the analysis-side stitching exists for.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import context as context_api
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

STAND_IN_VERSION = "0.33.0"
"""The vLLM release whose signatures the double copies exactly."""

EXACT_SIGNATURE_RELEASES = frozenset({STAND_IN_VERSION, "0.32.0"})
"""The releases whose signatures the double matches exactly (0.32.0: the CPU build ``make test`` installs)."""

VLLM_TRACER_PROVIDER: Any = None
"""Where the double's ``llm_request`` spans go (vLLM's own OTLP pipeline, in the real thing)."""

DECODE_SECONDS = 0.002
"""How long the double "decodes" each request, so spans have a measurable length."""


# -- vllm.sampling_params / vllm.outputs / vllm.v1.metrics.reader ------------------------------


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = 16


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True


@dataclass
class Counter:
    name: str
    labels: dict[str, str]
    value: int


@dataclass
class Gauge:
    name: str
    labels: dict[str, str]
    value: float


@dataclass
class EngineArgs:
    """The engine arguments ``vllm_tracing_engine_args`` may set (a subset of vLLM's fields)."""

    model: str = "facebook/opt-125m"
    otlp_traces_endpoint: str | None = None
    collect_detailed_traces: list[str] | None = None
    disable_log_stats: bool = False


# -- vllm.v1.engine.llm_engine.LLMEngine -------------------------------------------------------


@dataclass
class _Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_ns: int
    trace_headers: Mapping[str, str] | None
    prompt: str | None = None


@dataclass
class _ModelConfig:
    model: str


class LLMEngine:
    """The v1 ``LLMEngine`` surface ``LLM`` uses: add_request, step, has_unfinished_requests."""

    def __init__(self, model: str, *, tracing: bool) -> None:
        self.model_config = _ModelConfig(model)
        self.tracing = tracing
        self.received_trace_headers: list[Mapping[str, str] | None] = []
        self._queue: list[_Request] = []
        self.counters = {"vllm:prompt_tokens": 0, "vllm:generation_tokens": 0, "vllm:request_success": 0}

    def add_request(
        self,
        request_id: str,
        prompt: Any,
        params: Any,
        arrival_time: float | None = None,
        lora_request: Any | None = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        trace_headers: Mapping[str, str] | None = None,
        priority: int = 0,
        session_id: str | None = None,
        prompt_text: str | None = None,
        kv_hints: Any | None = None,
    ) -> str:
        self.received_trace_headers.append(trace_headers)
        self._enqueue(request_id, prompt, params, trace_headers)
        return request_id

    def _enqueue(self, request_id: str, prompt: Any, params: Any, trace_headers: Mapping[str, str] | None) -> None:
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            ids, text = list(prompt["prompt_token_ids"]), None
        else:
            text = prompt["prompt"] if isinstance(prompt, dict) else str(prompt)
            ids = [ord(c) % 50_000 for c in text]
        self._queue.append(_Request(request_id, ids, params, time.time_ns(), trace_headers, text))

    def has_unfinished_requests(self) -> bool:
        return bool(self._queue)

    def get_num_unfinished_requests(self) -> int:
        return len(self._queue)

    def step(self) -> list[RequestOutput]:
        request = self._queue.pop(0)
        time.sleep(DECODE_SECONDS)
        n_tokens = request.params.max_tokens or 16
        outputs = [CompletionOutput(i, "x" * n_tokens, list(range(n_tokens))) for i in range(request.params.n)]
        self.counters["vllm:prompt_tokens"] += len(request.prompt_token_ids)
        self.counters["vllm:generation_tokens"] += n_tokens * request.params.n
        self.counters["vllm:request_success"] += 1
        if self.tracing:
            self._do_tracing(request, n_tokens)
        return [RequestOutput(request.request_id, request.prompt, request.prompt_token_ids, outputs)]

    def _do_tracing(self, request: _Request, n_tokens: int) -> None:
        """vLLM's ``OutputProcessor.do_tracing``: one ``llm_request`` span from arrival to now."""
        if VLLM_TRACER_PROVIDER is None:
            return
        if request.trace_headers:
            parent = TraceContextTextMapPropagator().extract(dict(request.trace_headers))
        else:
            parent = context_api.Context()  # the engine side sees no caller context
        tracer = VLLM_TRACER_PROVIDER.get_tracer("vllm.llm_engine")
        span = tracer.start_span("llm_request", context=parent, kind=SpanKind.SERVER,
                                 start_time=request.arrival_ns)
        e2e = (time.time_ns() - request.arrival_ns) / 1e9
        span.set_attributes({
            "gen_ai.request.id": request.request_id,
            "gen_ai.usage.prompt_tokens": len(request.prompt_token_ids),
            "gen_ai.usage.completion_tokens": n_tokens * request.params.n,
            "gen_ai.request.max_tokens": request.params.max_tokens or 0,
            "gen_ai.request.n": request.params.n,
            "gen_ai.latency.e2e": e2e,
            "gen_ai.latency.time_in_queue": 0.0,
        })
        span.end()


class LegacyLLMEngine(LLMEngine):
    """An engine whose ``add_request`` takes no ``trace_headers`` (pre-tracing vLLM)."""

    def add_request(  # type: ignore[override]
        self,
        request_id: str,
        prompt: Any,
        params: Any,
        arrival_time: float | None = None,
        lora_request: Any | None = None,
        priority: int = 0,
    ) -> str:
        self.received_trace_headers.append(None)
        self._enqueue(request_id, prompt, params, None)
        return request_id


# -- vllm.LLM ----------------------------------------------------------------------------------


class LLM:
    """``vllm.LLM``: builds the engine from engine arguments; ``generate`` as in vLLM 0.33."""

    def __init__(self, model: str, *, engine: str = "v1", **kwargs: Any) -> None:
        args = EngineArgs(model=model, **{k: v for k, v in kwargs.items() if k in EngineArgs.__dataclass_fields__})
        self.engine_args = args
        tracing = args.otlp_traces_endpoint is not None
        engine_cls = LegacyLLMEngine if engine == "no_trace_headers" else LLMEngine
        self.llm_engine = engine_cls(model, tracing=tracing)
        self.request_counter = itertools.count()
        self.log_stats = not kwargs.get("disable_log_stats", True)

    def generate(
        self,
        prompts: Any | Sequence[Any],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool | Callable[..., Any] = True,
        lora_request: Sequence[Any] | Any | None = None,
        priority: int | Sequence[int] | None = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        seq = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
        params = sampling_params if sampling_params is not None else SamplingParams()
        seq_params = list(params) if isinstance(params, (list, tuple)) else [params] * len(seq)
        for prompt, sp in zip(seq, seq_params):
            self._add_request(prompt, sp, lora_request=None, priority=0)
        return self._run_engine()

    def _add_request(self, prompt: Any, params: SamplingParams, lora_request: Any = None, priority: int = 0) -> str:
        request_id = str(next(self.request_counter))
        return self.llm_engine.add_request(request_id, prompt, params, lora_request=lora_request, priority=priority)

    def _run_engine(self) -> list[RequestOutput]:
        outputs: list[RequestOutput] = []
        while self.llm_engine.has_unfinished_requests():
            outputs.extend(o for o in self.llm_engine.step() if o.finished)
        return sorted(outputs, key=lambda o: int(o.request_id))

    def get_metrics(self) -> list[Any]:
        assert self.log_stats, "Stat logging disabled"
        counters = [Counter(name, {}, value) for name, value in self.llm_engine.counters.items()]
        return [*counters, Gauge("vllm:num_requests_running", {}, 0.0)]


# -- vllm.v1.engine.async_llm.AsyncLLM ---------------------------------------------------------


class AsyncLLM:
    """``AsyncLLM.generate``: one request, with ``trace_headers`` as the online path passes them."""

    def __init__(self, model: str, **kwargs: Any) -> None:
        self._llm = LLM(model, **kwargs)

    async def generate(
        self,
        prompt: Any,
        sampling_params: SamplingParams,
        request_id: str,
        *,
        prompt_text: str | None = None,
        lora_request: Any | None = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        trace_headers: Mapping[str, str] | None = None,
        priority: int = 0,
        data_parallel_rank: int | None = None,
        session_id: str | None = None,
        kv_hints: Any | None = None,
        reasoning_ended: bool | None = None,
        reasoning_parser_kwargs: dict[str, Any] | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        engine = self._llm.llm_engine
        engine.add_request(request_id, prompt, sampling_params, trace_headers=trace_headers, priority=priority)
        while engine.has_unfinished_requests():
            for output in engine.step():
                yield output


@dataclass
class _Registry:
    """What the contract test compares: (our double, vLLM's dotted path) per surface we call."""

    surfaces: dict[str, tuple[Any, str]] = field(default_factory=lambda: {
        "LLM.generate": (LLM.generate, "vllm.entrypoints.llm:LLM.generate"),
        "LLM.get_metrics": (LLM.get_metrics, "vllm.entrypoints.llm:LLM.get_metrics"),
        "LLMEngine.add_request": (LLMEngine.add_request, "vllm.v1.engine.llm_engine:LLMEngine.add_request"),
        "AsyncLLM.generate": (AsyncLLM.generate, "vllm.v1.engine.async_llm:AsyncLLM.generate"),
    })


SURFACES = _Registry().surfaces

PARAMETERS_WE_USE: dict[str, tuple[str, ...]] = {
    # instrument_vllm's generate wrapper forwards (prompts, sampling_params, *args, **kwargs) positionally
    "LLM.generate": ("prompts", "sampling_params"),
    "LLM.get_metrics": (),
    # route_trace_headers injects trace_headers as a keyword when the caller did not pass it
    "LLMEngine.add_request": ("request_id", "prompt", "params", "trace_headers"),
    # online callers pass trace_headers=vllm_trace_headers()
    "AsyncLLM.generate": ("prompt", "sampling_params", "request_id", "trace_headers"),
}
"""Per surface, the parameters our instrumentation calls by name or position, in vLLM's order."""
