"""vLLM two-layer tracing: our generation spans, and vLLM's own ``llm_request`` spans joined under them.

Layer one is ours: ``rl.vllm.generate`` (token prompts) and ``rl.vllm.generate_text`` (text
prompts) around ``LLM.generate`` -- group ``generation``, so productive unless a
``bucket_scope`` says otherwise (validation) -- with ``gen_ai.*`` request and usage attributes;
and ``rl.vllm.load_model`` (umbrella group ``model_init``) around engine construction::

    llm = load_vllm("Qwen/Qwen2.5-0.5B", tensor_parallel_size=1)   # or instrument_vllm(LLM(...))
    outputs = llm.generate(prompts, sampling_params)

Layer two is vLLM's: with ``otlp_traces_endpoint`` set (:func:`vllm_tracing_engine_args` reads it
from the standard ``OTEL_EXPORTER_OTLP_*`` variables and passes only the arguments the installed
``EngineArgs`` has), the engine exports one ``llm_request`` span (kind SERVER) per request with
``gen_ai.latency.*`` and ``gen_ai.usage.*`` attributes. vLLM exports OTLP only (no files), so
point the endpoint at a collector (``nemo-telemetry collect``, or the OpenTelemetry Collector).

How vLLM's spans find their parent, per version (checked against vLLM's source):

=========================  ==========================================================  =========
vLLM                       what happens                                                path
=========================  ==========================================================  =========
< 0.5.1                    no OpenTelemetry tracing in vLLM: layer one only            --
0.5.1 - 0.10.x             setting ``otlp_traces_endpoint`` selects the V0 engine      headers
                           (the V1 oracle falls back); ``LLMEngine.add_request`` takes
                           ``trace_headers`` and ``do_tracing`` parents ``llm_request``
                           on them
>= 0.11 (V1 engine)        ``v1 LLMEngine.add_request(..., trace_headers=...)`` carries  headers
                           them on ``EngineCoreRequest`` to ``OutputProcessor.do_tracing``
engine without the param   ``add_request`` has no ``trace_headers``                    stitch
=========================  ==========================================================  =========

Verified on a GPU (NVIDIA H200, torch 2.11): vLLM 0.24.0 takes the headers path, every
``llm_request`` a child of its ``rl.vllm.generate`` (``bench/gpu_vllm_check.py``); and on the CPU
in every ``make test`` (vLLM's CPU build 0.32.0, ``tests/vllm_engine``).

Which exporter carries vLLM's spans: the engine-core and worker processes export through vLLM's
own provider to ``otlp_traces_endpoint`` (their start-up spans, ``EngineCoreProc init`` and
below, parented under ``rl.vllm.load_model``). In the driver process, vLLM 0.32 starts
``llm_request`` (and ``SyncMPClient init``) from OpenTelemetry's *global* tracer provider, and
``init_telemetry_*`` installs ours as the global where none is set yet, so with telemetry started
before the engine those spans travel our exporter (dump or OTLP), with our resource; either way
they keep their ids and parents. Read both places (our output and the collector's dataset).

In every version above, offline ``LLM.generate`` itself takes no trace context and its
``_add_request`` calls ``self.llm_engine.add_request`` without ``trace_headers`` (vLLM issue
32177). :func:`instrument_vllm` therefore *routes* them: where the engine's ``add_request``
accepts ``trace_headers``, it wraps that bound method on this one engine instance so a call
without headers gets the current ``traceparent`` -- inside ``rl.vllm.generate``, that span's.
Where it does not, the analysis stitches: :func:`nemo_telemetry.analysis.views.stitch.stitch_vllm_spans`
re-parents ``llm_request`` spans under the enclosing ``rl.vllm.generate`` of the same
``nemo.run.id`` by time containment and marks them ``nemo.stitched=true``. The path taken is on
every generate span as ``rl.vllm.trace_path`` (``headers`` or ``stitch``). For stitching to
match runs, vLLM's resource needs ``nemo.run.id``: :func:`vllm_tracing_env` adds it to
``OTEL_RESOURCE_ATTRIBUTES`` (and pins ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``, which vLLM
reads with a default of ``grpc``); :func:`load_vllm` applies both.

Online ``AsyncLLM.generate`` takes ``trace_headers`` directly: pass :func:`vllm_trace_headers`.

vLLM is imported lazily, never at module import. Nothing here raises into the caller except
vLLM's own errors, which propagate (recorded on the span).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import os
from typing import Any, Callable, Iterable, Mapping

from nemo_telemetry.instrument import _gate
from nemo_telemetry.instrument import environment_variables as env
from nemo_telemetry.instrument._primitives import managed_span, umbrella_span
from nemo_telemetry.instrument.busy import DEFAULT_ACTIVITY, busy_union
from nemo_telemetry.instrument.metrics import VllmCounterDeltas
from nemo_telemetry.instrument.propagation import current_trace_carrier
from nemo_telemetry.instrument.span_groups import RLSpanGroup

__all__ = [
    "GENERATE_SPAN",
    "GENERATE_TEXT_SPAN",
    "LOAD_MODEL_SPAN",
    "TRACE_PATH_KEY",
    "instrument_vllm",
    "load_vllm",
    "route_trace_headers",
    "engine_accepts_trace_headers",
    "vllm_trace_headers",
    "vllm_tracing_engine_args",
    "vllm_tracing_env",
    "vllm_counter_totals",
    "record_vllm_engine_counters",
    "track_vllm_busy",
    "finished_request_intervals",
]

_log = logging.getLogger("nemo_telemetry")

GENERATE_SPAN = "rl.vllm.generate"
GENERATE_TEXT_SPAN = "rl.vllm.generate_text"
LOAD_MODEL_SPAN = "rl.vllm.load_model"
TRACE_PATH_KEY = "rl.vllm.trace_path"
_GENERATION = str(RLSpanGroup.GENERATION)
_MODEL_INIT = str(RLSpanGroup.MODEL_INIT)
_TRACE_HEADERS = ("traceparent", "tracestate")
_ROUTED = "_nemo_telemetry_routes_trace_headers"
_BUSY = "_nemo_telemetry_counts_busy"
_warned: set[str] = set()


def _warn_once(key: str, message: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        _log.warning(message, *args)


# -- trace headers ----------------------------------------------------------------------------


def vllm_trace_headers() -> dict[str, str]:
    """The current span as vLLM's ``trace_headers`` (``traceparent``/``tracestate``); ``{}`` if none."""
    carrier = current_trace_carrier()
    return {k: v for k, v in carrier.items() if k in _TRACE_HEADERS}


