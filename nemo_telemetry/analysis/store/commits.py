"""The dataset's commit record: which files are committed, and which ingests began and never finished.

::

    DATASET/_commits/<time ns>-<writer>-<n>.json   one record each, never rewritten
    DATASET/_writers/<writer>.lock                  locked (flock) while that writer is open
    DATASET/_lock                                   the dataset's one writer (flock), and who it is

A record is written to a hidden temporary name, fsync'd, renamed into place and its folder
fsync'd, so it is there whole or not at all. There are three kinds: ``begin`` (an ingest's
inputs, written before any of its files), ``commit`` (files a writer committed, with each
file's size, rows and a checksum of its Parquet footer; the last one of an ingest is ``final``;
a repair's also names the files it ``removes``) and ``snapshot`` (the union of the records it
replaced, written by :func:`compact` before it removes them). Everything a record says is a set
that only grows, but for a repair's removals: the state is the records present applied in the
order of their names (the time they were written), a file removed and later committed again
(a metrics file, named by its content) being committed. A snapshot holds the removals too, so a
reader that sees it beside the records it folds gets the same state: compactions need no lock on
the folder, and a reader never needs the history.

A data file is written under ``DATASET/_staging/<writer>/`` (:func:`staging_name`: outside the
table folders, so a plain pyarrow or DuckDB read of ``DATASET/spans`` never lists it) and renamed
to its name only after the record that commits it is in place, so a plain read never sees an
uncommitted file. A reader that finds a committed file still staged (the writer died between
the two) reads it there; the next writer renames it. Writers hold ``_lock`` (:class:`DatasetLock`): one at
a time, so the spans a writer loads at its start to deduplicate against are all there are.

Every record carries the dataset format of the files it commits (``dataset_format``:
:mod:`~nemo_telemetry.analysis.store.formats`); :func:`dataset_state` refuses a dataset of a format
this version does not read. A dataset with no record (no ``_commits`` folder, or an empty one) was written by a version
without commit records: every ``*.parquet`` file in it is read, when its spans files are of a format read here. The first writer to open a
dataset writes a first record before anything else, listing those files as committed (none
for a new dataset), so from then on only recorded files count (:func:`prepare`).
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import socket
import sys
import time
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from nemo_telemetry.analysis.store.formats import DATASET_FORMAT, FORMAT_KEY, dataset_format
from nemo_telemetry.errors import DamagedDatasetError, DatasetLockedError, IncompleteDatasetWarning, IngestError

__all__ = [
    "COMMITS",
    "TABLES",
    "DatasetLock",
    "DatasetState",
    "FileProblem",
    "file_info",
    "inspect_file",
    "UnfinishedIngest",
    "WriterLock",
    "committed_files",
    "damaged_error",
    "compact",
    "dataset_state",
    "fsync_path",
    "ingest_inputs",
    "roll_forward",
    "staged_copy",
    "remove_empty_folders",
    "prepare",
    "temporary_name",
    "staging_name",
    "publish_record",
    "stage_record",
    "with_path",
    "write_record",
]

COMMITS = "_commits"
WRITERS = "_writers"
STAGING = "_staging"
TABLES = ("spans", "events", "links", "metrics", "logs")  # folders whose Parquet files the record covers
_FORMAT = 1
_FORMAT_REMOVES = 2  # a record that removes files: a reader that knows no removal must not read it
_LOCK = "_lock"
_MAGIC = b"PAR1"
_COMPACT_AFTER = 256  # records beside the snapshot before a writer folds them into a new one
_TEMPORARY = ".tmp"


def temporary_name(final: Path, writer: str) -> Path:
    """Where a record is written before it is renamed to ``final``: hidden, named by its writer."""
    return final.with_name(f".{final.name}.{writer}{_TEMPORARY}")


def staging_name(root: Path, final: Path, writer: str) -> Path:
    """Where a data file is written before its commit: ``_staging/<writer>/<its path>.tmp``, outside
    the table folders, so no read of ``DATASET/spans`` (pyarrow's, DuckDB's ``spans/**``) finds it."""
    return root / STAGING / writer / f"{final.relative_to(root)}{_TEMPORARY}"


def fsync_path(path: Path) -> None:
    """Make a file's bytes, or a folder's names (a rename, a new file or subfolder), durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def with_path(exc: OSError, path: Path) -> OSError:
    """``exc`` naming ``path`` when it names no file (pyarrow's write errors and ``os.fsync``'s
    do not); the same errno and so the same class (``OSError(ENOSPC, ...)``, ``PermissionError``)."""
    if exc.filename is not None or exc.errno is None:
        return exc
    return OSError(exc.errno, os.strerror(exc.errno), str(path))


@dataclass(frozen=True)
class UnfinishedIngest:
    """An ingest that recorded its start and no final commit: crashed, killed, or still running."""

    writer: str
    inputs: tuple[str, ...]
    out: str
    started_ns: int
    running: bool
    tool: str = "ingest"  # or "collect": a receiver that recorded its start

    @property
    def command(self) -> str:
        """The command that finishes it: the same ingest again (it skips the spans already stored)."""
        return shlex.join(["nemo-telemetry", "ingest", *self.inputs, "--out", self.out])

    def describe(self) -> str:
        """The warning a reader gives: the word "incomplete", what did not finish, how to finish it."""
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started_ns / 1e9))
        what = "is still running" if self.running else "did not finish"
        if self.tool == "collect":
            return (f"dataset {self.out} is incomplete: the collect started {when} {what}; the spans it "
                    f"acknowledged are in the dataset, those it did not were never stored (exporters retry "
                    f"them). To finish it, run: nemo-telemetry collect --out {shlex.quote(self.out)}")
        return (f"dataset {self.out} is incomplete: the ingest of {', '.join(self.inputs)} started {when} {what}; "
                f"its spans are not in the dataset. To finish it, run: {self.command}")


@dataclass(frozen=True)
class FileProblem:
    """A committed file that cannot be read as committed: ``path`` relative to the dataset."""

    path: str
    problem: str
    rows: int | None  # the rows its commit recorded (None: a record without sizes)


@dataclass(frozen=True)
class DatasetState:
    """What a reader may read: the committed files of each table, and the unfinished ingests."""

    root: Path
    committed: frozenset[str] | None  # paths relative to root; None: no commit record (every file)
    unfinished: tuple[UnfinishedIngest, ...]
    info: dict = field(default_factory=dict)  # relative path -> [bytes, rows, footer crc32] its commit recorded
    format: int = DATASET_FORMAT  # the dataset format of its files (store.formats): one this version reads

    def recorded(self, table: str) -> list[str]:
        """The committed files of ``table`` as the record names them (relative, sorted), unchecked."""
        if self.committed is None:
            return sorted((str(p.relative_to(self.root)) for p in (self.root / table).rglob("*.parquet")), key=str)
        prefix = f"{table}/"
        return sorted((rel for rel in self.committed if rel.startswith(prefix)), key=lambda rel: str(self.root / rel))

    def recorded_rows(self, table: str) -> int | None:
        """The rows the commit records give ``table``'s committed files, without opening one; None
        when a file's record has no row count (a dataset without records, or an older record)."""
        counts = [self.info.get(rel) for rel in self.recorded(table)]
        if self.committed is None or any(not info or len(info) < 2 or info[1] is None for info in counts):
            return None
        return sum(int(info[1]) for info in counts)

    def files(self, table: str) -> list[Path]:
        """The committed Parquet files of ``table`` (``spans``, ``events``, ``links``, ``metrics``, ``logs``),
        sorted, each checked against its commit (there, its size, its footer): a
        :class:`~nemo_telemetry.errors.DamagedDatasetError` names every one that is not as committed."""
        return [path for _, path in self.placed(table)]

    def placed(self, table: str) -> list[tuple[str, Path]]:
        """:meth:`files` with the path each file has in the record (relative to the root): the same
        unless a writer died before renaming it (then the path read is where it is staged)."""
        placed, problems = [], []
        for rel in self.recorded(table):
            path, problem = inspect_file(self.root, rel, self.info.get(rel))
            if problem is not None:
                problems.append(problem)
            else:
                placed.append((rel, path))
        if problems:
            raise damaged_error(self.root, problems)
        return placed


def damaged_error(root: Path, problems: list[FileProblem]) -> DamagedDatasetError:
    """The error every reader raises for damaged committed files: each named, and the fix."""
    shown = "; ".join(f"{p.path} ({p.problem})" for p in problems[:5])
    more = f"; and {len(problems) - 5} more" if len(problems) > 5 else ""
    quoted = shlex.quote(str(root))
    return DamagedDatasetError(
        f"{root}: {len(problems)} committed file(s) damaged: {shown}{more}. Run nemo-telemetry verify {quoted} to "
        f"list them, then nemo-telemetry repair {quoted} to drop them from the commit record (re-running the "
        f"ingest of their dumps restores their spans)", tuple((p.path, p.problem) for p in problems))


def file_info(path: Path, rows: int) -> list:
    """[bytes, rows, crc32 of the Parquet footer] of a file just written: what its commit records,
    so a reader can tell a file is the one committed from its size and its last bytes alone."""
    with open(path, "rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        footer = _footer(handle, size)
    return [size, int(rows), zlib.crc32(footer) if footer is not None else None]


def _footer(handle, size: int) -> bytes | None:
    """The Parquet footer (file metadata) of an open file, or None when it is not a Parquet file."""
    if size < 12:
        return None
    handle.seek(0)
    head = handle.read(4)
    handle.seek(size - 8)
    tail = handle.read(8)
    length = int.from_bytes(tail[:4], "little")
    if head != _MAGIC or tail[4:] != _MAGIC or length > size - 12:
        return None
    handle.seek(size - 8 - length)
    return handle.read(length)


def inspect_file(root: Path, rel: str, info: list | None) -> tuple[Path, FileProblem | None]:
    """(where to read the committed file ``rel``, what is wrong with it or None): there or still
    under its temporary name, of the committed size, a Parquet file whose footer is the committed
    one. Reads a file's first 4 and last bytes only (its footer), not its data."""
    path = root / rel
    rows = int(info[1]) if info else None
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        staged = staged_copy(root, rel)
        if staged is None:
            return path, FileProblem(rel, "missing", rows)
        path, handle = staged, open(staged, "rb")
    except OSError as exc:
        return path, FileProblem(rel, f"cannot be opened: {exc.strerror or exc}", rows)
    with handle:
        try:
            size = handle.seek(0, os.SEEK_END)
            if info and size != info[0]:
                what = "truncated" if size < info[0] else "grown"
                return path, FileProblem(rel, f"{what}: {size} bytes, {info[0]} committed", rows)
            footer = _footer(handle, size)
        except OSError as exc:
            return path, FileProblem(rel, f"cannot be read: {exc.strerror or exc}", rows)
    if footer is None:
        return path, FileProblem(rel, "not a Parquet file (overwritten or zeroed)", rows)
    if info and info[2] is not None and zlib.crc32(footer) != info[2]:
        return path, FileProblem(rel, "not the file committed: another Parquet file of the same size", rows)
    return path, None


def staged_copy(root: Path, rel: str) -> Path | None:
    """A committed file still staged (its writer died after the commit record and before the
    rename), or None."""
    try:
        found = sorted((root / STAGING).glob(f"*/{_glob_escape(rel)}{_TEMPORARY}"))
    except OSError:
        return None
    return found[0] if found else None


def _glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


class DatasetLock:
    """``DATASET/_lock``: the dataset's one writer. An ``flock`` the kernel releases when the process
    ends (``kill -9`` included); the file holds who took it (pid, host, command, since when) for
    the message the next writer gets. Held by ``ingest``, ``collect``, ``monitor --port`` and
    ``repair``; readers never take it."""

    def __init__(self, root: Path, *, command: str | None = None) -> None:
        import fcntl

        self.root = Path(root)
        self.path = self.root / _LOCK
        self._fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            self._fd = -1
            raise self._locked_error() from None
        except BaseException:
            os.close(self._fd)
            self._fd = -1
            raise
        self.holder = {"pid": os.getpid(), "host": socket.gethostname(),
                       "command": command or shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
                       "since_ns": time.time_ns()}
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, json.dumps(self.holder).encode(), 0)

    def _locked_error(self) -> DatasetLockedError:
        holder: dict = {}
        for _ in range(50):  # the holder writes who it is just after it takes the lock
            try:
                holder = json.loads(self.path.read_bytes() or b"{}")
            except (OSError, ValueError):
                holder = {}
            if holder:
                break
            time.sleep(0.01)
        since = holder.get("since_ns")
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since / 1e9)) if isinstance(since, int) else "?"
        return DatasetLockedError(
            f"{self.root}: another writer holds this dataset: pid {holder.get('pid', '?')} on host "
            f"{holder.get('host', '?')} ({holder.get('command', '?')}), since {when}. One writer at a time keeps "
            f"every span once: wait for it to finish or stop it, then run this again", holder)

    def release(self) -> None:
        """Let the dataset go (the lock file stays: removing it would race the next writer's open)."""
        if self._fd < 0:
            return
        try:
            os.ftruncate(self._fd, 0)
        except OSError:
            pass
        finally:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = -1

    def __enter__(self) -> "DatasetLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class WriterLock:
    """``_writers/<writer>.lock``, held while a writer is open, so others can tell it is alive
    (the kernel drops the lock when the process dies, ``kill -9`` included)."""

    def __init__(self, root: Path, writer: str) -> None:
        import fcntl

        folder = root / WRITERS
        folder.mkdir(exist_ok=True)
        self.path = folder / f"{writer}.lock"
        self._fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def release(self) -> None:
        if self._fd < 0:
            return
        try:
            self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)
            self._fd = -1


