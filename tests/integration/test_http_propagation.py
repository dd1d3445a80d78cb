"""The HTTP hop across a process boundary: aiohttp client span -> FastAPI server span.

The server is this file run as a script: a FastAPI app under uvicorn on 127.0.0.1 in its own
process, with ``init_telemetry_worker`` and ``instrument_fastapi``; the client is the test
process, with ``init_telemetry_driver`` and ``instrument_aiohttp_client``. Both write dump files
into one directory, which the test reads back as OTLP JSON lines.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SERVER_RANK = 1
CLIENT_KIND, SERVER_KIND = 3, 2  # OTLP SpanKind enum values


def serve(port_file: str) -> None:
    """Run the instrumented Gym-like server until SIGTERM; flush telemetry on the way out."""
    import uvicorn
    from fastapi import FastAPI

    from nemo_telemetry.instrument import (
        GymSpanGroup,
        init_telemetry_worker,
        instrument_fastapi,
        shutdown_telemetry,
        umbrella_span,
    )

    # uvicorn stops on SIGTERM, then re-raises it to the previous handler: make that a clean exit,
    # so the finally below flushes the spans (a default SIGTERM would kill the process first).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    init_telemetry_worker(rank=SERVER_RANK, world_size=2)
    app = FastAPI()

    @app.post("/verify/{task}")
    async def verify(task: str):
        with umbrella_span(GymSpanGroup.VERIFY, "gym.verify"):
            return {"task": task, "reward": 1.0}

    instrument_fastapi(app, namespace="nemo_gym")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))

    async def main() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        Path(port_file).write_text(str(port))
        await task

    try:
        asyncio.run(main())
    finally:
        shutdown_telemetry()


@pytest.fixture()
def gym_server(tmp_path, actor_env, telemetry_environment):
    """The server process (the driver's telemetry variables in its environment) and its base URL."""
    from nemo_telemetry.instrument import init_telemetry_driver, shutdown_telemetry

    dump_dir = tmp_path / "dump"
    init_telemetry_driver({"enabled": True, "span_groups": "all", "exporter": "dump", "dump_dir": str(dump_dir)},
                          algorithm="grpo")
    port_file = tmp_path / "port"
    env = {**os.environ, **actor_env(), "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]),
                                                                       os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, __file__, str(port_file)], env=env)
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server process did not start (exit code {process.poll()})")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port_file.read_text()}", process, dump_dir
    finally:
        shutdown_telemetry()
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)


@pytest.mark.slow
def test_client_span_and_server_span_are_parent_and_child_across_processes(gym_server, read_dump_spans, request):
    import aiohttp

    from nemo_telemetry.instrument import RLSpanGroup, instrument_aiohttp_client, shutdown_telemetry, umbrella_span
    from nemo_telemetry.instrument.http import uninstrument_aiohttp_client

    url, process, dump_dir = gym_server
    assert instrument_aiohttp_client(namespace="nemo_rl")
    request.addfinalizer(uninstrument_aiohttp_client)  # the patch is process-wide

    async def post() -> dict:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/verify/math") as response:
                return await response.json()

    with umbrella_span(RLSpanGroup.U_ROLLOUT, "rl.gym.run_rollouts"):
        assert asyncio.run(post()) == {"task": "math", "reward": 1.0}
    shutdown_telemetry()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0

    exported = read_dump_spans(dump_dir)
    # one SERVER span per request: FastAPI's own (ungated) request tracing is switched off
    assert [s["kind"] for s in exported].count(SERVER_KIND) == 1
    spans = {s["name"]: s for s in exported}
    rollout, client, server, verify = (spans[n] for n in ("rl.gym.run_rollouts", "POST", "POST /verify/{task}",
                                                        "gym.verify"))
    assert client["kind"] == CLIENT_KIND and server["kind"] == SERVER_KIND
    assert client["parent"] == rollout["span_id"]
    assert server["parent"] == client["span_id"]
    assert verify["parent"] == server["span_id"]
    assert len({s["trace_id"] for s in (rollout, client, server, verify)}) == 1
    assert server["pid"] == process.pid and client["pid"] == os.getpid()
    assert (client["rank"], server["rank"]) == (0, SERVER_RANK)
    assert server["attributes"]["http.response.status_code"] == 200


if __name__ == "__main__":
    serve(sys.argv[1])
