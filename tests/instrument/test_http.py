"""The HTTP hop in one process: a real aiohttp client against a real uvicorn server on 127.0.0.1.

Both sides export into the same in-memory exporter (the ``exporter`` fixture of conftest.py), so
parentage can be read directly; the cross-process case is tests/integration/test_http_propagation.py.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time

import aiohttp
import pytest
import uvicorn
from fastapi import FastAPI, Request
from opentelemetry import trace as otel_trace
from opentelemetry.trace import SpanKind, StatusCode

from nemo_telemetry.instrument import (
    GymSpanGroup,
    RLSpanGroup,
    get_tracer,
    instrument_aiohttp_client,
    instrument_fastapi,
    managed_span,
    set_enabled_span_groups,
)
from nemo_telemetry.instrument.http import uninstrument_aiohttp_client
from nemo_telemetry.instrument import _gate
from nemo_telemetry.instrument import http as http_module


def _make_app(namespace: str) -> FastAPI:
    app = FastAPI()

    @app.post("/items/{item_id}")
    async def post_item(item_id: int, request: Request):
        with managed_span(RLSpanGroup.REWARD, "handler.work"):
            pass
        return {"item": item_id, "traceparent": request.headers.get("traceparent")}

    @app.get("/boom")
    async def boom():
        raise RuntimeError("handler failed")

    instrument_fastapi(app, namespace=namespace)
    return app


class _Server:
    """uvicorn in a daemon thread on 127.0.0.1 with an ephemeral port."""

    def __init__(self, app: FastAPI) -> None:
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc_info) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module", autouse=True)
def _uninstrument_after_module():
    yield
    uninstrument_aiohttp_client()  # the patch is process-wide: leave other modules' sessions alone


@pytest.fixture(scope="module")
def rl_server():
    with _Server(_make_app("nemo_rl")) as url:
        yield url


@pytest.fixture(scope="module")
def gym_server():
    with _Server(_make_app("nemo_gym")) as url:
        yield url


async def _post(url: str) -> dict:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/items/7") as response:
            return await response.json()


def _call_under(name: str, coro_fn):
    with get_tracer().start_as_current_span(name) as span:
        result = asyncio.run(coro_fn())
    return span.get_span_context(), result


def _spans(exporter, *, wait_for: tuple[str, ...] = ()) -> dict:
    """Finished spans by name; the server ends its span after the response is sent, so wait for it."""
    deadline = time.monotonic() + 10
    while True:
        spans = {s.name: s for s in exporter.get_finished_spans()}
        if all(name in spans for name in wait_for) or time.monotonic() > deadline:
            return spans
        time.sleep(0.01)


def test_client_span_parents_the_server_span_which_parents_the_handler(exporter, rl_server):
    instrument_aiohttp_client()
    ambient, body = _call_under("rl.gym.run_rollouts", lambda: _post(rl_server))
    spans = _spans(exporter, wait_for=("POST /items/{item_id}",))
    client, server, handler = spans["POST"], spans["POST /items/{item_id}"], spans["handler.work"]
    assert client.kind is SpanKind.CLIENT and server.kind is SpanKind.SERVER
    assert client.parent.span_id == ambient.span_id
    assert server.parent.span_id == client.context.span_id
    assert handler.parent.span_id == server.context.span_id
    assert {client.context.trace_id, server.context.trace_id} == {ambient.trace_id}
    assert body["traceparent"].split("-")[2] == f"{client.context.span_id:016x}"
    assert client.attributes["http.response.status_code"] == 200
    assert client.attributes["url.full"].endswith("/items/7")
    assert server.attributes["http.route"] == "/items/{item_id}"
    assert "rl.bucket" not in client.attributes and "rl.bucket" not in server.attributes  # umbrellas


def test_fastapi_native_tracing_is_replaced_not_doubled(exporter, rl_server):
    # init_telemetry_* makes the global OpenTelemetry provider follow ours, and recent FastAPI
    # releases trace every request through the global provider on their own, ignoring span groups.
    if isinstance(otel_trace.get_tracer_provider(), otel_trace.ProxyTracerProvider):
        otel_trace.set_tracer_provider(_gate.GLOBAL_TRACER_PROVIDER)
    assert otel_trace.get_tracer_provider() is _gate.GLOBAL_TRACER_PROVIDER, "another global provider is set"
    instrument_aiohttp_client()
    _call_under("outer", lambda: _post(rl_server))
    spans = _spans(exporter, wait_for=("POST /items/{item_id}",))
    time.sleep(0.2)  # a second server span, if any, would end right after ours
    assert [s.kind for s in exporter.get_finished_spans()].count(SpanKind.SERVER) == 1

    set_enabled_span_groups(())  # gated off: no request span at all, not FastAPI's either
    exporter.clear()
    asyncio.run(_post(rl_server))
    time.sleep(0.2)
    assert [s.name for s in exporter.get_finished_spans()] == []
    assert spans


def test_nemo_rl_hop_is_gated_on_per_prompt(exporter, rl_server):
    instrument_aiohttp_client(namespace="nemo_rl")
    set_enabled_span_groups([g for g in RLSpanGroup.ALL_GROUPS if g != RLSpanGroup.PER_PROMPT])
    _, body = _call_under("outer", lambda: _post(rl_server))
    assert body["traceparent"] is None  # no header written
    assert set(_spans(exporter)) == {"outer", "handler.work"}  # no CLIENT or SERVER span


def test_nemo_gym_client_and_server_gates_are_separate(exporter, gym_server):
    instrument_aiohttp_client(namespace="nemo_gym")
    set_enabled_span_groups([GymSpanGroup.HTTP_CLIENT])  # the server half switched off
    _, body = _call_under("outer", lambda: _post(gym_server))
    assert body["traceparent"] is not None
    assert set(_spans(exporter)) == {"outer", "POST"}

    exporter.clear()
    set_enabled_span_groups([GymSpanGroup.HTTP_CLIENT, GymSpanGroup.SERVER])
    _call_under("outer", lambda: _post(gym_server))
    spans = _spans(exporter, wait_for=("POST /items/{item_id}",))
    assert spans["POST /items/{item_id}"].parent.span_id == spans["POST"].context.span_id
    # each half records the group that gated it, which check reads for the group's presence
    assert spans["POST"].attributes["rl.span_group"] == "http_client"
    assert spans["POST /items/{item_id}"].attributes["rl.span_group"] == "server"


def test_a_server_without_an_incoming_header_opens_a_root_span(exporter, rl_server):
    set_enabled_span_groups([RLSpanGroup.PER_PROMPT])
    instrument_aiohttp_client(group="not_enabled")  # client off, server on
    asyncio.run(_post(rl_server))
    server = _spans(exporter, wait_for=("POST /items/{item_id}",))["POST /items/{item_id}"]
    assert server.parent is None


def test_a_failing_handler_marks_the_server_span_and_still_answers_500(exporter, rl_server):
    instrument_aiohttp_client()

    async def get_boom():
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{rl_server}/boom") as response:
                return response.status

    _, status = _call_under("outer", get_boom)
    assert status == 500
    spans = _spans(exporter, wait_for=("GET /boom",))
    server = spans["GET /boom"]
    assert server.status.status_code is StatusCode.ERROR
    assert any(e.name == "exception" for e in server.events)
    assert spans["GET"].status.status_code is StatusCode.ERROR  # 5xx on the client side too


def test_a_connection_error_is_recorded_on_the_client_span_and_reraised(exporter):
    instrument_aiohttp_client()

    async def refused():
        async with aiohttp.ClientSession() as session:
            await session.get("http://127.0.0.1:9/unreachable")

    with pytest.raises(aiohttp.ClientError):
        _call_under("outer", refused)
    client = _spans(exporter)["GET"]
    assert client.status.status_code is StatusCode.ERROR
    assert client.attributes["error.type"]


def test_instrumenting_twice_adds_one_trace_config(exporter):
    instrument_aiohttp_client()
    instrument_aiohttp_client()

    async def configs():
        async with aiohttp.ClientSession() as session:
            return [c for c in session.trace_configs if getattr(c, "_nemo_telemetry", False)]

    assert len(asyncio.run(configs())) == 1


def test_uninstrument_restores_plain_sessions(exporter):
    instrument_aiohttp_client()
    uninstrument_aiohttp_client()

    async def configs():
        async with aiohttp.ClientSession() as session:
            return [c for c in session.trace_configs if getattr(c, "_nemo_telemetry", False)]

    assert asyncio.run(configs()) == []
    instrument_aiohttp_client()
    assert len(asyncio.run(configs())) == 1


def test_unknown_namespace_is_a_configuration_error():
    with pytest.raises(ValueError, match="nemo_gym"):
        instrument_aiohttp_client(namespace="nemo_unknown")
    with pytest.raises(ValueError, match="nemo_rl"):
        instrument_fastapi(FastAPI(), namespace="nemo_unknown")


def test_missing_aiohttp_warns_once_and_does_not_crash(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "aiohttp", None)  # import aiohttp now raises ImportError
    monkeypatch.setattr(http_module, "_warned_missing", set())
    with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
        assert instrument_aiohttp_client() is False
        assert instrument_aiohttp_client() is False
    assert len([r for r in caplog.records if "aiohttp is not installed" in r.getMessage()]) == 1
