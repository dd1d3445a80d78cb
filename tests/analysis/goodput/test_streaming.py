"""The out-of-core goodput engine gives the in-memory numbers, batch by batch, in bounded memory."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nemo_telemetry.analysis.model.tables import OtlpTables
from nemo_telemetry.analysis.store.dataset import DatasetWriter
from nemo_telemetry.analysis.goodput.steps import analyse, goodput_document, run_goodput
from nemo_telemetry.analysis.ingestion.ingest import read_spans
from nemo_telemetry.analysis.model.records import spans_table
from nemo_telemetry.analysis.model.schema import EVENTS_SCHEMA, LINKS_SCHEMA
from nemo_telemetry.analysis.engines import choose as engines
from nemo_telemetry.analysis.goodput import partials as streaming
from nemo_telemetry.analysis.engines.choose import goodput_with_engine
from nemo_telemetry.analysis.goodput.partials import stream_goodput
from nemo_telemetry.analysis.model.tree import with_id_keys
from nemo_telemetry.errors import NemoTelemetryError

S = 1_000_000_000
T0 = 1_767_225_600 * S


def scenario_records(*, steps: int = 12, ranks: int = 3, microbatches: int = 4, seed: int = 0) -> list[dict]:
    """Two runs (and a few spans with no run) shaped like NeMo-RL, with every case that attribution
    and per-step merging must get right across (run, rank) partitions:

    - one trace per run; the step and its phases on rank 0, stamped;
    - an *unstamped* training umbrella on rank 0, unstamped ``rl.policy.train`` on every worker rank
      under it, and bucketed unstamped micro-batches under those: each micro-batch walks two
      levels up, across partitions, for its iteration;
    - some steps have a second step span on another rank (the window is their union);
    - validation at iteration 0 (stamped, no step span); unstamped roots; orphans (parent not in
      the data); a bucketed span that ends after its step; overlapping bucketed spans; a span
      that ends before it starts; an unknown bucket value; a job span per run.
    """
    rng = random.Random(seed)
    records: list[dict] = []

    def span_id() -> str:  # random, as OpenTelemetry's are
        return f"{rng.getrandbits(64) | 1:016x}"

    def add(run, trace, name, start, end, *, parent=None, rank=0, bucket=None, iteration=None):
        sid = span_id()
        records.append({"trace_id": trace, "span_id": sid, "parent_span_id": parent, "name": name,
                        "start_ns": int(start), "end_ns": int(end), "run_id": run, "rank": rank,
                        "service_name": "driver" if rank == 0 else "policy_worker", "bucket": bucket,
                        "iteration": iteration})
        return sid

    for r, run in enumerate(("run-b", "run-a")):  # written in this order: run order must not depend on it
        trace = f"{rng.getrandbits(128) | 1:032x}"
        base = T0 + r * 7 * S
        job = add(run, trace, "rl.grpo.job", base, base + (steps + 2) * 30 * S)
        for k in range(3):  # validation before the first step: stamped 0, no step span
            add(run, trace, "rl.grpo.validate", base + k * S, base + k * S + S // 2, parent=job, bucket="overhead",
                iteration=0)
        for i in range(1, steps + 1):
            t = base + i * 30 * S
            step = add(run, trace, "rl.grpo.step", t, t + 29 * S, parent=job, iteration=i)
            if i % 4 == 0:  # a second step span for the same iteration, later end, on rank 1
                add(run, trace, "rl.grpo.step", t + S, t + 29 * S + rng.randrange(S), parent=job, rank=1, iteration=i)
            add(run, trace, "rl.grpo.generation", t, t + 8 * S, parent=step, bucket="productive", iteration=i)
            add(run, trace, "rl.grpo.logprob", t + 8 * S, t + 11 * S, parent=step, bucket="productive", iteration=i)
            add(run, trace, "rl.idle.refit", t + 26 * S, t + 28 * S, parent=step, bucket="idle", iteration=i)
            umbrella = add(run, trace, "rl.grpo.policy_training", t + 12 * S, t + 25 * S, parent=step)
            for rank in range(1, ranks + 1):
                train = add(run, trace, "rl.policy.train", t + 12 * S, t + 25 * S, parent=umbrella, rank=rank)
                for m in range(microbatches):
                    a = t + 12 * S + m * 3 * S + rng.randrange(S // 10)
                    add(run, trace, "rl.policy.microbatch", a, a + 2 * S + rng.randrange(S), parent=train, rank=rank,
                        bucket="productive")
            if i % 3 == 0:  # overlapping bucketed spans (double counted) and a span past the step's end
                add(run, trace, "rl.weights.refit", t + 10 * S, t + 13 * S, parent=step, bucket="overhead",
                    iteration=i)
                add(run, trace, "rl.checkpoint.save", t + 28 * S, t + 35 * S, parent=step, bucket="overhead",
                    iteration=i)
            if i % 5 == 0:  # unstamped root, orphan, invalid interval, unknown bucket
                add(run, f"{rng.getrandbits(128) | 1:032x}", "rl.collector.batch", t, t + S, rank=2, bucket="idle")
                add(run, trace, "rl.policy.microbatch", t + S, t + 2 * S, parent="00000000deadbeef", rank=3,
                    bucket="productive")
                add(run, trace, "rl.data.collate", t + 5 * S, t + 4 * S, parent=step, bucket="overhead",
                    iteration=i)
                add(run, trace, "rl.data.collate", t + 5 * S, t + 6 * S, parent=step, bucket="busy", iteration=i)
        # iteration stamped on a worker with no step span at all (outside the steps)
        add(run, trace, "rl.policy.microbatch", base + (steps + 1) * 30 * S, base + (steps + 1) * 30 * S + S,
            parent=job, rank=1, bucket="wasted", iteration=steps + 1)
    for k in range(3):  # spans with no run id at all: their own "run"
        add(None, f"{999:032x}", "rl.grpo.step", T0 + k * 10 * S, T0 + k * 10 * S + 9 * S, iteration=k + 1)
        add(None, f"{999:032x}", "rl.grpo.generation", T0 + k * 10 * S, T0 + k * 10 * S + 5 * S, bucket="productive",
            iteration=k + 1)
    rng.shuffle(records)  # batches then cut steps and trees apart anywhere
    return records


def write_scenario(root: Path, *, batch: int = 97, **kwargs) -> Path:
    """The scenario ingested in small batches into a dataset (run/rank partitions, many files)."""
    spans = with_id_keys(spans_table(scenario_records(**kwargs)))
    writer = DatasetWriter(root)
    for offset in range(0, spans.num_rows, batch):
        writer.write(OtlpTables(spans.slice(offset, batch), EVENTS_SCHEMA.empty_table(), LINKS_SCHEMA.empty_table()))
    writer.close()
    return root


def as_plain(runs) -> list[dict]:
    """RunGoodput tuples as plain values, for exact comparison."""
    return [{"run_id": r.run_id, "steps": r.steps.to_pylist(), "total": r.total, "outside": r.outside_steps,
             "job_wall_s": r.job_wall_s, "outliers": r.outliers} for r in runs]


@pytest.fixture(scope="module")
def scenario(tmp_path_factory) -> Path:
    return write_scenario(tmp_path_factory.mktemp("scenario") / "ds")


def test_the_scenario_exercises_what_the_engine_must_merge(scenario):
    runs = {r.run_id: r for r in run_goodput(read_spans(scenario))}
    assert set(runs) == {"run-a", "run-b", None}
    a = runs["run-a"]
    assert a.total["steps"] == 12
    assert a.outside_steps["unstamped_spans"] == 4  # 2 unstamped roots + 2 orphans
    assert a.outside_steps["iterations"] == [0, 13]
    assert a.steps.column("double_counted_s").to_pylist()[2] > 0
    assert a.outliers and a.job_wall_s is not None  # the later second step spans stretch a few windows
    # the micro-batches walked two levels up across ranks: productive time is more than the driver's phases
    assert min(a.steps.column("productive_s").to_pylist()) > 11.0
    parts = {p.parent.relative_to(scenario / "spans").as_posix() for p in (scenario / "spans").rglob("*.parquet")}
    assert {"run_id=run-a/rank=0", "run_id=run-a/rank=3", "run_id=__HIVE_DEFAULT_PARTITION__/rank=0"} <= parts


@pytest.mark.parametrize("batch_rows", [5, 64, 1 << 18])
def test_streaming_equals_in_memory_whatever_the_batch(scenario, batch_rows):
    expected = as_plain(run_goodput(read_spans(scenario)))
    assert as_plain(stream_goodput(scenario, batch_rows=batch_rows)) == expected


@pytest.mark.parametrize("run_id", [None, "run-a"])
def test_reading_only_goodputs_rows_equals_decoding_the_whole_table(scenario, run_id):
    # by step decodes only bucketed, step and job spans (walking through the rest when it must);
    # by rank and the findings' analyse decode every span: the rules must give them the same numbers
    spans = read_spans(scenario)
    by_rank = run_goodput(spans, run_id=run_id, by="rank")
    assert as_plain(run_goodput(spans, run_id=run_id)) == as_plain(by_rank)
    table = analyse(spans, run_id=run_id).table
    steps = pa.concat_tables([r.steps for r in by_rank])
    assert table["productive_s"].tolist() == steps.column("productive_s").to_pylist()
    assert table["covered_s"].tolist() == steps.column("covered_s").to_pylist()


@pytest.mark.parametrize("batch_rows", [5, 64])
@pytest.mark.parametrize("run_id", [None, "run-b"])
def test_streaming_by_rank_gives_the_in_memory_json(scenario, batch_rows, run_id):
    expected = goodput_document(run_goodput(read_spans(scenario), run_id=run_id, by="rank"))
    assert all(run["ranks"] for run in expected["runs"])
    assert goodput_document(stream_goodput(scenario, run_id=run_id, batch_rows=batch_rows, by="rank")) == expected


def test_streaming_one_run(scenario):
    expected = as_plain(run_goodput(read_spans(scenario), run_id="run-b"))
    assert [r["run_id"] for r in expected] == ["run-b"]
    assert as_plain(stream_goodput(scenario, run_id="run-b", batch_rows=50)) == expected


def test_unknown_run_is_a_typed_error_naming_the_runs(scenario):
    with pytest.raises(NemoTelemetryError, match="run-a"):
        stream_goodput(scenario, run_id="nope")


def test_empty_dataset(tmp_path):
    DatasetWriter(tmp_path / "empty").close()
    assert stream_goodput(tmp_path / "empty") == run_goodput(read_spans(tmp_path / "empty")) == ()


def test_local_engine_streams_when_the_dataset_is_over_the_memory_budget(scenario, monkeypatch):
    calls = []
    monkeypatch.setattr(engines, "stream_goodput", lambda *a, **k: calls.append(a) or stream_goodput(*a, **k))
    expected = as_plain(run_goodput(read_spans(scenario)))
    assert as_plain(goodput_with_engine(scenario, engine="local")) == expected
    assert calls == []  # a small dataset is read into memory
    assert as_plain(goodput_with_engine(scenario, engine="local", memory_budget=1)) == expected
    assert len(calls) == 1
    by_rank = goodput_with_engine(scenario, engine="local", by="rank", memory_budget=1)
    assert len(calls) == 2 and all(r.ranks is not None for r in by_rank)  # per rank streams too


def test_unknown_engine_is_a_typed_error(scenario):
    with pytest.raises(NemoTelemetryError, match="local, ray"):
        goodput_with_engine(scenario, engine="spark")


def test_ray_engine_needs_a_dataset_directory(tmp_path):
    dump = tmp_path / "traces.jsonl"
    dump.write_text("")
    with pytest.raises(NemoTelemetryError, match="ingest"):  # said before any cluster is started
        goodput_with_engine(dump, engine="ray")


_MEASURE = """
import json, sys, pyarrow as pa
from nemo_telemetry.analysis.ingestion.ingest import read_spans
from nemo_telemetry.analysis.goodput.steps import run_goodput
from nemo_telemetry.analysis.goodput.partials import stream_goodput
root, how = sys.argv[1], sys.argv[2]
if how == "stream":
    runs = stream_goodput(root, batch_rows=2000)
