"""``run_demo``: an instrumented GRPO run on this machine, written to dump files, then analysed.

    result = run_demo(out="demo-run", steps=6, mode="async")
    result.goodput.total["goodput"]       # productive share of the steps' wall clock
    result.check.findings                 # what would make that number lie
    result.waterfall.rows                 # one step, as a tree

The run is real (Ray actors, threads, an HTTP server on 127.0.0.1); only the device work is
modelled with sleeps (see ``workload``). Telemetry goes through the dump exporter into
``<out>/dumps``; the dumps are ingested into ``<out>/dataset``, which the CLI and the notebook
read. Nothing is printed here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from nemo_telemetry.demo.trainer import MODES, PLACEMENTS, DemoSettings, TrainSummary
from nemo_telemetry.demo.workload import PhaseTimes
from nemo_telemetry.errors import DemoError

__all__ = ["DEFAULT_SPAN_GROUPS", "TRAINERS", "DemoError", "DemoResult", "run_demo"]

DEFAULT_SPAN_GROUPS = "per_step,per_prompt"
"""Every phase, the collector's batches and the per-prompt HTTP hop: the whole picture."""

TRAINERS = ("toy", "trl")
"""``toy``: the GRPO-shaped demo trainer (Ray actors, threads, HTTP); ``trl``: TRL's GRPOTrainer."""

_MARKER = ".nemo-telemetry-demo"  # an --out directory the demo made, so re-running may clear it
_OWNED = ("dumps", "dataset", "checkpoints", "model")


@dataclass(frozen=True)
class DemoResult:
    """Where the run went and what the analysis found in it.

    ``goodput`` is the run's :class:`~nemo_telemetry.analysis.goodput.steps.RunGoodput`, ``check`` the
    :class:`~nemo_telemetry.analysis.findings.checks.CheckReport`, ``waterfall`` one step's
    :class:`~nemo_telemetry.analysis.views.waterfall.Waterfall` (``waterfall_step``).
    """

    out: Path
    dumps: Path
    dataset: Path
    mode: str
    span_groups: str
    no_carrier: bool
    run_id: str
    steps: int
    wall_s: float
    spans: int
    traces: int
    train: TrainSummary
    goodput: object
    check: object
    waterfall: object
    waterfall_step: int
    trainer: str = "toy"
    placement: str = "colocated"


def run_demo(*, out: str | os.PathLike | None = None, steps: int = 6, mode: str = "sync",
             span_groups: str = DEFAULT_SPAN_GROUPS, seed: int = 0, no_carrier: bool = False,
             times: PhaseTimes | None = None, trainer: str = "toy", placement: str | None = None) -> DemoResult:
    """Run the demo trainer, ingest its dumps into ``<out>/dataset`` and analyse them.

    ``out`` defaults to a fresh temporary directory. An existing ``out`` the demo made before is
    reused (its dumps, dataset and checkpoints are replaced); any other non-empty one is refused.
    Ray: an already initialised cluster (or ``RAY_ADDRESS``) is joined, otherwise a 2-CPU local
    one is started and shut down at the end.

    ``trainer="trl"`` trains a tiny GRPO run with TRL's ``GRPOTrainer`` instead, traced by
    ``instrument_trl()`` alone (:mod:`nemo_telemetry.demo.trl_run`; needs the ``[trl]`` extra):
    its span groups are the ones the integration enables, and ``mode`` must be ``sync``.

    ``placement`` says where generation runs: ``colocated`` on the policy workers' GPUs (the
    default in sync mode) or ``split``, on a GPU of its own (the default, and the only choice, in
    async mode). Every process declares its fleet and GPUs, and the driver describes the placement
    in the run's resource attributes, for ``goodput --by fleet``.
    """
    if trainer not in TRAINERS:
        raise DemoError(f"trainer {trainer!r}: choose one of {', '.join(TRAINERS)}")
    if trainer == "trl" and mode != "sync":
        raise DemoError("demo --trainer trl runs TRL's synchronous GRPO loop: use --mode sync")
    if trainer == "trl" and placement is not None:
        raise DemoError("demo --trainer trl trains and generates in one process: --placement does not apply")
    settings = _settings(steps=steps, mode=mode, seed=seed, no_carrier=no_carrier, times=times, placement=placement)
    root = _prepare_out(out)
    dumps = root / "dumps"
    config = {"enabled": True, "span_groups": span_groups, "exporter": "dump", "dump_dir": str(dumps)}
    settings = dataclasses.replace(settings, checkpoint_dir=str(root / "checkpoints"))
    started = time.monotonic()
    with _fresh_telemetry_environment():
        if trainer == "trl":
            from nemo_telemetry.demo.trl_run import CHECKPOINT_EVERY, train_trl

            summary, run_id = train_trl(root, steps=settings.steps, seed=settings.seed)
            settings = dataclasses.replace(settings, checkpoint_every=CHECKPOINT_EVERY)
            span_groups = "the TRL integration's"
        else:
            summary, run_id = _train_with_telemetry(config, settings)
    wall_s = time.monotonic() - started
    return _analyse(root, settings, span_groups, run_id, summary, wall_s, trainer=trainer)


