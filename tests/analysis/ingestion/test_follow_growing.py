"""``monitor --follow`` on files that grow, rotate, are rewritten and hold records past the bound:
for every format ``ingest`` reads, the monitor's figures at the end equal offline goodput on the
final files, and what it rejects is what ``ingest`` rejects."""

from __future__ import annotations

import gzip
import os
import random
import shutil
import struct
import threading
import time
import zlib
from pathlib import Path

import orjson
import pyarrow as pa
import pytest
import zstandard

from nemo_telemetry.analysis import (
    DumpFollower,
    goodput_document,
    ingest,
    load_traces,
    read_spans,
    run_goodput,
    run_monitor,
)
from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf

# Each test on both paths: the compiled kernels and the reference ones (auto's choice on inputs this small).
pytestmark = pytest.mark.usefixtures("kernel_path")

FORMATS = ["jsonl", "jsonl.gz", "jsonl.gz-members", "jsonl.zst", "pb", "pb.zst", "pb-zstd-records", "json-pretty",
           "json-pretty.zst"]


@pytest.fixture(scope="module")
def requests() -> list[dict]:
    return list(synthetic_requests(3000, ranks=2, spans_per_request=25, seed=7))


def _offline(spans: pa.Table) -> dict:
    return {(run["run_id"], step["iteration"]): step for run in goodput_document(run_goodput(spans))["runs"]
            for step in run["steps"]}


def _latest(records) -> dict:
    out = {}
    for record in records:
        doc = record.to_dict()
        doc.pop("revised", None)
        out[(doc.pop("run_id"), doc["iteration"])] = doc
    return out


def _plain(fmt: str, requests: list[dict]) -> bytes:
    """The uncompressed bytes of a dump of ``requests`` in ``fmt``."""
    if fmt.startswith("jsonl"):
        return b"".join(orjson.dumps(r) + b"\n" for r in requests)
    if fmt.startswith("json-pretty"):
        doc = {"resourceSpans": [rs for r in requests for rs in r["resourceSpans"]]}
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2)
    compressor = zstandard.ZstdCompressor() if fmt == "pb-zstd-records" else None
    out = []
    for request in requests:
        payload = to_protobuf(request)
        payload = compressor.compress(payload) if compressor else payload
        out.append(struct.pack(">I", len(payload)) + payload)
    return b"".join(out)


def _pieces(fmt: str, plain: bytes, count: int, seed: int = 0) -> list[bytes]:
    """``plain`` cut at random bytes into ``count`` pieces, as a writer would append them: a
    streaming compressor flushed after each piece (a block, a sync flush) for .gz / .zst."""
    cuts = sorted(random.Random(seed).sample(range(1, len(plain)), count - 1))
    parts = [plain[a:b] for a, b in zip([0, *cuts], [*cuts, len(plain)])]
    if fmt.endswith(".zst"):
        compressor = zstandard.ZstdCompressor().compressobj()
        out = [compressor.compress(p) + compressor.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK) for p in parts]
        out[-1] += compressor.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH)
        return out
    if fmt.endswith(".gz-members"):  # a gzip member per append, as `gzip -c >> FILE` writes
        return [gzip.compress(p, 1) for p in parts]
    if fmt.endswith(".gz"):
        compressor = zlib.compressobj(1, zlib.DEFLATED, 31)
        out = [compressor.compress(p) + compressor.flush(zlib.Z_SYNC_FLUSH) for p in parts]
        out[-1] += compressor.flush(zlib.Z_FINISH)
        return out
    return parts


