"""The dataset format: which layout of spans files a dataset holds, and the one reader of each
format this nemo-telemetry reads.

Every commit record a writer writes carries the format of the files it commits
(``"dataset_format"``, :data:`DATASET_FORMAT`). A dataset is read as the format its latest
record names. One whose latest record names none (written before formats were recorded, or
with no commit record at all) is read as the newest format whose columns every committed spans
file holds, and refused otherwise as format 0: the layouts before format 1 (files without the
uint64 id keys, without the ``span_groups`` column, without ``parent_row``) have no reader here.
A format above the ones read (a newer nemo-telemetry's) is refused too. Either refusal is a
:class:`~nemo_telemetry.errors.DatasetFormatError` that names the format and the fix: the same
dumps ingested again, into a new folder. :func:`~nemo_telemetry.analysis.store.commits.dataset_state`,
where every reader and writer of a dataset starts, decides the format; the reader of that format
(:data:`READERS`) checks each spans file it opens, so spans files handed over without their
dataset are held to it as well.

Format 1::

    every column of SPANS_SCHEMA but format 2's (span_groups included), the uint64 id keys
    trace_key, span_key and parent_key, and parent_row (int32): each span's parent as a row of
    the same file

Format 2: format 1's columns and the group columns, ``rl.span_group`` (the group each span was
opened in) and ``span_groups_namespace`` (the namespace each process resolved its span groups in).

Format 3 (the spans files ingest writes): format 2's columns, ``trace_low`` (uint64: the trace
id's low half) and ``trace_key`` holding a mix of both halves of the trace id
(:func:`~nemo_telemetry.analysis.model.tree.trace_key_of`), so that (``trace_key``,
``trace_low``, ``span_key``) is a span's whole identity and ``parent_row`` is joined on it. In
formats 1 and 2 ``trace_key`` is the trace id's first 64 bits and ``parent_row`` was joined on
it: traces that share their high half (64-bit ids padded to 128, as Jaeger, Zipkin and B3 write
them) are one trace there, and their parents and orphans are wrong. Those datasets are refused
with the fix (ingest the dumps again), not read: the rows their files hold are exact, the keys
and parent rows beside them are not. Format 3 also holds the OTLP fields kept for the way back to
OTLP (:data:`~nemo_telemetry.analysis.model.schema.OTLP_SPAN_COLUMNS`: flags, dropped counts, scope
attributes, schema URLs, attribute value types).

``parent_row`` makes a file's row order part of the format: a file whose rows another tool
reordered is found by the reader that uses the column
(:class:`~nemo_telemetry.analysis.decode.strategies.FileParents`), which checks each file's column
against the file's own keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from nemo_telemetry.analysis.model.schema import ID_KEY_FIELDS, PARENT_ROW, SPANS_SCHEMA
from nemo_telemetry.errors import DatasetFormatError

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.dataset as ds

__all__ = ["DATASET_FORMAT", "FORMAT_KEY", "UNVERSIONED", "SpansFormat", "READERS", "reader", "dataset_format",
           "format_error"]

DATASET_FORMAT = 3  # the format this nemo-telemetry writes
KEYED_ON_TRACE_HIGH = (1, 2)
"""Formats whose ``trace_key`` is the trace id's first 64 bits (no ``trace_low``): refused."""
FORMAT_KEY = "dataset_format"  # the commit record's field that holds it
UNVERSIONED = 0  # a dataset whose records name no format and whose files are in no layout read here