def _settings(*, steps: int, mode: str, seed: int, no_carrier: bool, times: PhaseTimes | None,
              placement: str | None = None) -> DemoSettings:
    if mode not in MODES:
        raise DemoError(f"mode {mode!r}: choose one of {', '.join(MODES)}")
    placement = placement or ("split" if mode == "async" else "colocated")
    if placement not in PLACEMENTS:
        raise DemoError(f"placement {placement!r}: choose one of {', '.join(PLACEMENTS)}")
    if mode == "async" and placement == "colocated":
        raise DemoError("async GRPO generates while the policy trains, so generation needs GPUs of its own: "
                        "use --placement split (the default with --mode async)")
    if not 1 <= int(steps) <= 1000:
        raise DemoError(f"steps={steps}: choose between 1 and 1000")
    return DemoSettings(steps=int(steps), mode=mode, placement=placement, seed=int(seed),
                        no_carrier=bool(no_carrier), times=times or PhaseTimes())


def _prepare_out(out: str | os.PathLike | None) -> Path:
    if out is None:
        root = Path(tempfile.mkdtemp(prefix="nemo-telemetry-demo-"))
    else:
        root = Path(out).expanduser().resolve()
        if root.exists() and not root.is_dir():
            raise DemoError(f"--out {root}: exists and is not a directory; choose a directory")
        if root.is_dir() and any(root.iterdir()) and not (root / _MARKER).exists():
            raise DemoError(f"--out {root}: not empty and not a previous demo's output; "
                            "choose a new or empty directory")
    root.mkdir(parents=True, exist_ok=True)
    (root / _MARKER).write_text("written by nemo-telemetry demo; re-running replaces dumps/ dataset/ checkpoints/\n")
    for name in _OWNED:
        shutil.rmtree(root / name, ignore_errors=True)
    return root


@contextlib.contextmanager
def _fresh_telemetry_environment() -> Iterator[None]:
    """Run with no inherited ``NEMO_TELEMETRY_*`` variables (a fresh run id), then put them back.

    The demo's flags define its telemetry; a variable left by an earlier run in this process
    (``init_telemetry_driver`` writes them for the workers) would otherwise win over them.
    """
    saved = {k: v for k, v in os.environ.items() if k.startswith("NEMO_TELEMETRY_")}
    for key in saved:
        del os.environ[key]
    try:
        yield
    finally:
        for key in [k for k in os.environ if k.startswith("NEMO_TELEMETRY_")]:
            del os.environ[key]
        os.environ.update(saved)


def _train_with_telemetry(config: dict, settings: DemoSettings) -> tuple[TrainSummary, str]:
    from nemo_telemetry.demo.actors import SERVICE_NAMES
    from nemo_telemetry.demo.trainer import fleet_gpus, run_config, train
    from nemo_telemetry.instrument import init_telemetry_driver, shutdown_telemetry
    from nemo_telemetry.instrument.environment_variables import NEMO_TELEMETRY_RUN_ID

    init_telemetry_driver(config, algorithm="grpo", service_name=SERVICE_NAMES["driver"],
                          run_config=run_config(settings), fleet="driver", gpus=fleet_gpus(settings)["driver"])
    run_id = os.environ.get(NEMO_TELEMETRY_RUN_ID, "")
    try:
        summary = train(settings)
    finally:
        shutdown_telemetry()
    return summary, run_id


def _analyse(root: Path, settings: DemoSettings, span_groups: str, run_id: str, summary: TrainSummary,
             wall_s: float, *, trainer: str = "toy") -> DemoResult:
    from nemo_telemetry.analysis import ingest, read_spans
    from nemo_telemetry.analysis.findings.checks import check_run
    from nemo_telemetry.analysis.goodput.steps import run_goodput
    from nemo_telemetry.analysis.ingestion.metrics import with_step_metrics
    from nemo_telemetry.analysis.views.waterfall import waterfall

    dumps, dataset = root / "dumps", root / "dataset"
    ingested = ingest([dumps], out=dataset)
    spans = read_spans(dataset)
    runs = with_step_metrics(run_goodput(spans, run_id=run_id), dataset)
    if not runs:
        raise DemoError(f"the run wrote no job or bucketed spans to {dumps}; enable the job group "
                        "(every preset has it) to get a report")
    step = _waterfall_step(settings)
    return DemoResult(
        out=root, dumps=dumps, dataset=dataset, mode=settings.mode, span_groups=span_groups,
        no_carrier=settings.no_carrier, run_id=run_id, steps=settings.steps, wall_s=wall_s,
        spans=ingested.spans, traces=ingested.traces, train=summary, goodput=runs[0],
        check=check_run(spans, run_id=run_id), waterfall=waterfall(spans, step=step, run_id=run_id),
        waterfall_step=step, trainer=trainer, placement=settings.placement,
    )


def _waterfall_step(settings: DemoSettings) -> int:
    """The step worth looking at: the first checkpointing one (its finalize outlives it), else the last."""
    return min(settings.checkpoint_every, settings.steps)
