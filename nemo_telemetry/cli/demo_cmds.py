"""``demo``: run a small instrumented GRPO job on this machine, then print its goodput report."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from nemo_telemetry.cli._common import EXIT_FINDINGS, console, library_errors
from nemo_telemetry.cli.app import app

if TYPE_CHECKING:
    from rich.console import Console

DEFAULT_OUT = Path("demo-out")


@app.command("demo")
def demo_command(
    out: Path = typer.Option(DEFAULT_OUT, "--out", help="Directory for dumps/, dataset/ and checkpoints/ "
                                                        "(the notebook reads <out>/dataset)."),
    steps: int = typer.Option(6, "--steps", min=1, max=1000, help="Training steps to run."),
    mode: str = typer.Option("sync", "--mode", help="sync: generate then train; async: a collector actor "
                                                    "generates while the driver trains."),
    span_groups: str = typer.Option("per_step,per_prompt", "--span-groups",
                                    help="span_groups spec for the run (try default, per_step, all)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the toy task."),
    no_carrier: bool = typer.Option(False, "--no-carrier",
                                    help="Withhold the job's trace carrier from the collector (async), "
                                         "to see what a detached trace looks like."),
    placement: str = typer.Option(None, "--placement",
                                  help="colocated: generation shares the policy workers' GPUs (default for "
                                       "--mode sync); split: generation has a GPU of its own (default, and "
                                       "required, for --mode async). Shows in goodput --by fleet."),
    trainer: str = typer.Option("toy", "--trainer",
                                help="toy: the GRPO-shaped demo trainer; trl: a tiny GRPO run with Hugging Face "
                                     "TRL on the CPU, traced by instrument_trl() (needs the [trl] extra)."),
) -> None:
    """Run an instrumented GRPO-shaped job (Ray actors, threads, an HTTP reward server on
    127.0.0.1), write its spans with the dump exporter, ingest them, and print the goodput table,
    the findings and one step's waterfall. Exit 1 when a finding is at error severity.

    Example: nemo-telemetry demo --mode async --steps 6 --out ./demo-run

    Example: nemo-telemetry demo --placement split --steps 6

    Example: nemo-telemetry demo --trainer trl --steps 5
    """
    from nemo_telemetry.demo import run_demo  # Ray and the analysis load only here

    out_console = console()
    with library_errors():
        what = "TRL GRPOTrainer" if trainer == "trl" else f"{mode}, {placement or 'default placement'}, " \
                                                          f"span_groups={span_groups}"
        with out_console.status(f"running the demo ({what}, {steps} steps) ..."):
            result = run_demo(out=out, steps=steps, mode=mode, span_groups=span_groups, seed=seed,
                              no_carrier=no_carrier, trainer=trainer, placement=placement)
    print_demo_report(result, out_console)
    if result.check.has("error"):
        raise typer.Exit(EXIT_FINDINGS)


def print_demo_report(result, out: Console) -> None:
    """The run's header, then the same renderings ``goodput``, ``check`` and ``waterfall`` print."""
    from nemo_telemetry.cli.render import bar_width_for, print_waterfall, render_report, render_run

    carrier = ", collector WITHOUT the job's carrier" if result.no_carrier else ""
    if result.trainer == "trl":
        out.print(f"[bold]nemo-telemetry demo[/]: Hugging Face TRL GRPOTrainer (CPU, tiny random Qwen2), "
                  f"{result.steps} steps, traced by instrument_trl()")
    else:
        out.print(f"[bold]nemo-telemetry demo[/]: {result.mode} GRPO, generation {result.placement}, "
                  f"{result.steps} steps, span_groups={result.span_groups}{carrier}")
    out.print(f"run {result.run_id}: {result.spans} spans in {result.traces} trace(s), "
              f"{result.wall_s:.1f} s wall; dataset {result.dataset}")
    out.print()
    out.print(render_run(result.goodput, bar_width=bar_width_for(out.width)))
    out.print()
    out.print(render_report(result.check))
    out.print()
    out.print(f"[bold]step {result.waterfall_step}[/] (nemo-telemetry waterfall {result.dataset} "
              f"--step {result.waterfall_step})")
    print_waterfall(result.waterfall, out)
    out.print()
    out.print(f"Next: nemo-telemetry goodput {result.dataset} --plot goodput.html, or the notebook "
              f"(NEMO_TELEMETRY_DATASET={result.dataset} jupyter lab notebooks/goodput.ipynb)")