def _follow_while_writing(folder: Path, write, **options):
    """``run_monitor`` following ``folder`` while ``write()`` runs on a thread; stops once it is done."""
    stop, records = threading.Event(), []

    def writer() -> None:
        try:
            write()
            time.sleep(0.3)  # a few polls after the last write
        finally:
            stop.set()

    thread = threading.Thread(target=writer)
    thread.start()
    summary = run_monitor(follow=folder, grace_s=0, poll_s=0.02, on_step=records.append, stop=stop, **options)
    thread.join()
    return summary, records


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_growing_dump_is_read_on_every_poll_and_equals_offline_goodput(tmp_path, requests, fmt):
    """A writer appends the dump in pieces cut at random bytes (mid-line, mid-record, mid-block)
    while the monitor follows: every span is seen, none rejected, the steps equal `goodput`."""
    folder = tmp_path / "dumps"
    folder.mkdir()
    path = folder / f"traces.{fmt}"
    pieces = _pieces(fmt, _plain(fmt, requests), 60)

    def write() -> None:
        with open(path, "wb") as out:
            for index, piece in enumerate(pieces):
                out.write(piece)
                out.flush()
                time.sleep(0.06 if index % 3 == 0 else 0.005)  # at times still for a few polls

    summary, records = _follow_while_writing(folder, write)
    offline = load_traces(path).spans
    assert offline.num_rows >= 3000
    assert summary.spans == offline.num_rows
    assert summary.follow.rejected_records == 0, summary.follow.warnings
    assert _latest(records) == _offline(offline)


def _poll_all(follower: DumpFollower) -> int:
    got = follower.poll()
    return 0 if got is None else got.num_rows


@pytest.mark.parametrize("fmt", ["pb", "pb-zstd-records", "pb.zst", "jsonl.gz"])
def test_a_poll_inside_a_record_reads_it_whole_on_the_next_poll(tmp_path, requests, fmt):
    """Each record written in two halves with a poll between: none rejected, all read."""
    path = tmp_path / f"traces.{fmt}"
    plain = _plain(fmt, requests[:20])
    pieces = _pieces(fmt, plain, 41, seed=3)
    follower = DumpFollower(tmp_path)
    seen = 0
    with open(path, "wb") as out:
        for piece in pieces:
            out.write(piece)
            out.flush()
            seen += _poll_all(follower)
    last = follower.close()
    seen += 0 if last is None else last.num_rows
    assert follower.counts().rejected_records == 0, follower.counts().warnings
    assert seen == load_traces(path).spans.num_rows == 500


def test_a_file_rewritten_in_place_keeping_its_inode_is_read_again_from_its_start(tmp_path, requests):
    """What a reused inode looks like to a follower (same device and inode, at least as long, other
    bytes): the fingerprint differs, so the file is read again from its start, not from the old offset."""
    folder = tmp_path / "dumps"
    folder.mkdir()
    live, archive = folder / "traces.jsonl", folder / "traces.1.jsonl"
    old, new = _plain("jsonl", requests[:40]), _plain("jsonl", requests[40:])
    assert len(new) > len(old)
    live.write_bytes(old)
    follower = DumpFollower(folder)
    seen = _poll_all(follower)
    inode = live.stat().st_ino
    shutil.copyfile(live, archive)  # the old spans stay in the final files
    with open(live, "r+b") as handle:  # same inode, new bytes, longer
        handle.write(new)
    assert live.stat().st_ino == inode
    seen += _poll_all(follower)
    last = follower.close()
    seen += 0 if last is None else last.num_rows
    counts = follower.counts()
    offline = load_traces(folder).spans
    assert counts.reread_files == 1
    assert seen == offline.num_rows == sum(len(rs["scopeSpans"][0]["spans"]) for r in requests
                                           for rs in r["resourceSpans"])
    assert counts.rejected_records == 0


def test_a_deleted_file_whose_inode_is_reused_is_read_from_its_start(tmp_path, requests):
    """Delete and create at one name between polls (the filesystem may hand the new file the
    freed inode): every span of the final files is seen either way."""
    folder = tmp_path / "dumps"
    folder.mkdir()
    live = folder / "traces.jsonl"
    live.write_bytes(_plain("jsonl", requests[:30]))
    follower = DumpFollower(folder)
    seen = _poll_all(follower)
    shutil.copyfile(live, folder / "traces.1.jsonl")
    os.unlink(live)
    live.write_bytes(_plain("jsonl", requests[30:]))
    seen += _poll_all(follower)
    last = follower.close()
    seen += 0 if last is None else last.num_rows
    assert seen == load_traces(folder).spans.num_rows
    assert follower.counts().rejected_records == 0


