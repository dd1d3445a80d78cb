"""Benchmark: ``goodput`` + ``check`` over a 10-million-span Parquet dataset.

    .venv/bin/python bench/goodput.py [--spans 10000000] [--dataset DIR] [--repeat N]

Writes a synthetic dataset in ingest's layout (``DIR/spans/run_id=<run>/rank=<rank>/part-*.parquet``,
each process's spans in the order it exports them, as they end, in files of ingest's ``FILE_ROWS``;
the uint64 id key columns, the ``span_groups`` column and each file's ``parent_row`` included, and
a commit record naming them, their sizes and the dataset format) unless DIR already holds one, then
measures each command in a fresh child process of its own, as a user running ``nemo-telemetry
goodput`` and then ``nemo-telemetry check`` gets them (the console script's settings at the start
and its frozen collector at the end, ``cli/startup.py``; nothing read or allocated by one helps
the other; the measured package byte-compiled first, as an installed one is: ``bench/_bytecode.py``):

- goodput:  ``goodput_with_engine`` (every run, by step), what the command runs on its local engine,
            the read included;
- check:    ``check_with_engine`` (every finding code), the same;

and prints in-process wall and CPU seconds and each child's peak RSS (imports and rendering not
counted there). The target on the project's 2-core machines is under 5 s for goodput + check and
under 4 GB peak.

With ``duckdb`` installed (``pip install -e .[bench]``) it also runs the SQL a user would write
for the same per-step bucket sums, in a fresh process of its own on 2 threads: a recursive CTE
that gives each unstamped bucketed span its nearest stamped ancestor's ``rl.iteration`` over the
public columns (``trace_id``, ``span_id``, ``parent_span_id``, ``rl.iteration``, ``rl.bucket``,
``duration_ns``), then a group-by. Each of the three children is also timed whole from this
process (interpreter start-up, imports, read and computation), and ours are printed as a ratio
to DuckDB's (targets: goodput at most 0.5x, check at most 0.6x, each under 2 GB peak RSS).

The run: two runs (``nemo.run.id``), GRPO-shaped steps of 30 s with 2,500 spans each. Per step
a stamped step span, four bucketed phases, a stamped rollout umbrella with 16 productive
generate leaves (unstamped, as a vLLM worker opens them: each walks up to the umbrella for its
iteration, in our walk and in DuckDB's recursive CTE alike), an idle refit bubble, 8 worker ranks
x 60 unbucketed micro-batch spans under training, and ~1,000 per-prompt umbrella pairs. Every
200th step a collector batch re-roots into its own trace (``detached-trace``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

# Nothing heavy at the top: each child imports what its command imports (ours the CLI's modules,
# DuckDB's only duckdb); the dataset writer imports numpy and pyarrow for itself.

SPANS_PER_STEP = 2_500
STEP_NS = 30_000_000_000
T0 = 1_767_225_600_000_000_000
S = 1_000_000_000
NAMES = ["rl.grpo.job", "rl.grpo.step", "rl.grpo.data_processing", "rl.grpo.policy_and_reference_logprobs",
         "rl.grpo.reward_calculation", "rl.grpo.policy_training", "rl.grpo.generation", "rl.vllm.generate",
         "rl.idle.refit_bubble", "rl.policy.microbatch", "rl.sc.generate_and_push", "rl.data_plane.put",
         "rl.idle.generation_limit_pause"]
BUCKET_VALUES = ["productive", "overhead", "idle"]
SERVICES = ["driver", "policy_worker", "collector"]
SPAN_GROUPS = "job,step,checkpoint,evaluate,setup,model_init,rollout,generation,logprob,reward,advantage," \
              "policy_update,data_processing,data_plane,efficiency,per_prompt"
SERVICE_SPAN_GROUPS = [SPAN_GROUPS, "policy_update", "rollout,efficiency"]  # each of SERVICES' span groups


def _step_template() -> dict[str, np.ndarray]:
    """One step's spans: name, parent (index in the step, -1 = the job), times, bucket, stamped, who."""
    import numpy as np

    rows: list[tuple] = []  # (name, parent, start_s, end_s, bucket, stamped, service, rank)
    rows.append((1, -1, 0.0, 29.0, -1, True, 0, 0))  # 0 step
    for name, a, b, bucket in ((2, 0.0, 2.0, 1), (3, 10.0, 14.0, 1), (4, 14.0, 15.0, 0), (5, 15.0, 27.0, 0)):
        rows.append((name, 0, a, b, bucket, True, 0, 0))  # 1..4 phases
    rows.append((6, 0, 2.0, 10.0, -1, True, 0, 0))  # 5 rollout umbrella
    for k in range(16):  # 6..21 generate leaves, unstamped as a vLLM worker opens them: walked up to the umbrella
        rows.append((7, 5, 2.0 + 0.5 * k, 2.45 + 0.5 * k, 0, False, 0, 0))
    rows.append((8, 0, 27.0, 28.0, 2, True, 0, 0))  # 22 refit bubble
    for rank in range(8):  # worker micro-batches under policy_training, unstamped
        for k in range(60):
            rows.append((9, 4, 15.0 + 0.2 * k, 15.15 + 0.2 * k, -1, False, 1, rank + 1))
    while len(rows) + 2 <= SPANS_PER_STEP:  # per-prompt umbrella + its put
        j = len(rows)
        rows.append((10, 5, 2.0 + (j % 700) * 0.01, 9.0, -1, False, 0, 0))
        rows.append((11, j, 8.0, 8.5, -1, False, 0, 0))
    while len(rows) < SPANS_PER_STEP:
        rows.append((9, 4, 26.0, 26.5, -1, False, 1, 1))
    cols = list(zip(*rows))
    keys = ("name", "parent", "start", "end", "bucket", "stamped", "service", "rank")
    out = {k: np.array(v) for k, v in zip(keys, cols)}
    under = np.zeros(len(rows), dtype=bool)  # the rollout umbrella's subtree (rows only point back)
    under[5] = True
    for i, parent in enumerate(out["parent"]):
        under[i] |= parent >= 0 and under[parent]
    out["rollout_subtree"] = under
    return out


