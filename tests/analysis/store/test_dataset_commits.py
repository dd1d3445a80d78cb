"""The dataset's commit record: staged files stay invisible until ``commit``, a failed commit
leaves the committed state and a usable writer, an ingest that did not finish makes every
reader warn, the same ingest again finishes it, and datasets without a record read as before."""

from __future__ import annotations

import errno
import json
import os
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nemo_telemetry.errors import DatasetFormatError, IngestError
from nemo_telemetry.analysis import IncompleteDatasetWarning, ingest, load_traces, read_events, read_links, read_spans
from nemo_telemetry.analysis.store import commits
from nemo_telemetry.analysis.store import dataset
from nemo_telemetry.analysis.model.tables import OtlpTables
from nemo_telemetry.analysis.store.formats import DATASET_FORMAT, READERS
from nemo_telemetry.analysis.ingestion.read import read_for_analysis
from nemo_telemetry.analysis.store.read import read_span_files
from nemo_telemetry.analysis.store.repair import verify_dataset
from nemo_telemetry.analysis.store.partitions import span_files
from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf, write_length_prefixed


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> OtlpTables:
    """1,100 spans of four ranks, read back from a protobuf dump."""
    requests = synthetic_requests(1_100, spans_per_request=55, ranks=4)
    path = write_length_prefixed(tmp_path_factory.mktemp("commits") / "t.pb", [to_protobuf(r) for r in requests])
    return load_traces(path)


def _batch(loaded, start: int, stop: int) -> OtlpTables:
    """Spans ``start:stop`` with their events and links."""
    mask = np.zeros(loaded.spans.num_rows, dtype=bool)
    mask[start:stop] = True
    return OtlpTables(loaded.spans, loaded.events, loaded.links).keep_spans(mask)


def _ids(spans: pa.Table) -> list:
    return sorted(zip(spans.column("trace_id").to_pylist(), spans.column("span_id").to_pylist()))


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "_writers" not in p.parts)


def _quiet_read(root: Path) -> pa.Table:
    with warnings.catch_warnings():
        warnings.simplefilter("error", IncompleteDatasetWarning)  # a complete dataset says nothing
        return read_spans(root)


def test_staged_spans_are_invisible_until_commit_then_durable_and_named(tables, tmp_path):
    root = tmp_path / "ds"
    writer = dataset.DatasetWriter(root)
    written = writer.write(_batch(tables, 0, 500))
    assert written.spans.num_rows == 500
    assert _quiet_read(root).num_rows == 0 and span_files(root) == []
    assert not list(root.rglob("*.parquet"))  # staged under hidden temporary names
    tmp, final = writer._staged[0]
    os.link(tmp, final)  # what a crash during this first commit leaves: a file in place, no record of it
    assert _quiet_read(root).num_rows == 0
    final.unlink()
    writer.commit(requests=3)
    assert _ids(_quiet_read(root)) == _ids(tables.spans.slice(0, 500))
    assert not [p for p in root.rglob("*.tmp")]
    records = sorted((root / commits.COMMITS).glob("*.json"))
    assert len(records) == 2 and b'"requests":3' in records[1].read_bytes()  # after the dataset's first record
    writer.write(_batch(tables, 500, 1_100))
    writer.close()
    assert _ids(_quiet_read(root)) == _ids(tables.spans)
    assert not (root / "_writers").exists() or not list((root / "_writers").iterdir())