@pytest.mark.parametrize("fmt", ["jsonl", "pb"])
def test_a_file_truncated_and_rewritten_between_polls_is_read_again(tmp_path, requests, fmt):
    """copytruncate rotation: the file is copied away, truncated, and written longer than before
    between two polls; the monitor's figures equal offline goodput on the final files."""
    folder = tmp_path / "dumps"
    folder.mkdir()
    live = folder / f"traces.{fmt}"

    def write() -> None:
        live.write_bytes(_plain(fmt, requests[:50]))
        time.sleep(0.2)
        shutil.copyfile(live, folder / f"traces.1.{fmt}")
        with open(live, "r+b") as handle:
            handle.truncate(0)
            handle.write(_plain(fmt, requests[50:]))

    summary, records = _follow_while_writing(folder, write)
    offline = load_traces(folder).spans
    assert summary.spans == offline.num_rows
    assert summary.follow.reread_files == 1
    assert _latest(records) == _offline(offline)


def test_a_line_over_the_bound_is_rejected_and_named_before_its_newline_and_the_rest_followed(tmp_path, requests):
    """An unterminated line grows past the bound: it is rejected (file:line) while still unterminated,
    not held; the lines after it are followed; counts equal ingest's with the same bound."""
    folder = tmp_path / "dumps"
    folder.mkdir()
    path = folder / "traces.jsonl"
    limit = 1 << 16
    good = _plain("jsonl", requests[:10])
    path.write_bytes(good + b'{"resourceSpans": [' + b" " * (3 * limit))
    follower = DumpFollower(folder, max_record_bytes=limit)
    seen = _poll_all(follower)
    counts = follower.counts()
    assert counts.rejected_records == 1
    assert counts.warnings[0].startswith(f"{path}:11: line longer than {limit} bytes")
    with open(path, "ab") as out:
        out.write(b" " * limit + b"]}\n" + _plain("jsonl", requests[10:20]))
    seen += _poll_all(follower)
    last = follower.close()
    seen += 0 if last is None else last.num_rows
    summary = ingest(folder, out=tmp_path / "ds", max_request_bytes=limit)
    assert seen == summary.spans == 500
    assert follower.counts().rejected_records == summary.rejected_records == 1
    assert summary.warnings == follower.counts().warnings


def test_a_protobuf_record_over_the_bound_is_rejected_and_skipped_and_the_rest_followed(tmp_path, requests):
    folder = tmp_path / "dumps"
    folder.mkdir()
    path = folder / "traces.pb"
    limit = 1 << 16
    huge = struct.pack(">I", 4 * limit) + b"\x0a" + b"\x00" * (4 * limit - 1)
    data = _plain("pb", requests[:5]) + huge + _plain("pb", requests[5:10])
    follower = DumpFollower(folder, max_record_bytes=limit)
    seen = 0
    with open(path, "wb") as out:
        for piece in _pieces("pb", data, 30, seed=5):
            out.write(piece)
            out.flush()
            seen += _poll_all(follower)
    last = follower.close()
    seen += 0 if last is None else last.num_rows
    summary = ingest(folder, out=tmp_path / "ds", max_request_bytes=limit)
    assert seen == summary.spans == 250
    assert follower.counts().warnings == summary.warnings
    assert len(summary.warnings) == 1 and f"{path}: record 6 (byte " in summary.warnings[0]
    assert "longer than 65536 bytes" in summary.warnings[0]


