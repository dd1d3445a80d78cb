"""What a durable commit costs: ``DatasetWriter.write`` + ``commit`` of small batches (what a
receiver does per group of requests) against hand-written loops over the same tables, in one run.

    python bench/commits.py [--commits 400] [--spans 256] [--ranks 1] [--data DIR]

- ``pq.write_table`` in place: no fsync, no rename, no record (what a crash can tear);
- the same plus fsync of the file, rename, fsync of its folder: the floor of one durable file;
- ``DatasetWriter``: dedup, a file per (run, rank), those fsyncs and renames, then one commit
  record (tmp + fsync + rename + folder fsync), folded into a snapshot every 256 records;
- what every reader pays first: ``dataset_state`` of the resulting dataset.

The load average is printed beside the figures: fsync times depend on the disk and on what
else writes to it. Figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _batches(commits: int, spans: int, ranks: int) -> list:
    from nemo_telemetry.analysis import load_traces
    from nemo_telemetry.analysis.model.tables import OtlpTables
    from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf, write_length_prefixed

    folder = Path(tempfile.mkdtemp(prefix="bench-commits-"))
    path = write_length_prefixed(folder / "t.pb", [to_protobuf(r) for r in synthetic_requests(
        commits * spans, spans_per_request=max(1, spans // ranks), ranks=ranks)])
    loaded = load_traces(path)
    shutil.rmtree(folder)
    out = []
    for start in range(0, loaded.spans.num_rows, spans):
        out.append(OtlpTables(loaded.spans.slice(start, spans), loaded.events.slice(0, 0), loaded.links.slice(0, 0)))
    return out[:commits]


def _in_place(batches, root: Path) -> None:
    import pyarrow.parquet as pq

    root.mkdir(parents=True)
    for i, batch in enumerate(batches):
        pq.write_table(batch.spans, root / f"part-{i:09d}.parquet")


def _durable_file(batches, root: Path) -> None:
    import pyarrow.parquet as pq

    root.mkdir(parents=True)
    folder = os.open(root, os.O_RDONLY)
    try:
        for i, batch in enumerate(batches):
            tmp, final = root / f".part-{i:09d}.tmp", root / f"part-{i:09d}.parquet"
            pq.write_table(batch.spans, tmp)
            fd = os.open(tmp, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
            os.replace(tmp, final)
            os.fsync(folder)
    finally:
        os.close(folder)


def _dataset_writer(batches, root: Path) -> None:
    from nemo_telemetry.analysis.store.dataset import DatasetWriter

    writer = DatasetWriter(root)
    for batch in batches:
        writer.write(batch)
        writer.commit()
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--commits", type=int, default=400)
    parser.add_argument("--spans", type=int, default=256, help="spans per commit")
    parser.add_argument("--ranks", type=int, default=1, help="(run, rank) partitions, so files, per commit")
    parser.add_argument("--data", type=Path, default=None, help="where to write (default: a temporary folder)")
    args = parser.parse_args()
    from nemo_telemetry.analysis.store.commits import dataset_state

    batches = _batches(args.commits, args.spans, args.ranks)
    base = Path(tempfile.mkdtemp(prefix="bench-commits-", dir=args.data))
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; writing under {base}")
    _dataset_writer(batches[:2], base / "warm-up")  # compiled kernels loaded before the clock
    figures = {}
    for name, run in (("pq.write_table in place", _in_place), ("durable file (fsync+rename)", _durable_file),
                      ("DatasetWriter write+commit", _dataset_writer)):
        started = time.perf_counter()
        run(batches, base / name.split()[0])
        figures[name] = time.perf_counter() - started
        rate = len(batches) / figures[name]
        print(f"{name:32s} {rate:8,.0f} commits/s  {rate * args.spans:11,.0f} spans/s  "
              f"{figures[name] / len(batches) * 1e3:6.2f} ms per commit")
    writer_s = figures["DatasetWriter write+commit"]
    for name in ("pq.write_table in place", "durable file (fsync+rename)"):
        print(f"DatasetWriter / {name}: {writer_s / figures[name]:.2f}x the time")
    started = time.perf_counter()
    state = dataset_state(base / "DatasetWriter", warn=False)
    print(f"dataset_state after {len(batches)} commits: {(time.perf_counter() - started) * 1e3:.1f} ms, "
          f"{len(state.committed):,} files, {len(list((base / 'DatasetWriter' / '_commits').iterdir()))} records")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    shutil.rmtree(base)


if __name__ == "__main__":
    main()
