"""The collector's committer: one thread that owns the dataset writer and commits every request
queued while it was busy in one write and one fsync (group commit).

Its own module so that :mod:`~nemo_telemetry.analysis.ingestion.collect` (the server) and
:mod:`~nemo_telemetry.analysis.ingestion._collect_http` (the requests) each stay one concern: here
is what makes an answer 200 mean "on disk", and a failed write mean 503 until writing works again.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable

import pyarrow as pa

from nemo_telemetry.analysis.ingestion._columns import OtlpTables
from nemo_telemetry.analysis.store.commits import DatasetLock
from nemo_telemetry.errors import IngestError
from nemo_telemetry.analysis.store.dataset import DatasetWriter, SpanDeduplicator, read_dataset

__all__ = ["Committer", "open_session", "hold_dataset", "describe_failure"]

_log = logging.getLogger("nemo_telemetry.analysis.ingestion.collect")  # the collector's one log


class _Ticket:
    """One request's tables waiting for a commit (``files``: its metrics or logs table, as
    ``(relative path, table)``); its handler waits on ``done``. ``error`` is the write's
    ``OSError`` (answer 503) or what else stopped them being stored (400)."""

    def __init__(self, tables: OtlpTables, files: tuple = ()) -> None:
        self.tables = tables
        self.files = files
        self.done = threading.Event()
        self.error: BaseException | None = None


class Committer:
    """One thread owns the dataset writer: it takes every request queued while it was busy,
    writes and commits them together, then wakes their handlers with the outcome."""

    def __init__(self, root: Path, writer: DatasetWriter, counts: dict, lock: threading.Lock,
                 on_commit: Callable[[pa.Table], None] | None = None, dataset_lock: DatasetLock | None = None) -> None:
        self._root = root
        self._dataset_lock = dataset_lock  # held by the server for its whole session, across reopened writers
        self._on_commit = on_commit  # sees each committed group's new spans, before any handler answers
        self._writer: DatasetWriter | None = writer  # None after a failed write, until reopened
        self._counts, self._lock = counts, lock  # the server's summary counters and their lock
        self._cond = threading.Condition()
        self._queued: list[_Ticket] = []
        self._closing = False
        self._failing = False
        self._failed_ids: list[pa.Table] = []  # distinct spans whose write failed
        self._failed_seen = SpanDeduplicator()
        self._written_files: set[str] = set()  # metrics and logs files committed by this session (named by content)
        self._thread = threading.Thread(target=self._run, name="nemo-collect-commit", daemon=True)
        self._thread.start()

    def submit(self, tables: OtlpTables, files: tuple = ()) -> _Ticket:
        """Queue ``tables`` (and ``files``: ``(metrics/<hash>.parquet, table)`` ...) for the next
        commit; wait on the ticket's ``done``."""
        ticket = _Ticket(tables, files)
        with self._cond:
            self._queued.append(ticket)
            self._cond.notify()
        return ticket

    def close(self) -> None:
        """Commit what is queued, stop the thread, close the writer; count what stayed unwritten."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception as exc:  # reported in the summary
                self._record_failure(exc)
        if self._failed_ids:
            with self._lock:
                self._counts["unwritten_spans"] = self._still_unwritten()

    def _still_unwritten(self) -> int:
        """The failed spans that no later commit wrote (the dataset on disk is the judge)."""
        ids = pa.concat_tables(self._failed_ids)
        try:
            committed = SpanDeduplicator()
            committed.remember(read_dataset(self._root, "spans", columns=["trace_id", "span_id"]))
        except Exception as exc:  # cannot tell: count every failed span
            self._record_failure(exc)
            return ids.num_rows
        return int(committed.admit(ids).sum())

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queued and not self._closing:
                    self._cond.wait()
                group, self._queued = self._queued, []
            if group:
                self._commit(group)
                for ticket in group:
                    ticket.done.set()
            elif self._closing:
                return

    def _commit(self, group: list[_Ticket]) -> None:
        """One write and commit for the group. A failure that is not the disk's (a table the
        writer refuses) is the fault of one request or more: each is then committed alone, so
        one bad request cannot fail the others."""
        tables = OtlpTables.concat([ticket.tables for ticket in group])
        # A body sent again (its answer lost) has the same name: stored once.
        files = {rel: table for ticket in group for rel, table in ticket.files if rel not in self._written_files}
        try:
            written = self._write(tables, files, requests=len(group))
        except OSError as exc:
            self._record_failure(exc)
            self._remember_failed(tables.spans)
            for ticket in group:
                ticket.error = exc
            return
        except Exception as exc:  # answered 400; the thread lives on
            if len(group) == 1:
                group[0].error = exc
                return
            for ticket in group:
                self._commit([ticket])
            return
        if self._failing:
            self._failing = False
            _log.warning("writing %s works again", self._root)
        self._written_files.update(files)
        with self._lock:
            for rel, table in files.items():
                self._counts["metric_points" if rel.startswith("metrics/") else "logs"] += table.num_rows
            self._counts["spans"] += written.spans.num_rows
            self._counts["events"] += written.events.num_rows
            self._counts["links"] += written.links.num_rows
            self._counts["duplicates_dropped"] += tables.spans.num_rows - written.spans.num_rows
        if self._on_commit is not None and written.spans.num_rows:
            try:
                self._on_commit(written.spans)
            except Exception:  # a consumer's fault must not fail a durable commit
                _log.exception("the on_commit hook failed; the spans are committed")

    def _write(self, tables: OtlpTables, files: dict, *, requests: int) -> OtlpTables:
        """Write and commit; durable on return. A failed commit leaves the writer usable; a
        failed write leaves it half-staged, so it is aborted and the next commit opens another."""
        writer = self._writer if self._writer is not None else self._open()
        try:
            written = writer.write(tables)
            for relative, table in files.items():
                writer.stage_table(relative, table)
        except BaseException:
            self._writer = None
            try:
                writer.abort()
            except Exception:  # the write's own error is the one to report
                pass
            raise
        writer.commit(source="collect", requests=requests)
        return written

    def _open(self) -> DatasetWriter:
        self._writer = open_session(self._root, lock=self._dataset_lock)
        return self._writer

    def _record_failure(self, exc: BaseException) -> None:
        """Log a failure once per outage (not per request); keep the cause for the summary."""
        cause = describe_failure(exc)
        if not self._failing:
            self._failing = True
            _log.error("cannot write %s (%s); answering 503 with Retry-After until writing works again",
                       self._root, cause)
        with self._lock:
            self._counts["write_error"] = cause

    def _remember_failed(self, spans: pa.Table) -> None:
        ids = spans.select(["trace_id", "span_id"])
        fresh = self._failed_seen.admit(ids)
        self._failed_ids.append(ids if fresh.all() else ids.filter(pa.array(fresh)))


def open_session(root: Path, *, lock: DatasetLock | None = None) -> DatasetWriter:
    """A writer whose start is recorded: until it closes, readers say a collect is running (or
    was killed); its clean close also finishes the sessions of writers that failed before it.
    ``lock``: the dataset's lock, held by the caller (else the writer takes and releases its own)."""
    writer = DatasetWriter(root, lock=lock)
    try:
        writer.start([], tool="collect")
    except BaseException:
        writer.abort()
        raise
    return writer


def hold_dataset(root: Path) -> DatasetLock:
    """The dataset's lock for a receiver's session (its folder made first): a second writer is refused."""
    if root.exists() and not root.is_dir():
        raise IngestError(f"{root}: exists and is not a directory; choose another --out")
    root.mkdir(parents=True, exist_ok=True)
    return DatasetLock(root)


def describe_failure(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return f"{type(exc).__name__}: {exc}"

