"""Stacked bar charts of goodput per step: a PNG (matplotlib) or a self-contained HTML page (SVG).

One bar per step, its height the step's wall clock, stacked by bucket with the unattributed
gap on top; one panel per run. Runs analysed ``by="fleet"`` get one bar per fleet with GPUs
instead, its height the fleet's GPU-seconds, stacked productive / overhead / wasted / idle /
unknown. The HTML page needs nothing but a browser: inline SVG, every
run id and label escaped.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

from nemo_telemetry.analysis.goodput.steps import BUCKETS, RunGoodput
from nemo_telemetry.errors import NemoTelemetryError

__all__ = ["BUCKET_COLOURS", "write_goodput_plot"]

BUCKET_COLOURS = {"productive": "#2ca02c", "overhead": "#ffbf00", "idle": "#1f77b4", "wasted": "#d62728",
                  "unattributed": "#bbbbbb"}
_COLOURS = {**BUCKET_COLOURS, "unknown": "#bbbbbb"}  # a fleet's unknown GPU-seconds: grey, as unattributed time
_LAYERS = (*BUCKETS, "unattributed")
_FLEET_LAYERS = ("productive", "overhead", "wasted", "idle", "unknown")


@dataclass(frozen=True)
class _Chart:
    """One panel: a bar per label, stacked by ``keys``; its axis labels and caption."""

    labels: list
    layers: dict
    keys: tuple
    xlabel: str
    unit: str
    caption: str


def _chart(run: RunGoodput) -> _Chart:
    goodput = run.total.get("goodput")
    if run.fleets is not None:
        rows = [r for r in run.fleets.fleets.to_pylist() if r["gpus"] > 0]
        cluster = run.fleets.cluster.get("goodput")
        caption = f"run {run.run_id}: cluster goodput {cluster:.1%}" if cluster is not None else f"run {run.run_id}"
        return _Chart([r["fleet"] for r in rows], {k: [r[f"{k}_gpu_s"] for r in rows] for k in _FLEET_LAYERS},
                      _FLEET_LAYERS, "fleet (rl.fleet)", "GPU-seconds", caption)
    rows = run.steps.to_pylist()
    caption = f"run {run.run_id}: goodput {goodput:.1%}" if goodput is not None else f"run {run.run_id}"
    return _Chart([r["iteration"] for r in rows], {k: [r[f"{k}_s"] for r in rows] for k in _LAYERS}, _LAYERS,
                  "step (rl.iteration)", "seconds", caption)


def write_goodput_plot(runs: tuple[RunGoodput, ...], path: Path) -> Path:
    """Write the chart to ``path`` (``.png`` or ``.html``) and return it."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".png":
        _png(runs, path)
    elif suffix == ".html":
        path.write_text(_html(runs), encoding="utf-8")
    else:
        raise NemoTelemetryError(f"{path}: a goodput plot is written as .png or .html")
    return path


def _png(runs: tuple[RunGoodput, ...], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise NemoTelemetryError("a .png plot needs matplotlib: pip install 'nemo-telemetry[plot]', "
                                 "or write .html instead") from None
    fig, axes = plt.subplots(max(len(runs), 1), 1, figsize=(10, 3 * max(len(runs), 1)), squeeze=False)
    for ax, run in zip(axes[:, 0], runs):
        chart = _chart(run)
        steps, layers = [str(x) for x in chart.labels], chart.layers
        bottom = [0.0] * len(steps)
        for key in chart.keys:
            ax.bar(steps, layers[key], bottom=bottom, color=_COLOURS[key], label=key, width=0.8)
            bottom = [b + v for b, v in zip(bottom, layers[key])]
        ax.set_title(chart.caption)
        ax.set_xlabel(chart.xlabel)
        ax.set_ylabel(chart.unit)
        ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _html(runs: tuple[RunGoodput, ...]) -> str:
    panels = "\n".join(_svg_panel(run) for run in runs) or "<p>no steps</p>"
    fleets = any(run.fleets is not None for run in runs)
    keys = _FLEET_LAYERS if fleets else BUCKET_COLOURS
    legend = " ".join(f'<span style="background:{_COLOURS[k]};padding:0 .6em;margin-right:.3em"></span>{k}'
                      for k in keys)
    what = "GPU-seconds per fleet" if fleets else "goodput per step"
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{what}</title>"
            "<style>body{font-family:sans-serif;margin:1em} svg{background:#fafafa}</style></head><body>"
            f"<h1>{what}</h1><p>{legend}</p>{panels}</body></html>\n")


def _svg_panel(run: RunGoodput, width: int = 900, height: int = 240) -> str:
    chart = _chart(run)
    steps, layers, keys = chart.labels, chart.layers, chart.keys
    what, unit = ("fleet", "GPU-s") if run.fleets is not None else ("step", "s")
    tallest = max([sum(layers[k][i] for k in keys) for i in range(len(steps))] or [1.0]) or 1.0
    slot = width / max(len(steps), 1)
    rects = []
    for i, step in enumerate(steps):
        y = float(height)
        for key in keys:
            h = layers[key][i] / tallest * (height - 10)
            if h <= 0:
                continue
            y -= h
            title = html.escape(f"{what} {step}: {key} {layers[key][i]:.3f} {unit}")
            rects.append(f'<rect class="{key}" x="{i * slot + 1:.1f}" y="{y:.1f}" width="{max(slot - 2, 1):.1f}" '
                         f'height="{h:.1f}" fill="{_COLOURS[key]}"><title>{title}</title></rect>')
    caption = chart.caption
    return (f'<h2>{html.escape(caption)}</h2><svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
            f'height="{height}" data-run="{html.escape(str(run.run_id), quote=True)}">{"".join(rects)}</svg>')
