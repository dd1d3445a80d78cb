"""What the demo's phases cost, and the tiny "model" they run.

Device work (generation, log-probs, the optimizer step) is modelled as sleeps on the worker
that owns the device: the host really waits that long, exactly as a driver waits on a GPU.
Host work (scoring, advantages) is real Python. The proportions follow a typical GRPO step:
generation is the largest phase, then training, then log-probs.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

__all__ = ["PhaseTimes", "Rollout", "sample_responses", "group_advantages", "ObjectStoreQueue", "ReplayBuffer"]


@dataclass(frozen=True)
class PhaseTimes:
    """Seconds each phase takes (before ``scale``); one step of the sync loop is about 0.9 s."""

    data_processing: float = 0.03
    generate: float = 0.36
    verify: float = 0.01  # per prompt group, on the reward server
    logprobs: float = 0.09
    advantage: float = 0.01
    data_plane_put: float = 0.0  # ray.put of the training batch: real time only
    train: float = 0.20
    refit: float = 0.03
    validate_generate: float = 0.12
    checkpoint_stage: float = 0.05
    checkpoint_finalize: float = 0.9
    load_model: float = 0.05
    scale: float = 1.0

    def __getitem__(self, phase: str) -> float:
        return getattr(self, phase) * self.scale


@dataclass(frozen=True)
class Rollout:
    """One prompt group: the prompt's target and its responses (token ids)."""

    prompt_id: int
    target: int
    responses: tuple[tuple[int, ...], ...]


def sample_responses(prompt_ids: list[int], *, num_generations: int, weight_version: int, seed: int,
                     tokens: int = 32) -> list[Rollout]:
    """Deterministic "generations": later weight versions hit the prompt's target more often."""
    hit_rate = min(0.9, 0.2 + 0.08 * weight_version)
    rollouts = []
    for prompt_id in prompt_ids:
        rng = random.Random(f"{seed}:{prompt_id}:{weight_version}")
        target = prompt_id % 7
        responses = tuple(
            tuple(target + 7 * rng.randrange(100) if rng.random() < hit_rate else rng.randrange(700)
                  for _ in range(tokens))
            for _ in range(num_generations)
        )
        rollouts.append(Rollout(prompt_id, target, responses))
    return rollouts


def group_advantages(rewards: list[float]) -> list[float]:
    """GRPO's advantage: each response's reward normalised within its prompt group."""
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    return [(r - mean) / (std + 1e-6) for r in rewards]


class ObjectStoreQueue:
    """The demo's transfer queue on the driver: a put stores the samples in Ray's object store
    and returns the reference the training workers read them from."""

    def put(self, samples: list, partition: str = "train"):
        import ray

        return ray.put(samples)


class ReplayBuffer:
    """The collector's transfer queue: each put commits prompt groups; ``take`` empties it."""

    def __init__(self) -> None:
        self._committed: list = []

    def put(self, samples: list, partition: str = "rollout") -> int:
        self._committed.extend(samples)
        return len(samples)

    def take(self) -> list:
        committed, self._committed = self._committed, []
        return committed
