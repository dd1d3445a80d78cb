"""Goodput for Hugging Face TRL's trainers, enabled in one line before the trainer is built.

    from nemo_telemetry.integrations.trl import instrument_trl
    instrument_trl()                   # then build and train GRPOTrainer / SFTTrainer / DPOTrainer as before

Everything :mod:`nemo_telemetry.integrations.transformers` does for a ``Trainer``, and for TRL's
online trainers (``GRPOTrainer``, ``RLOOTrainer``) the phases inside a step, read from TRL's own
timing seam: every ``profiling_context`` / ``@profiling_decorator`` block of a trainer goes
through :class:`trl.extras.profiling.ProfilingContext`, whose enter and exit the integration
follows. :data:`TRL_BLOCKS` maps each block TRL times to its span:

======================================  =======================================  ==================
TRL block                               span                                     bucket
======================================  =======================================  ==================
``transformers.generate`` (and          ``rl.<algo>.generate``                   productive
``transformers.generate_batch``)
``vLLM.generate``                       ``rl.<algo>.generate``; with TRL's       productive
                                        colocated engine, ``instrument_vllm``'s
                                        ``rl.vllm.generate`` inside it instead
``_calculate_rewards``                  ``rl.<algo>.reward_calculation``         productive
``_get_per_token_logps_and_entropies``  ``rl.<algo>.policy_and_reference_logprobs``  overhead
(reference / old-policy passes)
``sync_weights``                        ``rl.<algo>.sync_weights``               overhead
``compute_loss`` (the loss pass)        ``rl.<algo>.forward`` (the Trainer seam)  productive
======================================  =======================================  ==================

A block inside another phase's span (the loss pass's log-probs, each reward function) is an
unbucketed child, so nothing is counted twice. A block TRL times that the table does not know (a
renamed method in a newer TRL) is warned about once and recorded unbucketed: its time shows as
unattributed, never as a silently lost phase. ``tests/integrations/test_trl_seams.py`` fails when
TRL stops timing a block of the table or changes ``ProfilingContext``'s shape.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from nemo_telemetry.integrations.transformers import (
    TrainerTelemetry,
    active_trainer_telemetry,
    instrument_transformers,
    patch_init,
    trainer_algorithm,
    uninstrument_transformers,
)

__all__ = [
    "ONLINE_ALGORITHMS",
    "SUPPORTED_TRL",
    "TRL_BLOCKS",
    "TRL_TRAINERS",
    "TRL_UNMAPPED_BLOCKS",
    "instrument_trl",
    "join_vllm_engine",
    "online_span_groups",
    "uninstrument_trl",
]

_log = logging.getLogger("nemo_telemetry")

SUPPORTED_TRL = ">=1.14,<1.17"
"""The ``trl`` releases the integration is tested against (the ``[trl]`` extra pins them)."""

TRL_BLOCKS: dict[str, tuple[str, str, str | None]] = {
    "transformers.generate": ("generation", "generate", None),
    "transformers.generate_batch": ("generation", "generate", None),
    "vLLM.generate": ("generation", "generate", None),
    "_calculate_rewards": ("reward", "reward_calculation", None),
    "_get_per_token_logps_and_entropies": ("logprob", "policy_and_reference_logprobs", None),
    "sync_weights": ("generation", "sync_weights", "overhead"),
}
"""TRL's profiled block (the name after ``<TrainerClass>.``) -> (span group, phase, bucket over the
group's default or None)."""

TRL_UNMAPPED_BLOCKS = frozenset({"_prepare_inputs", "compute_loss"})
"""Blocks covered otherwise: ``_prepare_inputs`` holds the mapped phases (an umbrella over them
would say nothing), ``compute_loss`` is the ``Trainer`` seam's forward leaf."""

ONLINE_ALGORITHMS = frozenset({"grpo", "rloo", "online_dpo"})
"""Algorithms whose steps generate: their generation, reward and log-prob groups are enabled."""

TRL_TRAINERS = ("GRPOTrainer", "RLOOTrainer", "OnlineDPOTrainer", "DPOTrainer", "KTOTrainer", "SFTTrainer",
                "RewardTrainer")
"""TRL trainer classes whose own ``__init__`` is timed (building one is ``rl.setup.trainer``)."""

_warned: set[str] = set()


def online_span_groups(trainer: Any) -> frozenset[str]:
    """Generation, reward and log-prob for the online trainers; nothing more for the others."""
    if trainer_algorithm(trainer) in ONLINE_ALGORITHMS:
        return frozenset({"generation", "reward", "logprob"})
    return frozenset()


