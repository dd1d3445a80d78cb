"""The demo's Ray actors: policy workers, a generation worker and the async trajectory collector.

Each is a plain class (``ray.remote`` is applied by the trainer), instrumented the way a real
worker is: ``init_telemetry_worker`` with an explicit rank in ``__init__``, the model load inside
``traced_worker_init`` (``rl.<role>.load_model``, ``model_init``), per-call methods decorated with ``@accepts_trace_context`` and called
through ``dispatch_with_trace_context``, and a ``flush_telemetry`` method (from
``TelemetryFlushMixin``) the driver calls before ``ray.kill``.

The constructors also take the driver's carrier (``trace_carrier``), so even the load spans join
the run's trace: Ray carries no context into ``__init__`` by itself. ``init_telemetry_worker`` gets
it too, so a worker the driver's settings never reached says so once.

The collector follows seed 000 ("Async rollout spans come from the collector actor"): the carrier
it is built with is re-attached in its loop thread and in every batch-worker thread; each batch is
one ``rl.grpo.generation`` umbrella; its loop waits are unbucketed efficiency spans.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from nemo_telemetry.instrument import (
    RLSpanGroup,
    TelemetryFlushMixin,
    TraceCarrierThread,
    TracedDataPlaneClient,
    accepts_trace_context,
    dispatch_with_trace_context,
    efficiency_span,
    fleet_busy,
    flush_metrics,
    init_telemetry_worker,
    per_prompt_scope,
    span_cm,
    traced_worker_init,
    umbrella_span,
)
from nemo_telemetry.demo.workload import PhaseTimes, ReplayBuffer, Rollout, sample_responses

__all__ = ["PolicyWorker", "GenerationWorker", "TrajectoryCollector", "SERVICE_NAMES", "FLEET_GPUS"]

SERVICE_NAMES = {
    "driver": "demo-grpo-driver",
    "policy": "demo-policy-worker",
    "generation": "demo-generation-worker",
    "collector": "demo-trajectory-collector",
}

FLEET_GPUS = {"policy": 1, "generation": 1, "collector": 0}
"""``rl.fleet`` -> the GPUs one of its workers declares (``nv.dl.gpu.count``). The demo runs on CPU,
where nothing could be counted, so each worker says what it stands for: a policy rank and the
generation engine one GPU each, the collector (a CPU loop in NeMo-RL too) none. Colocated, the
engine instead spans the policy ranks' GPUs (:func:`nemo_telemetry.demo.trainer.fleet_gpus`)."""


def _load_model(role: str, seconds: float, carrier: dict[str, str] | None) -> None:
    with traced_worker_init(role, backend="demo", trace_carrier=carrier):
        time.sleep(seconds)


class PolicyWorker(TelemetryFlushMixin):
    """One rank of the training fleet: log-probs, the optimizer step, its checkpoint shard."""

    def __init__(self, rank: int, world_size: int, *, times: PhaseTimes,
                 trace_carrier: dict[str, str] | None = None) -> None:
        init_telemetry_worker(rank=rank, world_size=world_size, service_name=SERVICE_NAMES["policy"],
                              fleet="policy", gpus=FLEET_GPUS["policy"], trace_carrier=trace_carrier)
        self.rank = rank
        self.times = times
        self.updates = 0
        _load_model("policy", times["load_model"], trace_carrier)

    def ready(self) -> int:
        return self.rank

    @accepts_trace_context
    def get_logprobs(self, rollouts: list[Rollout]) -> list[float]:
        with span_cm("rl.policy.get_logprobs", **{"rl.num_prompt_groups": len(rollouts)}):
            time.sleep(self.times["logprobs"])
            return [-0.01 * sum(r.responses[0][:4]) / 4 for r in rollouts]

    @accepts_trace_context
    def train(self, batch: list[list[float]]) -> float:
        """One optimizer step over the batch the driver put: each prompt group's advantages."""
        with span_cm("rl.policy.train", **{"rl.num_prompt_groups": len(batch)}):
            time.sleep(self.times["train"])
            self.updates += 1
            advantages = [a for group in batch for a in group]
            return sum(a * a for a in advantages) / max(1, len(advantages))

    @accepts_trace_context
    def save_shard(self, directory: str) -> str:
        import json
        import os

        with span_cm("rl.policy.save_shard"):
            path = os.path.join(directory, f"shard-{self.rank}.json")
            with open(path, "w", encoding="utf-8") as fh:
                json.dump({"rank": self.rank, "updates": self.updates}, fh)
            return path