def make_run(run_index: int, steps: int, rng: np.random.Generator) -> pa.Table:
    """One run's spans table (SPANS_TABLE_SCHEMA), vectorized over steps."""
    groups, group_codes = _name_groups()
    import numpy as np
    import pyarrow as pa
    from _columns import (  # bench/_columns.py (this script's folder is on sys.path)
        dictionary,
        uint64_hex,
    )

    from nemo_telemetry.analysis.model.tables import SPANS_TABLE_SCHEMA

    t = _step_template()
    p = SPANS_PER_STEP
    n = steps * p + 1
    step_of = np.repeat(np.arange(steps), p)
    offset = np.tile(np.arange(p), steps)
    span_key = rng.integers(1, 2**63, n, dtype=np.int64).astype(np.uint64)
    row_parent = np.where(t["parent"][offset] >= 0, step_of * p + t["parent"][offset] + 1, 0)
    base = T0 + step_of.astype(np.int64) * STEP_NS
    start = np.concatenate([[T0 - S], base + (t["start"][offset] * S).astype(np.int64)])
    end = np.concatenate([[T0 + steps * STEP_NS], base + (t["end"][offset] * S).astype(np.int64)])
    parent_key = np.concatenate([np.zeros(1, np.uint64), span_key[row_parent]])
    iteration = np.concatenate([[0], step_of + 1])
    stamped = np.concatenate([[False], t["stamped"][offset]])
    name = np.concatenate([[0], t["name"][offset]])
    bucket = np.concatenate([[-1], t["bucket"][offset]])
    service = np.concatenate([[0], t["service"][offset]])
    rank = np.concatenate([[0], t["rank"][offset]])
    trace_key = np.full(n, rng.integers(1, 2**63, dtype=np.int64), dtype=np.uint64)
    # Every 200th step's rollout batch re-roots: its whole subtree moves to a trace of its own.
    detached_steps = np.arange(0, steps, 200)
    new_trace = np.zeros(steps, dtype=np.uint64)
    new_trace[detached_steps] = rng.integers(1, 2**63, len(detached_steps), dtype=np.int64).astype(np.uint64)
    moved = np.concatenate([[False], t["rollout_subtree"][offset] & (new_trace[step_of] != 0)])
    trace_key[moved] = new_trace[np.concatenate([[0], step_of])[moved]]
    parent_key[np.concatenate([[False], (offset == 5) & (new_trace[step_of] != 0)])] = 0
    run_id = f"bench-run-{run_index}"
    # each service's span groups in their column, as ingest promotes them; the rest of the resource in the map
    resource = pa.MapArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)), pa.repeat("rl.algorithm", n),
                                       pa.repeat("grpo", n))
    parent_hex = uint64_hex(parent_key)
    columns = {
        "trace_id": uint64_hex(trace_key, 32), "span_id": uint64_hex(span_key),
        "parent_span_id": pa.array(parent_hex.to_numpy(zero_copy_only=False), pa.string(), mask=parent_key == 0),
        "name": dictionary(name, NAMES), "kind": dictionary(np.ones(n, np.int32), ["unspecified", "internal"]),
        "start_ns": start, "end_ns": end, "duration_ns": end - start,
        "status_code": dictionary(np.zeros(n, np.int32), ["unset"]), "status_message": pa.nulls(n, pa.string()),
        "service_name": dictionary(service, SERVICES), "run_id": dictionary(np.zeros(n, np.int32), [run_id]),
        "rank": rank.astype(np.int64), "span_groups": dictionary(service, SERVICE_SPAN_GROUPS),
        "rl.bucket": dictionary(bucket, BUCKET_VALUES),
        "rl.iteration": pa.array(iteration.astype(np.int64), mask=~stamped),
        "rl.efficiency.category": dictionary(np.where(name == 8, 0, -1), ["idle/refit_bubble"]),
        # the group each span was opened in, as the instrument records it; each process's namespace
        "rl.span_group": dictionary(group_codes[name], groups),
        "span_groups_namespace": dictionary(np.zeros(n, np.int32), ["nemo_rl"]),
        "trace_state": pa.nulls(n, pa.string()), "scope_name": dictionary(np.zeros(n, np.int32), ["nemo_telemetry"]),
        "scope_version": dictionary(np.full(n, -1), ["0"]),
        "attributes": pa.MapArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), pa.array([], pa.string()),
                                              pa.array([], pa.string())),
        "resource_attributes": resource,
        # the ids are the key and 16 zeros (uint64_hex pads on the right): the low half 0, whose mix is 0,
        # so trace_key is the high half, as model.tree.trace_keys computes it
        "trace_key": trace_key, "span_key": span_key, "parent_key": parent_key, "trace_low": np.zeros(n, np.uint64),
    }
    columns = {f.name: columns.get(f.name, pa.nulls(n, f.type)) for f in SPANS_TABLE_SCHEMA}  # OTLP-only: nulls
    return pa.table([pa.array(columns[f.name]) if not isinstance(columns[f.name], pa.Array) else columns[f.name]
                     for f in SPANS_TABLE_SCHEMA], schema=SPANS_TABLE_SCHEMA)