def _block_scope(telemetry: TrainerTelemetry, block: str) -> Any:
    from nemo_telemetry.instrument import NOOP_SPAN, span_cm

    if block in TRL_UNMAPPED_BLOCKS:
        return NOOP_SPAN
    mapped = TRL_BLOCKS.get(block)
    if mapped is None:
        if telemetry.leaf_depth:
            return span_cm(f"rl.{telemetry.algorithm}.{block}", **{"rl.trl.block": block})
        if block not in _warned:
            _warned.add(block)
            _log.warning("telemetry: TRL times a block %r the integration does not map (TRL %s is tested); its "
                         "time is recorded unbucketed and shows as unattributed", block, SUPPORTED_TRL)
        return span_cm(f"rl.{telemetry.algorithm}.{block}", **{"rl.trl.block": block, "rl.trl.unmapped": True})
    group, phase, bucket = mapped
    if block == "vLLM.generate" and telemetry.vllm_instrumented:
        return span_cm(telemetry.span_name(phase), **{"rl.trl.block": block})  # rl.vllm.generate is the leaf
    attributes: dict[str, Any] = {"rl.trl.block": block}
    if bucket is not None:
        attributes["rl.bucket"] = bucket
    return telemetry.leaf(group, phase, **attributes)


def _traced_enter(original: Callable) -> Callable:
    @functools.wraps(original)
    def __enter__(self: Any) -> Any:
        telemetry = active_trainer_telemetry()
        if telemetry is not None and telemetry.training:
            try:
                block = str(getattr(self, "name", "")).split(".", 1)[-1]
                scope = _block_scope(telemetry, block)
                scope.__enter__()
                self.__dict__["_nemo_telemetry_block"] = scope  # until the block exits
            except Exception:
                _log.warning("telemetry: could not trace a TRL block", exc_info=True)
        return original(self)  # inside the span: the span is the whole block TRL times

    __enter__.__nemo_telemetry_original__ = original  # type: ignore[attr-defined]
    return __enter__


def _traced_exit(original: Callable) -> Callable:
    @functools.wraps(original)
    def __exit__(self: Any, exc_type: Any, exc: Any, tb: Any) -> Any:
        try:
            return original(self, exc_type, exc, tb)
        finally:
            held = self.__dict__.pop("_nemo_telemetry_block", None)
            if held is not None:
                try:
                    held.__exit__(exc_type, exc, tb)
                except Exception:
                    _log.warning("telemetry: could not end a TRL block's span", exc_info=True)

    __exit__.__nemo_telemetry_original__ = original  # type: ignore[attr-defined]
    return __exit__


def _patch_profiling_context() -> bool:
    """Follow ``ProfilingContext``'s enter and exit (idempotent); False, warned, when TRL has none."""
    try:
        from trl.extras.profiling import ProfilingContext
    except ImportError as exc:
        _log.warning("telemetry: trl.extras.profiling.ProfilingContext is missing (%s); generation, reward and "
                     "log-prob phases go unattributed (TRL %s is tested)", exc, SUPPORTED_TRL)
        return False
    enter, exit_ = ProfilingContext.__dict__.get("__enter__"), ProfilingContext.__dict__.get("__exit__")
    if enter is None or exit_ is None:
        _log.warning("telemetry: ProfilingContext has no __enter__ / __exit__ of its own; TRL's phases go "
                     "unattributed (TRL %s is tested)", SUPPORTED_TRL)
        return False
    if not hasattr(enter, "__nemo_telemetry_original__"):
        ProfilingContext.__enter__ = _traced_enter(enter)
        ProfilingContext.__exit__ = _traced_exit(exit_)
    return True


def join_vllm_engine(telemetry: TrainerTelemetry) -> None:
    """TRL's colocated vLLM engine (``use_vllm=True, vllm_mode="colocate"``) gets ``instrument_vllm``."""
    generation = getattr(telemetry.trainer, "vllm_generation", None)
    llm = getattr(generation, "llm", None)
    if llm is None or telemetry.vllm_instrumented:
        return
    try:
        from nemo_telemetry.instrument import instrument_vllm

        instrument_vllm(llm)
        telemetry.vllm_instrumented = True
    except Exception:
        _log.warning("telemetry: could not instrument TRL's vLLM engine; its generation is timed by TRL's "
                     "vLLM.generate block instead", exc_info=True)


def _on_built(telemetry: TrainerTelemetry) -> None:
    telemetry.on_train_start.append(join_vllm_engine)


def instrument_trl(config: Any = None) -> None:
    """Trace every TRL (and ``transformers``) trainer built after this call (module docstring).

    ``config`` is a ``telemetry:`` block over the integration's defaults, as for
    :func:`~nemo_telemetry.integrations.transformers.instrument_transformers`. Idempotent.
    """
    import trl

    instrument_transformers(config, groups_for=online_span_groups, on_built=_on_built)
    _patch_profiling_context()
    for name in TRL_TRAINERS:
        try:
            cls = getattr(trl, name)
        except (AttributeError, ImportError):
            continue
        patch_init(cls)


def uninstrument_trl() -> None:
    """Undo :func:`instrument_trl` for trainers built from now on (traced ones stay traced)."""
    try:
        from trl.extras.profiling import ProfilingContext
    except ImportError:
        ProfilingContext = None
    if ProfilingContext is not None:
        for name in ("__enter__", "__exit__"):
            original = getattr(ProfilingContext.__dict__.get(name), "__nemo_telemetry_original__", None)
            if original is not None:
                setattr(ProfilingContext, name, original)
    uninstrument_transformers()