class GenerationWorker(TelemetryFlushMixin):
    """The generation engine (vLLM's place): one batch at a time, weights refitted by the driver.

    Its work is counted in ``rl.fleet.busy.seconds`` too: in async mode the spans it opens sit under
    the collector's unbucketed batches, so only this metric says how busy the generation fleet was.
    """

    def __init__(self, *, seed: int, times: PhaseTimes, gpus: int = FLEET_GPUS["generation"],
                 trace_carrier: dict[str, str] | None = None) -> None:
        init_telemetry_worker(rank=0, world_size=1, service_name=SERVICE_NAMES["generation"],
                              fleet="generation", gpus=gpus, trace_carrier=trace_carrier)
        self.seed = seed
        self.times = times
        self.weight_version = 0
        _load_model("vllm", times["load_model"], trace_carrier)

    def ready(self) -> int:
        return self.weight_version

    @accepts_trace_context
    def generate(self, prompt_ids: list[int], *, num_generations: int, seconds: float) -> list[Rollout]:
        attrs = {"rl.weight_version": self.weight_version, "rl.num_prompt_groups": len(prompt_ids)}
        with span_cm("rl.vllm.engine.generate", **attrs), fleet_busy("generation"):
            time.sleep(seconds)
            rollouts = sample_responses(prompt_ids, num_generations=num_generations,
                                        weight_version=self.weight_version, seed=self.seed)
        # A point of rl.fleet.busy.seconds per batch (the SDK's own interval is a minute), so the
        # busy time can be put beside the driver's steps.
        flush_metrics()
        return rollouts

    @accepts_trace_context
    def update_weights(self, version: int) -> int:
        with span_cm("rl.vllm.update_weights", **{"rl.weight_version": version}):
            time.sleep(self.times["refit"])
            self.weight_version = version
            return version


