"""Goodput for any ``transformers.Trainer``, enabled in one line before the trainer is built.

    from nemo_telemetry.integrations.transformers import instrument_transformers
    instrument_transformers()          # then build and train the Trainer as before

Every ``Trainer`` built afterwards (TRL's ``SFTTrainer``, ``DPOTrainer``, ``RewardTrainer`` are
Trainers) is traced; nothing of the training code changes. Telemetry starts when the first one is
built, unless the process started it already (then its settings win): the span groups are those
the trainer can emit, spans go to ``OTEL_EXPORTER_OTLP_*`` when set, else to dump files in
``<output_dir>/telemetry``, and rank, world size and the run id come from the launcher
(:mod:`nemo_telemetry.integrations.launch`).

What each phase becomes (``<algo>`` from the trainer class: ``sft``, ``dpo``, ``rm``, ``grpo`` ...):

=====================================  ==================================  ======================
phase                                  span                                bucket
=====================================  ==================================  ======================
``train()``                            ``rl.<algo>.job``                   umbrella
building the trainer                   ``rl.startup`` > ``rl.setup.trainer``  umbrella (setup)
one optimizer step, with its logging,  ``rl.<algo>.step``, ``rl.iteration``  umbrella (the window)
evaluation and checkpoint              = ``state.global_step`` after it
fetching the step's batches            ``rl.<algo>.data_processing``       overhead
``compute_loss`` (the forward pass)    ``rl.<algo>.forward``               productive
``accelerator.backward``               ``rl.<algo>.backward``              productive
clipping, ``optimizer.step()``,        ``rl.<algo>.optimizer_step``        productive
scheduler and ``zero_grad``
``evaluate()``                         ``rl.<algo>.evaluate``, inside it    umbrella; the loop
                                       ``rl.<algo>.evaluation_loop`` (its  overhead
                                       forward passes unbucketed children)
checkpoint save                        ``rl.<algo>.checkpointing``         overhead
=====================================  ==================================  ======================

The seams, and how each is guarded: ``get_batch_samples``, ``training_step``, ``compute_loss``,
``evaluate``, ``evaluation_loop`` and ``train`` are public ``Trainer`` methods, ``backward`` a public ``Accelerator``
method, ``on_step_end`` / ``on_train_end`` callback events; ``_save_checkpoint(model, trial)`` is
private, the one seam transformers gives no public event for (``on_save`` fires after the save).
:data:`TRAINER_SEAMS` lists each with the parameters it is called with;
``tests/integrations/test_trainer_seams.py`` fails when one disappears or changes shape, and at run
time a seam that is missing is warned about once, naming the phase whose time goes unattributed.

A step span opens when the step's batches are fetched and closes when the next step's are (or at
``on_train_end``), so the window holds that step's logging, evaluation and checkpoint. A step
that raises ends its open spans with error status, then the job span, and flushes the run's
spans before the exception goes on. Only ``evaluate()`` inside ``train()`` is traced; code inline
in the trainer's own methods (loss scaling, metric gathering, logging) lands in unattributed.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import Any

from nemo_telemetry.instrument import environment_variables as env
from nemo_telemetry.integrations.launch import launch_info, shared_run_id

__all__ = [
    "SUPPORTED_TRANSFORMERS",
    "TRAINER_ALGORITHMS",
    "TRAINER_SEAMS",
    "TrainerTelemetry",
    "active_trainer_telemetry",
    "instrument_trainer",
    "instrument_transformers",
    "seam_matches",
    "trainer_algorithm",
    "trainer_resource_attributes",
    "uninstrument_transformers",
]

_log = logging.getLogger("nemo_telemetry")

SUPPORTED_TRANSFORMERS = ">=5.16,<5.24"
"""The ``transformers`` releases the integration is tested against (the ``[trl]`` extra pins them)."""

TRAINER_ALGORITHMS: tuple[tuple[str, str], ...] = (
    ("GRPOTrainer", "grpo"), ("RLOOTrainer", "rloo"), ("OnlineDPOTrainer", "online_dpo"),
    ("DPOTrainer", "dpo"), ("KTOTrainer", "kto"), ("RewardTrainer", "rm"), ("SFTTrainer", "sft"),
    ("Trainer", "sft"),
)
"""Trainer class name -> ``rl.algorithm``, first match along the class's MRO (a subclass of
``GRPOTrainer`` is ``grpo``); a plain ``Trainer`` is supervised training."""

TRAINER_SEAMS: dict[str, tuple[str, ...]] = {
    "train": (),
    "get_batch_samples": ("epoch_iterator", "num_batches", "device"),
    "training_step": ("model", "inputs", "num_items_in_batch"),
    "compute_loss": ("model", "inputs", "return_outputs", "num_items_in_batch"),
    "evaluate": ("eval_dataset", "ignore_keys", "metric_key_prefix"),
    "evaluation_loop": ("dataloader", "description", "prediction_loss_only"),
    "_save_checkpoint": ("model", "trial"),
}
"""``Trainer`` methods the integration wraps -> the leading parameters it passes through by name."""

_SEAM_PHASES = {
    "get_batch_samples": "step windows (each step's data fetch opens its window)",
    "training_step": "the optimizer step",
    "compute_loss": "the forward pass",
    "evaluate": "evaluation",
    "evaluation_loop": "evaluation's batches",
    "_save_checkpoint": "checkpoint saves",
}

_ACTIVE: ContextVar[TrainerTelemetry | None] = ContextVar("nemo_telemetry_active_trainer", default=None)
_install_lock = threading.Lock()
_installed: dict[str, Any] = {}  # "init" -> the original Trainer.__init__, "config" / "groups_for"
_warned: set[str] = set()


def _warn_once(key: str, message: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        _log.warning(message, *args)


def active_trainer_telemetry() -> TrainerTelemetry | None:
    """The :class:`TrainerTelemetry` whose ``train()`` is running here, or None."""
    return _ACTIVE.get()


def trainer_algorithm(trainer_or_class: Any) -> str:
    """``rl.algorithm`` for a trainer (or its class): :data:`TRAINER_ALGORITHMS`, first match in the MRO."""
    cls = trainer_or_class if isinstance(trainer_or_class, type) else type(trainer_or_class)
    known = dict(TRAINER_ALGORITHMS)
    for klass in cls.__mro__:
        if klass.__name__ in known:
            return known[klass.__name__]
    return "sft"


def _precision(args: Any) -> str:
    if getattr(args, "bf16", False):
        return "bf16"
    if getattr(args, "fp16", False):
        return "fp16"
    return "fp32"


def trainer_resource_attributes(trainer: Any, *, world_size: int = 1) -> dict[str, Any]:
    """The run's resource attributes read off a built trainer and its ``TrainingArguments``."""
    args = trainer.args
    accumulation = int(getattr(args, "gradient_accumulation_steps", 1) or 1)
    micro = int(getattr(args, "per_device_train_batch_size", 0) or 0)
    attributes: dict[str, Any] = {
        "nemo.precision": _precision(args),
        "nv.dl.topology.size.world": int(world_size),
        "nv.dl.topology.size.dp": int(world_size),
        "nv.dl.topology.size.gradient_accumulation": accumulation,
    }
    model = getattr(getattr(trainer, "model", None), "name_or_path", None)
    if model:
        attributes["rl.model"] = str(model)
    if micro:
        attributes["nv.dl.training.config.micro_batch_size"] = micro
        attributes["nv.dl.training.config.global_batch_size"] = micro * accumulation * int(world_size)
    max_steps = getattr(args, "max_steps", -1)
    if isinstance(max_steps, int) and max_steps > 0:
        attributes["nv.dl.training.target.max_steps"] = max_steps
    epochs = getattr(args, "num_train_epochs", None)
    if isinstance(epochs, (int, float)) and epochs > 0 and not (isinstance(max_steps, int) and max_steps > 0):
        attributes["nv.dl.training.target.max_epochs"] = epochs
    seed = getattr(args, "seed", None)
    if isinstance(seed, int):
        attributes["nv.dl.training.config.seed"] = seed
    generations = getattr(args, "num_generations", None)
    if isinstance(generations, int):
        attributes["nv.dl.training.config.num_generations_per_prompt"] = generations
    return attributes