else:
    runs = run_goodput(read_spans(root))
print(json.dumps({"peak": pa.default_memory_pool().max_memory(), "steps": sum(r.total["steps"] for r in runs)}))
"""


def _arrow_peak(root: Path, how: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _MEASURE, str(root), how], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_streaming_memory_is_bounded_by_the_batch_not_the_dataset(tmp_path):
    # ~50k spans; the in-memory path decodes them all at once, the stream 2,000 rows at a time.
    root = write_scenario(tmp_path / "big", steps=400, ranks=8, microbatches=6, batch=20_000)
    size = pa.concat_tables([read_spans(root)]).nbytes
    in_memory, streamed = _arrow_peak(root, "memory"), _arrow_peak(root, "stream")
    assert streamed["steps"] == in_memory["steps"] == 803
    assert in_memory["peak"] > size  # the whole table was in Arrow memory at once
    assert streamed["peak"] < size / 8, (streamed, size)


def test_walks_climb_inside_a_batch_so_passes_count_partition_hops(tmp_path):
    # micro-batch -> train (same rank) -> umbrella -> step (rank 0): one hop between partitions
    root = write_scenario(tmp_path / "ds", batch=100_000)  # one file per (run, rank) partition
    passes = []
    inner = streaming.local_scan(1 << 18)

    def counting_scan(fn, columns, files):
        passes.append(len(files))
        return inner(fn, columns, files)

    expected = as_plain(run_goodput(read_spans(root)))
    assert as_plain(streaming.partitioned_goodput(root, counting_scan)) == expected
    # the search for step spans to number (goodput.numbering: name and rl.iteration), walk starts
    # (climbed in their batch), one lookup round, partials
    assert len(passes) == 4


def test_merge_shuffled_by_step_to_reducers_equals_one_merge(scenario):
    # the Ray engine's map and reduce task bodies, run here: partials split by (run, iteration)
    # to three reducers, each condensing its steps' interval unions to two rows per step
    from nemo_telemetry.analysis.engines.ray_engine import _partials_by_step, _reduce_steps

    plan = streaming.attribution(scenario, streaming.local_scan())
    files = [str(f) for f in plan.files]
    pieces = [_partials_by_step(files[i:i + 60], 3, plan.attributed, None) for i in range(0, len(files), 60)]
    reduced = [_reduce_steps(*[p[1 + r] for p in pieces]) for r in range(3)]
    assert all(t.num_rows for t in reduced)  # every reducer owns some steps
    accumulator = streaming.GoodputAccumulator()
    for table in reduced:
        accumulator.add(table)
    assert as_plain(accumulator.result(plan.order)) == as_plain(run_goodput(read_spans(scenario)))


@pytest.mark.parametrize("batch_rows", [5, 64, None])
@pytest.mark.parametrize("run_id", [None, "run-a", "run-b"])
def test_the_local_engine_reads_a_dataset_batch_by_batch_as_the_table_gives(scenario, batch_rows, run_id):
    """By step, the local engine keeps only each batch's goodput rows and walk columns: walks that
    leave those rows (micro-batches two levels under their stamped step) and the runs' order come
    out as from the whole table, whatever the batch."""
    from nemo_telemetry.analysis.goodput.steps import goodput_of_rows, read_goodput_rows
    from nemo_telemetry.analysis.store.read import STEP_GOODPUT_COLUMNS, span_source_files

    expected = as_plain(run_goodput(read_spans(scenario), run_id=run_id))
    _, files = span_source_files(scenario)
    rows = read_goodput_rows(files, STEP_GOODPUT_COLUMNS, batch_rows=batch_rows)
    assert rows is not None and len(rows.position) < rows.walk_table().num_rows
    assert as_plain(goodput_of_rows(rows, run_id=run_id)) == expected
    assert as_plain(goodput_with_engine(scenario, run_id=run_id)) == expected


def test_spans_written_without_id_keys_are_stored_with_them_and_read_by_batch(tmp_path):
    """A writer given spans without the id key columns stores them with the keys and their parent
    rows (the dataset format: a file without them is refused, see test_dataset_commits), so the
    batch read serves them."""
    spans = spans_table(scenario_records(steps=3))
    assert "trace_key" not in spans.column_names
    writer = DatasetWriter(tmp_path / "ds")
    writer.write(OtlpTables(spans, EVENTS_SCHEMA.empty_table(), LINKS_SCHEMA.empty_table()))
    writer.close()
    from nemo_telemetry.analysis.goodput.steps import goodput_of_rows, read_goodput_rows
    from nemo_telemetry.analysis.store.read import STEP_GOODPUT_COLUMNS, span_source_files

    _, files = span_source_files(tmp_path / "ds")
    assert files and all({"trace_key", "span_key", "parent_key", "parent_row"} <= set(pq.read_schema(f).names)
                         for f in files)
    rows = read_goodput_rows(files, STEP_GOODPUT_COLUMNS)
    assert rows is not None
    assert as_plain(goodput_of_rows(rows)) == as_plain(run_goodput(spans))
    assert as_plain(goodput_with_engine(tmp_path / "ds")) == as_plain(run_goodput(spans))