def test_a_failed_commit_keeps_the_committed_state_and_the_writer_usable(tables, tmp_path, monkeypatch):
    """With a test double for the record's rename (it raises ENOSPC once): the OSError comes
    out unchanged, the failed commit's files are removed, its spans are not "seen" (writing
    them again stores them), and the next commit succeeds."""
    root = tmp_path / "ds"
    writer = dataset.DatasetWriter(root)
    writer.write(_batch(tables, 0, 300))
    writer.commit()
    before = _files(root)
    real = commits.publish_record

    def disk_full_once(tmp, final):
        monkeypatch.setattr(commits, "publish_record", real)
        tmp.unlink()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(final))

    monkeypatch.setattr(commits, "publish_record", disk_full_once)
    writer.write(_batch(tables, 300, 700))
    with pytest.raises(OSError) as failed:
        writer.commit()
    assert failed.value.errno == errno.ENOSPC
    assert _files(root) == before
    assert _ids(_quiet_read(root)) == _ids(tables.spans.slice(0, 300))
    again = writer.write(_batch(tables, 0, 700))  # the first 300 are stored: dropped; the 400 are not
    assert again.spans.num_rows == 400
    writer.close()
    spans = _quiet_read(root)
    assert spans.num_rows == 700 and _ids(spans) == _ids(tables.spans.slice(0, 700))


def test_forget_removes_exactly_the_keys_given(tables):
    """The deduplicator's removal (backward shift) against a Python set, over a crowded table."""
    rng = np.random.default_rng(7)
    keys = rng.integers(0, 2**63, size=(5_000, 3), dtype=np.int64).astype(np.uint64)
    keys[:, 0] &= np.uint64(0xFF)  # many near-collisions in the first word
    dedup = dataset.SpanDeduplicator()
    spans = tables.spans.slice(0, 0)
    assert dedup.admit(spans, keys).all()
    gone = keys[rng.permutation(len(keys))[:2_000]]
    dedup.forget(gone)
    fresh = dedup.admit(spans, keys)
    assert {tuple(k) for k in keys[fresh]} == {tuple(k) for k in gone}
    assert not dedup.admit(spans, keys).any()


def test_an_unfinished_ingest_makes_every_reader_warn_and_the_same_ingest_finishes_it(tables, tmp_path):
    first = write_length_prefixed(tmp_path / "first.pb", [to_protobuf(r) for r in synthetic_requests(
        110, spans_per_request=11, ranks=2, run_id="first", seed=1)])
    root = tmp_path / "ds"
    ingest([first], out=root)
    committed = _ids(read_spans(root))
    second = tmp_path / "second.pb"
    write_length_prefixed(second, [to_protobuf(r) for r in synthetic_requests(1_100, spans_per_request=55, ranks=4)])
    writer = dataset.DatasetWriter(root, file_rows=100)
    writer.start([str(second)])
    writer.write(_batch(tables, 0, 800))
    with pytest.warns(IncompleteDatasetWarning, match="still running"):
        assert _ids(read_spans(root)) == committed
    writer.abort()  # what a crash leaves, but for the staged files (a later writer removes those)
    command = f"nemo-telemetry ingest {second} --out {root.resolve()}"
    readers = {
        "read_spans": lambda: _ids(read_spans(root)),
        "read_events": lambda: read_events(root).num_rows,
        "read_links": lambda: read_links(root).num_rows,
        "load_traces": lambda: _ids(load_traces(root).spans),
        "read_for_analysis": lambda: read_for_analysis(root).num_rows,
        "span_files": lambda: len(span_files(root)),
    }
    for name, read in readers.items():
        with pytest.warns(IncompleteDatasetWarning) as caught:
            read()
        message = str(caught[0].message)
        assert "incomplete" in message and str(second) in message and command in message, (name, message)
    summary = ingest([second], out=root)
    assert summary.spans == tables.spans.num_rows
    spans = _quiet_read(root)
    assert spans.num_rows == len(committed) + tables.spans.num_rows
    assert len(set(_ids(spans))) == spans.num_rows  # each span once


