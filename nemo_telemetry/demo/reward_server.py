"""The demo's reward server: a small FastAPI app on 127.0.0.1, the NeMo-Gym shape of an HTTP hop.

The trainer's reward phase posts each prompt group's responses here with aiohttp; the request
carries ``traceparent`` (``instrument_aiohttp_client``) and the app adopts it
(``instrument_fastapi``), so the server's span is the client span's child in the run's trace.
Both halves are gated on ``per_prompt`` (seed 000: the HTTP volume scales with prompts).

The server runs uvicorn on a daemon thread in the process that starts it, on an ephemeral port,
so nothing else on the machine can collide with it or reach it from outside.
"""

# No ``from __future__ import annotations`` here: FastAPI reads the handler's annotations at
# definition time, and the request model is local to make_reward_app (imported lazily).
import threading
import time
from typing import Any

__all__ = ["MAX_RESPONSES", "score_response", "make_reward_app", "RewardServer"]

MAX_RESPONSES = 1024
"""Largest group a request may carry; bigger bodies are refused (bounded request size)."""
MAX_TOKENS = 4096
"""Longest response a request may carry."""


def score_response(tokens: list[int], target: int) -> float:
    """The task's reward: the share of tokens that hit the prompt's target residue (mod 7)."""
    if not tokens:
        return 0.0
    return sum(1 for t in tokens if t % 7 == target % 7) / len(tokens)


def make_reward_app(*, verify_s: float = 0.0):
    """The FastAPI app: ``POST /verify`` scores one prompt group; ``verify_s`` models a slow verifier."""
    from fastapi import FastAPI
    from pydantic import BaseModel, Field

    from nemo_telemetry.instrument import instrument_fastapi

    class VerifyRequest(BaseModel):
        target: int
        responses: list[list[int]] = Field(max_length=MAX_RESPONSES)

    app = FastAPI(title="nemo-telemetry demo reward server")

    @app.post("/verify")
    async def verify(request: VerifyRequest) -> dict[str, Any]:
        import asyncio

        if any(len(r) > MAX_TOKENS for r in request.responses):
            from fastapi import HTTPException

            raise HTTPException(status_code=413, detail=f"a response is longer than {MAX_TOKENS} tokens")
        if verify_s:
            await asyncio.sleep(verify_s)
        return {"rewards": [score_response(r, request.target) for r in request.responses]}

    instrument_fastapi(app, namespace="nemo_rl")
    return app


class RewardServer:
    """uvicorn serving :func:`make_reward_app` on a daemon thread; ``with RewardServer() as url:``."""

    def __init__(self, *, verify_s: float = 0.0, start_timeout_s: float = 30.0) -> None:
        import uvicorn

        config = uvicorn.Config(make_reward_app(verify_s=verify_s), host="127.0.0.1", port=0,
                                log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="demo-reward-server", daemon=True)
        self._start_timeout_s = start_timeout_s
        self.url: str | None = None

    def start(self) -> str:
        """Start serving and return the base URL (``http://127.0.0.1:<port>``)."""
        self._thread.start()
        deadline = time.monotonic() + self._start_timeout_s
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the demo reward server did not start on 127.0.0.1")
            time.sleep(0.01)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    def stop(self) -> None:
        """Ask uvicorn to exit and wait (bounded) for its thread."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()
