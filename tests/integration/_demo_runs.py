"""Demo runs shared by test_demo.py and test_notebook.py: each (mode, steps, carrier) runs once.

A run starts five Ray actors and takes several seconds, so the suite keeps to four of them. The
runs join the session's Ray cluster (the ``ray_cluster`` fixture), as ``run_demo`` does with any
cluster this process already has.
"""

from __future__ import annotations

from pathlib import Path

from nemo_telemetry.demo import DemoResult, run_demo

_RUNS: dict[tuple, DemoResult] = {}


def demo_run(base: Path, *, mode: str, steps: int, no_carrier: bool = False,
             placement: str | None = None) -> DemoResult:
    """The result of ``run_demo`` for these settings, run on first use under ``base``."""
    key = (mode, steps, no_carrier, placement)
    if key not in _RUNS:
        out = base / f"demo-{mode}-{steps}{'-no-carrier' if no_carrier else ''}{'-' + placement if placement else ''}"
        _RUNS[key] = run_demo(out=out, steps=steps, mode=mode, no_carrier=no_carrier, placement=placement)
    return _RUNS[key]


def spans_frame(result: DemoResult):
    """The run's spans as a pandas frame, with ``attributes`` as dicts (tests only)."""
    from nemo_telemetry.analysis import read_spans

    frame = read_spans(result.dataset).to_pandas()
    for column in ("name", "service_name", "rl.bucket", "kind", "run_id", "status_code"):
        frame[column] = frame[column].astype(object)
    frame["attributes"] = frame["attributes"].map(lambda pairs: dict(pairs) if pairs is not None else {})
    return frame