def test_leftovers_of_a_writer_that_is_gone_are_removed_and_stray_files_ignored(tables, tmp_path):
    root = tmp_path / "ds"
    writer = dataset.DatasetWriter(root)
    writer.write(_batch(tables, 0, 200))
    writer.commit()
    writer.write(_batch(tables, 200, 400))
    tmp, final = writer._staged[0]
    os.replace(tmp, final)  # renamed into place, never recorded: what a crash during the commit leaves
    writer._lock.release()  # the process is gone: its locks with it
    writer._release_dataset()
    stray = root / "spans" / "notes.parquet"
    stray.write_bytes(b"not parquet")  # not a name a writer gives: never read, never removed
    assert _ids(_quiet_read(root)) == _ids(tables.spans.slice(0, 200))
    dataset.DatasetWriter(root).close()
    left = _files(root)
    assert not [f for f in left if f.endswith(".tmp")]
    assert [f for f in left if f.endswith(".parquet")] == sorted(
        [str(p.relative_to(root)) for p in span_files(root)] + ["spans/notes.parquet"])
    assert _ids(_quiet_read(root)) == _ids(tables.spans.slice(0, 200))


def test_a_dataset_without_commit_record_reads_as_before_and_is_adopted(tables, tmp_path):
    """Files an older version wrote (no ``_commits``) in the current layout: all read, as that format;
    the next writer records them first, and its records name the format."""
    root = tmp_path / "old"
    folder = root / "spans" / "run_id=synthetic-run"
    folder.mkdir(parents=True)
    pq.write_table(dataset.with_parent_rows(tables.spans.slice(0, 400)), folder / "part-0.parquet")
    assert commits.dataset_state(root).format == DATASET_FORMAT
    assert _ids(_quiet_read(root)) == _ids(tables.spans.slice(0, 400))
    writer = dataset.DatasetWriter(root)
    writer.write(_batch(tables, 0, 1_100))
    writer.close()
    spans = _quiet_read(root)
    assert spans.num_rows == 1_100 and _ids(spans) == _ids(tables.spans)
    assert "spans/run_id=synthetic-run/part-0.parquet" in commits.dataset_state(root).committed
    records = [json.loads(p.read_bytes()) for p in sorted((root / commits.COMMITS).glob("*.json"))]
    assert records and all(r["dataset_format"] == DATASET_FORMAT for r in records)



def test_the_commit_records_count_each_tables_rows_without_a_file_opened(tables, tmp_path, monkeypatch):
    """What a reader sizes its work by (the local engine's in-memory or streamed choice): the rows
    the records give, equal to the files' footers; none where a file has no record."""
    root = tmp_path / "counted"
    writer = dataset.DatasetWriter(root)
    writer.write(_batch(tables, 0, 500))
    writer.write(_batch(tables, 500, 1_100))
    writer.close()
    state = commits.dataset_state(root)
    footers = sum(pq.ParquetFile(f).metadata.num_rows for f in span_files(root))
    monkeypatch.setattr(pq, "ParquetFile", None)  # the count reads no footer
    assert state.recorded_rows("spans") == footers == 1_100
    monkeypatch.undo()
    unrecorded = tmp_path / "unrecorded" / "spans" / "run_id=synthetic-run"
    unrecorded.mkdir(parents=True)
    pq.write_table(dataset.with_parent_rows(tables.spans.slice(0, 400)), unrecorded / "part-0.parquet")
    assert commits.dataset_state(tmp_path / "unrecorded").recorded_rows("spans") is None


@pytest.mark.parametrize("version", [1, 2])
def test_datasets_keyed_on_the_trace_ids_high_half_are_refused_with_the_reingest_fix(tables, tmp_path, version):
    """Formats 1 and 2 keyed traces on the first 64 bits of their ids, and joined parent_row on
    that: their files (no trace_low column), with no record or with records naming the format,
    are refused by every reader and writer, with why and the fix; nothing is written."""
    spans = dataset.with_parent_rows(tables.spans.slice(0, 400)).drop_columns(["trace_low"])
    if version == 1:
        spans = spans.drop_columns(["rl.span_group", "span_groups_namespace"])
    root = tmp_path / f"format-{version}"
    folder = root / "spans" / "run_id=synthetic-run"
    folder.mkdir(parents=True)
    pq.write_table(spans, folder / "part-0.parquet")
    before = _files(root)
    _every_reader_refuses(root, 0)
    with pytest.raises(DatasetFormatError, match=r"part-0\.parquet has no (.*, )?trace_low columns? \(a format before "
                       r"3: its trace keys are the first 64 bits of each trace id"):
        read_for_analysis(root)
    assert [f for f in _files(root) if f != "_lock"] == before
    recorded = tmp_path / f"recorded-{version}"
    writer = dataset.DatasetWriter(recorded)
    writer.write(_batch(tables, 0, 400))
    writer.close()
    for record in (recorded / commits.COMMITS).glob("*.json"):
        record.write_text(json.dumps({**json.loads(record.read_bytes()), "dataset_format": version}))
    _every_reader_refuses(recorded, version)
    with pytest.raises(DatasetFormatError, match="first 64 bits of each trace id.*re-run nemo-telemetry ingest"):
        read_for_analysis(recorded)


