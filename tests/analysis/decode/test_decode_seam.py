"""The read seam (``nemo_telemetry.analysis.decode``): every strategy builds the structure the plain
reference builds from the same rows, field by field, and the rules give the same goodput and
findings whichever strategy built their input.

The datasets are random: several files and commits, trees that cross files and traces, the same
span id in two traces, spans naming a parent no one holds or themselves, rows without a bucket,
an iteration or a category, intervals that end before they start, resources on some processes
only; read whole, and batch by batch in batches of several sizes."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from nemo_telemetry.analysis.decode import SpanReader, file_rows, reference_arrays, rows_arrays, span_arrays
from nemo_telemetry.analysis.engines.choose import check_with_engine, goodput_with_engine
from nemo_telemetry.analysis.engines.partitioned_check import stream_check
from nemo_telemetry.analysis.findings.checks import check_arrays, check_run, check_span_files
from nemo_telemetry.analysis.goodput.numbering import numbered_spans
from nemo_telemetry.analysis.goodput.partials import stream_goodput
from nemo_telemetry.analysis.goodput.steps import run_goodput
from nemo_telemetry.analysis.ingestion._columns import OtlpTables
from nemo_telemetry.analysis.model.records import spans_table
from nemo_telemetry.analysis.model.schema import EVENTS_SCHEMA, LINKS_SCHEMA
from nemo_telemetry.analysis.model.tree import with_id_keys
from nemo_telemetry.analysis.settings.machine import ReadSettings
from nemo_telemetry.analysis.store.dataset import DatasetWriter
from nemo_telemetry.analysis.ingestion.read import read_for_analysis
from nemo_telemetry.analysis.store.read import span_source_files

NAMES = ("rl.grpo.step", "rl.job", "rl.vllm.generate", "rl.train.microbatch", "rl.policy.update", "rl.rollout")
BUCKET_VALUES = ("productive", "overhead", "idle", "wasted", "made-up")
S = 1_000_000_000


def random_records(seed: int, n: int) -> list[dict]:
    """``n`` spans over 2 runs x 2 ranks (one process without a run), a handful of traces."""
    rng = random.Random(seed)
    processes = [(run, rank) for run in ("run-a", "run-b") for rank in (0, 1)] + [(None, 0)]
    resources = {}
    for run, rank in processes:
        resource = {"service.name": f"svc-{rank}", "nv.dl.rank": str(rank)}
        if run is not None:
            resource["nemo.run.id"] = run
        if rng.random() < 0.7:
            resource["nemo.telemetry.span_groups"] = rng.choice(["step,generation", "step", "rollout,checkpoint"])
        resources[(run, rank)] = resource
    traces = [f"{rng.getrandbits(128):032x}" for _ in range(rng.randint(2, 6))]
    ids = [rng.getrandbits(63) | 1 for _ in range(n)]
    ids[-1] = ids[0]  # the same span id in two traces (unless the trace draw puts both in one: then a dup)
    trace_of = [rng.choice(traces) for _ in range(n)]
    if trace_of[-1] == trace_of[0]:
        trace_of[-1] = traces[(traces.index(trace_of[0]) + 1) % len(traces)]
    records = []
    for i in range(n):
        roll = rng.random()
        if roll < 0.15:
            parent = None  # a root
        elif roll < 0.2:
            parent = f"{rng.getrandbits(63) | 1:016x}"  # held by no one: an orphan
        elif roll < 0.22:
            parent = f"{ids[i]:016x}"  # itself
        else:
            j = rng.randrange(n)  # any span, before or after, in any file; same trace mostly
            parent = f"{ids[j]:016x}"
            if rng.random() < 0.8:
                trace_of[i] = trace_of[j] if j != n - 1 and i != n - 1 else trace_of[i]
        start = rng.randrange(0, 100 * S)
        end = start + rng.randrange(0, 5 * S) if rng.random() < 0.95 else start - rng.randrange(1, S)
        process = rng.choice(processes)
        record = {"trace_id": trace_of[i], "span_id": f"{ids[i]:016x}", "parent_span_id": parent,
                  "name": rng.choice(NAMES), "start_ns": start, "end_ns": end,
                  "resource_attributes": resources[process]}
        if rng.random() < 0.5:
            record["bucket"] = rng.choice(BUCKET_VALUES)
        if rng.random() < 0.4:
            record["iteration"] = rng.randrange(0, 6)
        if rng.random() < 0.2:
            record["efficiency_category"] = rng.choice(["tool_call", "env_step", "queue_wait"])
        records.append(record)
    return records


def write(root: Path, records: list[dict], *, batch: int, file_rows: int, commit_every: int) -> Path:
    spans = with_id_keys(spans_table(records))
    writer = DatasetWriter(root, file_rows=file_rows)
    for k, offset in enumerate(range(0, spans.num_rows, batch)):
        writer.write(OtlpTables(spans.slice(offset, batch), EVENTS_SCHEMA.empty_table(), LINKS_SCHEMA.empty_table()))
        if k % commit_every == commit_every - 1:
            writer.commit()
    writer.close()
    return root


SEEDS = [1, 2, 3, 4]


@pytest.fixture(scope="module", params=SEEDS)
def dataset(request, tmp_path_factory) -> tuple[Path, list[str], pa.Table]:
    """(dataset root, its spans files in dataset order, every column of every row in that order)."""
    rng = random.Random(request.param)
    records = random_records(request.param, rng.randint(150, 700))
    root = write(tmp_path_factory.mktemp(f"seam-{request.param}") / "ds", records, batch=rng.randint(20, 300),
                 file_rows=rng.choice([0, 40, 97]), commit_every=rng.randint(1, 3))
    _, files = span_source_files(root)
    assert len(files) > 2
    whole = ds.dataset(files, format="parquet").to_table()
    return root, files, whole


def values(codes: np.ndarray, table: tuple) -> list:
    return [table[c] if c >= 0 else None for c in codes.tolist()]


def assert_same(got, want) -> None:
    """``got`` holds what the reference ``want`` holds, field by field (values, not codes)."""
    n = len(want)
    assert len(got) == n
    for codes, table in (("name", "names"), ("run", "runs"), ("bucket_raw", "bucket_values"),
                         ("category", "categories")):
        got_values, want_values = (values(getattr(a, codes), getattr(a, table)) for a in (got, want))
        assert got_values == want_values, codes
    for field in ("start", "end", "valid_interval", "bucket", "iteration", "has_iteration"):
        assert getattr(got, field).tolist() == getattr(want, field).tolist(), field
    assert got.parents.tolist() == want.parents.tolist()
    assert got.has_parent.tolist() == want.has_parent.tolist()
    assert got.orphan.tolist() == want.orphan.tolist()
    every = np.arange(n)
    assert got.span_id(every) == want.span_id(every)
    assert got.trace_id(every) == want.trace_id(every)

    def pairs(a):
        p = a.pairs.get()
        return ({(a.runs[r], a.names[c]) for r, c in p.names},
                {key: {(a.runs[r], v) for r, v in found} for key, found in p.resources.items()})

    assert pairs(got) == pairs(want)
    for code, run in enumerate(got.runs):  # per run, as a run filter reads them
        keep = got.run == code
        assert {got.names[c] for _, c in got.run_names(keep)} == {
            want.names[c] for r, c in want.run_names(np.ones(n, bool)) if want.runs[r] == run}


def test_the_random_datasets_hold_every_case(dataset):
    """Not vacuous: each dataset has roots, orphans, parents across files, every kind of row."""
    _, files, whole = dataset
    want = reference_arrays(whole)
    assert want.orphan.any() and (~want.has_parent).any() and (want.parents >= 0).any()
    assert (want.bucket == -1).any() and (want.bucket == -2).any() and (want.bucket >= 0).any()
    assert (~want.has_iteration).any() and want.has_iteration.any() and (~want.valid_interval).any()
    assert (want.category == -1).any() and (want.category >= 0).any()
    assert len(set(values(want.run, want.runs))) >= 2
    file_of = np.repeat(np.arange(len(files)), [ds.dataset(f).count_rows() for f in files])
    has = want.parents >= 0
    assert (file_of[has] != file_of[want.parents[has]]).any()  # parents in another file


def test_a_table_in_memory_decodes_as_the_reference(dataset):
    _, _, whole = dataset
    want = reference_arrays(whole)
    assert_same(span_arrays(whole), want)
    for threads in (1, 3):
        with SpanReader(ReadSettings(threads=threads, memory_budget=1 << 30)) as read:
            got = read.table(whole)
        assert_same(got, want)


@pytest.mark.parametrize("batch_rows", [7, 64, None])
def test_spans_files_batch_by_batch_decode_as_the_reference(dataset, batch_rows):
    root, files, whole = dataset
    want = reference_arrays(whole)
    with SpanReader(ReadSettings(threads=2, memory_budget=1 << 30, batch_rows=50)) as read:
        got = read.files(files, batch_rows=batch_rows)
    assert_same(got, want)
    assert_same(span_arrays(read_for_analysis(root)), want)  # the projection check reads, in memory


def test_rows_handed_over_as_arrays_decode_as_the_reference(dataset):
    """The partitioned check's driver gets rows as values and uint64 ids (its orphan test and run
    pairs done over the files): handed every row so, it holds what the reference holds."""
    _, _, whole = dataset
    want = reference_arrays(whole)
    every = np.arange(len(want))
    keys = tuple(np.asarray(want.table.column(c).to_numpy(), np.uint64) for c in ("span_key", "trace_key"))
    parent_key = np.array([0 if p is None else int(p, 16) for p in whole.column("parent_span_id").to_pylist()],
                          np.uint64)
    got = rows_arrays(
        trace_id=want.trace_id(every), keys=(*keys, parent_key), name=(want.name, want.names),
        run=(want.run, want.runs), bucket=(want.bucket_raw, want.bucket_values),
        category=(want.category, want.categories), start=want.start, end=want.end, iteration=want.iteration,
        has_iteration=want.has_iteration, orphan=want.orphan, pairs=want.pairs.get())
    assert_same(got, want)


@pytest.mark.parametrize("batch_rows", [13, None])
def test_the_rows_goodput_reads_decode_as_the_reference_there(dataset, batch_rows):
    """goodput by step reads only the bucketed, step and job spans of the files (and every row's
    walk columns): those rows hold what the reference holds at them, and the walk columns are
    every row's."""
    _, files, whole = dataset
    want = reference_arrays(whole)
    read = file_rows(files, ("name", "start_ns", "end_ns", "run_id", "rl.bucket", "rl.iteration", "trace_key",
                             "span_key", "parent_key"), r"^rl\.grpo\.step$|^rl\.job$", batch_rows=batch_rows)
    expected = np.flatnonzero((want.bucket != -1) | want.rows_of_names(r"^rl\.grpo\.step$|^rl\.job$"))
    assert 0 < len(expected) < len(want) and read.position.tolist() == expected.tolist()
    got = span_arrays(read.rows)
    for codes, table in (("name", "names"), ("run", "runs"), ("bucket_raw", "bucket_values")):
        assert values(getattr(got, codes), getattr(got, table)) == [
            values(getattr(want, codes), getattr(want, table))[i] for i in expected], codes
    for field in ("start", "end", "iteration", "has_iteration", "bucket"):
        assert getattr(got, field).tolist() == getattr(want, field)[expected].tolist(), field
    walk = read.walk_table()
    assert walk.column("span_key").to_pylist() == want.table.column("span_key").to_pylist()