def engine_accepts_trace_headers(engine: Any) -> bool:
    """Whether ``engine.add_request`` has a ``trace_headers`` parameter (see the module table)."""
    try:
        return "trace_headers" in inspect.signature(engine.add_request).parameters
    except (AttributeError, TypeError, ValueError):
        return False


def route_trace_headers(engine: Any) -> bool:
    """Make ``engine.add_request`` calls without ``trace_headers`` carry the current span's.

    Wraps the bound method on this engine instance only (idempotent); True when the headers
    now reach the engine, False when this engine cannot take them (the stitching path).
    """
    if getattr(engine.add_request, _ROUTED, False):
        return True
    if not engine_accepts_trace_headers(engine):
        return False
    original = engine.add_request
    position = list(inspect.signature(original).parameters).index("trace_headers")

    @functools.wraps(original)
    def add_request(*args: Any, **kwargs: Any) -> Any:
        if len(args) <= position and kwargs.get("trace_headers") is None:
            headers = vllm_trace_headers()
            if headers:
                kwargs["trace_headers"] = headers
        return original(*args, **kwargs)

    setattr(add_request, _ROUTED, True)
    try:
        engine.add_request = add_request
    except (AttributeError, TypeError):
        _warn_once("route", "vLLM engine %s does not allow wrapping add_request; its llm_request spans "
                   "are stitched at analysis time instead", type(engine).__name__)
        return False
    return True


