"""Terminal waterfall of a 1,000,000-span run: build and render times against reading the table.

    .venv/bin/python bench/waterfall.py [--spans 1000000] [--repeat 3]

The run: one job, STEPS steps; each step has a generation span over per-prompt rollouts (each
with a vLLM generate child), policy training and checkpointing. It is written as a Parquet
dataset and read back with ``read_spans``, which is the baseline: a waterfall should cost a
small multiple of just reading the spans. Target: the collapsed full tree under 2 s.
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console

from nemo_telemetry.analysis import SPANS_SCHEMA, read_spans, waterfall, with_id_keys
from nemo_telemetry.analysis.store.dataset import with_parent_rows
from nemo_telemetry.cli.render import print_waterfall

S = 1_000_000_000
STEPS = 100
FIXED_PER_STEP = 4  # step, generation, training, checkpointing


def synthetic_run(total: int) -> pa.Table:
    """About ``total`` spans: STEPS steps of (4 + 2 * prompts) spans plus the job span."""
    prompts = max((total // STEPS - FIXED_PER_STEP) // 2, 1)
    per_step = FIXED_PER_STEP + 2 * prompts
    n = 1 + STEPS * per_step
    idx = np.arange(n)
    step = np.maximum(idx - 1, 0) // per_step
    k = np.maximum(idx - 1, 0) % per_step  # 0 step, 1 generation, 2 training, 3 checkpointing, then pairs
    base = 1 + step * per_step
    prompt = (k - FIXED_PER_STEP) // 2
    is_rollout = (k >= FIXED_PER_STEP) & ((k - FIXED_PER_STEP) % 2 == 0)
    t0 = step * 60 * S
    rollout_start = t0 + 1 * S + prompt * (30 * S // prompts)
    kind = np.select([idx == 0, k == 0, k == 1, k == 2, k == 3, is_rollout], [0, 1, 2, 3, 4, 5], 6)
    start = np.select([kind == 0, kind == 1, kind == 2, kind == 3, kind == 4, kind == 5],
                      [0, t0, t0 + S, t0 + 40 * S, t0 + 55 * S, rollout_start], rollout_start + S // 10)
    duration = np.select([kind == 0, kind == 1, kind == 2, kind == 3, kind == 4, kind == 5],
                         [STEPS * 60 * S, 58 * S, 38 * S, 14 * S, 2 * S, (3 + prompt % 7) * S], 2 * S)
    parent = np.select([kind == 0, kind == 1, kind == 5, kind == 6], [-1, 0, base + 1, idx - 1], base)
    names = np.array(["rl.grpo.job", "rl.grpo.step", "rl.grpo.generation", "rl.grpo.policy_training",
                      "rl.grpo.checkpointing", "rl.gym.run_rollouts", "rl.vllm.generate"])
    buckets = np.array([None, None, None, "productive", "overhead", None, "productive"], dtype=object)
    with np.errstate(over="ignore"):
        keys = (idx.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
    ids = pa.array(np.char.mod("%016x", keys))  # random-looking, like real span ids
    parent_ids = pa.array(np.where(parent >= 0, np.asarray(ids)[np.maximum(parent, 0)], None))
    columns = {
        "trace_id": pa.array(np.full(n, "ab" * 16)), "span_id": ids, "parent_span_id": parent_ids,
        "name": pa.DictionaryArray.from_arrays(pa.array(kind.astype(np.int32)), pa.array(names)),
        "start_ns": pa.array(start), "end_ns": pa.array(start + duration), "duration_ns": pa.array(duration),
        "service_name": pa.array(np.where(kind >= 5, "rollout-worker", "driver")),
        "run_id": pa.array(np.full(n, "bench-run")), "rank": pa.array(np.zeros(n, dtype=np.int64)),
        "rl.bucket": pa.array(buckets[kind]),
        "rl.iteration": pa.array(np.where(kind == 0, None, step).tolist(), pa.int64()),
    }
    table = pa.table({**columns, **{f.name: pa.nulls(n, f.type) for f in SPANS_SCHEMA if f.name not in columns}})
    return with_id_keys(table.select(SPANS_SCHEMA.names).cast(SPANS_SCHEMA))


def best_of(repeat: int, fn):
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return min(times), result


def render(shown) -> str:
    out = Console(file=io.StringIO(), width=160, color_system="truecolor")
    print_waterfall(shown, out)
    return out.file.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "spans").mkdir()
        pq.write_table(with_parent_rows(synthetic_run(args.spans)), root / "spans" / "part-0.parquet")  # format 1
        read_s, spans = best_of(args.repeat, lambda: read_spans(root))
        print(f"spans: {spans.num_rows:,}")
        print(f"baseline  read_spans (Parquet dataset)      {read_s:7.3f} s")
        views = {
            "steps view (default, one line per step)": {},
            "full tree, collapsed (--expand)": {"fold_steps": False},
            "one step (--step 50)": {"step": 50},
        }
        for label, options in views.items():
            build_s, shown = best_of(args.repeat, lambda: waterfall(spans, **options))
            render_s, text = best_of(args.repeat, lambda: render(shown))
            total = build_s + render_s
            print(f"{label:<44} build {build_s:6.3f} s  render {render_s:6.3f} s  total {total:6.3f} s  "
                  f"= {total / read_s:4.1f}x read  ({shown.rows.num_rows:,} rows, {len(text.splitlines()):,} lines)")


if __name__ == "__main__":
    main()