class TrajectoryCollector(TelemetryFlushMixin):
    """Async GRPO's collector: a loop thread launching batch-worker threads into a bounded buffer.

    The driver samples finished batches, and around each refit calls :meth:`prepare_refit` (stop
    launching, wait for in-flight batches) and :meth:`finish_refit`. ``buffer_limit`` bounds the
    batches buffered or in flight (one: generation runs at most one step ahead of training). Thread safety: one condition
    variable guards all state; the loop and batch workers never hold it across a Ray call.
    """

    def __init__(self, generation_worker: Any, *, prompts_per_batch: int, num_generations: int,
                 times: PhaseTimes, buffer_limit: int = 1, trace_carrier: dict[str, str] | None = None) -> None:
        init_telemetry_worker(rank=0, world_size=1, service_name=SERVICE_NAMES["collector"],
                              fleet="collector", gpus=FLEET_GPUS["collector"], trace_carrier=trace_carrier)
        self._carrier = dict(trace_carrier or {})
        self._replay = TracedDataPlaneClient(ReplayBuffer())
        self._generation = generation_worker
        self._prompts_per_batch = prompts_per_batch
        self._num_generations = num_generations
        self._times = times
        self._buffer_limit = buffer_limit
        self._cond = threading.Condition()
        self._buffer: list[dict[str, Any]] = []
        self._inflight: list[threading.Thread] = []
        self._weight_version = 0
        self._next_prompt = 0
        self._refit_pending = False
        self._stopping = False
        self._errors: list[str] = []
        self._loop = TraceCarrierThread(target=self._run_loop, carrier=self._carrier,
                                        name="collector-loop", daemon=True)
        self._loop.start()

    # -- driver-facing methods (the actor's own thread) --------------------------------------

    def sample(self) -> dict[str, Any] | None:
        """The oldest finished batch, or None when the buffer is empty (the driver polls)."""
        with self._cond:
            if self._errors:
                raise RuntimeError(f"collector batch failed: {self._errors[0]}")
            if not self._buffer:
                return None
            batch = self._buffer.pop(0)
            self._cond.notify_all()
            return batch

    def prepare_refit(self, timeout_s: float = 60.0) -> int:
        """Stop launching batches and wait for those in flight: the safe point for a weight update."""
        with self._cond:
            self._refit_pending = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._inflight or self._stopping, timeout=timeout_s)
            return len(self._buffer)

    def finish_refit(self, weight_version: int) -> None:
        """New weights are live on the generation worker: resume collecting against them."""
        with self._cond:
            self._weight_version = weight_version
            self._refit_pending = False
            self._cond.notify_all()

    def stop_telemetry_threads(self) -> None:
        """Stop the loop and join the batch workers (bounded) before the terminal flush."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            workers = list(self._inflight)
        self._loop.join(timeout=10)
        for worker in workers:
            worker.join(timeout=10)

    # -- the loop thread ---------------------------------------------------------------------

    def _run_loop(self) -> None:
        while True:
            with self._cond:
                if self._stopping:
                    return
                refit = self._refit_pending
                full = len(self._buffer) + len(self._inflight) >= self._buffer_limit
                if not refit and not full:
                    self._launch_locked()
                    continue
            if refit:
                with efficiency_span("idle/refit_event_wait"):
                    self._wait(lambda: not self._refit_pending)
            else:
                with efficiency_span("idle/generation_limit_pause"):
                    self._wait(lambda: self._refit_pending
                               or len(self._buffer) + len(self._inflight) < self._buffer_limit)

    def _wait(self, predicate) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._stopping or predicate())

    def _launch_locked(self) -> None:
        prompt_ids = list(range(self._next_prompt, self._next_prompt + self._prompts_per_batch))
        self._next_prompt += self._prompts_per_batch
        worker = TraceCarrierThread(target=self._run_batch, args=(prompt_ids, self._weight_version),
                                    carrier=self._carrier, name=f"batch-worker-{prompt_ids[0]}", daemon=True)
        self._inflight.append(worker)
        worker.start()

    # -- batch-worker threads ----------------------------------------------------------------

    def _run_batch(self, prompt_ids: list[int], weight_version: int) -> None:
        import ray

        attrs = {
            "rl.weight_version": weight_version,
            "rl.target_weight_version": weight_version + 1,
            "rl.num_generations_per_prompt": self._num_generations,
            "rl.num_prompt_groups": len(prompt_ids),
        }
        try:
            with umbrella_span(RLSpanGroup.U_ROLLOUT, "rl.grpo.generation", **attrs):
                ref = dispatch_with_trace_context(self._generation.generate, prompt_ids,
                                                  num_generations=self._num_generations,
                                                  seconds=self._times["generate"])
                rollouts = ray.get(ref)
                self._push(rollouts, weight_version)
        except Exception as exc:  # surfaced to the driver by sample()
            with self._cond:
                self._errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            with self._cond:
                self._inflight.remove(threading.current_thread())
                self._cond.notify_all()

    def _push(self, rollouts: list[Rollout], weight_version: int) -> None:
        """Commit one prompt group at a time, as a replay buffer does: a per-prompt data-plane op."""
        with per_prompt_scope():  # the client gates these puts on per_prompt, unbucketed
            for rollout in rollouts:
                self._replay.put([rollout], partition="rollout")
        with self._cond:
            self._buffer.append({"rollouts": self._replay.inner.take(), "weight_version": weight_version})
            self._cond.notify_all()