def test_a_pretty_printed_document_written_in_pieces_is_read_once_whole(tmp_path, requests):
    """The OTLP/JSON document ``ingest`` reads is not rejected line by line while it is written."""
    path = tmp_path / "traces.json"
    follower = DumpFollower(tmp_path)
    seen = 0
    with open(path, "wb") as out:
        for piece in _pieces("json-pretty", _plain("json-pretty", requests[:8]), 25):
            out.write(piece)
            out.flush()
            seen += _poll_all(follower)
    last = follower.close()
    seen += 0 if last is None else last.num_rows
    assert follower.counts().rejected_records == 0, follower.counts().warnings
    assert seen == read_spans(path).num_rows == 200


@pytest.mark.parametrize("fmt", FORMATS)
def test_seeded_cuts_polled_after_every_append_read_every_span_once(tmp_path, requests, fmt):
    """Five seeds of random cut points, a poll after every append: the spans read equal ingest's,
    none rejected, whatever byte a poll lands on."""
    plain = _plain(fmt, requests[:30])
    for seed in range(5):
        folder = tmp_path / f"seed{seed}"
        folder.mkdir()
        path = folder / f"traces.{fmt}"
        follower = DumpFollower(folder)
        seen = 0
        with open(path, "wb") as out:
            for piece in _pieces(fmt, plain, 30, seed=seed):
                out.write(piece)
                out.flush()
                seen += _poll_all(follower)
        last = follower.close()
        seen += 0 if last is None else last.num_rows
        assert follower.counts().rejected_records == 0, (seed, follower.counts().warnings)
        assert seen == load_traces(path).spans.num_rows == 750, seed


def test_close_reads_a_backlog_longer_than_one_poll_reads(tmp_path):
    """A poll reads at most 8 MiB of a file; stopping (close) reads the rest first, so the figures at
    the end cover the whole file."""
    path = tmp_path / "traces.jsonl"
    path.write_bytes(_plain("jsonl", list(synthetic_requests(60_000, ranks=2, spans_per_request=100, seed=1))))
    assert path.stat().st_size > 2 * (8 << 20)
    follower = DumpFollower(tmp_path)
    first = follower.poll().num_rows
    rest = follower.close().num_rows
    assert first < first + rest == load_traces(path).spans.num_rows


def test_a_backlog_is_read_poll_after_poll_without_waiting_and_equals_offline_goodput(tmp_path, requests,
                                                                                      monkeypatch):
    """A monitor started on dumps already written reads them a bounded block per poll: it polls
    again at once while a read stopped short (``DumpFollower.behind``), and waits ``poll_s`` only
    once it has caught up. With an hour between polls, the whole backlog is read before the first
    wait (the stop, set from the first view that has seen every span, ends the wait)."""
    from nemo_telemetry.analysis.ingestion import follow

    monkeypatch.setattr(follow, "_READ_BYTES", 1 << 16)  # a backlog of many blocks
    (tmp_path / "dumps").mkdir()
    (tmp_path / "dumps" / "traces.jsonl").write_bytes(_plain("jsonl", requests))
    follower = DumpFollower(tmp_path / "dumps")
    assert follower.poll() is not None and follower.behind  # one block of many
    blocks = 1
    while follower.behind:
        follower.poll()
        blocks += 1
    assert blocks > 10 and follower.poll() is None and not follower.behind  # caught up

    total = load_traces(tmp_path / "dumps").spans.num_rows
    stop, records, views = threading.Event(), [], []

    def on_view(view) -> None:
        views.append(view.spans)
        if view.spans == total:
            stop.set()

    guard = threading.Timer(120, stop.set)  # a monitor that waits between blocks is stopped, short of the total
    guard.start()
    try:
        summary = run_monitor(follow=tmp_path / "dumps", grace_s=0, poll_s=3600, on_step=records.append,
                              on_view=on_view, stop=stop)
    finally:
        guard.cancel()
    assert views[-1] == total and len(views) > 10  # block after block, every span before a wait
    assert summary.spans == total
    assert _latest(records) == _offline(read_spans(tmp_path / "dumps"))
