"""Benchmark: goodput at 1M and 10M spans on the local engines and on Ray; ingest on both engines.

    .venv/bin/python bench/scale.py [--spans 1000000 10000000] [--ingest-spans 1000000] [--dir DIR]

Data is generated once into DIR (a temp dir by default): per size, a Parquet dataset in ingest's
run/rank layout (two runs, GRPO-shaped steps of ~500 spans: the step and its phases on rank 0,
an unstamped training umbrella, and on each of 8 worker ranks an unstamped ``rl.policy.train``
with 60 bucketed, unstamped micro-batches, so every micro-batch walks two levels up, across
partitions, for its iteration), and OTLP JSON-lines dumps (8 files) for the ingest figures.

Each measurement runs in a fresh child process and prints wall seconds and peak RSS:

- ``memory``: ``run_goodput(read_for_analysis(dataset))``, the whole table in memory (baseline);
- ``stream``: ``stream_goodput``, the out-of-core local engine, one batch at a time; its
  per-partition cost is the map step (the per-batch partials) timed partition by partition;
- ``ray``: ``ray_goodput`` on a local Ray cluster started by the child (start-up not counted;
  the RSS is the driver's plus the largest Ray worker's);
- ``check-memory`` / ``check-ray``: ``check_run`` on the whole table, and ``ray_check`` (the
  findings computed by Ray tasks file by file, merged on the driver), reports checked equal;
- ``ingest-local`` / ``ingest-ray``: the dumps into a fresh dataset.

Every engine's result is checked equal to the baseline's before its figures are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from _columns import dictionary, uint64_hex  # bench/_columns.py (this script's folder is on sys.path)
from nemo_telemetry.analysis.model.tables import SPANS_TABLE_SCHEMA
from nemo_telemetry.analysis.store.dataset import span_file_table
from nemo_telemetry.analysis.store.partitions import split_by_partition

RANKS = 8
MICROBATCHES = 60
STEP_NS = 30_000_000_000
S = 1_000_000_000
T0 = 1_767_225_600 * S
NAMES = ["rl.grpo.job", "rl.grpo.step", "rl.grpo.generation", "rl.grpo.logprob", "rl.grpo.reward",
         "rl.grpo.data", "rl.grpo.policy_training", "rl.policy.train", "rl.policy.microbatch", "rl.idle.refit"]
BUCKET_VALUES = ["productive", "overhead", "idle"]


def _template() -> dict[str, np.ndarray]:
    """One step: (name, parent index in the step or -1 = job, start s, end s, bucket, stamped, rank)."""
    rows = [(1, -1, 0.0, 29.0, -1, True, 0)]  # 0: step
    for name, a, b, bucket in ((2, 0.0, 10.0, 0), (3, 10.0, 13.0, 0), (4, 13.0, 14.0, 0), (5, 14.0, 15.0, 1)):
        rows.append((name, 0, a, b, bucket, True, 0))  # 1..4 phases
    rows.append((6, 0, 15.0, 27.0, -1, False, 0))  # 5: training umbrella, unstamped
    rows.append((9, 0, 27.0, 28.5, 2, True, 0))  # 6: refit idle
    for rank in range(1, RANKS + 1):
        train = len(rows)
        rows.append((7, 5, 15.0, 27.0, -1, False, rank))
        for k in range(MICROBATCHES):
            rows.append((8, train, 15.0 + 0.2 * k, 15.0 + 0.2 * k + 0.15 + 0.01 * (k % 3), 0, False, rank))
    keys = ("name", "parent", "start", "end", "bucket", "stamped", "rank")
    return {k: np.array(v) for k, v in zip(keys, zip(*rows))}


SPANS_PER_STEP = len(_template()["name"])


def _chunk(run_id: str, trace: np.uint64, job_key: np.uint64, first_step: int, steps: int,
           rng: np.random.Generator) -> pa.Table:
    t = _template()
    p = SPANS_PER_STEP
    n = steps * p
    step_of = np.repeat(np.arange(first_step, first_step + steps), p)
    offset = np.tile(np.arange(p), steps)
    span_key = rng.integers(1, 2**63, n, dtype=np.int64).astype(np.uint64)
    parent_row = (step_of - first_step) * p + t["parent"][offset]
    parent_key = np.where(t["parent"][offset] >= 0, span_key[np.maximum(parent_row, 0)], job_key)
    base = T0 + step_of.astype(np.int64) * STEP_NS
    start = base + (t["start"][offset] * S).astype(np.int64)
    end = base + (t["end"][offset] * S).astype(np.int64)
    stamped = t["stamped"][offset]
    trace_key = np.full(n, trace, dtype=np.uint64)
    return _table(run_id, trace_key, span_key, parent_key, t["name"][offset], start, end, t["bucket"][offset],
                  np.where(stamped, step_of + 1, 0), stamped, t["rank"][offset])


def _table(run_id, trace_key, span_key, parent_key, name, start, end, bucket, iteration, stamped, rank) -> pa.Table:
    n = len(span_key)
    empty_map = pa.MapArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), pa.array([], pa.string()),
                                        pa.array([], pa.string()))
    columns = {
        "trace_id": uint64_hex(trace_key, 32), "span_id": uint64_hex(span_key),
        "parent_span_id": pa.array(uint64_hex(parent_key).to_numpy(zero_copy_only=False), pa.string(), mask=parent_key == 0),
        "name": dictionary(name, NAMES), "kind": dictionary(np.ones(n), ["unspecified", "internal"]),
        "start_ns": pa.array(start), "end_ns": pa.array(end), "duration_ns": pa.array(end - start),
        "status_code": dictionary(np.zeros(n), ["unset"]), "status_message": pa.nulls(n, pa.string()),
        "service_name": dictionary(np.minimum(rank, 1), ["driver", "policy_worker"]),
        "run_id": dictionary(np.zeros(n), [run_id]), "rank": pa.array(rank.astype(np.int64)),
        "span_groups": pa.nulls(n, SPANS_TABLE_SCHEMA.field("span_groups").type),
        "rl.bucket": dictionary(bucket, BUCKET_VALUES),
        "rl.iteration": pa.array(iteration.astype(np.int64), mask=~stamped),
        "rl.efficiency.category": pa.nulls(n, SPANS_TABLE_SCHEMA.field("rl.efficiency.category").type),
        "trace_state": pa.nulls(n, pa.string()), "scope_name": dictionary(np.zeros(n), ["nemo_telemetry"]),
        "scope_version": pa.nulls(n, SPANS_TABLE_SCHEMA.field("scope_version").type),
        "attributes": empty_map, "resource_attributes": empty_map,
        "trace_key": pa.array(trace_key), "span_key": pa.array(span_key), "parent_key": pa.array(parent_key),
        "trace_low": pa.array(np.zeros(n, np.uint64)),  # ids padded on the right: the low half 0, whose mix is 0
    }
    return pa.table([columns.get(f.name, pa.nulls(n, f.type)).cast(f.type) for f in SPANS_TABLE_SCHEMA],
                    schema=SPANS_TABLE_SCHEMA)


def write_dataset(root: Path, spans: int, *, steps_per_chunk: int = 2_000) -> None:
    """Two runs of ``spans`` spans in all, written chunk by chunk into run/rank partitions."""
    rng = np.random.default_rng(7)
    steps_per_run = max(1, spans // (2 * SPANS_PER_STEP))
    for r in range(2):
        run_id = f"scale-run-{r}"
        trace, job_key = (np.uint64(v) for v in rng.integers(1, 2**63, 2))
        job = _table(run_id, np.array([trace]), np.array([job_key]), np.zeros(1, np.uint64), np.zeros(1, np.int64),
                     np.array([T0 - S]), np.array([T0 + (steps_per_run + 1) * STEP_NS]), np.array([-1]),
                     np.zeros(1, np.int64), np.zeros(1, bool), np.zeros(1, np.int64))
        for index, first in enumerate(range(0, steps_per_run, steps_per_chunk)):
            table = _chunk(run_id, trace, job_key, first, min(steps_per_chunk, steps_per_run - first), rng)
            if index == 0:
                table = pa.concat_tables([job, table])
            for folder, part in split_by_partition(table):
                (root / "spans" / folder).mkdir(parents=True, exist_ok=True)
                pq.write_table(span_file_table(part), root / "spans" / folder / f"part-{index:05d}.parquet",
                               row_group_size=1 << 17)  # a spans file of dataset format 1: its parent rows
    for table in ("events", "links"):
        (root / table).mkdir(parents=True, exist_ok=True)


def write_dumps(folder: Path, spans: int, files: int = 8) -> None:
    """OTLP JSON lines from analysis.synthetic, split over ``files`` files (as a rotating Collector writes)."""
    from nemo_telemetry.analysis.synthetic import synthetic_requests, write_json_lines

    folder.mkdir(parents=True, exist_ok=True)
    requests = list(synthetic_requests(spans, spans_per_request=512))
    per_file = -(-len(requests) // files)
    for i in range(files):
        write_json_lines(folder / f"traces-{i:02d}.jsonl", requests[i * per_file:(i + 1) * per_file])


# -- measurements (each in a fresh child process) ----------------------------------------------


class _PeakSampler:
    """Peak RSS of a set of processes (Ray workers), sampled every 0.1 s."""

    def __init__(self, pids_of) -> None:
        self.pids_of, self.peak, self._stop = pids_of, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            for pid in self.pids_of():
                try:
                    self.peak = max(self.peak, psutil.Process(pid).memory_info().rss)
                except psutil.Error:
                    pass
            time.sleep(0.1)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def _plain(runs) -> str:
    return json.dumps([{"run": r.run_id, "steps": r.steps.to_pylist(), "total": r.total, "outside": r.outside_steps,
                        "job": r.job_wall_s} for r in runs], sort_keys=True, default=str)


def _plain_check(report) -> str:
    return json.dumps(report.to_dict(), sort_keys=True, default=str)


def _fixed_agent_ports() -> None:
    """Give the node's agents fixed free ports before ``ray.init``: with port 0 the raylet waits a
    fixed 15 s for each agent to write its port file, which a loaded 2-core machine misses."""
    import socket

    from ray._private import parameter

    def free_port() -> int:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]

    original = parameter.RayParams.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        for name in ("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port",
                     "runtime_env_agent_port"):
            setattr(self, name, free_port())  # also the fixed default 52365, which another cluster may hold

    parameter.RayParams.__init__ = init


def _start_ray():
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    _fixed_agent_ports()
    for attempt in range(5):  # a loaded machine can miss Ray's start-up deadlines (ray-project/ray#65983)
        try:
            ray.init(num_cpus=os.cpu_count(), include_dashboard=False, configure_logging=False, log_to_driver=False)
            break
        except Exception:  # Ray raises a bare Exception on a start-up timeout
            if attempt == 4:
                raise
            time.sleep(5)
    raylet = ray._private.worker._global_node.all_processes["raylet"][0].process.pid

    def workers() -> list[int]:
        import psutil

        try:
            return [c.pid for c in psutil.Process(raylet).children(recursive=True) if "ray::" in " ".join(c.cmdline())]
        except psutil.Error:
            return []

    return ray, workers


def measure(mode: str, path: Path, expected: Path | None) -> None:
    extra: dict = {}
    sampler = None
    if mode in ("ray", "ingest-ray", "check-ray"):
        ray, workers = _start_ray()
        sampler = _PeakSampler(workers)
    t0 = time.perf_counter()
    if mode == "memory":
        from nemo_telemetry.analysis.ingestion.read import read_for_analysis
        from nemo_telemetry.analysis.goodput.steps import run_goodput

        result = _plain(run_goodput(read_for_analysis(path)))
    elif mode == "stream":
        result, extra = _stream_with_partition_costs(path)
    elif mode == "ray":
        from nemo_telemetry.analysis.engines.ray_engine import ray_goodput

        result = _plain(ray_goodput(path))
    elif mode == "check-memory":
        from nemo_telemetry.analysis.ingestion.read import read_for_analysis
        from nemo_telemetry.analysis.findings.checks import check_run

        result = _plain_check(check_run(read_for_analysis(path)))
    elif mode == "check-ray":
        from nemo_telemetry.analysis.engines.ray_engine import ray_check

        result = _plain_check(ray_check(path))
    elif mode in ("ingest-local", "ingest-ray"):
        out = Path(tempfile.mkdtemp(dir=path.parent)) / "ds"
        if mode == "ingest-local":
            from nemo_telemetry.analysis.ingestion.ingest import ingest as run
        else:
            from nemo_telemetry.analysis.engines.ray_engine import ray_ingest as run
        summary = run(path, out=out)
        result = json.dumps({"spans": summary.spans, "traces": summary.traces, "duplicates": summary.duplicates_dropped})
    wall = time.perf_counter() - t0
    peak = _own_peak_rss()
    if sampler is not None:
        extra["worker_peak_mb"] = sampler.stop() / 2**20
    if expected is not None and expected.exists():
        extra["equal"] = expected.read_text() == result
    elif expected is not None:
        expected.write_text(result)
    print(json.dumps({"wall_s": wall, "peak_mb": peak / 2**20, **extra}))


def _own_peak_rss() -> int:
    """This process's peak RSS (VmHWM: ru_maxrss would carry the parent's peak across exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _stream_with_partition_costs(path: Path) -> tuple[str, dict]:
    """stream_goodput, with the map step (per-batch partials) timed per (run, rank) partition."""
    from nemo_telemetry.analysis.goodput import partials as streaming
    from nemo_telemetry.analysis.store.partitions import span_partitions

    partition_of = {f: (p.run_id, p.rank) for p in span_partitions(path) for f in p.files}
    cost: dict = {}
    rows: dict = {}
    inner = streaming.local_scan()

    def timed_scan(fn, columns, files):
        for file in files:
            key = partition_of[file]
            t = time.perf_counter()
            for out in inner(fn, columns, [file]):
                cost[key] = cost.get(key, 0.0) + time.perf_counter() - t
                yield out
                t = time.perf_counter()

    result = _plain(streaming.partitioned_goodput(path, timed_scan))
    for p in span_partitions(path):
        rows[(p.run_id, p.rank)] = sum(pq.ParquetFile(f).metadata.num_rows for f in p.files)
    seconds = np.array(list(cost.values()))
    per_row = np.array([cost[k] / rows[k] for k in cost])
    return result, {"partitions": len(cost), "partition_s_mean": float(seconds.mean()),
                    "partition_s_max": float(seconds.max()), "partition_rows_mean": float(np.mean(list(rows.values()))),
                    "partition_us_per_span": float(per_row.mean() * 1e6), "scan_s_total": float(seconds.sum())}