def _sorted_report(report) -> dict:
    out = report.to_dict()
    return {"counts": out["counts"], "findings": sorted(out["findings"], key=lambda f: repr(sorted(f.items())))}


def test_check_and_goodput_are_the_same_from_every_strategy(dataset):
    """The rules over every strategy's arrays, the reference's included, give one report; goodput
    on every engine gives one result."""
    root, files, whole = dataset
    table = read_for_analysis(root)
    expected = check_run(table).to_dict()
    assert sum(expected["counts"]["by_code"].values()) > 0
    assert check_span_files(files).to_dict() == expected
    one_thread = ReadSettings(threads=1, memory_budget=0)
    assert check_span_files(files, batch_rows=11, settings=one_thread).to_dict() == expected
    assert check_run(table, settings=ReadSettings(threads=4, memory_budget=1 << 30)).to_dict() == expected
    assert check_with_engine(root).to_dict() == expected
    assert stream_check(root).to_dict() == expected
    # the reference numbers values in another order: the same findings, maybe listed in another order
    numbered, numbers = numbered_spans(with_id_keys(table))
    assert _sorted_report(check_arrays(reference_arrays(numbered), run_id=None, numbers=numbers,
                                       unattributed_threshold=0.2, overlap_tolerance_s=0.001, max_span_ids=10,
                                       max_findings_per_code=100)) == _sorted_report(check_run(table))
    for by in ("step", "rank"):
        runs = run_goodput(table, by=by)
        assert goodput_with_engine(root, by=by) == runs
        assert stream_goodput(root, by=by) == runs


