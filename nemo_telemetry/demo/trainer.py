"""A small GRPO-shaped training loop on the driver, instrumented exactly as a real trainer is.

    rl.grpo.job                                   umbrella_trace_fn(U_JOB)
    ├── rl.startup / rl.setup.{ray_init,reward_server,workers}   (+ the workers' load spans)
    ├── rl.grpo.evaluate            rl.iteration=0, generation inside bucket_scope(OVERHEAD)
    ├── rl.grpo.step  (iteration_scope(i))
    │   ├── sync:  rl.grpo.data_processing, rl.grpo.generation > rl.vllm.generate
    │   ├── async: rl.idle.buffer_starvation, rl.grpo.data_processing
    │   ├── rl.grpo.reward_calculation > rl.gym.run_rollouts > POST /verify (HTTP hop)
    │   ├── rl.grpo.policy_and_reference_logprobs, rl.grpo.advantage_calculation
    │   ├── rl.data_plane.put, rl.grpo.policy_training
    │   ├── async: rl.idle.refit_bubble
    │   ├── rl.grpo.evaluate every ``validate_every`` steps
    │   └── rl.grpo.checkpointing > rl.checkpoint.finalize (ends in a later step)
    └── async: the collector's rl.grpo.generation batches and loop waits (carrier from the job)

Nothing here knows about the analysis: it emits, and the dump exporter writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from nemo_telemetry.demo.actors import FLEET_GPUS, GenerationWorker, PolicyWorker, TrajectoryCollector
from nemo_telemetry.demo.reward_server import RewardServer
from nemo_telemetry.demo.workload import ObjectStoreQueue, PhaseTimes, Rollout, group_advantages
from nemo_telemetry.instrument import (
    Bucket,
    RLSpanGroup,
    TracedDataPlaneClient,
    begin_checkpoint_finalize,
    bucket_scope,
    checkpoint_span,
    current_trace_carrier,
    dispatch_with_trace_context,
    efficiency_span,
    flush_actors_telemetry,
    flush_metrics,
    instrument_aiohttp_client,
    iteration_scope,
    managed_span,
    setup_span,
    start_efficiency_span,
    startup_span,
    tee_metrics,
    telemetry_runtime_env,
    traced_ray_init,
    umbrella_span,
    umbrella_trace_fn,
)

__all__ = ["DemoSettings", "TrainSummary", "train", "run_config", "fleet_gpus", "MODES", "PLACEMENTS"]

MODES = ("sync", "async")
PLACEMENTS = ("colocated", "split")
"""Where generation runs: on the training GPUs (``colocated``, NeMo-RL's default for sync GRPO) or on
GPUs of its own (``split``; async GRPO needs it)."""


@dataclass(frozen=True)
class DemoSettings:
    """One demo run's shape. ``no_carrier`` withholds the job's carrier from the collector.

    ``placement`` left empty is the mode's: ``colocated`` for sync, ``split`` for async.
    """

    steps: int = 6
    mode: str = "sync"
    placement: str = ""
    seed: int = 0
    no_carrier: bool = False
    prompts_per_step: int = 4
    num_generations: int = 4
    policy_workers: int = 2
    validate_every: int = 3
    checkpoint_every: int = 3
    checkpoint_dir: str = "checkpoints"
    times: PhaseTimes = field(default_factory=PhaseTimes)

    def __post_init__(self) -> None:
        if not self.placement:
            object.__setattr__(self, "placement", "split" if self.mode == "async" else "colocated")


@dataclass(frozen=True)
class TrainSummary:
    """What the loop itself measured (the analysis measures the rest from the spans)."""

    steps: int
    mean_reward: tuple[float, ...]
    checkpoints: tuple[str, ...]
    ray_cluster_source: str


def fleet_gpus(settings: DemoSettings) -> dict[str, int]:
    """``rl.fleet`` -> the GPUs one of its processes declares (``nv.dl.gpu.count``; the demo runs on CPU).

    Split: the engine has one GPU of its own. Colocated: the engine spans the policy ranks' GPUs
    (tensor parallel over all of them), as a colocated vLLM sees the training devices; the run's
    ``rl.generation.colocated`` says those are the same GPUs.
    """
    generation = settings.policy_workers if settings.placement == "colocated" else FLEET_GPUS["generation"]
    return {"driver": 0, "policy": FLEET_GPUS["policy"], "generation": generation,
            "collector": FLEET_GPUS["collector"]}


def run_config(settings: DemoSettings) -> dict[str, Any]:
    """The run described as a NeMo-RL GRPO config, from which ``run_resource_attributes`` derives
    the placement (``rl.generation.colocated``, both fleets' topology sizes) and ``rl.async``."""
    gpus = fleet_gpus(settings)
    colocated = settings.placement == "colocated"
    training = settings.policy_workers * gpus["policy"]
    generation: dict[str, Any] = {"backend": "vllm", "colocated": {"enabled": colocated},
                                  "vllm_cfg": {"tensor_parallel_size": gpus["generation"]}}
    if not colocated:
        generation["colocated"]["resources"] = {"gpus_per_node": gpus["generation"], "num_nodes": 1}
    return {
        "policy": {"model_name": "demo-toy-grpo", "dtensor_cfg": {"tensor_parallel_size": 1},
                   "generation": generation},
        "cluster": {"num_nodes": 1, "gpus_per_node": training + (0 if colocated else gpus["generation"])},
        "grpo": {"num_prompts_per_step": settings.prompts_per_step,
                 "num_generations_per_prompt": settings.num_generations, "max_num_steps": settings.steps,
                 "seed": settings.seed, "async_grpo": {"enabled": settings.mode == "async"}},
    }


# -- the job ------------------------------------------------------------------------------------


@umbrella_trace_fn(RLSpanGroup.U_JOB, "rl.grpo.job")
def train(settings: DemoSettings) -> TrainSummary:
    """Set up Ray, the reward server and the workers, validate, run the steps, tear down."""
    with contextlib.ExitStack() as teardown:
        with startup_span():
            source = teardown.enter_context(ray_session())
            with setup_span("reward_server"):
                reward_url = teardown.enter_context(RewardServer(verify_s=settings.times["verify"]))
                instrument_aiohttp_client(namespace="nemo_rl")
            with setup_span("workers"):
                fleet = teardown.enter_context(Fleet.start(settings, actor_options(source)))
        loop = _Loop(settings, fleet, reward_url)
        loop.validate(0)
        if settings.mode == "async":
            loop.wait_for_first_batch()
        rewards = []
        for iteration in range(1, settings.steps + 1):
            with iteration_scope(iteration):
                rewards.append(loop.step(iteration))
        checkpoints = loop.finish_checkpoints()
    return TrainSummary(settings.steps, tuple(rewards), tuple(checkpoints), source)


@contextlib.contextmanager
def ray_session() -> Iterator[str]:
    """Join the Ray cluster this process already has, the one ``RAY_ADDRESS`` names, or start one,
    inside ``rl.setup.ray_init`` (:func:`traced_ray_init`).

    Yields ``rl.ray.cluster_source``; a cluster started here is shut down on exit.
    """
    import ray

    quiet = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.WARNING}
    source = traced_ray_init(local_options={"num_cpus": 2, "object_store_memory": 256 * 1024**2}, **quiet)
    try:
        yield source
    finally:
        if source != "reused_local":  # disconnect from what this call started or joined
            ray.shutdown()


def actor_options(cluster_source: str) -> dict[str, Any]:
    """``.options()`` for every actor: no CPU reservation, and the telemetry environment.

    ``traced_ray_init`` gave the job the driver's telemetry settings whenever it called
    ``ray.init``. A process already connected (a shared test cluster) kept the job's own
    ``runtime_env``, so there the settings go to each actor (:func:`telemetry_runtime_env`).
    """
    if cluster_source != "reused_local":
        return {"num_cpus": 0}
    return {"num_cpus": 0, "runtime_env": telemetry_runtime_env()}


@dataclass
class Fleet:
    """The actors of one run; leaving it flushes their telemetry, then kills them."""

    policy: list[Any]
    generation: Any
    collector: Any | None
    options: dict[str, Any]

    @classmethod
    @contextlib.contextmanager
    def start(cls, settings: DemoSettings, options: dict[str, Any]) -> Iterator["Fleet"]:
        import ray

        carrier = current_trace_carrier()
        n = settings.policy_workers
        policy = [ray.remote(PolicyWorker).options(**options).remote(rank, n, times=settings.times,
                                                                    trace_carrier=carrier)
                  for rank in range(n)]
        generation = ray.remote(GenerationWorker).options(**options).remote(
            seed=settings.seed, times=settings.times, gpus=fleet_gpus(settings)["generation"], trace_carrier=carrier)
        actors = [*policy, generation]
        fleet = cls(policy, generation, None, options)
        try:
            ray.get([a.ready.remote() for a in actors])
            yield fleet
        finally:
            if fleet.collector is not None:
                actors.insert(0, fleet.collector)  # first: it stops calling the generation worker
            flush_actors_telemetry(actors, kill=True)


# -- one step -----------------------------------------------------------------------------------


class _Loop:
    """The driver's per-step phases; the mode decides where rollouts come from."""

    def __init__(self, settings: DemoSettings, fleet: Fleet, reward_url: str) -> None:
        self.s = settings
        self.times = settings.times
        self.fleet = fleet
        self.reward_url = reward_url
        self.finalizers: list[threading.Thread] = []
        self.data_plane = TracedDataPlaneClient(ObjectStoreQueue())
        self.checkpoints: list[str] = []
        self._first: dict[str, Any] | None = None  # async: the batch the initial fill waited for
        self._waits: dict[str, float] = {"idle/buffer_starvation": 0.0, "idle/refit_bubble": 0.0}
        if settings.mode == "async":
            self._start_collector()

    def _start_collector(self) -> None:
        import ray

        # The carrier is taken inside rl.grpo.job, where the collector is built (seed 000);
        # --no-carrier withholds it, so every batch the collector runs starts its own trace.
        carrier = {} if self.s.no_carrier else current_trace_carrier()
        self.fleet.collector = ray.remote(TrajectoryCollector).options(**self.fleet.options).remote(
            self.fleet.generation, prompts_per_batch=self.s.prompts_per_step,
            num_generations=self.s.num_generations, times=self.times, trace_carrier=carrier)

    def step(self, i: int) -> float:
        with umbrella_span(RLSpanGroup.U_STEP, "rl.grpo.step",
                           **{"rl.epoch": 0, "rl.num_generations_per_prompt": self.s.num_generations}):
            rollouts = self._sync_rollouts(i) if self.s.mode == "sync" else self._async_rollouts()
            with managed_span(RLSpanGroup.REWARD, "rl.grpo.reward_calculation"):
                rewards = asyncio.run(self._score(rollouts))
            self._train(rollouts, rewards)
            self._refit(i)
            if i % self.s.validate_every == 0:
                self.validate(i)
            if i % self.s.checkpoint_every == 0:
                self._checkpoint(i)
            self._report_efficiency()
        return sum(sum(r) for r in rewards) / max(1, sum(len(r) for r in rewards))

    def _report_efficiency(self) -> None:
        """Tee the step's efficiency timers as rl.efficiency.seconds, as a trainer's logger dict would.

        Flushed inside the step: data points carry their collection time, which is how the
        analysis puts them beside this step's buckets.
        """
        if self.s.mode == "async":
            tee_metrics("efficiency", self._waits)
            flush_metrics()
        self._waits = {"idle/buffer_starvation": 0.0, "idle/refit_bubble": 0.0}

    # -- rollouts

    def _prompts(self, i: int) -> list[int]:
        first = (i - 1) * self.s.prompts_per_step
        return list(range(first, first + self.s.prompts_per_step))

    def _generate(self, prompt_ids: list[int], seconds: float) -> list[Rollout]:
        import ray

        with managed_span(RLSpanGroup.GENERATION, "rl.vllm.generate"):
            return ray.get(dispatch_with_trace_context(self.fleet.generation.generate, prompt_ids,
                                                       num_generations=self.s.num_generations,
                                                       seconds=seconds))

    def _sync_rollouts(self, i: int) -> list[Rollout]:
        with managed_span(RLSpanGroup.DATA_PROCESSING, "rl.grpo.data_processing"):
            prompts = self._prompts(i)
            time.sleep(self.times["data_processing"])
        with umbrella_span(RLSpanGroup.U_ROLLOUT, "rl.grpo.generation",
                           **{"rl.weight_version": i - 1, "rl.num_prompt_groups": len(prompts)}):
            return self._generate(prompts, self.times["generate"])

    def wait_for_first_batch(self) -> None:
        """The initial buffer fill: ``init/total``, unbucketed (the collector's spans fill it)."""
        with efficiency_span("init/total"):
            self._first = self._poll_batch(None)

    def _async_rollouts(self) -> list[Rollout]:
        batch, self._first = self._first, None
        if batch is None:
            batch = self._poll_batch("idle/buffer_starvation")
        with managed_span(RLSpanGroup.DATA_PROCESSING, "rl.grpo.data_processing"):
            time.sleep(self.times["data_processing"])
            return batch["rollouts"]

    def _poll_batch(self, category: str | None) -> dict[str, Any]:
        """Poll the collector until it has a batch; a starved wait is one span with ``rl.idle.polls``."""
        import ray

        wait, started = None, 0.0
        while True:
            batch = ray.get(self.fleet.collector.sample.remote())
            if batch is not None:
                if wait is not None:
                    wait.end()
                    self._waits[category] += time.monotonic() - started
                return batch
            if wait is None and category is not None:
                wait = start_efficiency_span(category)
                started = time.monotonic()
            if wait is not None:
                wait.poll()
            time.sleep(0.01)

    # -- reward: the HTTP hop

    async def _score(self, rollouts: list[Rollout]) -> list[list[float]]:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            return list(await asyncio.gather(*(self._score_group(session, r) for r in rollouts)))

    async def _score_group(self, session: Any, rollout: Rollout) -> list[float]:
        with umbrella_span(RLSpanGroup.U_PER_PROMPT, "rl.gym.run_rollouts",
                           **{"rl.gym.batch_size": len(rollout.responses)}):
            payload = {"target": rollout.target, "responses": [list(r) for r in rollout.responses]}
            async with session.post(f"{self.reward_url}/verify", json=payload) as response:
                response.raise_for_status()
                return (await response.json())["rewards"]

    # -- training

    def _train(self, rollouts: list[Rollout], rewards: list[list[float]]) -> None:
        import ray

        policy = self.fleet.policy
        with managed_span(RLSpanGroup.LOGPROB, "rl.grpo.policy_and_reference_logprobs"):
            ray.get([dispatch_with_trace_context(w.get_logprobs, rollouts) for w in policy])
        with managed_span(RLSpanGroup.ADVANTAGE, "rl.grpo.advantage_calculation"):
            advantages = [group_advantages(r) for r in rewards]
            time.sleep(self.times["advantage"])
        batch_ref = self.data_plane.put(advantages, partition="train")  # rl.data_plane.put
        with managed_span(RLSpanGroup.POLICY_UPDATE, "rl.grpo.policy_training"):
            ray.get([dispatch_with_trace_context(w.train, batch_ref) for w in policy])

    def _refit(self, i: int) -> None:
        """Push step ``i``'s weights to the generation worker (async: at the collector's safe point)."""
        import ray

        generation = self.fleet.generation
        if self.s.mode == "sync":  # NeMo-RL's sync loop has no span here: a small unattributed gap
            ray.get(dispatch_with_trace_context(generation.update_weights, i))
            return
        collector = self.fleet.collector
        started = time.monotonic()
        with efficiency_span("idle/refit_bubble"):
            ray.get(collector.prepare_refit.remote())
            ray.get(dispatch_with_trace_context(generation.update_weights, i))
            ray.get(collector.finish_refit.remote(i))
        self._waits["idle/refit_bubble"] += time.monotonic() - started

    # -- validation and checkpoints

    def validate(self, i: int) -> None:
        """Validation: generation counted as overhead, and ``rl.iteration`` set on the span itself."""
        with bucket_scope(Bucket.OVERHEAD):
            with umbrella_span(RLSpanGroup.U_EVALUATE, "rl.grpo.evaluate", **{"rl.iteration": i}):
                self._generate([10_000 + i], self.times["validate_generate"])

    def _checkpoint(self, i: int) -> None:
        import ray

        root = os.path.abspath(self.s.checkpoint_dir)
        tmp, final = os.path.join(root, f"tmp_step_{i}"), os.path.join(root, f"step_{i}")
        with checkpoint_span("grpo"):
            os.makedirs(tmp, exist_ok=True)
            ray.get([dispatch_with_trace_context(w.save_shard, tmp) for w in self.fleet.policy])
            time.sleep(self.times["checkpoint_stage"])
            finalize = begin_checkpoint_finalize(tmp)
            thread = threading.Thread(target=self._finalize, args=(finalize, tmp, final),
                                      name=f"checkpoint-finalize-{i}", daemon=True)
            thread.start()
        self.finalizers.append(thread)
        self.checkpoints.append(final)

    def _finalize(self, finalize: Any, tmp: str, final: str) -> None:
        with finalize:  # writers drain, then tmp_step_N becomes step_N: durable from here on
            time.sleep(self.times["checkpoint_finalize"])
            os.replace(tmp, final)

    def finish_checkpoints(self) -> list[str]:
        for thread in self.finalizers:
            thread.join(timeout=60)
        return [c for c in self.checkpoints if os.path.isdir(c)]