def _refused(version: int):
    """What every reader and writer raises for a dataset of format ``version``: it names the
    format, the formats read, and the fix (the dumps ingested again, into a new folder)."""
    return pytest.raises(DatasetFormatError, match=(
        rf"dataset format {version} \(.*\), which this nemo-telemetry does not read \(it reads format {', '.join(map(str, sorted(READERS)))}\); "
        r"(upgrade nemo-telemetry, or )?re-run nemo-telemetry ingest of its dumps into a new folder"))


def _every_reader_refuses(root: Path, version: int) -> None:
    for read in (lambda: read_for_analysis(root), lambda: commits.dataset_state(root), lambda: span_files(root),
                 lambda: read_spans(root),  # waterfall's read, and a monitor resuming its --out dataset
                 lambda: dataset.DatasetWriter(root), lambda: verify_dataset(root)):
        with _refused(version) as caught:
            read()
        assert caught.value.version == version and caught.value.supported == tuple(sorted(READERS))


@pytest.mark.parametrize("layout", ["no-parent-row", "no-id-keys", "no-span-groups"])
def test_an_unversioned_dataset_of_an_older_layout_is_refused_by_every_reader(tables, tmp_path, layout):
    """Files of a layout before format 1, with no commit record or records that name no format (an
    earlier version's): refused as format 0, naming the file and the column it lacks; nothing written."""
    spans = dataset.with_parent_rows(tables.spans.slice(0, 400))
    dropped = {"no-parent-row": ["parent_row"], "no-id-keys": ["trace_key", "span_key", "parent_key", "parent_row"],
               "no-span-groups": ["span_groups"]}[layout]
    root = tmp_path / "old"
    folder = root / "spans" / "run_id=synthetic-run"
    folder.mkdir(parents=True)
    pq.write_table(spans.drop_columns(dropped), folder / "part-0.parquet")
    before = _files(root)
    _every_reader_refuses(root, 0)
    with pytest.raises(DatasetFormatError, match=rf"part-0\.parquet has no {dropped[0]}"):
        read_for_analysis(root)
    assert [f for f in _files(root) if f != "_lock"] == before  # the writer refused before recording anything
    # the same files committed by an earlier version's records (no "dataset_format"): refused alike
    other = tmp_path / "recorded"
    writer = dataset.DatasetWriter(other)
    writer.write(_batch(tables, 0, 400))
    writer.close()
    for path in span_files(other):
        pq.write_table(pq.read_table(path).drop_columns(dropped), path)
    for record in (other / commits.COMMITS).glob("*.json"):
        content = json.loads(record.read_bytes())
        del content["dataset_format"]
        content.pop("sizes", None)  # an earlier version's records hold no file sizes
        record.write_text(json.dumps(content))
    _every_reader_refuses(other, 0)


def test_a_dataset_of_a_newer_format_is_refused_with_upgrade(tables, tmp_path):
    root = tmp_path / "ds"
    writer = dataset.DatasetWriter(root)
    writer.write(_batch(tables, 0, 400))
    writer.close()
    assert _ids(_quiet_read(root)) == _ids(tables.spans.slice(0, 400))
    latest = sorted((root / commits.COMMITS).glob("*.json"))[-1]
    content = json.loads(latest.read_bytes())
    latest.write_text(json.dumps({**content, "dataset_format": DATASET_FORMAT + 1}))
    _every_reader_refuses(root, DATASET_FORMAT + 1)
    with pytest.raises(DatasetFormatError, match="written by a newer nemo-telemetry.*upgrade nemo-telemetry"):
        read_for_analysis(root)