def _strategy(args: Any, name: str) -> str:
    value = getattr(args, name, "no")
    return str(getattr(value, "value", value)).lower()


def base_span_groups(trainer: Any) -> frozenset[str]:
    """The groups a Trainer's loop opens: evaluation and checkpoint only where its arguments ask."""
    from nemo_telemetry.instrument import RLSpanGroup as G

    groups = {G.JOB, G.STEP, G.SETUP, G.POLICY_UPDATE, G.DATA_PROCESSING}
    if _strategy(trainer.args, "eval_strategy") != "no":
        groups.add(G.EVALUATE)
    if _strategy(trainer.args, "save_strategy") != "no":
        groups.add(G.CHECKPOINT)
    return frozenset(str(g) for g in groups)


class _Leaf:
    """A bucketed leaf of the trainer's phases; a seam nested inside one is an unbucketed child."""

    __slots__ = ("_owner", "_scope")

    def __init__(self, owner: TrainerTelemetry, scope: Any) -> None:
        self._owner, self._scope = owner, scope

    def __enter__(self) -> Any:
        self._owner.leaf_depth += 1
        return self._scope.__enter__()

    def __exit__(self, exc_type, exc, tb) -> None:
        self._owner.leaf_depth -= 1
        self._scope.__exit__(exc_type, exc, tb)


