"""The HTTP hop: outgoing aiohttp requests carry ``traceparent``, a FastAPI server adopts it.

A Gym rollout leaves the NemoGym actor over HTTP (seed 000, "NeMo-Gym spans cross the HTTP
boundary"). The request is made inside Gym's own client, so there is no call site to pass a
carrier at: :func:`instrument_aiohttp_client` patches ``aiohttp.ClientSession`` once per process
so every session gets a ``TraceConfig`` that opens a CLIENT span and writes its ``traceparent``
into the request headers. :func:`instrument_fastapi` adds a plain ASGI middleware that reads the
header and opens the SERVER span (``"<METHOD> <route>"``) as its child.

Gates, checked per request (a disabled request costs one membership test and gets no header):

- ``nemo_rl``: ``per_prompt`` on both sides. Span volume is prompts x turns x tool calls, which
  is exactly the dataset-sized cardinality ``per_prompt`` exists to fence off; gating on
  ``rollout`` would put it in ``per_step``, whose cost must scale with steps (seed 000).
- ``nemo_gym``: ``http_client`` writes the header and ``server`` reads it; both sit in every
  Gym preset because disabling either splits the trace (seed 003).

These spans belong to umbrella groups, so they carry no ``rl.bucket``. No
``opentelemetry-instrumentation-*`` package is used: they pin exact OpenTelemetry versions.
A missing aiohttp logs one warning and instruments nothing; a request never fails for telemetry.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from nemo_telemetry.instrument import _gate
from nemo_telemetry.instrument._primitives import SPAN_GROUP_KEY
from nemo_telemetry.instrument.gym_span_groups import GymSpanGroup
from nemo_telemetry.instrument.propagation import PROPAGATOR, context_from_carrier
from nemo_telemetry.instrument.span_groups import RLSpanGroup

__all__ = ["instrument_aiohttp_client", "uninstrument_aiohttp_client", "instrument_fastapi",
           "TraceContextMiddleware", "CLIENT_GROUPS", "SERVER_GROUPS"]

_log = logging.getLogger("nemo_telemetry")

CLIENT_GROUPS: dict[str, str] = {"nemo_rl": RLSpanGroup.PER_PROMPT, "nemo_gym": GymSpanGroup.HTTP_CLIENT}
"""Namespace -> the group that gates outgoing requests (header and CLIENT span)."""

SERVER_GROUPS: dict[str, str] = {"nemo_rl": RLSpanGroup.PER_PROMPT, "nemo_gym": GymSpanGroup.SERVER}
"""Namespace -> the group that gates adopting ``traceparent`` and the SERVER span."""

_lock = threading.Lock()
_client_group: str | None = None  # set once aiohttp is patched; the gate every session consults
_warned_missing: set[str] = set()


def _gate_group(table: dict[str, str], namespace: str, group: str | None) -> str:
    if group is not None:
        return str(group).strip().lower()
    try:
        return str(table[namespace])
    except KeyError:
        raise ValueError(
            f"unknown telemetry namespace {namespace!r} for HTTP instrumentation; "
            f"use one of {sorted(table)} or pass group= explicitly"
        ) from None


def _warn_missing_once(package: str, what: str) -> None:
    if package not in _warned_missing:
        _warned_missing.add(package)
        _log.warning(
            "nemo_telemetry: %s is not installed, so %s are not traced and start their own traces; "
            "install nemo-telemetry[http]", package, what,
        )


# -- client: aiohttp --------------------------------------------------------------------------


def instrument_aiohttp_client(*, namespace: str = "nemo_rl", group: str | None = None) -> bool:
    """Make every ``aiohttp.ClientSession`` in this process propagate trace context.

    Idempotent; a later call only changes the gating group. Returns False (after one warning)
    when aiohttp is not installed. Call it once, e.g. in the actor's constructor after
    ``init_telemetry_worker``.
    """
    global _client_group
    gate = _gate_group(CLIENT_GROUPS, namespace, group)
    try:
        import aiohttp
    except ImportError:
        _warn_missing_once("aiohttp", "outgoing HTTP requests")
        return False
    with _lock:
        _client_group = gate
        if not getattr(aiohttp.ClientSession, "_nemo_telemetry_patched", False):
            _patch_client_session(aiohttp)
    return True


def uninstrument_aiohttp_client() -> None:
    """Undo :func:`instrument_aiohttp_client`: sessions created from now on are left alone."""
    global _client_group
    try:
        import aiohttp
    except ImportError:
        return
    with _lock:
        _client_group = None
        patched = aiohttp.ClientSession.__dict__.get("__init__")
        original = getattr(patched, "__wrapped__", None)
        if getattr(aiohttp.ClientSession, "_nemo_telemetry_patched", False) and original is not None:
            aiohttp.ClientSession.__init__ = original
            aiohttp.ClientSession._nemo_telemetry_patched = False


def _patch_client_session(aiohttp: Any) -> None:
    original_init = aiohttp.ClientSession.__init__

    def __init__(self: Any, *args: Any, trace_configs: Any = None, **kwargs: Any) -> None:
        configs = list(trace_configs or [])
        if not any(getattr(c, "_nemo_telemetry", False) for c in configs):
            configs.append(_make_trace_config(aiohttp))
        original_init(self, *args, trace_configs=configs, **kwargs)

    __init__.__wrapped__ = original_init  # type: ignore[attr-defined]
    aiohttp.ClientSession.__init__ = __init__
    aiohttp.ClientSession._nemo_telemetry_patched = True


def _make_trace_config(aiohttp: Any) -> Any:
    config = aiohttp.TraceConfig()
    config._nemo_telemetry = True
    config.on_request_start.append(_on_request_start)
    config.on_request_end.append(_on_request_end)
    config.on_request_exception.append(_on_request_exception)
    return config


async def _on_request_start(session: Any, ctx: Any, params: Any) -> None:
    ctx.nemo_span = None
    if _client_group is None or not _gate.is_span_group_enabled(_client_group):
        return
    try:
        url = params.url
        span = _gate.get_tracer().start_span(
            params.method,
            kind=SpanKind.CLIENT,
            attributes={
                "http.request.method": params.method,
                "url.full": str(url.with_user(None)),
                "server.address": url.host or "",
                "server.port": url.port or 0,
                SPAN_GROUP_KEY: _client_group,
            },
        )
        carrier_context = trace.set_span_in_context(span) if span.is_recording() else None
        PROPAGATOR.inject(params.headers, context=carrier_context)
        ctx.nemo_span = span
    except Exception:
        _log.debug("nemo_telemetry: could not open the HTTP client span", exc_info=True)


async def _on_request_end(session: Any, ctx: Any, params: Any) -> None:
    span = getattr(ctx, "nemo_span", None)
    if span is None:
        return
    try:
        status = params.response.status
        span.set_attribute("http.response.status_code", status)
        if status >= 400:
            span.set_attribute("error.type", str(status))
            span.set_status(Status(StatusCode.ERROR))
    finally:
        span.end()


async def _on_request_exception(session: Any, ctx: Any, params: Any) -> None:
    span = getattr(ctx, "nemo_span", None)
    if span is None:
        return
    try:
        exc = params.exception
        span.record_exception(exc)
        span.set_attribute("error.type", type(exc).__qualname__)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
    finally:
        span.end()


# -- server: FastAPI / any ASGI app -----------------------------------------------------------


def instrument_fastapi(app: Any, *, namespace: str = "nemo_gym", group: str | None = None) -> bool:
    """Make ``app`` adopt an incoming ``traceparent`` and open a SERVER span per request.

    Call before the app starts serving (Starlette refuses middleware afterwards). Idempotent per
    app. The span is named ``"<METHOD> <route template>"``, e.g. ``POST /verify``.
    """
    gate = _gate_group(SERVER_GROUPS, namespace, group)
    if getattr(app, "_nemo_telemetry_instrumented", False):
        return True
    try:
        app.add_middleware(TraceContextMiddleware, group=gate)
    except Exception:
        _log.warning("nemo_telemetry: could not add the trace-context middleware to %r", app, exc_info=True)
        return False
    _disable_native_tracing(app)
    app._nemo_telemetry_instrumented = True
    return True


def _disable_native_tracing(app: Any) -> None:
    """Switch off FastAPI's own request tracing on an app we instrument.

    Recent FastAPI releases open SERVER (and per-operation) spans natively whenever a global
    tracer provider is set, which ``init_telemetry_*`` does. Those spans ignore span groups, so
    next to ours they would be a second, ungated span per request: the volume ``per_prompt``
    exists to fence off. Metrics and logs are left as the app configured them.
    """
    config = getattr(app, "_telemetry", None)
    if isinstance(config, dict) and "tracing" in config:
        config["tracing"] = False


_CARRIER_HEADERS = (b"traceparent", b"tracestate")


def _carrier_from_headers(headers: Any) -> dict[str, str]:
    """The W3C headers of an ASGI request (raw, lowercase byte pairs) as a carrier."""
    return {
        name.decode("latin-1"): value.decode("latin-1")
        for name, value in headers
        if name.lower() in _CARRIER_HEADERS
    }


class TraceContextMiddleware:
    """Plain ASGI middleware: the request's ``traceparent`` becomes the parent of a SERVER span."""

    def __init__(self, app: Any, *, group: str) -> None:
        self.app = app
        self.group = group

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or not _gate.is_span_group_enabled(self.group):
            await self.app(scope, receive, send)
            return
        request = _ServerSpan(scope)
        token = request.start(self.group)
        try:
            await self.app(scope, receive, request.wrap_send(send))
        except BaseException as exc:
            request.fail(exc)
            raise
        finally:
            request.end(scope, token)