def test_spans_files_of_an_older_layout_are_refused_without_their_dataset(tables, tmp_path):
    """The format's reader checks every file it opens, not only the first (whose schema a
    dataset of files takes): a file without ``parent_row`` among current ones is named."""
    new, old = tmp_path / "new.parquet", tmp_path / "old.parquet"
    pq.write_table(dataset.with_parent_rows(tables.spans.slice(0, 100)), new)
    pq.write_table(tables.spans.slice(100, 200), old)
    assert read_span_files([str(new)]).num_rows == 100
    with pytest.raises(DatasetFormatError, match="old.parquet: dataset format 0 .*it has no parent_row column"):
        read_span_files([str(new), str(old)])


def test_many_commits_are_compacted_and_read_the_same(tables, tmp_path):
    root = tmp_path / "ds"
    writer = dataset.DatasetWriter(root)
    for start in range(0, 1_100, 2):
        writer.write(_batch(tables, start, start + 2))
        writer.commit()
    writer.close()
    records = list((root / commits.COMMITS).glob("*.json"))
    assert len(records) <= 300  # one snapshot and the records since, not one per commit
    assert _ids(_quiet_read(root)) == _ids(tables.spans)
    assert len(commits.dataset_state(root).committed) == len(list(root.rglob("*.parquet")))


def test_a_receiver_session_that_did_not_finish_is_said_and_the_next_one_finishes_it(tables, tmp_path):
    root = tmp_path / "ds"
    killed = dataset.DatasetWriter(root)
    killed.start([], tool="collect")
    killed.write(_batch(tables, 0, 100))
    killed.commit()  # acknowledged: stays
    killed.abort()
    with pytest.warns(IncompleteDatasetWarning, match="incomplete: the collect .* did not finish.*collect --out"):
        assert read_spans(root).num_rows == 100
    ingest_writer = dataset.DatasetWriter(root)  # an ingest's final commit does not finish a receiver's session
    ingest_writer.start(["elsewhere.pb"])
    ingest_writer.close()
    with pytest.warns(IncompleteDatasetWarning, match="collect"):
        read_spans(root)
    again = dataset.DatasetWriter(root)
    again.start([], tool="collect")
    again.close()
    assert _quiet_read(root).num_rows == 100


def test_a_failed_staging_write_discards_the_uncommitted_batch(tables, tmp_path, monkeypatch):
    """With a test double for the Parquet write (a full disk on the second file): ``write``
    raises, nothing it staged (torn or whole) is renamed by the next commit, and its spans can
    be written again."""
    root = tmp_path / "ds"
    writer = dataset.DatasetWriter(root)
    real, calls = dataset.pq.write_table, []

    def disk_full_on_second(table, where, **options):
        calls.append(where)
        real(table, where, **options)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(dataset.pq, "write_table", disk_full_on_second)
    with pytest.raises(OSError) as failed:
        writer.write(_batch(tables, 0, 400))  # four ranks: a file each
    assert failed.value.errno == errno.ENOSPC and failed.value.filename  # names the file
    writer.commit()
    assert _quiet_read(root).num_rows == 0 and not list(root.rglob("*.tmp"))
    monkeypatch.setattr(dataset.pq, "write_table", real)
    assert writer.write(_batch(tables, 0, 400)).spans.num_rows == 400
    writer.close()
    assert _ids(_quiet_read(root)) == _ids(tables.spans.slice(0, 400))