def _alive(root: Path, writer: str) -> bool:
    """Whether the writer ``writer`` holds its lock now."""
    import fcntl

    try:
        fd = os.open(root / WRITERS / f"{writer}.lock", os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


def write_record(root: Path, writer: str, sequence: int, record: dict) -> Path:
    """Append one record to ``_commits`` atomically (tmp + fsync + rename + folder fsync)."""
    tmp, final = stage_record(root, writer, sequence, record)
    try:
        fsync_path(tmp)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        raise with_path(exc, final) if isinstance(exc, OSError) else exc from exc
    return publish_record(tmp, final)


def stage_record(root: Path, writer: str, sequence: int, record: dict) -> tuple[Path, Path]:
    """Write a record under its temporary name, not fsync'd (the caller fsyncs it, alongside
    the files it commits); returns (temporary, final) for :func:`publish_record`."""
    final = root / COMMITS / f"{time.time_ns():020d}-{writer}-{sequence:09d}.json"
    tmp = temporary_name(final, writer)
    try:
        with open(tmp, "wb") as handle:
            version = _FORMAT_REMOVES if record.get("removes") else _FORMAT  # a reader of format 1 would keep them
            content = {"format": version, FORMAT_KEY: DATASET_FORMAT, "writer": writer, **record}
            handle.write(json.dumps(content, separators=(",", ":")).encode())
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        raise with_path(exc, final) if isinstance(exc, OSError) else exc from exc
    return tmp, final


def publish_record(tmp: Path, final: Path) -> Path:
    """Rename a staged, fsync'd record into place and fsync its folder: from then on it counts.
    On a failure the record is taken back (the caller removes the files it names)."""
    try:
        os.replace(tmp, final)
        tmp = final
        fsync_path(final.parent)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        raise with_path(exc, final) if isinstance(exc, OSError) else exc from exc
    return final


@dataclass
class _Union:
    """The union of records: committed files (and what each commit recorded of them), files a
    repair removed, begun ingests (writer -> begin record), finished writers."""

    files: set
    begun: dict
    finished: set
    names: list  # the record files read
    info: dict = field(default_factory=dict)
    removed: set = field(default_factory=set)
    format: int | None = None  # the dataset format the latest record names (None: it names none)

    def committed(self) -> set:
        return self.files

    def snapshot(self) -> dict:
        done = self.finished & set(self.begun)  # an ingest that began and finished: nothing left to say
        files = self.committed()
        record = {"kind": "snapshot", "files": sorted(files),
                  "begun": {w: b for w, b in self.begun.items() if w not in done},
                  "finished": sorted(self.finished - done),
                  "sizes": {rel: info for rel, info in self.info.items() if rel in files}}
        if self.removed:  # kept: a record beside the snapshot, older, may still add them
            record["removes"] = sorted(self.removed)
        return record


def _read_union(root: Path) -> _Union | None:
    folder = root / COMMITS
    for _ in range(20):  # a compaction may remove a record between the listing and the read: list again
        try:
            names = sorted(n for n in os.listdir(folder) if n.endswith(".json") and not n.startswith("."))
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            raise IngestError(f"{folder}: is not a directory; this is not a dataset nemo-telemetry wrote") from None
        union = _Union(set(), {}, set(), names)
        try:
            for name in names:
                _add(union, folder / name)
        except FileNotFoundError:
            continue
        return union
    raise IngestError(f"{folder}: the commit records keep changing while read; try again")


def _add(union: _Union, path: Path) -> None:
    try:
        record = json.loads(path.read_bytes())
        version = record.get("format", _FORMAT)
        if not isinstance(version, int) or version > _FORMAT_REMOVES:
            raise IngestError(f"{path}: a commit record of format {version!r}, which this nemo-telemetry cannot "
                              f"read (it reads {_FORMAT} to {_FORMAT_REMOVES}); upgrade nemo-telemetry")
        kind = record["kind"]
        union.format = record.get(FORMAT_KEY)
        if union.format is not None and not isinstance(union.format, int):
            raise TypeError(f"{FORMAT_KEY} {union.format!r}")
        if kind == "begin":
            union.begun[record["writer"]] = record
        elif kind == "commit":
            union.finished.update(record.get("finishes", ()))
        elif kind == "snapshot":
            union.begun.update(record["begun"])
            union.finished.update(record["finished"])
        if kind in ("commit", "snapshot"):  # a record's removals and additions name different files
            removes = set(record.get("removes", ()))
            union.files -= removes
            union.removed |= removes
            union.files.update(record["files"])
            union.removed.difference_update(record["files"])  # a file of that name committed again
            union.info.update(record.get("sizes", {}))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise IngestError(f"{path}: unreadable commit record ({exc}); restore it or remove the dataset") from None


def dataset_state(root: Path, *, warn: bool = True) -> DatasetState:
    """The committed files and unfinished ingests of the dataset at ``root``; with ``warn``, an
    :class:`~nemo_telemetry.errors.IncompleteDatasetWarning` for each unfinished ingest (its
    inputs and the command that finishes it). Every reader of a dataset starts here."""
    root = Path(root)
    union = _read_union(root)
    if union is None or not union.names:  # the first record (prepare's) is written before any file
        state = DatasetState(root, None, ())
        version = dataset_format(root, None, lambda: (root / rel for rel in state.recorded("spans")))
        return DatasetState(root, None, (), format=version)
    unfinished = tuple(
        UnfinishedIngest(writer, tuple(begin.get("inputs", ())), begin.get("out", str(root)),
                         int(begin.get("started_ns", 0)), _alive(root, writer), begin.get("tool", "ingest"))
        for writer, begin in sorted(union.begun.items(), key=lambda item: item[1].get("started_ns", 0))
        if writer not in union.finished
    )
    committed = union.committed()
    info = {rel: recorded for rel, recorded in union.info.items() if rel in committed}
    state = DatasetState(root, frozenset(committed), unfinished, info)
    version = dataset_format(root, union.format, lambda: _readable(state, "spans"))
    if warn:
        for ingest in unfinished:
            warnings.warn(ingest.describe(), IncompleteDatasetWarning, stacklevel=2)
    return DatasetState(root, state.committed, unfinished, info, version)


def _readable(state: DatasetState, table: str):
    """Where each committed file of ``table`` is, skipping the damaged ones (:meth:`DatasetState.files` names them)."""
    for rel in state.recorded(table):
        path, problem = inspect_file(state.root, rel, state.info.get(rel))
        if problem is None:
            yield path


def ingest_inputs(root: Path) -> dict[str, tuple[str, ...]]:
    """writer -> the inputs of its ingest, for the ingests whose start the records still hold."""
    union = _read_union(Path(root))
    if union is None:
        return {}
    return {writer: tuple(begin.get("inputs", ())) for writer, begin in union.begun.items()
            if begin.get("tool", "ingest") == "ingest"}


def committed_files(root: Path, table: str = "spans", *, warn: bool = True) -> list[Path]:
    """The committed Parquet files of one table of the dataset at ``root``, sorted; warns as
    :func:`dataset_state` does."""
    return dataset_state(root, warn=warn).files(table)


def compact(root: Path, writer: str, sequence: int, *, at_least: int = _COMPACT_AFTER) -> bool:
    """Fold the records into one snapshot when there are ``at_least`` of them; True when it did.

    The snapshot is written (atomically) before the records it covers are removed, so a reader
    sees either them, or it, or both: the same union.
    """
    try:
        if sum(1 for n in os.listdir(root / COMMITS) if n.endswith(".json")) < max(at_least, 2):
            return False  # the usual case, without reading the records
    except FileNotFoundError:
        return False
    union = _read_union(root)
    if union is None or len(union.names) < 2:
        return False
    write_record(root, writer, sequence, union.snapshot())
    folder = root / COMMITS
    for name in union.names:
        (folder / name).unlink(missing_ok=True)
    fsync_path(folder)
    return True


def prepare(root: Path, writer: str) -> tuple[DatasetState, int]:
    """Ready ``root`` for a new writer: record an older dataset's files as committed, and remove
    what writers that are gone left behind (temporary files, files renamed but never committed).

    Returns the state and how many records this writer wrote (its next sequence number).
    """
    sequence = 0
    if not (root / COMMITS).is_dir():
        (root / COMMITS).mkdir()
        fsync_path(root)  # the folder's name is durable before any record in it
    state = dataset_state(root, warn=False)
    if state.committed is None:  # no record yet: an older dataset's files, or a new dataset
        legacy = sorted(str(p.relative_to(root)) for table in TABLES for p in (root / table).rglob("*.parquet"))
        write_record(root, writer, sequence, {"kind": "commit", "files": legacy, "adopted": bool(legacy)})
        sequence += 1
        state = dataset_state(root, warn=False)
    roll_forward(root, state)
    _remove_leftovers(root, state)
    return state, sequence


def roll_forward(root: Path, state: DatasetState) -> list[str]:
    """Rename the committed files still under their temporary names (a writer died between its
    commit record and the renames) to their names; the ones renamed. Only a lock holder calls it."""
    moved = []
    for rel in sorted(state.committed or ()):
        path = root / rel
        if path.exists():
            continue
        staged = staged_copy(root, rel)
        if staged is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged, path)
            moved.append(rel)
    for folder in sorted({(root / rel).parent for rel in moved}):
        fsync_path(folder)
    return moved


