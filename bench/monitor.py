"""The monitor's state over a long run: spans/s, peak RSS and state size at 10^4 .. 10^6 steps.

Spans are the synthetic generator's (``analysis/synthetic.py``: one rank's step span and its ten
bucketed children), decoded once, then tiled step after step (iteration, times and ids shifted) and
streamed through :class:`MonitorState` in batches of ``--batch-steps`` steps, each batch followed by
``finished_steps()`` as the monitor's loop does. The baseline is the same run's first checkpoint
(10^4 steps): bounded memory means the state size and RSS at 10^6 steps stay near it, and spans/s
does not fall with the run's length. Offline ``run_goodput`` on the first 10^4 steps' spans is
printed beside it for the rate of the rules applied once to a whole table.

    python bench/monitor.py --steps 1000000     # about 11 M spans

``--part batch``: the monitor's whole work per batch of spans as a followed dump gives them (full
span tables): the state (``MonitorState.add`` and ``finished_steps``) plus the findings it shows
(invalid-interval, unknown-bucket, umbrella-bucket), by ``check_batch`` (what the monitor runs)
and, as the baseline, by ``check_run`` on the batch with those three codes kept (what it ran
before ``check_batch``). Both give the same findings (asserted here, tested in
``tests/analysis/test_batch_findings.py``).

``--part replay``: a backlog of ``--spans`` spans (default 1M) in a dump directory, replayed
through ``run_monitor(follow=...)`` (what ``monitor --follow DIR --until-idle S`` runs), against
the offline work on the same spans: one decode (``read_spans``), ``run_goodput`` and
``check_run``. The replay's time is its wall clock less the idle wait that ends it.
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

from nemo_telemetry.analysis import MonitorState, check_run, load_traces, read_spans, run_goodput, run_monitor
from nemo_telemetry.analysis.findings.checks import BATCH_FINDING_CODES, check_batch
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
                         "trace_key", "span_key", "parent_key", "trace_low"])


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


def _load() -> str:
    return open("/proc/loadavg").read().split()[0]


def synthetic_dumps(folder: Path, spans: int) -> Path:
    """``spans`` synthetic spans (8 ranks) as one JSON-lines dump in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    return write_json_lines(folder / "traces.jsonl", synthetic_requests(spans, ranks=8))


def batch_part(args: argparse.Namespace) -> None:
    """Per batch: the state, and the findings by check_batch (now) or check_run (before)."""
    with tempfile.TemporaryDirectory() as folder:
        spans = load_traces(synthetic_dumps(Path(folder), args.spans)).spans
    batches = [spans.slice(at, args.batch_rows) for at in range(0, spans.num_rows, args.batch_rows)]
    print(f"{spans.num_rows} spans in {len(batches)} batches of {args.batch_rows} rows")

    def kept(report) -> list:
        return [f for f in report.findings if f.code in BATCH_FINDING_CODES]

    for one in batches[:3]:  # the figures compare equal work
        assert kept(check_batch(one)) == kept(check_run(one))
    rows = {"state": [], "check_batch": [], "check_run": []}
    for _ in range(args.rounds):  # rounds alternate the sides, so load from other processes hits both alike
        state = MonitorState(grace_s=0)
        for one in batches:
            started = time.perf_counter()
            state.add(one)
            state.finished_steps(LATER)
            middle = time.perf_counter()
            check_batch(one, max_findings_per_code=5)
            after = time.perf_counter()
            kept(check_run(one, max_findings_per_code=5))
            rows["state"].append(middle - started)
            rows["check_batch"].append(after - middle)
            rows["check_run"].append(time.perf_counter() - after)
    n = len(batches) * args.rounds
    ms = {k: 1e3 * sum(v) / n for k, v in rows.items()}
    print(f"load {_load()}; per batch, mean over {n} batches:")
    print(f"  state (add + finished_steps)       {ms['state']:8.2f} ms")
    print(f"  findings by check_batch (now)      {ms['check_batch']:8.2f} ms  "
          f"({ms['check_batch'] / ms['state']:.2f}x the state)")
    print(f"  findings by check_run (before)     {ms['check_run']:8.2f} ms  "
          f"({ms['check_run'] / ms['state']:.2f}x the state)")
    before, after = ms["state"] + ms["check_run"], ms["state"] + ms["check_batch"]
    print(f"  whole per-batch cost: before {before:.2f} ms, now {after:.2f} ms ({before / after:.2f}x less)")


def replay_part(args: argparse.Namespace) -> None:
    """A backlog through monitor --follow against the offline goodput + check of the same spans."""
    with tempfile.TemporaryDirectory() as folder:
        dumps = Path(folder) / "dumps"
        synthetic_dumps(dumps, args.spans)
        size = sum(p.stat().st_size for p in dumps.rglob("*") if p.is_file())
        print(f"{args.spans} spans, {size / 2**20:.0f} MiB of JSON lines; load {_load()}")
        started = time.perf_counter()
        spans = read_spans(dumps)
        decoded = time.perf_counter()
        run_goodput(spans)
        goodput = time.perf_counter()
        report = check_run(spans)
        offline = time.perf_counter() - started
        print(f"  offline: decode {decoded - started:.2f} s + goodput {goodput - decoded:.2f} s + check "
              f"{offline - (goodput - started):.2f} s = {offline:.2f} s ({report.counts['error']} errors)")
        del spans
        steps = []
        started = time.perf_counter()
        summary = run_monitor(follow=dumps, until_idle_s=args.idle_s, poll_s=args.poll_s, grace_s=0,
                              on_step=steps.append)
        replay = time.perf_counter() - started - args.idle_s
        print(f"  monitor --follow (poll {args.poll_s:g} s): {replay:.2f} s for {summary.spans} spans, "
              f"{summary.steps_reported} steps reported (wall less the {args.idle_s:g} s idle wait); load {_load()}")
        print(f"  replay / offline: {replay / offline:.2f}x (target <= 3x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("state", "batch", "replay"), default="state")
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--batch-steps", type=int, default=2_000)
    parser.add_argument("--spans", type=int, default=None, help="batch: 200k spans; replay: 1M spans")
    parser.add_argument("--batch-rows", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--poll-s", type=float, default=0.5, help="replay: the monitor's poll period (its default)")
    parser.add_argument("--idle-s", type=float, default=1.0, help="replay: --until-idle")
    args = parser.parse_args()
    print(f"load: {open('/proc/loadavg').read().strip()}  cpus: {os.cpu_count()}")
    if args.part != "state":
        args.spans = args.spans or (200_000 if args.part == "batch" else 1_000_000)
        (batch_part if args.part == "batch" else replay_part)(args)
        return
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