class TrainerTelemetry:
    """One traced trainer: its algorithm, the open step and optimizer handles, and its wrappers."""

    def __init__(self, trainer: Any) -> None:
        from nemo_telemetry.instrument import NOOP_HANDLE

        self.trainer = trainer
        self.algorithm = trainer_algorithm(trainer)
        self.step = NOOP_HANDLE
        self.optimizer = NOOP_HANDLE
        self.training = False
        self.leaf_depth = 0
        self.built_ns: tuple[int, int] | None = None  # (start, end) of building the trainer
        self.startup_reported = False
        self.vllm_instrumented = False  # TRL's colocated engine traced by instrument_vllm
        self.on_train_start: list[Callable[[TrainerTelemetry], None]] = []

    def span_name(self, phase: str) -> str:
        return f"rl.{self.algorithm}.{phase}"

    # -- spans ----------------------------------------------------------------------------------

    def leaf(self, group: str, phase: str, **attributes: Any) -> Any:
        """A leaf span of ``group`` named ``rl.<algo>.<phase>`` inside ``train()``; else a no-op."""
        from nemo_telemetry.instrument import NOOP_SPAN, managed_span, span_cm

        if not self.training:
            return NOOP_SPAN
        if self.leaf_depth:
            return span_cm(self.span_name(phase), **attributes)
        return _Leaf(self, managed_span(group, self.span_name(phase), **attributes))

    def open_step(self) -> None:
        """Close the step before and open the next (its iteration: ``global_step`` once it is done)."""
        from nemo_telemetry.instrument import start_step_span

        self.close_step()
        self.step = start_step_span(int(self.trainer.state.global_step) + 1, self.span_name("step"))

    def open_optimizer_step(self) -> None:
        from nemo_telemetry.instrument import RLSpanGroup, start_span

        self.optimizer.end()
        if self.leaf_depth == 0:
            self.optimizer = start_span(RLSpanGroup.POLICY_UPDATE, self.span_name("optimizer_step"))

    def close_optimizer_step(self, error: BaseException | None = None) -> None:
        self.optimizer.end(error)

    def close_step(self, error: BaseException | None = None) -> None:
        self.close_optimizer_step(error)
        self.step.end(error)

    def report_startup(self) -> None:
        """``rl.startup`` (building the trainer until ``train()``) and ``rl.setup.trainer`` inside it."""
        if self.startup_reported or self.built_ns is None:
            return
        self.startup_reported = True
        from opentelemetry import trace as trace_api

        from nemo_telemetry.instrument import SPAN_GROUP_KEY, RLSpanGroup, get_tracer, is_span_group_enabled

        if not is_span_group_enabled(RLSpanGroup.SETUP):
            return
        try:
            tracer = get_tracer()
            start, built = self.built_ns
            group = {SPAN_GROUP_KEY: str(RLSpanGroup.SETUP)}
            startup = tracer.start_span("rl.startup", start_time=start,  # nemo-telemetry-lint: allow raw-otel-span
                                        context=trace_api.set_span_in_context(trace_api.INVALID_SPAN),
                                        attributes=group)
            child = tracer.start_span("rl.setup.trainer", start_time=start,  # nemo-telemetry-lint: allow raw-otel-span
                                      context=trace_api.set_span_in_context(startup),
                                      attributes={"rl.trainer.class": type(self.trainer).__name__, **group})
            child.end(end_time=built)
            startup.end(end_time=time.time_ns())
        except Exception:
            _log.warning("could not record the trainer's start-up spans", exc_info=True)

    # -- the wrapped methods ----------------------------------------------------------------------

    def traced_train(self, original: Callable) -> Callable:
        @functools.wraps(original)
        def train(*args: Any, **kwargs: Any) -> Any:
            from nemo_telemetry.instrument import RLSpanGroup, flush_telemetry, start_umbrella_span

            if self.training:  # train() re-entered (find_executable_batch_size retries): one job span
                return original(*args, **kwargs)
            self.report_startup()
            for hook in self.on_train_start:
                hook(self)
            job = start_umbrella_span(RLSpanGroup.U_JOB, self.span_name("job"))
            token = _ACTIVE.set(self)
            self.training = True
            error: BaseException | None = None
            try:
                return original(*args, **kwargs)
            except BaseException as exc:
                error = exc
                raise
            finally:
                self.training = False
                self.close_step(error)
                job.end(error)
                _ACTIVE.reset(token)
                flush_telemetry()

        return train

    def traced_get_batch_samples(self, original: Callable) -> Callable:
        from nemo_telemetry.instrument import RLSpanGroup

        @functools.wraps(original)
        def get_batch_samples(*args: Any, **kwargs: Any) -> Any:
            if self.training:
                self.open_step()
            with self.leaf(RLSpanGroup.DATA_PROCESSING, "data_processing"):
                return original(*args, **kwargs)

        return get_batch_samples

    def traced_training_step(self, original: Callable) -> Callable:
        @functools.wraps(original)
        def training_step(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            if self.training and _syncs_gradients(self.trainer):
                self.open_optimizer_step()  # clipping, optimizer.step(), scheduler, zero_grad: to on_step_end
            return result

        return training_step

    def traced_leaf(self, group: str, phase: str, **attributes: Any) -> Callable[[Callable], Callable]:
        """A wrapper that runs the method inside the leaf ``rl.<algo>.<phase>`` of ``group``."""

        def wrap(original: Callable) -> Callable:
            @functools.wraps(original)
            def traced(*args: Any, **kwargs: Any) -> Any:
                with self.leaf(group, phase, **attributes):
                    return original(*args, **kwargs)

            return traced

        return wrap

    def traced_evaluate(self, original: Callable) -> Callable:
        from nemo_telemetry.instrument import NOOP_SPAN, Bucket, RLSpanGroup, bucket_scope, umbrella_span

        @functools.wraps(original)
        def evaluate(*args: Any, **kwargs: Any) -> Any:
            if not self.training:
                return original(*args, **kwargs)
            with bucket_scope(Bucket.OVERHEAD):
                scope = umbrella_span(RLSpanGroup.U_EVALUATE, self.span_name("evaluate")) if not self.leaf_depth \
                    else NOOP_SPAN
                with scope:
                    return original(*args, **kwargs)

        return evaluate

def _syncs_gradients(trainer: Any) -> bool:
    """Whether the micro-batch that just ran was the last of its optimizer step."""
    try:
        return bool(trainer.accelerator.sync_gradients)
    except Exception:
        return True


def _wrap_method(trainer: Any, name: str, wrap: Callable[[Callable], Callable]) -> bool:
    """Shadow ``trainer.<name>`` with ``wrap(bound method)`` on this instance; False (warned) if absent."""
    original = getattr(trainer, name, None)
    if not callable(original):
        _warn_once(f"seam:{name}", "telemetry: %s has no %s(); %s go unattributed (transformers %s is tested)",
                   type(trainer).__name__, name, _SEAM_PHASES.get(name, "its phase"), SUPPORTED_TRANSFORMERS)
        return False
    if not seam_matches(original, TRAINER_SEAMS.get(name, ())):
        _warn_once(f"shape:{name}", "telemetry: %s.%s%s is not the shape the integration was tested with (%s); "
                   "its phase may be misattributed", type(trainer).__name__, name,
                   inspect.signature(original), ", ".join(TRAINER_SEAMS.get(name, ())))
    setattr(trainer, name, wrap(original))
    return True


def seam_matches(method: Callable, expected: tuple[str, ...]) -> bool:
    """Whether ``method`` takes ``expected`` as its leading parameters (or passes ``*args`` through)."""
    try:
        parameters = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError):
        return True
    if parameters and parameters[0].name == "self":  # the function on the class, not the bound method
        parameters = parameters[1:]
    named = []
    for parameter in parameters:
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            return list(expected[:len(named)]) == named
        if parameter.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            named.append(parameter.name)
    return named[:len(expected)] == list(expected)


