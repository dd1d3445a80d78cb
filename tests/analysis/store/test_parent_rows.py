"""The ``parent_row`` index a spans file carries: each span's parent as a row of the same file.

Ingest writes it (:func:`~nemo_telemetry.analysis.store.dataset.with_parent_rows`, from
:func:`~nemo_telemetry.analysis.model.keys.local_parent_rows`), and ``check`` reads it instead of
building a key index of every span, looking up only the references a file does not answer.
What a user relies on:

- the column says what it claims, checked against a plain Python reference;
- ``check`` over a dataset gives the same report as the in-memory ``check_run`` (the key index)
  and the partitioned engine, with parents across files, orphans, detached traces and unstamped
  spans walking across files to their stamped ancestor;
- a dataset whose files (some or all) lack the column is of a layout before dataset format 1:
  refused, naming the file, not read another way;
- a damaged column, or a file whose rows another tool reordered, is a clear error naming the file
  (exit 2 from the CLI), never a wrong report.
"""

from __future__ import annotations

import json

import shutil
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from test_streaming import as_plain
from test_streaming_check import check_records
from typer.testing import CliRunner

from nemo_telemetry.analysis.engines.choose import (
    check_with_engine,
    goodput_with_engine,
)
from nemo_telemetry.analysis.engines.partitioned_check import stream_check
from nemo_telemetry.analysis.goodput.census import NOT_A_RUN_CODES
from nemo_telemetry.analysis.findings.checks import (
    SPAN_GROUPS_ATTRIBUTE,
    check_run,
    check_span_files,
)
from nemo_telemetry.analysis.model.tables import OtlpTables
from nemo_telemetry.analysis.model import keys as keys_module
from nemo_telemetry.analysis.decode import SpanReader, span_arrays
from nemo_telemetry.analysis.model.keys import (
    NO_PARENT,
    PARENT_ELSEWHERE,
    local_parent_rows,
)
from nemo_telemetry.analysis.model.records import spans_table
from nemo_telemetry.analysis.model.schema import EVENTS_SCHEMA, LINKS_SCHEMA, PARENT_ROW
from nemo_telemetry.analysis.model.tree import with_id_keys
from nemo_telemetry.analysis.store import commits
from nemo_telemetry.analysis.store.dataset import DatasetWriter, with_parent_rows
from nemo_telemetry.analysis.ingestion.read import read_for_analysis
from nemo_telemetry.analysis.store.read import span_source_files
from nemo_telemetry.cli.app import app
from nemo_telemetry.errors import DamagedDatasetError, DatasetFormatError, IngestError

ID_KEYS = ("span_key", "trace_key", "parent_key")
runner = CliRunner()


# --- references --------------------------------------------------------------------------------

def parent_rows_by_hand(span_key, trace_key, parent_key) -> list[int]:
    """What ``parent_row`` means, in plain Python: -1 for no parent (key 0), else the lowest row
    other than the span's own whose (trace, span id) is (the span's trace, its parent key), else -2."""
    rows_of = defaultdict(list)
    for row, (trace, span) in enumerate(zip(trace_key.tolist(), span_key.tolist())):
        rows_of[trace, span].append(row)
    out = []
    for row, (trace, parent) in enumerate(zip(trace_key.tolist(), parent_key.tolist())):
        if parent == 0:
            out.append(NO_PARENT)
            continue
        others = [r for r in rows_of.get((trace, parent), ()) if r != row]
        out.append(others[0] if others else PARENT_ELSEWHERE)
    return out