def _remove_leftovers(root: Path, state: DatasetState) -> None:
    committed = state.committed or frozenset()
    alive: dict[str, bool] = {}

    def gone(writer: str | None) -> bool:
        if writer is None:  # not a name a writer gives its files: left alone (and unread)
            return False
        if writer not in alive:
            alive[writer] = _alive(root, writer)
        return not alive[writer]

    folders = [root / COMMITS] + [root / table for table in TABLES]
    for folder in folders:
        if not folder.is_dir():
            continue
        for path in folder.rglob("*"):
            if not path.is_file():
                continue
            name = path.name
            if name.startswith(".") and name.endswith(_TEMPORARY):
                writer = name[: -len(_TEMPORARY)].rsplit(".", 1)[-1]
            elif name.endswith(".parquet") and folder.name != COMMITS and str(path.relative_to(root)) not in committed:
                writer = _writer_of(name)
            else:
                continue
            if gone(writer):
                _unlink(path)
    staging = root / STAGING
    for folder in sorted(staging.iterdir()) if staging.is_dir() else ():
        if not gone(folder.name):
            continue
        for path in sorted(folder.rglob("*")):
            rel = str(path.relative_to(folder))
            if path.is_file() and rel.endswith(_TEMPORARY) and rel[: -len(_TEMPORARY)] not in committed:
                _unlink(path)  # staged, never committed: a dead writer's
        remove_empty_folders(folder)


def remove_empty_folders(folder: Path) -> None:
    """``folder`` and the folders under it that hold nothing (a writer's staging area once renamed)."""
    if not folder.is_dir():
        return
    for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        _rmdir(sub)
    _rmdir(folder)


def _rmdir(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:  # not empty (a committed file it still holds), or gone
        pass


def _writer_of(name: str) -> str | None:
    """The writer id in a data file's name (``part-<writer>-<n>.parquet``), if it has one."""
    parts = name.split("-")
    return f"{parts[1]}-{parts[2]}" if name.startswith("part-") and len(parts) >= 4 else None


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