@dataclass(frozen=True)
class SpansFormat:
    """One dataset format's spans files: the columns each file holds, and the projection of a read."""

    version: int
    columns: tuple[str, ...]
    added: tuple[str, ...] = ()
    """The columns this format added to the one before it: files of that format, read as this
    one, read them as nulls."""

    def missing(self, schema: "pa.Schema") -> list[str]:
        """The columns of this format a spans file's ``schema`` lacks."""
        names = set(schema.names)
        return [c for c in self.columns if c not in names]

    def project(self, dataset: "ds.Dataset", columns: Iterable[str]) -> tuple["ds.Dataset", list[str]]:
        """``dataset`` (spans files of this format, or of the format before it) and the columns a
        read of ``columns`` takes, after checking every file holds this format's columns but the
        ones it added (each file's footer, which the scan reads anyway: the fragments keep it).
        An added column no file holds is in the schema all the same: read as nulls."""
        missing_added: set[str] = set()
        for fragment in dataset.get_fragments():
            missing = self.missing(fragment.physical_schema)
            lacking = [c for c in missing if c not in self.added]
            if lacking:
                raise format_error(fragment.path, UNVERSIONED, _lacks(fragment.path, lacking, named=False))
            missing_added.update(missing)
        columns = list(columns)
        wanted = [c for c in self.added if c in columns and c not in dataset.schema.names]
        if wanted:  # ds.dataset takes its schema from the first file: one of the older format's
            from nemo_telemetry.analysis.model.schema import SPANS_SCHEMA as schema

            fields = dataset.schema
            for name in wanted:
                fields = fields.append(schema.field(name))
            dataset = dataset.replace_schema(fields)
        return dataset, columns


# Every column ingest writes into a spans file: the table's, its id keys and the parent rows.
_WRITTEN = (*SPANS_SCHEMA.names, *(f.name for f in ID_KEY_FIELDS if f.name not in SPANS_SCHEMA.names), PARENT_ROW)
_V3 = SpansFormat(3, _WRITTEN)
READERS: dict[int, SpansFormat] = {3: _V3}  # one reader per format read


def reader(version: int = DATASET_FORMAT) -> SpansFormat:
    """The reader of dataset format ``version`` (one this nemo-telemetry reads)."""
    return READERS[version]


def dataset_format(root: Path, recorded: int | None, spans_files: Callable[[], Iterable[Path]]) -> int:
    """The format of the dataset at ``root``: ``recorded`` (its latest commit record's), or, where no
    record names one, the format whose columns every spans file (``spans_files()``) holds. A
    :class:`~nemo_telemetry.errors.DatasetFormatError` when that is no format read here."""
    if recorded is not None:
        if recorded not in READERS:
            raise format_error(root, recorded, "written by a newer nemo-telemetry" if recorded > DATASET_FORMAT
                               else _TRACE_HIGH if recorded in KEYED_ON_TRACE_HIGH
                               else "a format no nemo-telemetry wrote")
        return recorded
    import pyarrow as pa  # only for a dataset whose records name no format
    import pyarrow.parquet as pq

    version = DATASET_FORMAT  # the newest format every file holds
    oldest = READERS[min(READERS)]
    for path in spans_files():
        try:
            schema = pq.read_schema(path)
        except (pa.ArrowInvalid, OSError):  # not a Parquet file: the check of committed files names it
            continue
        missing = oldest.missing(schema)
        if missing:
            raise format_error(root, UNVERSIONED, _lacks(path, missing))
        while READERS[version].missing(schema):
            version -= 1
    return version


_TRACE_HIGH = ("its trace keys are the first 64 bits of each trace id, which join traces that share them: "
               "64-bit ids padded to 128 bits")


def _lacks(path, missing: list[str], *, named: bool = True) -> str:
    """Why a dataset (``named``: its file ``path``) or one spans file is of no format read here."""
    columns = f"{', '.join(missing)} column{'s' if len(missing) > 1 else ''}"
    older = f" (a format before 3: {_TRACE_HIGH})" if "trace_low" in missing else ""
    if named:
        return f"unversioned, its spans files in a layout older than format {min(READERS)}: {path} has no {columns}{older}"
    return f"a spans file in a layout older than format {min(READERS)}: it has no {columns}{older}"


def format_error(where, version: int, why: str) -> DatasetFormatError:
    """The refusal every reader gives: the format, why, which formats are read, and the fix."""
    read = ", ".join(str(v) for v in sorted(READERS))
    fix = "upgrade nemo-telemetry, or re-run" if version > DATASET_FORMAT else "re-run"
    return DatasetFormatError(
        f"{where}: dataset format {version} ({why}), which this nemo-telemetry does not read (it reads format "
        f"{read}); {fix} nemo-telemetry ingest of its dumps into a new folder: "
        f"nemo-telemetry ingest DUMPS --out NEW_DATASET", version, tuple(sorted(READERS)))