def file_keys(path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(span_key, trace_key, parent_key) of a spans file, a null key read as 0 (as ingest reads it)."""
    table = pq.read_table(path, columns=list(ID_KEYS))
    return tuple(pc.fill_null(table.column(c), 0).to_numpy().astype(np.uint64) for c in ID_KEYS)


def spans_files(root: Path) -> list[str]:
    _, files = span_source_files(root)
    return files


def rewrite_file(path, change) -> None:
    """Rewrite one spans file in place as ``change(table)`` gives it (same name, same commit), in a
    dataset whose commit records then hold no file sizes, as an earlier version's did (with them,
    a reader refuses a file that is not the one committed)."""
    table = pq.read_table(path)
    pq.write_table(change(table), path)
    root = next(p for p in Path(path).parents if (p / "_commits").is_dir())
    for record in (root / "_commits").glob("*.json"):
        content = json.loads(record.read_bytes())
        content.pop("sizes", None)
        record.write_text(json.dumps(content))


def without_parent_row(table: pa.Table) -> pa.Table:
    return table.drop_columns([PARENT_ROW])


def with_parent_row_at(row: int, value: int):
    """A ``change`` for :func:`rewrite_file`: ``parent_row`` set to ``value`` at ``row``."""
    def change(table: pa.Table) -> pa.Table:
        values = table.column(PARENT_ROW).to_numpy().copy()
        values[row] = value
        at = table.schema.get_field_index(PARENT_ROW)
        return table.set_column(at, table.schema.field(at), pa.array(values, type=pa.int32()))
    return change


def stripped_copy(root: Path, dest: Path, which=lambda i, n: True) -> Path:
    """A copy of the dataset ``root`` whose spans files ``which(i, n)`` picks (i-th of n, in
    sorted order) are rewritten without ``parent_row``: as a dataset ingested before the column."""
    shutil.copytree(root, dest)
    files = spans_files(dest)
    for i, path in enumerate(files):
        if which(i, len(files)):
            rewrite_file(path, without_parent_row)
    return dest


# --- 1. local_parent_rows -----------------------------------------------------------------------

def test_a_hand_built_file_gives_each_span_its_parents_row():
    """Parents before and after their children; roots; a parent id held only in another trace; a
    parent no span holds; a span naming itself; a duplicated id: the lowest row that is not the
    span's own (the lowest is the span itself for row 6, so its parent is row 7)."""
    rows = [  # (trace, span, parent) -> expected parent_row
        ((1, 10, 0), NO_PARENT),          # 0: root
        ((1, 11, 10), 0),                 # 1: parent before it
        ((1, 12, 11), 1),                 # 2: a chain
        ((2, 20, 10), PARENT_ELSEWHERE),  # 3: span 10 exists, but in trace 1 only
        ((1, 13, 99), PARENT_ELSEWHERE),  # 4: no span 99 anywhere
        ((1, 14, 14), PARENT_ELSEWHERE),  # 5: names itself only
        ((3, 30, 30), 7),                 # 6: names its own id, which row 7 holds too: the lowest other row
        ((3, 30, 0), NO_PARENT),          # 7: the duplicate, a root
        ((3, 31, 30), 6),                 # 8: two rows hold 30: the lowest
        ((3, 30, 30), 6),                 # 9: a third copy naming its id: the lowest other row
        ((4, 41, 40), 11),                # 10: the parent comes after its child
        ((4, 40, 0), NO_PARENT),          # 11
        ((2**64 - 1, 2**64 - 1, 2**64 - 1), PARENT_ELSEWHERE),  # 12: the largest keys, naming itself
        ((2**64 - 1, 2**64 - 2, 2**64 - 1), 12),                # 13
    ]
    trace, span, parent = (np.array(column, dtype=np.uint64) for column in zip(*(keys for keys, _ in rows)))
    expected = [want for _, want in rows]
    assert parent_rows_by_hand(span, trace, parent) == expected  # the reference says the same
    found = local_parent_rows(span, trace, parent)
    assert found.dtype == np.int32
    assert found.tolist() == expected