def _make_callback(telemetry: TrainerTelemetry) -> Any:
    from transformers import TrainerCallback

    class GoodputCallback(TrainerCallback):
        """Closes the optimizer-step span at ``on_step_end`` and the last step at ``on_train_end``."""

        def on_step_end(self, args, state, control, **kwargs):
            telemetry.close_optimizer_step()

        def on_train_end(self, args, state, control, **kwargs):
            telemetry.close_step()

    return GoodputCallback()


def instrument_trainer(trainer: Any) -> TrainerTelemetry:
    """Trace this built trainer (what :func:`instrument_transformers` does for each new one).

    Idempotent; returns the trainer's :class:`TrainerTelemetry`. Telemetry must be started (by
    :func:`instrument_transformers`, or ``init_telemetry_driver``) for spans to be recorded.
    """
    from nemo_telemetry.instrument import RLSpanGroup as G

    existing = trainer.__dict__.get("_nemo_telemetry")
    if existing is not None:
        return existing
    telemetry = TrainerTelemetry(trainer)
    trainer.__dict__["_nemo_telemetry"] = telemetry
    _wrap_method(trainer, "train", telemetry.traced_train)
    _wrap_method(trainer, "get_batch_samples", telemetry.traced_get_batch_samples)
    _wrap_method(trainer, "training_step", telemetry.traced_training_step)
    _wrap_method(trainer, "compute_loss", telemetry.traced_leaf(G.POLICY_UPDATE, "forward"))
    _wrap_method(trainer, "evaluate", telemetry.traced_evaluate)
    # One overhead leaf over every batch of an evaluation: its loop's own costs (batching, gathering,
    # metrics) are evaluation too; the forward / generation seams inside it are unbucketed children.
    _wrap_method(trainer, "evaluation_loop", telemetry.traced_leaf(G.EVALUATE, "evaluation_loop",
                                                                   **{"rl.bucket": "overhead"}))
    _wrap_method(trainer, "_save_checkpoint", telemetry.traced_leaf(G.CHECKPOINT, "checkpointing"))
    accelerator = getattr(trainer, "accelerator", None)
    if accelerator is not None and callable(getattr(accelerator, "backward", None)):
        accelerator.backward = telemetry.traced_leaf(G.POLICY_UPDATE, "backward")(accelerator.backward)
    else:
        _warn_once("seam:backward", "telemetry: %s has no accelerator.backward(); the backward pass goes "
                   "unattributed", type(trainer).__name__)
    trainer.add_callback(_make_callback(telemetry))
    return telemetry


