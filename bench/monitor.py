"""The monitor's state over a long run: spans/s, peak RSS and state size at 10^4 .. 10^6 steps.

Spans are the synthetic generator's (``analysis/synthetic.py``: one rank's step span and its ten
bucketed children), decoded once, then tiled step after step (iteration, times and ids shifted) and
streamed through :class:`MonitorState` in batches of ``--batch-steps`` steps, each batch followed by
``finished_steps()`` as the monitor's loop does. The baseline is the same run's first checkpoint
(10^4 steps): bounded memory means the state size and RSS at 10^6 steps stay near it, and spans/s
does not fall with the run's length. Offline ``run_goodput`` on the first 10^4 steps' spans is
printed beside it for the rate of the rules applied once to a whole table.

    python bench/monitor.py --steps 1000000     # about 11 M spans
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from nemo_telemetry.analysis import MonitorState, load_traces, run_goodput
from nemo_telemetry.analysis.synthetic import synthetic_requests, write_json_lines

STEP_NS = 30_000_000_000
LATER = 1 << 62  # a "now" after every synthetic step


def template() -> pa.Table:
    """One step's spans from the synthetic generator, with their uint64 id keys."""
    from nemo_telemetry.analysis import with_id_keys

    with tempfile.TemporaryDirectory() as folder:
        path = write_json_lines(Path(folder) / "one.jsonl", synthetic_requests(11, ranks=1, spans_per_request=11))
        spans = with_id_keys(load_traces(path).spans)
    return spans.select(["name", "start_ns", "end_ns", "run_id", "rl.bucket", "rl.iteration",
                         "trace_key", "span_key", "parent_key"])


def batch(base: pa.Table, first_step: int, steps: int) -> pa.Table:
    n = base.num_rows
    shift = np.repeat(np.arange(first_step, first_step + steps, dtype=np.int64), n)
    rows = np.tile(np.arange(n), steps)
    out = base.take(pa.array(rows))
    salt = (shift.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
    parent = out.column("parent_key").to_numpy().astype(np.uint64)
    columns = {
        "start_ns": pa.array(out.column("start_ns").to_numpy() + shift * STEP_NS),
        "end_ns": pa.array(out.column("end_ns").to_numpy() + shift * STEP_NS),
        "rl.iteration": pa.array(shift),
        "trace_key": pa.array(out.column("trace_key").to_numpy().astype(np.uint64) ^ salt),
        "span_key": pa.array(out.column("span_key").to_numpy().astype(np.uint64) ^ salt),
        "parent_key": pa.array(np.where(parent == 0, np.uint64(0), parent ^ salt)),
    }
    for name, values in columns.items():
        out = out.set_column(out.schema.get_field_index(name), name, values)
    return out


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--batch-steps", type=int, default=2_000)
    args = parser.parse_args()
    print(f"load: {open('/proc/loadavg').read().strip()}  cpus: {os.cpu_count()}")
    base = template()
    checkpoints = [c for c in (10_000, 100_000, 1_000_000, 10_000_000) if c <= args.steps] or [args.steps]

    first = batch(base, 0, checkpoints[0])
    started = time.perf_counter()
    run_goodput(first)
    offline_s = time.perf_counter() - started
    print(f"offline run_goodput on {checkpoints[0]} steps ({first.num_rows} spans): "
          f"{first.num_rows / offline_s:,.0f} spans/s")
    del first

    state = MonitorState(grace_s=0)
    done, reported, started = 0, 0, time.perf_counter()
    rows = []
    while done < args.steps:
        steps = min(args.batch_steps, args.steps - done)
        state.add(batch(base, done, steps))
        reported += len(state.finished_steps(LATER))  # synthetic time runs past the clock: close by span time
        done += steps
        if done in checkpoints:  # the rate since the last checkpoint: does it fall as the run grows?
            now = time.perf_counter()
            before = rows[-1] if rows else (0, 0, 0.0, 0.0, {}, 0, started)
            rate = (state.spans - before[1]) / (now - before[6])
            rows.append((done, state.spans, rate, peak_rss_mib(), state.size(), reported, now))
            print(f"  {done} steps  load {open('/proc/loadavg').read().split()[0]}", flush=True)
    reported += len(state.finish())
    baseline = rows[0]
    print(f"{'steps':>9} {'spans':>11} {'spans/s':>9} {'x base':>6} {'peak RSS MiB':>12} {'x base':>6}  state"
          "   (spans/s: since the previous checkpoint)")
    for steps, spans, rate, rss, size, _, _ in rows:
        print(f"{steps:>9} {spans:>11} {rate:>9,.0f} {rate / baseline[2]:>6.2f} {rss:>12.0f} "
              f"{rss / baseline[3]:>6.2f}  {size}")
    print(f"steps reported: {reported} of {args.steps}; streaming rate / offline rate at the first checkpoint: "
          f"{baseline[2] / (baseline[1] / offline_s) if offline_s else float('nan'):.2f}")


if __name__ == "__main__":
    main()
