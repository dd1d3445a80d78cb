"""The census (what ``check`` and ``goodput`` report a source holds) counts every run's spans, its
spans with an rl.* attribute and its step spans exactly, with few runs or many, whole or for one run."""

from __future__ import annotations

import random

import numpy as np
import pytest

from nemo_telemetry.analysis.decode import span_arrays
from nemo_telemetry.analysis.goodput.census import census_of_arrays
from nemo_telemetry.analysis.model.records import spans_table


def _records(runs: int, spans: int, seed: int, every_grouped: bool = False) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(spans):
        run = rng.randrange(runs + 1)  # runs + 1: no run id
        kind = rng.choice(["plain", "bucketed", "stamped", "step", "grouped"])
        record = {"trace_id": f"{run:032x}", "span_id": f"{i + 1:016x}", "start_ns": i, "end_ns": i + 5,
                  "name": "rl.grpo.step" if kind == "step" else f"work-{rng.randrange(3)}",
                  "run_id": f"run-{run}" if run < runs else None}
        if kind == "bucketed":
            record["bucket"] = "productive"
        elif kind in ("stamped", "step"):
            record["iteration"] = rng.randrange(1, 9)
        if kind == "grouped" or every_grouped:
            record["span_group"] = "generation"
        out.append(record)
    return out


def _expected(records: list[dict], run_id=None) -> dict:
    counts: dict = {}
    for r in records:
        if run_id is not None and r["run_id"] != run_id:
            continue
        rl = any(k in r for k in ("bucket", "iteration", "span_group")) or r["name"] == "rl.grpo.step"
        c = counts.setdefault(r["run_id"], [0, 0, 0])
        c[0] += 1
        c[1] += rl
        c[2] += r["name"] == "rl.grpo.step"
    return counts


@pytest.mark.parametrize("runs", [1, 3, 40])  # few runs are counted one comparison each, many in one count
@pytest.mark.parametrize("one_run", [False, True])
@pytest.mark.parametrize("every_grouped", [False, True], ids=["some-grouped", "every-span-grouped"])
def test_the_census_counts_each_runs_spans_whatever_the_number_of_runs(runs, one_run, every_grouped):
    records = _records(runs, 2_000, seed=runs, every_grouped=every_grouped)
    arrays = span_arrays(spans_table(records))
    assert (arrays.table.column("rl.span_group").null_count == 0) == every_grouped
    run_id = "run-0" if one_run else None
    keep = arrays.run == arrays.runs.index(run_id) if one_run else np.ones(len(arrays), dtype=bool)
    census = census_of_arrays(arrays, keep)
    got = {r.run_id: [r.spans, r.rl_spans, r.step_spans] for r in census.runs}
    assert got == _expected(records, run_id)
    assert sum(c[0] for c in got.values()) == (len(records) if not one_run else int(keep.sum()))
