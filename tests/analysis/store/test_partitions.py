"""The run/rank partition layout: how batches are split, listed, pruned, and read back in order."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from nemo_telemetry.analysis.model.tables import OtlpTables
from nemo_telemetry.analysis.store.dataset import DatasetWriter, read_dataset, with_parent_rows
from nemo_telemetry.analysis.store.partitions import NO_VALUE, span_files, span_partitions, split_by_partition
from nemo_telemetry.analysis.model.records import spans_table
from nemo_telemetry.analysis.model.schema import EVENTS_SCHEMA, LINKS_SCHEMA
from nemo_telemetry.analysis.model.tree import with_id_keys


def _spans(rows: list[tuple[str | None, int | None]], first_id: int = 1) -> pa.Table:
    return with_id_keys(spans_table([
        {"trace_id": f"{i + first_id:032x}", "span_id": f"{i + first_id:016x}", "name": "rl.x", "start_ns": i,
         "end_ns": i + 1, "run_id": run, "rank": rank}
        for i, (run, rank) in enumerate(rows)]))


def test_a_batch_splits_into_one_table_per_run_and_rank():
    spans = _spans([("b", 1), ("a/x y", 0), ("b", 0), ("b", 1), (None, 2), ("a/x y", None)])
    parts = dict(split_by_partition(spans))
    assert {k: v.num_rows for k, v in parts.items()} == {
        "run_id=b/rank=0": 1, "run_id=b/rank=1": 2, "run_id=a%2Fx%20y/rank=0": 1,
        f"run_id=a%2Fx%20y/rank={NO_VALUE}": 1, f"run_id={NO_VALUE}/rank=2": 1}
    assert parts["run_id=b/rank=1"].column("start_ns").to_pylist() == [0, 3]
    # each part's run_id dictionary holds its own run only (a reader orders runs by dictionaries)
    assert parts["run_id=b/rank=0"].column("run_id").chunk(0).dictionary.to_pylist() == ["b"]


def _write(root: Path, spans: pa.Table) -> None:
    writer = DatasetWriter(root)
    writer.write(OtlpTables(spans, EVENTS_SCHEMA.empty_table(), LINKS_SCHEMA.empty_table()))
    writer.close()


def test_partitions_are_listed_with_their_run_and_rank_and_pruned_by_run(tmp_path):
    _write(tmp_path, _spans([("b", 1), ("a/x y", 0), ("b", 0), (None, None)]))
    _write(tmp_path, _spans([("b", 1)] * 3, first_id=100))
    listed = [(p.run_id, p.rank, len(p.files)) for p in span_partitions(tmp_path)]
    assert listed == [(None, None, 1), ("a/x y", 0, 1), ("b", 0, 1), ("b", 1, 2)]
    assert [(p.run_id, p.rank) for p in span_partitions(tmp_path, run_id="b")] == [("b", 0), ("b", 1)]
    assert sum(pq.ParquetFile(f).metadata.num_rows for f in span_files(tmp_path, run_id="b")) == 5
    assert span_files(tmp_path) == sorted(span_files(tmp_path), key=str)


def test_datasets_without_the_rank_level_still_read(tmp_path):
    spans = _spans([("a", 0), ("a", 1)])
    folder = tmp_path / "spans" / "run_id=a"
    folder.mkdir(parents=True)
    pq.write_table(with_parent_rows(spans), folder / "part-0.parquet")  # a spans file of format 1, no record
    assert [(p.run_id, p.rank) for p in span_partitions(tmp_path)] == [("a", None)]
    assert read_dataset(tmp_path).num_rows == 2


def test_split_keeps_each_partitions_rows_in_order_whatever_the_interleaving():
    """Partitions are slices put together (no gather): rows of one (run, rank) keep their
    order, partitions come sorted by run (first appearance) then rank (null first), and each
    part's run_id dictionary holds only its own run."""
    import numpy as np

    rng = np.random.default_rng(1)
    for trial in range(100):
        n = int(rng.integers(1, 60))
        runs, ranks = rng.choice(["a", "b", None], n), rng.choice([0, 1, 2, -1], n)
        if trial % 2:  # runs of equal keys, as spans of one request arrive
            runs, ranks = np.repeat(runs[: n // 5 + 1], 5)[:n], np.repeat(ranks[: n // 5 + 1], 5)[:n]
        table = pa.table({
            "run_id": pa.array(list(runs), pa.string()).dictionary_encode(),
            "rank": pa.array([None if r == -1 else int(r) for r in ranks], pa.int64()),
            "row": pa.array(range(n)),
        })
        rows = table.to_pylist()
        codes: dict = {}
        for r in rows:
            if r["run_id"] is not None:
                codes.setdefault(r["run_id"], len(codes))

        def key(r):
            return (codes.get(r["run_id"], -1), -(2**63) if r["rank"] is None else r["rank"])

        expected = [[r["row"] for r in rows if key(r) == k] for k in sorted({key(r) for r in rows})]
        parts = [part for _, part in split_by_partition(table)]
        assert [part.column("row").to_pylist() for part in parts] == expected
        for part in parts:
            assert len(part.column("run_id").combine_chunks().dictionary) <= 1