def _start_telemetry(trainer: Any, config: Any, groups: Iterable[str]) -> None:
    """Start this process's telemetry for ``trainer`` unless it is running already."""
    from nemo_telemetry.instrument import current_telemetry_config, init_telemetry_driver

    if current_telemetry_config() is not None:
        return
    info = launch_info()
    os.environ[env.NEMO_TELEMETRY_RUN_ID] = shared_run_id()
    otlp = os.environ.get(env.OTEL_EXPORTER_OTLP_ENDPOINT) or os.environ.get(env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
    output_dir = getattr(trainer.args, "output_dir", None) or "."
    settings: dict[str, Any] = {
        "enabled": True,
        "span_groups": ",".join(sorted(groups)),
        "exporter": "otlp" if otlp else "dump",
        "dump_dir": os.path.join(output_dir, "telemetry"),
    }
    if config is not None:
        settings.update(dict(config))
    algorithm = trainer_algorithm(trainer)
    # Every rank of a Trainer trains: the policy fleet, with the devices this process drives
    # (``args.n_gpu``: one under torchrun, all visible ones in single-process DataParallel, 0 on CPU).
    init_telemetry_driver(settings, algorithm=algorithm,
                          service_name=settings.get("service_name") or f"{algorithm}-trainer",
                          resource_attributes=trainer_resource_attributes(trainer, world_size=info.world_size),
                          rank=info.rank, world_size=info.world_size, local_rank=info.local_rank,
                          fleet="policy", gpus=_process_gpus(trainer.args))


def _process_gpus(args: Any) -> int | None:
    """The GPUs this Trainer process drives, or None (resolved from the environment) where the
    arguments do not say."""
    try:
        count = int(getattr(args, "n_gpu"))
    except Exception:  # a TrainingArguments-like object without a readable count
        return None
    return count if count >= 0 else None


def _built(trainer: Any, started_ns: int) -> None:
    """After the outermost traced ``__init__``: start telemetry, then trace the trainer."""
    try:
        groups_for = _installed.get("groups_for")
        groups = set(base_span_groups(trainer))
        if groups_for is not None:
            groups |= set(groups_for(trainer))
        _start_telemetry(trainer, _installed.get("config"), groups)
        telemetry = instrument_trainer(trainer)
        telemetry.built_ns = (started_ns, time.time_ns())
        for hook in _installed.get("on_built", ()):
            hook(telemetry)
    except Exception:
        _log.warning("telemetry: could not instrument %s; training goes on without it", type(trainer).__name__,
                     exc_info=True)


def traced_init(original: Callable) -> Callable:
    """``__init__`` of a trainer class: the outermost traced one times the build, then instruments it."""

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        depth = self.__dict__.get("_nemo_telemetry_init_depth", 0)
        self.__dict__["_nemo_telemetry_init_depth"] = depth + 1
        started = time.time_ns()
        try:
            original(self, *args, **kwargs)
        finally:
            self.__dict__["_nemo_telemetry_init_depth"] = depth
        if depth == 0:
            del self.__dict__["_nemo_telemetry_init_depth"]
            _built(self, started)

    __init__.__nemo_telemetry_original__ = original  # type: ignore[attr-defined]
    return __init__


def patch_init(cls: type) -> None:
    """Trace every ``cls(...)`` built from now on (idempotent)."""
    init = cls.__dict__.get("__init__")
    if init is None or hasattr(init, "__nemo_telemetry_original__"):
        return
    cls.__init__ = traced_init(init)
    _installed.setdefault("patched", []).append(cls)


def instrument_transformers(config: Any = None, *, groups_for: Callable[[Any], Iterable[str]] | None = None,
                            on_built: Callable[[TrainerTelemetry], None] | None = None) -> None:
    """Trace every ``transformers.Trainer`` built after this call (module docstring: what and how).

    ``config`` is a ``telemetry:`` block (``span_groups``, ``exporter``, ``dump_dir`` ...) over the
    integration's defaults; the environment's ``NEMO_TELEMETRY_*`` still win, as everywhere.
    ``groups_for(trainer)`` adds span groups for a kind of trainer, ``on_built`` runs for each
    traced trainer (TRL's adapter uses both). Idempotent; never raises into the caller except for
    a missing ``transformers``.
    """
    import transformers

    with _install_lock:
        _installed["config"] = config
        if groups_for is not None:
            _installed["groups_for"] = groups_for
        if on_built is not None:
            hooks = _installed.setdefault("on_built", [])
            if on_built not in hooks:
                hooks.append(on_built)
        patch_init(transformers.Trainer)


def uninstrument_transformers() -> None:
    """Undo :func:`instrument_transformers` for trainers built from now on (traced ones stay traced)."""
    with _install_lock:
        for cls in _installed.pop("patched", []):
            init = cls.__dict__.get("__init__")
            original = getattr(init, "__nemo_telemetry_original__", None)
            if original is not None:
                cls.__init__ = original
        _installed.clear()