# -- layer one: our spans ---------------------------------------------------------------------


def _is_text(prompts: Any) -> bool:
    first = prompts[0] if isinstance(prompts, (list, tuple)) and prompts else prompts
    if isinstance(first, dict):
        return "prompt_token_ids" not in first
    return isinstance(first, str)


def _num_prompts(prompts: Any) -> int:
    return len(prompts) if isinstance(prompts, (list, tuple)) else 1


def _request_attributes(prompts: Any, sampling_params: Any, model: str | None, path: str) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "gen_ai.system": "vllm",
        "gen_ai.operation.name": "text_completion",
        TRACE_PATH_KEY: path,
        "rl.vllm.num_prompts": _num_prompts(prompts),
    }
    if model:
        attributes["gen_ai.request.model"] = model
    params = sampling_params[0] if isinstance(sampling_params, (list, tuple)) and sampling_params else sampling_params
    for attr, key in (("max_tokens", "gen_ai.request.max_tokens"), ("temperature", "gen_ai.request.temperature"),
                      ("top_p", "gen_ai.request.top_p"), ("n", "gen_ai.request.choice.count")):
        value = getattr(params, attr, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            attributes[key] = value
    return attributes


def _set_usage(span: Any, outputs: Any) -> None:
    try:
        input_tokens = sum(len(o.prompt_token_ids or ()) for o in outputs)
        output_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
        span.set_attribute("gen_ai.usage.input_tokens", input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", output_tokens)
    except Exception:
        _warn_once("usage", "could not read token usage from vLLM outputs; the span has no gen_ai.usage.*")


def _traced_generate(original: Callable, model: str | None, path: str) -> Callable:
    @functools.wraps(original)
    def generate(prompts: Any = None, sampling_params: Any = None, *args: Any, **kwargs: Any) -> Any:
        if _GENERATION not in _gate.enabled:
            return original(prompts, sampling_params, *args, **kwargs)
        try:
            name = GENERATE_TEXT_SPAN if _is_text(prompts) else GENERATE_SPAN
            attributes = _request_attributes(prompts, sampling_params, model, path)
        except Exception:
            name, attributes = GENERATE_SPAN, {TRACE_PATH_KEY: path}
        with managed_span(_GENERATION, name, **attributes) as span:
            outputs = original(prompts, sampling_params, *args, **kwargs)
            if span is not None:
                _set_usage(span, outputs)
            return outputs

    generate._nemo_telemetry_traced = True  # type: ignore[attr-defined]
    return generate


def _model_of(llm: Any) -> str | None:
    try:
        return str(llm.llm_engine.model_config.model)
    except AttributeError:
        return None


def instrument_vllm(llm: Any, *, model: str | None = None) -> Any:
    """Trace ``llm.generate`` and route trace headers into its engine; returns ``llm`` (idempotent).

    ``llm`` is a ``vllm.LLM``; only this instance is changed. Never raises: an object without
    the expected attributes is warned about and returned as it is.
    """
    try:
        if getattr(llm.generate, "_nemo_telemetry_traced", False):
            return llm
        routed = route_trace_headers(llm.llm_engine)
        path = "headers" if routed else "stitch"
        llm.generate = _traced_generate(llm.generate, model or _model_of(llm), path)
        llm._nemo_telemetry_trace_path = path
    except Exception:
        _warn_once("instrument", "instrument_vllm: %r does not look like a vllm.LLM; left uninstrumented",
                   type(llm).__name__)
    return llm


# -- layer two: vLLM's own tracing ------------------------------------------------------------


def _otlp_protocol(environ: Mapping[str, str]) -> str:
    from nemo_telemetry.instrument._lifecycle import otlp_protocol

    return otlp_protocol(environ)


def _traces_endpoint(environ: Mapping[str, str]) -> str | None:
    """The traces URL vLLM's exporter needs: the traces variable as is, else the base + /v1/traces (HTTP)."""
    specific = environ.get(env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
    if specific:
        return specific
    base = environ.get(env.OTEL_EXPORTER_OTLP_ENDPOINT)
    if not base:
        return None
    return base if _otlp_protocol(environ) == "grpc" else base.rstrip("/") + "/v1/traces"


def _engine_arg_names(engine_args_class: Any) -> frozenset[str] | None:
    if engine_args_class is None:
        try:
            from vllm.engine.arg_utils import EngineArgs as engine_args_class
        except ImportError:
            _warn_once("no-vllm", "vllm is not importable here; no vLLM tracing engine arguments are set")
            return None
    if dataclasses.is_dataclass(engine_args_class):
        return frozenset(f.name for f in dataclasses.fields(engine_args_class))
    return frozenset(inspect.signature(engine_args_class).parameters)


def vllm_tracing_engine_args(*, endpoint: str | None = None, detailed_traces: Iterable[str] | None = None,
                             engine_args_class: Any = None,
                             environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Engine keyword arguments that turn vLLM's own tracing on, limited to what ``EngineArgs`` has.

    The endpoint defaults to the standard ``OTEL_EXPORTER_OTLP_*`` variables; without one the
    result is ``{}`` (vLLM exports OTLP only). ``detailed_traces`` (``model``, ``worker``, ``all``)
    is vLLM's ``collect_detailed_traces``: costly, so off unless asked for.
    """
    environ = os.environ if environ is None else environ
    endpoint = endpoint or _traces_endpoint(environ)
    if not endpoint:
        _warn_once("no-endpoint", "vLLM tracing is off: no OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT. vLLM exports "
                   "llm_request spans over OTLP only; point it at a collector (nemo-telemetry collect)")
        return {}
    names = _engine_arg_names(engine_args_class)
    if names is None:
        return {}
    args: dict[str, Any] = {}
    if "otlp_traces_endpoint" in names:
        args["otlp_traces_endpoint"] = endpoint
    else:
        _warn_once("no-arg", "this vLLM's EngineArgs has no otlp_traces_endpoint (vLLM < 0.5.1?): "
                   "only our rl.vllm.* spans are emitted")
    if detailed_traces and "collect_detailed_traces" in names and args:
        args["collect_detailed_traces"] = list(detailed_traces)
    return args


def vllm_tracing_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for vLLM's exporter: the traces protocol we resolved, and ``nemo.run.id`` in its resource.

    Apply it (``os.environ.update``) before the engine starts; its worker processes inherit it.
    """
    environ = os.environ if environ is None else environ
    updates: dict[str, str] = {}
    if not environ.get(env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL):
        updates[env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL] = _otlp_protocol(environ)
    run_id = environ.get(env.NEMO_TELEMETRY_RUN_ID)
    existing = environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    if run_id and "nemo.run.id=" not in existing:
        updates["OTEL_RESOURCE_ATTRIBUTES"] = ",".join(p for p in (existing, f"nemo.run.id={run_id}") if p)
    return updates


def load_vllm(model: str, *, llm_class: Any = None, engine_args_class: Any = None, tracing: bool = True,
              detailed_traces: Iterable[str] | None = None, **engine_kwargs: Any) -> Any:
    """Build a ``vllm.LLM`` inside ``rl.vllm.load_model`` with vLLM's tracing on, then instrument it.

    Explicit ``engine_kwargs`` win over the tracing arguments. ``llm_class`` defaults to
    ``vllm.LLM`` (imported here); vLLM's own errors propagate.
    """
    if llm_class is None:
        from vllm import LLM as llm_class
    if tracing:
        os.environ.update(vllm_tracing_env())
        tracing_args = vllm_tracing_engine_args(detailed_traces=detailed_traces,
                                                engine_args_class=engine_args_class)
        engine_kwargs = {**tracing_args, **engine_kwargs}
    with umbrella_span(_MODEL_INIT, LOAD_MODEL_SPAN, **{"gen_ai.request.model": model, "rl.backend": "vllm"}):
        llm = llm_class(model, **engine_kwargs)
    return instrument_vllm(llm, model=model)


# -- engine counters --------------------------------------------------------------------------


def vllm_counter_totals(metrics: Iterable[Any]) -> dict[str, float]:
    """Sum ``LLM.get_metrics()`` counters by name over their labels (gauges and histograms ignored)."""
    totals: dict[str, float] = {}
    for metric in metrics:
        if type(metric).__name__ == "Counter" and isinstance(getattr(metric, "value", None), (int, float)):
            totals[metric.name] = totals.get(metric.name, 0.0) + float(metric.value)
    return totals


def record_vllm_engine_counters(llm: Any, deltas: VllmCounterDeltas, *,
                                attributes: Mapping[str, Any] | None = None) -> dict[str, float]:
    """Record how much vLLM's engine counters grew since the last call (once per step). Never raises.

    Needs an engine started with ``disable_log_stats=False`` (``LLM`` defaults to True).
    """
    try:
        totals = vllm_counter_totals(llm.get_metrics())
    except Exception:
        _warn_once("stats", "vLLM engine counters unavailable (start the LLM with disable_log_stats=False); "
                   "rl.vllm.* counters are not recorded")
        return {}
    return deltas.record(totals, attributes=attributes)


# -- engine busy time -------------------------------------------------------------------------


def finished_request_intervals(iteration_stats: Any, now: float) -> list[tuple[float, float]]:
    """``(start, end)`` of each request vLLM reports finished in ``iteration_stats``, ending at ``now``.

    A request's length is its prefill + decode time (from being scheduled to its last token, on
    the engine's clock); it ends when the engine reports it, so it starts that long before. The
    queue wait before scheduling is not work and is left out.
    """
    intervals = []
    for request in getattr(iteration_stats, "finished_requests", None) or ():
        length = float(getattr(request, "prefill_time", 0.0) or 0.0) + float(getattr(request, "decode_time", 0.0) or 0.0)
        if length > 0.0:
            intervals.append((now - length, now))
    return intervals


def track_vllm_busy(llm: Any, *, activity: str = DEFAULT_ACTIVITY, fleet: str | None = None) -> bool:
    """Count the engine's requests in ``rl.fleet.busy.seconds``, from vLLM's own request stats.

    ``llm`` is a ``vllm.LLM`` or a v1 ``LLMEngine`` / ``AsyncLLM``: every stats record the engine
    makes (one per engine step) hands its finished requests' prefill + decode intervals
    (:func:`finished_request_intervals`) to the union ``fleet_busy(activity, fleet=fleet)`` counts
    in, so overlapping requests count once; a request counts when it finishes. Needs the engine's
    stats (``disable_log_stats=False``; ``LLM`` defaults to True): without them it warns once and
    returns False. Idempotent; never raises.
    """
    try:
        engine = getattr(llm, "llm_engine", llm)
        manager = getattr(engine, "logger_manager", None)
        if manager is None or not callable(getattr(manager, "record", None)):
            _warn_once("busy-stats", "vLLM engine stats are off (start it with disable_log_stats=False); "
                       "rl.fleet.busy.seconds is not recorded for it")
            return False
        if getattr(manager.record, _BUSY, False):
            return True
        manager.record = _busy_record(manager.record, activity, fleet)
        return True
    except Exception:
        _warn_once("busy", "track_vllm_busy: %r does not look like a vLLM engine; its busy time is not recorded",
                   type(llm).__name__)
        return False


def _busy_record(original: Callable, activity: str, fleet: str | None) -> Callable:
    @functools.wraps(original)
    def record(*args: Any, **kwargs: Any) -> Any:
        try:
            union = busy_union(activity, fleet=fleet)
            stats = kwargs["iteration_stats"] if "iteration_stats" in kwargs else (args[1] if len(args) > 1 else None)
            if union is not None and stats is not None:
                for start, end in finished_request_intervals(stats, union.now()):
                    union.add_interval(start, end)
        except Exception:
            _warn_once("busy-record", "could not read vLLM's finished requests; some busy time is not counted")
        return original(*args, **kwargs)

    setattr(record, _BUSY, True)
    return record