def test_the_rules_and_engines_read_spans_through_the_seam_only():
    """goodput/, findings/ and engines/ import the seam's public module, never its parts, and no
    thread pool or future of their own schedules a decode (the seam owns its workers)."""
    import ast

    import nemo_telemetry.analysis as analysis

    base = Path(analysis.__file__).parent
    seen = 0
    for package in ("goodput", "findings", "engines"):
        for path in (base / package).glob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module:
                    seen += 1
                    assert not node.module.startswith("nemo_telemetry.analysis.decode."), (path, node.module)
                    assert node.module != "nemo_telemetry.analysis.model._arrays", path
            if package != "engines":
                assert "ThreadPoolExecutor" not in path.read_text(), path
    assert seen > 20


@pytest.mark.parametrize("threads", [1, 2])
def test_a_reader_uses_the_threads_its_settings_give_and_joins_them(dataset, threads):
    """The seam's workers number at most ``ReadSettings.threads``, are gone once its block ends, and
    leave the arrays whole (every Later answered after the block)."""
    import threading

    _, files, whole = dataset
    want = reference_arrays(whole)
    with SpanReader(ReadSettings(threads=threads, memory_budget=0)) as read:
        got = read.table(whole)
        files_got = read.files(files)
        workers = [t for t in threading.enumerate() if t.name.startswith("nemo-decode")]
        assert 1 <= len(workers) <= threads
    assert not [t for t in threading.enumerate() if t.name.startswith("nemo-decode")]
    assert_same(got, want)
    assert_same(files_got, want)