class _ServerSpan:
    """One request's SERVER span; every step swallows telemetry errors so the request is served."""

    __slots__ = ("method", "path", "carrier", "span", "status")

    def __init__(self, scope: dict) -> None:
        self.method = str(scope.get("method", "HTTP"))
        self.path = str(scope.get("path", ""))
        self.carrier = _carrier_from_headers(scope.get("headers") or ())
        self.span: trace.Span | None = None
        self.status: int | None = None

    def start(self, group: str) -> object | None:
        """Open the span under the request's carrier (the ambient context without one) and attach it."""
        try:
            parent = context_from_carrier(self.carrier)
            self.span = _gate.get_tracer().start_span(
                self.method, context=parent, kind=SpanKind.SERVER,
                attributes={"http.request.method": self.method, "url.path": self.path, SPAN_GROUP_KEY: group},
            )
            return otel_context.attach(trace.set_span_in_context(self.span, parent))
        except Exception:
            _log.debug("nemo_telemetry: could not open the HTTP server span", exc_info=True)
            return None

    def wrap_send(self, send: Any) -> Any:
        async def send_and_record_status(message: dict) -> None:
            if message.get("type") == "http.response.start":
                self.status = int(message.get("status", 0))
            await send(message)

        return send_and_record_status

    def fail(self, exc: BaseException) -> None:
        if self.span is not None and self.span.is_recording():
            self.span.record_exception(exc)
            self.span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))

    def end(self, scope: dict, token: object | None) -> None:
        try:
            if self.span is not None:
                route = getattr(scope.get("route"), "path", None)
                if route:
                    self.span.update_name(f"{self.method} {route}")
                    self.span.set_attribute("http.route", route)
                if self.status is not None:
                    self.span.set_attribute("http.response.status_code", self.status)
                    if self.status >= 500:
                        self.span.set_status(Status(StatusCode.ERROR))
                self.span.end()
        except Exception:
            _log.debug("nemo_telemetry: could not end the HTTP server span", exc_info=True)
        finally:
            if token is not None:
                otel_context.detach(token)