def test_a_file_repair_removed_and_committed_again_under_its_name_is_read(tmp_path):
    """Metrics and logs files are named by their content: after repair drops a damaged one, the
    ingest that restores it writes the same name, and that later commit wins; a compaction keeps
    both the removal of the others and the new commit."""
    from nemo_telemetry.analysis import repair_dataset

    root = tmp_path / "ds"
    table = pa.table({"x": list(range(100))})
    writer = dataset.DatasetWriter(root)
    writer.stage_table("metrics/same-content.parquet", table)
    writer.stage_table("metrics/other.parquet", table)
    writer.close()
    for name in ("same-content", "other"):
        (root / "metrics" / f"{name}.parquet").write_bytes(b"\0" * 64)
    assert [d.path for d in repair_dataset(root).dropped] == ["metrics/other.parquet", "metrics/same-content.parquet"]
    assert commits.dataset_state(root).files("metrics") == []
    writer = dataset.DatasetWriter(root)
    writer.stage_table("metrics/same-content.parquet", table)
    writer.close()
    assert commits.dataset_state(root).files("metrics") == [root / "metrics" / "same-content.parquet"]
    assert commits.compact(root, "compactor-0", 0, at_least=2)
    assert commits.dataset_state(root).files("metrics") == [root / "metrics" / "same-content.parquet"]
    assert pq.read_table(root / "metrics" / "same-content.parquet").equals(table)


def test_a_committed_file_left_staged_is_read_there_and_renamed_by_the_next_writer(tables, tmp_path, monkeypatch):
    """What a kill between the commit record and the renames leaves (a test double for the renames
    that fails them, as a dead process does not do them): every reader reads the committed files
    where they are staged, a plain read of ``spans/`` sees none of them, and the next writer
    renames them into place."""
    import pyarrow.dataset as pads

    from nemo_telemetry.analysis.engines.partitioned_check import stream_check
    from nemo_telemetry.analysis.goodput.partials import stream_goodput
    from nemo_telemetry.analysis.engines.choose import goodput_with_engine

    root = tmp_path / "ds"
    writer = dataset.DatasetWriter(root, file_rows=100)
    writer.write(_batch(tables, 0, 1_100))
    real = os.replace

    def no_rename_into_tables(src, dst):
        if commits.STAGING in Path(src).parts:
            raise OSError(errno.EIO, "killed before the rename", str(dst))
        real(src, dst)

    monkeypatch.setattr(dataset.os, "replace", no_rename_into_tables)
    writer.close()
    monkeypatch.setattr(dataset.os, "replace", real)
    assert not list((root / "spans").rglob("*.parquet"))  # nothing renamed: a plain read sees nothing
    assert pads.dataset(root / "spans", format="parquet").files == []
    assert _ids(_quiet_read(root)) == _ids(tables.spans)
    assert all(commits.STAGING in p.parts for p in span_files(root))
    expected = [(r.run_id, r.steps.to_pylist()) for r in goodput_with_engine(root)]
    assert [(r.run_id, r.steps.to_pylist()) for r in stream_goodput(root)] == expected
    report = stream_check(root).to_dict()
    dataset.DatasetWriter(root).close()  # the next writer renames them
    assert not (root / commits.STAGING).exists() or not [p for p in (root / commits.STAGING).rglob("*") if p.is_file()]
    assert all(commits.STAGING not in p.parts for p in span_files(root))
    assert _ids(_quiet_read(root)) == _ids(tables.spans)
    assert [(r.run_id, r.steps.to_pylist()) for r in goodput_with_engine(root)] == expected
    assert stream_check(root).to_dict() == report


def test_a_record_of_a_format_this_version_cannot_read_is_named(tables, tmp_path):
    root = tmp_path / "ds"
    writer = dataset.DatasetWriter(root)
    writer.write(_batch(tables, 0, 100))
    writer.close()
    record = sorted((root / commits.COMMITS).glob("*.json"))[-1]
    content = json.loads(record.read_bytes())
    assert content["format"] == 1  # a commit that removes nothing stays readable by earlier versions
    record.write_text(json.dumps({**content, "format": 3}))
    with pytest.raises(IngestError, match=f"{record}: a commit record of format 3, which this nemo-telemetry "
                                          "cannot read"):
        read_spans(root)
