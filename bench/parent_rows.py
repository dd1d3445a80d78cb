"""Benchmark: what ``parent_row`` costs ``check`` to trust, against computing it at read time.

    .venv/bin/python bench/parent_rows.py --dataset DIR [--spans 2000000] [--repeat 5]

On ``bench/goodput.py``'s synthetic dataset (written to DIR unless it holds one), per spans file,
in this process, medians of ``--repeat`` runs of wall and of CPU seconds (every thread of the
process: the steadier figure on a shared machine):

- decode:   ``SpanReader.files`` of every file and the parents resolved (what ``check`` reads
            and decodes), with each file's ``parent_row`` checked against its keys, as it ships;
- unchecked: the same with the check skipped;
- compute:  ``local_parent_rows`` of each file's keys (the index ingest writes), which a reader
            that computed ``parent_row`` instead of reading it would pay on top of ``unchecked``
            (the keys it reads are read anyway).

It prints each and the two costs as fractions of ``unchecked``: the check's (decode - unchecked)
and the computation's, in wall and in CPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--spans", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if not (args.dataset / "spans").is_dir():
        from goodput import write_dataset  # bench/goodput.py's synthetic dataset

        write_dataset(args.dataset, args.spans)

    import numpy as np
    import pyarrow.parquet as pq

    from nemo_telemetry.analysis.decode import SpanReader
    from nemo_telemetry.analysis.decode.strategies import FileParents
    from nemo_telemetry.analysis.model.columns import filled
    from nemo_telemetry.analysis.model.keys import local_parent_rows
    from nemo_telemetry.analysis.store.read import span_source_files

    _, files = span_source_files(args.dataset)
    checked_file_done = FileParents._file_done

    def unchecked_file_done(self) -> None:
        self.file_keys = []  # what the check would gather, let go unread
        if self.highest >= self.at - self.file_start:
            self._damaged(self.highest)

    def decode() -> tuple[float, float]:
        t, c = time.perf_counter(), time.process_time()
        with SpanReader() as read:
            read.files(files).parents  # the parents resolved, as check reads them
        return time.perf_counter() - t, time.process_time() - c

    keys = [tuple(filled(pq.read_table(f, columns=[c]).column(0), 0).astype(np.uint64, copy=False)
                  for c in ("span_key", "trace_key", "parent_key", "trace_low")) for f in files]

    def compute() -> tuple[float, float]:
        t, c = time.perf_counter(), time.process_time()
        for span, trace, parent, low in keys:
            local_parent_rows(span, trace, parent, low)
        return time.perf_counter() - t, time.process_time() - c

    timings: dict[str, list[tuple[float, float]]] = {"decode": [], "unchecked": [], "compute": []}
    decode()  # warm: imports, the compiled kernels, the page cache
    for _ in range(max(1, args.repeat)):
        FileParents._file_done = checked_file_done
        timings["decode"].append(decode())
        FileParents._file_done = unchecked_file_done
        timings["unchecked"].append(decode())
        FileParents._file_done = checked_file_done
        timings["compute"].append(compute())
    wall = {name: statistics.median(v[0] for v in values) for name, values in timings.items()}
    cpu = {name: statistics.median(v[1] for v in values) for name, values in timings.items()}
    spans = sum(len(k[0]) for k in keys)
    print(f"{spans:,} spans in {len(files)} files; medians of {args.repeat}")
    for name in timings:
        print(f"  {name:10s} {wall[name]:6.3f} s wall, {cpu[name]:6.3f} s CPU")
    for what, median in (("wall", wall), ("CPU", cpu)):
        base = median["unchecked"]
        print(f"  {what:4s}: check of parent_row {(median['decode'] - base) / base:+.3f}x, parent_row computed "
              f"instead {median['compute'] / base:+.3f}x the unchecked decode")


if __name__ == "__main__":
    main()
