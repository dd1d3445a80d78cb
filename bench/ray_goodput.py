"""Benchmark: goodput's scans on Ray as plain tasks (the engine's) against Ray Data, same run.

    .venv/bin/python bench/ray_goodput.py DATASET [--repeat 2]

DATASET is a spans dataset (``bench/goodput.py --dataset DIR`` writes a 10M-span one). Each
round times, on one local Ray cluster: ``ray_goodput`` (attribution and partials as plain tasks
over groups of files, the merge shuffled to reducers), ``partitioned_goodput`` over the
engine's plain-task scan, and ``partitioned_goodput`` over a Ray Data scan
(``read_parquet(...).map_batches(fn)``); the three results must agree. The first round pays
the cluster's and the workers' start-up; the load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from nemo_telemetry.analysis.engines.ray_engine import connect, ray_goodput, ray_scan
from nemo_telemetry.analysis.goodput import partials


def ray_data_scan(ray):
    """A ``partials.Scan`` whose batches are read and mapped by Ray Data."""
    import ray.data  # a submodule ray does not import by itself

    def scan(fn, columns, files):
        names = pq.ParquetFile(files[0]).schema_arrow.names
        dataset = ray.data.read_parquet([str(f) for f in files], columns=[c for c in columns if c in names])
        mapped = dataset.map_batches(fn, batch_format="pyarrow", batch_size=partials.BATCH_ROWS, zero_copy_batch=True)
        for batch in mapped.iter_batches(batch_format="pyarrow", batch_size=None):
            yield batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])

    return scan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", type=Path)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    ray = connect()
    print(f"cluster CPUs: {ray.cluster_resources().get('CPU')}, load average {os.getloadavg()[0]:.1f}")
    candidates = {
        "ray_goodput (plain tasks)": lambda: ray_goodput(args.dataset),
        "plain-task scan": lambda: partials.partitioned_goodput(args.dataset, ray_scan()),
        "Ray Data scan": lambda: partials.partitioned_goodput(args.dataset, ray_data_scan(ray)),
    }
    for round_ in range(args.repeat):
        results = {}
        for label, run in candidates.items():
            t = time.perf_counter()
            results[label] = [r.total for r in run()]
            print(f"round {round_ + 1}: {label:28s} {time.perf_counter() - t:6.2f} s")
        assert len({repr(v) for v in results.values()}) == 1, results
    print(f"load average after: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