@pytest.mark.parametrize("block_rows", [7, keys_module.BLOCK_ROWS], ids=["blocks-of-7", "one-block"])
def test_local_parent_rows_equals_the_reference_over_random_files(block_rows, monkeypatch):
    """Random files with few distinct ids, so that ids repeat within and across traces, spans name
    themselves, and parents are missing: every row as the plain Python reference gives it (the key
    index built a block of rows at a time, block edges included)."""
    monkeypatch.setattr(keys_module, "BLOCK_ROWS", block_rows)
    rng = np.random.default_rng(20261203)
    seen = set()
    for n in (0, 1, 2, 3, 17, 300, 3000):
        for _ in range(3):
            trace = rng.integers(1, 4, n).astype(np.uint64)
            span = rng.integers(1, max(2, n // 3), n).astype(np.uint64)
            parent = rng.integers(0, max(3, n // 3) + 5, n).astype(np.uint64)  # 0: root; past the ids: missing
            expected = parent_rows_by_hand(span, trace, parent)
            found = local_parent_rows(span, trace, parent)
            assert found.dtype == np.int32 and found.tolist() == expected, n
            seen.update(min(v, 0) for v in expected)  # -2, -1, or 0 for "a row"
    assert seen == {NO_PARENT, PARENT_ELSEWHERE, 0}  # every kind of answer came up


def test_with_parent_rows_appends_the_column_and_the_id_keys_it_is_made_from():
    """A spans table with its id keys gets ``parent_row`` (int32, never null) as its last column;
    one without them gets the keys first (a spans file always holds both: dataset format 1)."""
    spans = spans_table(check_records())
    keyed = with_id_keys(spans)
    assert "span_key" not in spans.column_names and with_parent_rows(spans).equals(with_parent_rows(keyed))
    out = with_parent_rows(keyed)
    assert out.column_names == [*keyed.column_names, PARENT_ROW]
    assert out.schema.field(PARENT_ROW).type == pa.int32() and out.column(PARENT_ROW).null_count == 0
    assert out.drop_columns([PARENT_ROW]).equals(keyed)
    assert out.column(PARENT_ROW).to_pylist() == parent_rows_by_hand(
        *(pc.fill_null(keyed.column(c), 0).to_numpy().astype(np.uint64) for c in ID_KEYS))


# --- datasets -----------------------------------------------------------------------------------

def write_dataset(root: Path, *, batch: int, file_rows: int = 0, commit_every: int | None = None,
                  records: list[dict] | None = None) -> Path:
    """``records`` (default: the check scenario, test_streaming_check.check_records: the goodput
    scenario's two runs over ranks 0-3, orphans, detached traces, unstamped micro-batches under
    unstamped spans of other ranks, nested buckets across ranks) ingested ``batch`` spans per
    write, a commit every ``commit_every`` writes."""
    spans = with_id_keys(spans_table(check_records() if records is None else records))
    writer = DatasetWriter(root, file_rows=file_rows)
    for k, offset in enumerate(range(0, spans.num_rows, batch)):
        writer.write(OtlpTables(spans.slice(offset, batch), EVENTS_SCHEMA.empty_table(), LINKS_SCHEMA.empty_table()))
        if commit_every and k % commit_every == commit_every - 1:
            writer.commit()
    writer.close()
    return root


LAYOUTS = {
    "file-per-partition": {"batch": 100_000},  # a trace's spans over ranks, so over files
    "file-per-write": {"batch": 150},  # several files per partition, one commit
    "file-rows-and-commits": {"batch": 97, "file_rows": 20, "commit_every": 2},
}


@pytest.fixture(scope="module", params=list(LAYOUTS))
def layout(request, tmp_path_factory) -> tuple[Path, Path]:
    """(a dataset as ingest writes it, a copy whose files were rewritten without ``parent_row``: a
    layout before dataset format 1, refused)."""
    base = tmp_path_factory.mktemp(request.param)
    root = write_dataset(base / "ds", **LAYOUTS[request.param])
    return root, stripped_copy(root, base / "stripped")


def test_every_spans_file_holds_its_parents_rows(layout):
    """Each file ingest writes carries ``parent_row``, as the reference computes it from that
    file's own keys; across files, spans whose parent sits in another file are marked -2."""
    root, _ = layout
    files = spans_files(root)
    kinds = set()
    for path in files:
        schema = pq.read_schema(path)
        assert schema.field(PARENT_ROW).type == pa.int32(), path
        column = pq.read_table(path, columns=[PARENT_ROW]).column(0)
        assert column.null_count == 0
        expected = parent_rows_by_hand(*file_keys(path))
        assert column.to_pylist() == expected, path
        kinds.update(min(v, 0) for v in expected)
    assert kinds == {NO_PARENT, PARENT_ELSEWHERE, 0}


def dataset_parents_by_hand(files: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(parent row, orphan) of every span of ``files`` in their order: the row holding the span's
    trace and parent key (ingest stores each (trace, span) once), -1 for a root, an orphan or a
    span naming itself."""
    span, trace, parent = (np.concatenate(k) for k in zip(*(file_keys(f) for f in files)))
    row_of = {}
    for row, key in enumerate(zip(trace.tolist(), span.tolist())):
        assert key not in row_of  # deduplicated: the reference is well defined
        row_of[key] = row
    parents = np.array([-1 if p == 0 else row_of.get((t, p), -1) for t, p in zip(trace.tolist(), parent.tolist())])
    # an orphan names an id no span of its trace holds (test_orphans' definition: a span naming
    # itself holds it, so it is no orphan), and a span naming itself has no parent row
    orphan = (parent != 0) & (parents < 0)
    parents[parents == np.arange(len(parents))] = -1
    return parents, orphan


def test_check_reads_parents_from_the_files_and_finds_those_in_other_files(layout):
    """With ``parent_row`` in every file, check takes its parents from there (no key index), and
    the references a file leaves open are found in the other files: every span's parent and the
    orphans as a plain dictionary over the whole dataset gives them. The layout has such
    references (a trace spread over files), so this is the cross-file lookup at work."""
    root, _ = layout
    files = spans_files(root)
    assert all(PARENT_ROW in pq.read_schema(f).names for f in files)
    arrays = decode_files(files)
    expected, orphan = dataset_parents_by_hand(files)
    assert arrays.parents.tolist() == expected.tolist()
    assert arrays.orphan.tolist() == orphan.tolist()
    assert 0 < orphan.sum()
    local = np.concatenate([pq.read_table(f, columns=[PARENT_ROW]).column(0).to_numpy() for f in files])
    across = (local == PARENT_ELSEWHERE) & (expected >= 0)
    assert across.sum() > 0  # parents found in another file


OPTIONS = [{}, {"run_id": "run-a"}, {"max_findings_per_code": 2, "max_span_ids": 3, "unattributed_threshold": 0.1}]


@pytest.mark.parametrize("options", OPTIONS, ids=["defaults", "one-run", "capped"])
def test_check_with_parent_rows_equals_every_other_way(layout, options):
    """The report from the files' parent rows is the report of check_run over the spans table in
    memory (the key index path); with the default options, of the partitioned engine too (which
    never reads the column). The scenario's every finding code comes up, so the walks (unstamped
    micro-batches up two ranks to their step), orphans, detached traces and nested buckets across
    files all count. The copy without the column is refused, naming a file."""
    root, stripped = layout
    assert all(PARENT_ROW in pq.read_schema(f).names for f in spans_files(root))
    with pytest.raises(DatasetFormatError, match=r"dataset format 0 .*has no parent_row column.*re-run nemo-telemetry "
                                                 r"ingest"):
        check_with_engine(stripped, **options)

    report = check_with_engine(root, **options).to_dict()
    if not options:
        by_code = report["counts"]["by_code"]
        assert all(n for code, n in by_code.items() if code not in NOT_A_RUN_CODES), by_code
        assert by_code["orphan-span"] and by_code["detached-trace"] and by_code["nested-bucket"]
    assert check_run(read_for_analysis(root), **options).to_dict() == report
    if not options:  # the slowest engine here: the options' partials are tested in test_streaming_check
        assert stream_check(root).to_dict() == report


@pytest.mark.parametrize("batch_rows", [7, 64])
def test_check_with_parent_rows_is_the_same_whatever_the_read_batches(layout, batch_rows):
    """A file read in several batches (parent rows of one file arriving in pieces, references
    gathered per batch) gives the report of the whole-file read."""
    root, _ = layout
    expected = check_run(read_for_analysis(root)).to_dict()
    assert check_span_files(spans_files(root), batch_rows=batch_rows).to_dict() == expected


def self_named_records() -> list[dict]:
    """The check scenario plus an unstamped bucketed span of run-a, on rank 2, that names itself as
    its parent (a broken exporter): its file cannot answer the reference (-2), the lookup across
    files finds only the span itself."""
    records = check_records()
    step = next(r for r in records if r["run_id"] == "run-a" and r["name"] == "rl.grpo.step")
    loop = f"{0xF00F:016x}"
    return records + [dict(step, span_id=loop, parent_span_id=loop, name="rl.policy.microbatch", rank=2,
                           bucket="productive", iteration=None)]


@pytest.fixture(scope="module")
def self_named(tmp_path_factory) -> tuple[Path, Path]:
    """A dataset with a span naming itself."""
    return write_dataset(tmp_path_factory.mktemp("self-named") / "ds", batch=100_000, records=self_named_records())


def decode_files(files: list[str], **options):
    """The spans ``files`` as check decodes them (batch by batch)."""
    with SpanReader() as read:
        return read.files(files, **options)


def key_index_parents(root: Path) -> tuple[np.ndarray, np.ndarray]:
    """(parent row, orphan) of every span as the key index path finds them (the table in memory)."""
    arrays = span_arrays(with_id_keys(read_for_analysis(root)))
    return arrays.parent_of(np.arange(len(arrays))), arrays.orphan


def test_a_span_naming_itself_gets_no_parent_row_either_way(self_named):
    """The span naming itself is never its own parent (a walk up from it ends there), whether its
    parent comes from the files' parent rows and the lookup across files, or from the key index."""
    root = self_named
    files = spans_files(root)
    arrays = decode_files(files)
    expected, _ = dataset_parents_by_hand(files)
    loop = arrays.span_id(np.arange(len(arrays))).index(f"{0xF00F:016x}")
    assert expected[loop] == -1
    assert arrays.parents.tolist() == expected.tolist()
    assert key_index_parents(root)[0].tolist() == expected.tolist()


def test_a_span_naming_itself_is_reported_alike_either_way(self_named):
    """Whether a span naming itself is an orphan is decided as the key index decides it (test_orphans:
    its trace holds the id it names): the same orphans, and the same report, from every path."""
    root = self_named
    arrays = decode_files(spans_files(root))
    _, orphan = dataset_parents_by_hand(spans_files(root))
    assert key_index_parents(root)[1].tolist() == orphan.tolist()
    expected = check_run(read_for_analysis(root)).to_dict()
    assert stream_check(root).to_dict() == expected
    assert arrays.orphan.tolist() == orphan.tolist()
    assert check_with_engine(root).to_dict() == expected


# --- 4. datasets where only some files carry the column -----------------------------------------

MIXES = {
    "first-lacks-it": lambda i, n: i == 0,
    "last-lacks-it": lambda i, n: i == n - 1,
    "every-other-lacks-it": lambda i, n: i % 2 == 1,
}


@pytest.mark.parametrize("mix", list(MIXES))
def test_a_dataset_where_some_files_lack_parent_rows_is_refused_naming_one(layout, mix, tmp_path):
    """A dataset whose records say format 1 but some of whose files lack the column (rewritten
    by another tool) is refused by the format's reader, which checks every file (not only the
    first, whose schema a dataset of files takes): the error names a file without it."""
    root, _ = layout
    mixed = stripped_copy(root, tmp_path / "mixed", MIXES[mix])
    files = spans_files(mixed)
    has = [PARENT_ROW in pq.read_schema(f).names for f in files]
    assert any(has) and not all(has)
    lacking = {f for f, h in zip(files, has) if not h}
    for read in (lambda: check_with_engine(mixed), lambda: decode_files(files),
                 lambda: read_for_analysis(mixed)):
        with pytest.raises(DatasetFormatError, match="has no parent_row column") as raised:
            read()
        assert any(f in str(raised.value) for f in lacking)
    result = runner.invoke(app, ["check", str(mixed)])
    assert result.exit_code == 2 and "re-run nemo-telemetry ingest" in result.output.replace("\n", "")


# --- 5. damaged parent rows ---------------------------------------------------------------------

def damaged(root: Path, dest: Path, *, which: str, value) -> tuple[Path, str]:
    """A copy of ``root`` whose first or last spans file holds ``value`` (given the file's row count)
    in ``parent_row`` at its last row; (the copy, that file)."""
    shutil.copytree(root, dest)
    files = spans_files(dest)
    path = files[0] if which == "first" else files[-1]
    rows = pq.ParquetFile(path).metadata.num_rows
    rewrite_file(path, with_parent_row_at(rows - 1, value(rows)))
    return dest, path


DAMAGE = {"past-the-file": lambda rows: rows, "far-past-the-file": lambda rows: 2**31 - 1,
          "below-minus-2": lambda rows: -3}


@pytest.fixture(scope="module")
def many_files(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("damage") / "ds", **LAYOUTS["file-per-write"])


@pytest.mark.parametrize("which", ["first", "last"])
@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("batch_rows", [None, 7])
def test_a_parent_row_that_is_no_row_of_its_file_is_an_error_naming_the_file(many_files, tmp_path, which, damage,
                                                                            batch_rows):
    """A value at or past the file's row count, or below -2, in the first file (found when the
    next file starts) or the last (found when the files are done), read whole or in batches:
    IngestError naming the file and saying to re-ingest, never a report built on it."""
    root, path = damaged(many_files, tmp_path / "ds", which=which, value=DAMAGE[damage])
    with pytest.raises(IngestError) as raised:
        check_span_files(spans_files(root), batch_rows=batch_rows)
    assert path in str(raised.value) and "re-run nemo-telemetry ingest" in str(raised.value)
    with pytest.raises(IngestError, match="re-run nemo-telemetry ingest") as raised:
        check_with_engine(root)
    assert path in str(raised.value)


@pytest.mark.parametrize("damage", ["past-the-file", "below-minus-2"])
def test_check_cli_on_a_damaged_parent_row_names_the_file_and_exits_2(many_files, tmp_path, damage):
    root, path = damaged(many_files, tmp_path / "ds", which="last", value=DAMAGE[damage])
    result = runner.invoke(app, ["check", str(root)])
    assert result.exit_code == 2, result.output
    output = result.output.replace("\n", "")
    assert path in output and "re-run nemo-telemetry ingest" in output
    assert "Traceback" not in result.output


def test_run_pairs_gathered_by_the_decode_equal_those_read_from_the_columns(layout):
    """check's decode gathers the (run, span groups) and (run, name) pairs as it reads (and keeps
    the span_groups column, which missing-group-spans reads per process): for every run, and for
    each run alone, the pairs are those read from the table's columns; a selection that is not
    whole runs is refused, not answered wrong."""
    root, _ = layout
    files = spans_files(root)
    arrays = decode_files(files)
    table = with_id_keys(read_for_analysis(root))
    plain = span_arrays(table)
    assert "span_groups" in arrays.table.column_names and "span_groups" in plain.table.column_names
    every = np.ones(len(arrays), dtype=bool)
    assert arrays.run_names(every) == plain.run_names(every)
    groups = arrays.run_resources(SPAN_GROUPS_ATTRIBUTE, every)
    assert groups == plain.run_resources(SPAN_GROUPS_ATTRIBUTE, every) != set()
    assert len(arrays.runs) > 1 and table.num_rows == len(arrays)
    for code in range(len(arrays.runs)):
        one = arrays.run == code
        assert arrays.run_names(one) == plain.run_names(one)
        assert arrays.run_resources(SPAN_GROUPS_ATTRIBUTE, one) == plain.run_resources(SPAN_GROUPS_ATTRIBUTE, one)
    with pytest.raises(ValueError, match="whole runs"):
        arrays.run_names(np.arange(len(arrays)) % 2 == 0)


def test_parent_lookups_of_rows_asked_many_times_equal_those_asked_once(layout):
    """The key index finds a row's parent however often the row is asked for in one call (a walk
    asks for shared ancestors once per walk), past the number of rows the index holds."""
    root, _ = layout
    arrays = span_arrays(with_id_keys(read_for_analysis(root)))
    rows = np.arange(len(arrays))
    once = arrays.parent_of(rows)
    assert (once >= 0).any()
    assert arrays.parent_of(np.tile(rows, 3)).tolist() == np.tile(once, 3).tolist()
    assert arrays.parent_of(rows[::-1]).tolist() == once[::-1].tolist()


# --- 6. a file whose rows another tool reordered --------------------------------------------------

def reordered(root: Path, dest: Path, *, record: bool) -> tuple[Path, str]:
    """A copy of ``root`` whose largest spans file is rewritten with pyarrow, its rows in reverse
    order (``parent_row`` moved with its rows, as any tool that knows nothing of it moves it); with
    ``record``, the commit record updated to the rewritten file's size and footer, as a tool that
    keeps the record consistent would. (the copy, that file)"""
    shutil.copytree(root, dest)
    files = spans_files(dest)
    path = max(files, key=lambda f: pq.ParquetFile(f).metadata.num_rows)
    table = pq.read_table(path)
    pq.write_table(table.take(pa.array(np.arange(table.num_rows)[::-1])), path)
    if record:
        rel = str(Path(path).relative_to(dest))
        latest = sorted((dest / commits.COMMITS).glob("*.json"))[-1]
        content = json.loads(latest.read_bytes())
        content.setdefault("sizes", {})[rel] = commits.file_info(Path(path), table.num_rows)
        content["files"] = sorted({*content["files"], rel})
        latest.write_text(json.dumps(content))
    return dest, path


def test_a_reordered_file_is_caught_by_its_commit_records_footer_checksum(many_files, tmp_path):
    """Rewritten in another row order behind the commit record's back: the file is not the one
    committed (its footer), named with the fix, before any read."""
    root, path = reordered(many_files, tmp_path / "ds", record=False)
    with pytest.raises(DamagedDatasetError, match=r"1 committed file\(s\) damaged.*nemo-telemetry repair") as raised:
        check_with_engine(root)
    assert str(Path(path).relative_to(root)) in str(raised.value)


@pytest.mark.parametrize("batch_rows", [None, 7])
def test_a_reordered_file_with_its_record_updated_is_named_by_the_parent_row_check(many_files, tmp_path,
                                                                                   batch_rows):
    """The same rewrite with a commit record that matches it: check's reader compares each file's
    parent rows with its own keys (read whole or in batches) and names the file, never reporting
    wrong parents; the CLI exits 2. Goodput, which does not read the column, stays right, and the
    partitioned check (which does not either) counts the findings of the dataset before the rewrite."""
    root, path = reordered(many_files, tmp_path / "ds", record=True)
    assert len(commits.dataset_state(root).files("spans")) == len(spans_files(many_files))  # as committed
    with pytest.raises(DamagedDatasetError, match="does not index its rows.*another row order") as raised:
        check_span_files(spans_files(root), batch_rows=batch_rows)
    assert path in str(raised.value) and raised.value.damaged[0][0] == path
    result = runner.invoke(app, ["check", str(root)])
    output = result.output.replace("\n", "")
    assert result.exit_code == 2 and path in output and "re-run nemo-telemetry ingest" in output.lower(), output
    assert "Traceback" not in result.output
    assert as_plain(goodput_with_engine(root)) == as_plain(goodput_with_engine(many_files))
    counts = stream_check(many_files).to_dict()["counts"]  # the span ids a finding lists follow the row order
    assert stream_check(root).to_dict()["counts"] == counts and counts["error"] > 0