def _child(mode: str, path: Path, expected: Path | None) -> dict:
    command = [sys.executable, __file__, "--measure", mode, "--path", str(path)]
    if expected is not None:
        command += ["--expected", str(expected)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"{mode} on {path} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--ingest-spans", type=int, default=1_000_000)
    parser.add_argument("--dir", type=Path, help="where the data is generated (kept); a temp dir by default")
    parser.add_argument("--no-ray", action="store_true", help="local engines only")
    parser.add_argument("--no-check", action="store_true", help="goodput and ingest figures only")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--path", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--expected", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(args.measure, args.path, args.expected)
        return
    with tempfile.TemporaryDirectory() as tmp:
        base = args.dir or Path(tmp)
        print(f"machine: {os.cpu_count()} CPUs; data in {base}")
        print(f"{'spans':>12} {'engine':<13} {'wall s':>8} {'peak MB':>9} {'x memory':>9}  notes")
        for spans in [n for n in args.spans if n > 0]:  # --spans 0: ingest figures only
            root = base / f"dataset-{spans}"
            if not (root / "spans").is_dir():
                t = time.perf_counter()
                write_dataset(root, spans)
                print(f"{spans:>12,} (generated in {time.perf_counter() - t:.1f} s, "
                      f"{sum(f.stat().st_size for f in root.rglob('*.parquet')) / 2**20:.0f} MB Parquet)")
            expected = base / f"expected-{spans}.json"
            expected.unlink(missing_ok=True)
            baseline = _child("memory", root, expected)
            _row(spans, "local-memory", baseline, baseline, "")
            stream = _child("stream", root, expected)
            _row(spans, "local-stream", stream, baseline,
                 f"equal={stream['equal']}; {stream['partitions']} partitions of ~{stream['partition_rows_mean']:,.0f} "
                 f"spans: map step {stream['partition_s_mean']:.3f} s mean / {stream['partition_s_max']:.3f} s max "
                 f"per partition ({stream['partition_us_per_span']:.2f} us/span), {stream['scan_s_total']:.1f} s "
                 "in all scans")
            if not args.no_ray:
                ray = _child("ray", root, expected)
                _row(spans, "ray", ray, baseline,
                     f"equal={ray['equal']}; largest worker peak RSS {ray['worker_peak_mb']:.0f} MB")
            if not args.no_check:
                expected = base / f"expected-check-{spans}.json"
                expected.unlink(missing_ok=True)
                check = _child("check-memory", root, expected)
                _row(spans, "check-memory", check, check, "")
                if not args.no_ray:
                    ray = _child("check-ray", root, expected)
                    _row(spans, "check-ray", ray, check,
                         f"equal={ray['equal']}; largest worker peak RSS {ray['worker_peak_mb']:.0f} MB")
        if args.ingest_spans:
            dumps = base / f"dumps-{args.ingest_spans}"
            if not dumps.is_dir():
                t = time.perf_counter()
                write_dumps(dumps, args.ingest_spans)
                print(f"{args.ingest_spans:>12,} (dumps generated in {time.perf_counter() - t:.1f} s, "
                      f"{sum(f.stat().st_size for f in dumps.iterdir()) / 2**20:.0f} MB JSON lines in 8 files)")
            expected = base / "expected-ingest.json"
            expected.unlink(missing_ok=True)
            local = _child("ingest-local", dumps, expected)
            _row(args.ingest_spans, "ingest-local", local, local, "")
            if not args.no_ray:
                ray = _child("ingest-ray", dumps, expected)
                _row(args.ingest_spans, "ingest-ray", ray, local,
                     f"same summary={ray['equal']}; largest worker peak RSS {ray['worker_peak_mb']:.0f} MB")


def _row(spans: int, engine: str, figures: dict, baseline: dict, notes: str) -> None:
    ratio = figures["wall_s"] / baseline["wall_s"]
    print(f"{spans:>12,} {engine:<13} {figures['wall_s']:8.2f} {figures['peak_mb']:9.0f} {ratio:9.2f}  {notes}",
          flush=True)


if __name__ == "__main__":
    main()