def _name_groups() -> tuple[list[str], "np.ndarray"]:
    """(the groups the bench's span names belong to, each name's code into them; -1: no group),
    from the span-group catalogue the instrument records groups by."""
    import re

    import numpy as np

    from nemo_telemetry.instrument import REGISTRY, span_name_regex

    groups: list[str] = []
    codes = np.full(len(NAMES), -1, np.int32)
    for i, name in enumerate(NAMES):
        for info in REGISTRY.catalogue():
            if any(re.fullmatch(span_name_regex(pattern), name) for pattern in info.spans):
                if info.name not in groups:
                    groups.append(info.name)
                codes[i] = groups.index(info.name)
                break
    return groups, codes


def write_dataset(root: Path, spans: int) -> None:
    import numpy as np
    import pyarrow.parquet as pq

    from nemo_telemetry.analysis.ingestion.ingest import FILE_ROWS
    from nemo_telemetry.analysis.store import commits
    from nemo_telemetry.analysis.store.dataset import (
        SPANS_PARQUET_OPTIONS,
        span_file_table,
    )

    rng = np.random.default_rng(7)
    steps_per_run = max(1, spans // (2 * SPANS_PER_STEP))
    for r in range(2):
        table = make_run(r, steps_per_run, rng)
        rank, end = table.column("rank").to_numpy(), table.column("end_ns").to_numpy()
        for k in np.unique(rank):
            # a process's spans as its exporter writes them, as they end (ingest keeps that order),
            # in files of the rows ingest gathers per (run, rank) before it writes one
            rows = np.flatnonzero(rank == k)
            rows = rows[np.argsort(end[rows], kind="stable")]
            folder = root / "spans" / f"run_id=bench-run-{r}" / f"rank={k}"
            folder.mkdir(parents=True, exist_ok=True)
            for i, lo in enumerate(range(0, len(rows), FILE_ROWS)):
                # written as ingest writes a spans file: dictionary pages only where values repeat (not
                # times or ids), and each span's parent row in the file
                pq.write_table(span_file_table(table.take(rows[lo:lo + FILE_ROWS])), folder / f"part-{i:09d}.parquet",
                               **SPANS_PARQUET_OPTIONS)
        del table
    # the record ingest writes: readers trust its format instead of opening every file's footer for it
    written = sorted(str(p.relative_to(root)) for p in (root / "spans").rglob("*.parquet"))
    (root / commits.COMMITS).mkdir(exist_ok=True)
    commits.write_record(root, "bench", 0, {"kind": "commit", "files": written, "sizes": {
        rel: commits.file_info(root / rel, pq.ParquetFile(root / rel).metadata.num_rows) for rel in written}})


def _peak_gb() -> float:
    """This process's peak RSS. ``ru_maxrss`` survives fork + exec on Linux (a child would report the
    parent's peak, here the dataset writer's), so the kernel's per-address-space ``VmHWM`` is read."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def measure(root: Path, command: str) -> dict:
    """In this (fresh) process, what the command runs on its local engine (its read included):
    ``goodput_with_engine`` / ``check_with_engine``; times, CPU and peak RSS."""
    try:  # the console script's settings for its own process (NEMO_TELEMETRY_PROCESS_TUNING=0: none)
        from nemo_telemetry.cli.startup import console_script_process, skip_pyarrow_pandas_probe
    except ImportError:  # another checkout measured may not have them
        pass
    else:
        console_script_process()
        skip_pyarrow_pandas_probe()  # as the goodput and check commands start
    # what the CLI's goodput and check commands import and call
    from nemo_telemetry.analysis.engines.choose import (
        check_with_engine,
        goodput_with_engine,
    )

    clock = time.perf_counter
    c0, t0 = time.process_time(), clock()
    result = goodput_with_engine(root) if command == "goodput" else check_with_engine(root)
    t1, c1 = clock(), time.process_time()
    # what the command does not do (counting the dataset's spans) is left to the bench's own process:
    # each child's whole-process wall is the command's
    out = {"run_s": t1 - t0, "cpu_s": c1 - c0, "peak_gb": _peak_gb(), "pandas": "pandas" in sys.modules}
    if command == "goodput":
        out["steps"] = sum(r.total["steps"] for r in result)
        out["goodput"] = {r.run_id: r.total["goodput"] for r in result}
    else:
        out["findings"] = {k: v for k, v in result.counts["by_code"].items() if v}
    try:  # as the console script ends its process
        from nemo_telemetry.cli.startup import freeze_for_exit
    except ImportError:
        pass
    else:
        freeze_for_exit()
    return out


DUCKDB_QUERY = """
WITH RECURSIVE spans AS (
    SELECT run_id, trace_id, span_id, parent_span_id, "rl.iteration" AS iteration, "rl.bucket" AS bucket,
           duration_ns
    FROM read_parquet(?, hive_partitioning = false)
),
walk AS (
    SELECT trace_id, span_id AS start_id, parent_span_id AS at, CAST(NULL AS BIGINT) AS iteration, 0 AS depth
    FROM spans WHERE bucket IS NOT NULL AND iteration IS NULL AND parent_span_id IS NOT NULL
    UNION ALL
    SELECT w.trace_id, w.start_id, p.parent_span_id, p.iteration, w.depth + 1
    FROM walk w JOIN spans p ON p.trace_id = w.trace_id AND p.span_id = w.at
    WHERE w.iteration IS NULL AND w.depth < 1024
),
found AS (SELECT trace_id, start_id, min(iteration) AS iteration FROM walk WHERE iteration IS NOT NULL
          GROUP BY trace_id, start_id)
SELECT s.run_id, coalesce(s.iteration, f.iteration) AS iteration, s.bucket, sum(s.duration_ns) AS ns, count(*) AS spans
FROM spans s LEFT JOIN found f ON s.iteration IS NULL AND f.trace_id = s.trace_id AND f.start_id = s.span_id
WHERE s.bucket IS NOT NULL
GROUP BY ALL
"""


def measure_duckdb(root: Path) -> dict:
    """In this (fresh) process: the per-step bucket sums by DuckDB's SQL on 2 threads, imports included."""
    t0, c0 = time.perf_counter(), time.process_time()
    import duckdb  # a bench-only dependency

    connection = duckdb.connect()
    connection.execute("SET threads = 2")
    rows = connection.execute(DUCKDB_QUERY, [str(root / "spans" / "**" / "*.parquet")]).fetchall()
    return {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "groups": len(rows),
            "steps": len({(r[0], r[1]) for r in rows if r[1] is not None}),
            "peak_gb": _peak_gb()}


def report(goodput: dict, check: dict) -> None:
    for name, m in (("goodput", goodput), ("check", check)):
        print(f"{name + ':':18s}{m['run_s']:5.2f} s in process (read, decode and rules), CPU {m['cpu_s']:5.2f} s, "
              f"peak RSS {m['peak_gb']:.2f} GB")
    total = sum(m["run_s"] for m in (goodput, check))
    print(f"goodput + check:  {total:5.2f} s wall, reads included, each in a fresh process (target < 5 s)")
    print(f"peak RSS:         {max(goodput['peak_gb'], check['peak_gb']):5.2f} GB  (target < 4 GB)")
    print(f"spans:            {check['spans']:,} in {len(goodput['goodput'])} runs, {goodput['steps']:,} steps; "
          f"findings by code: {check['findings']}")
    print("run goodput:      " + ", ".join(f"{run}={g:.3f}" for run, g in goodput["goodput"].items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=10_000_000)
    parser.add_argument("--dataset", type=Path, help="where the synthetic dataset is (or is written)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="fresh processes per command; the one with the median whole-process wall is reported")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--command", choices=("goodput", "check", "duckdb"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure_duckdb(args.measure) if args.command == "duckdb" else measure(args.measure,
                                                                                               args.command)))
        return
    from _bytecode import (
        compile_measured_packages,  # bench/_bytecode.py (this script's folder is on sys.path)
    )

    compile_measured_packages()  # start-up as an installed package has it (PYTHONDONTWRITEBYTECODE or not)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.dataset or Path(tmp) / "dataset"
        if not (root / "spans").is_dir():
            t = time.perf_counter()
            write_dataset(root, args.spans)
            print(f"wrote {root} in {time.perf_counter() - t:.1f} s")
        load = os.getloadavg()[0]
        # This checkout, after any PYTHONPATH given (to measure another checkout's analysis on the same data).
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (os.environ.get("PYTHONPATH"), str(Path(__file__).resolve().parents[1])) if p)}
        commands = ("goodput", "check", "duckdb") if importlib.util.find_spec("duckdb") else ("goodput", "check")
        figures, whole = {}, {}
        runs: dict[str, list] = {command: [] for command in commands}
        for _ in range(max(1, args.repeat)):  # interleaved, so a burst of load hits every command alike
            for command in commands:
                t = time.perf_counter()
                out = json.loads(subprocess.run(
                    [sys.executable, __file__, "--measure", str(root), "--command", command],
                    check=True, env=env, capture_output=True, text=True).stdout)
                runs[command].append((time.perf_counter() - t, out))
        for command, measured in runs.items():
            whole[command], figures[command] = sorted(measured, key=lambda m: m[0])[len(measured) // 2]
        import pyarrow.parquet as pq

        figures["check"]["spans"] = sum(pq.ParquetFile(f).metadata.num_rows for f in (root / "spans").rglob("*.parquet"))
        report(figures["goodput"], figures["check"])
        if "duckdb" in figures:
            duck = figures["duckdb"]
            print(f"duckdb (2 threads): {whole['duckdb']:5.2f} s whole process ({duck['wall_s']:.2f} s import + "
                  f"query), CPU {duck['cpu_s']:.2f} s, peak RSS {duck['peak_gb']:.2f} GB, {duck['steps']:,} steps")
            for command, target in (("goodput", 0.5), ("check", 0.6)):
                print(f"{command + ' / duckdb:':18s}{whole[command]:5.2f} s whole process = "
                      f"{whole[command] / whole['duckdb']:.2f}x DuckDB's (target <= {target}x), "
                      f"peak RSS {figures[command]['peak_gb']:.2f} GB (target < 2 GB)"
                      f"{', pandas loaded' if figures[command].get('pandas') else ', no pandas'}")
        else:
            print("duckdb:           not installed (pip install -e .[bench]); no SQL baseline")
        print(f"load average:     {load:.1f} before, {os.getloadavg()[0]:.1f} after, on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
