"""The one structure goodput and the findings read: a spans table as numpy arrays.

Every decode strategy of :mod:`decode.strategies` (a table in memory, spans files batch by
batch, ids handed over as arrays, a reference built row by row) fills the same fields, each
over every row: the rules cannot tell which one built their input. Strings that repeat (names,
buckets, runs, categories) are integer codes into a small tuple of values
(:mod:`model.columns`), so every rule over names is decided once per distinct name.

Three parts cost more than the rest and are often not read (goodput by step never looks at
orphans): how spans hang together (:class:`Parents`), the orphan test, and the (run, name) and
(run, resource value) pairs (:class:`RunPairs`). They are :class:`Later` values: computed once, when first
read, in the reading thread or by a worker a strategy started; a rule reads them the same way
either way.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Generic, TypeVar

import numpy as np
import pyarrow as pa

from nemo_telemetry.analysis.model.columns import (
    code_mask, codes_matching, column_codes, column_rows, int_column, row_value,
)
from nemo_telemetry.analysis.model.tree import TRACE_LOW, trace_hex
from nemo_telemetry.analysis.model.walk import climb

__all__ = ["BUCKETS", "UNKNOWN_BUCKET", "NO_BUCKET", "Later", "Parents", "RunPairs", "SpanArrays",
           "SPAN_GROUPS_ATTRIBUTE", "RUN_RESOURCES"]

BUCKETS = ("productive", "overhead", "idle", "wasted")
UNKNOWN_BUCKET = -2
NO_BUCKET = -1
SPAN_GROUPS_ATTRIBUTE = "nemo.telemetry.span_groups"
RUN_RESOURCES = (SPAN_GROUPS_ATTRIBUTE,)
"""Resource attribute keys whose (run, value) pairs every strategy gathers (:class:`RunPairs`)."""

T = TypeVar("T")


class Later(Generic[T]):
    """A value computed once, on the first :meth:`get`: by ``compute`` in the thread that asks, or
    by a worker (``compute`` is then the worker's future's ``result``). Thread-safe."""

    __slots__ = ("_compute", "_value", "_done", "_lock")

    def __init__(self, compute: Callable[[], T]) -> None:
        self._compute: Callable[[], T] | None = compute
        self._value: T | None = None
        self._done = False
        self._lock = threading.Lock()

    @classmethod
    def known(cls, value: T) -> Later[T]:
        later = cls(lambda: value)
        later._value, later._done, later._compute = value, True, None
        return later

    def get(self) -> T:
        if not self._done:
            with self._lock:
                if not self._done and self._compute is not None:
                    self._value = self._compute()
                    self._compute, self._done = None, True
        return self._value  # type: ignore[return-value]  # set once _done


@dataclass(frozen=True, eq=False)
class Parents:
    """How the spans hang together, over every row.

    ``of(rows)``: each row's parent row (-1: a root, or a parent not in the data): the lowest other
    row whose span id and trace are the reference's; a strategy answers it from whatever it holds
    (an array of every row's parent, or a sorted key index it searches: a walk from a few rows
    then costs a few lookups). ``has_parent``: the span names a parent (``parent_span_id`` set,
    else a ``parent_key`` other than 0).
    """

    of: Callable[[np.ndarray], np.ndarray]
    has_parent: np.ndarray

    @cached_property
    def row(self) -> np.ndarray:
        """Every row's parent row."""
        return self.of(np.arange(len(self.has_parent), dtype=np.int64))


@dataclass(frozen=True, eq=False)
class RunPairs:
    """The distinct (run code, name code) pairs of every row, and per resource attribute key of
    :data:`RUN_RESOURCES` its distinct (run code, value) pairs (values as the map writes them)."""

    names: frozenset
    resources: dict


@dataclass(frozen=True, eq=False)
class SpanArrays:
    """Columns of one spans table as numpy arrays, one entry per row, whatever built them.

    ``table`` keeps what is read only for messages or by few rules, in every strategy:
    ``trace_key`` and ``span_key`` (ids), ``trace_id`` where it was read, ``service_name`` and
    ``rank`` where they were read (goodput by rank, decoded on first use), and the group columns
    ``missing-group-spans`` reads per row where they were read (``span_groups``, ``rl.span_group``,
    ``span_groups_namespace``: :func:`~nemo_telemetry.analysis.findings.groups.group_presence`). A strategy may keep more
    (a table in memory keeps every column it was given; a caller that decodes its own batch may
    read those), never less.
    """

    table: pa.Table
    name: np.ndarray
    names: tuple
    run: np.ndarray
    runs: tuple
    start: np.ndarray  # int64 ns
    end: np.ndarray
    valid_interval: np.ndarray  # end >= start
    bucket: np.ndarray  # index into BUCKETS, NO_BUCKET, or UNKNOWN_BUCKET
    bucket_raw: np.ndarray  # code into bucket_values
    bucket_values: tuple
    category: np.ndarray  # code into categories (rl.efficiency.category), -1: none
    categories: tuple
    iteration: np.ndarray  # own rl.iteration (0 where none)
    has_iteration: np.ndarray
    links: Later[Parents]
    orphans: Later[np.ndarray]  # spans naming a parent that no row holds (not even themselves)
    pairs: Later[RunPairs]

    def __len__(self) -> int:
        return len(self.name)

    @cached_property
    def has_bucket(self) -> np.ndarray:
        """Read-only mask of the rows with an ``rl.bucket`` (known or not): the walks, the
        attribution and the findings each start from it."""
        mask = self.bucket != NO_BUCKET
        mask.setflags(write=False)
        return mask

    # -- read on first use from ``table``: goodput by step never reads them ---------------------

    @cached_property
    def _service(self) -> tuple[np.ndarray, tuple]:
        return column_codes(self.table, "service_name")

    @property
    def service(self) -> np.ndarray:
        return self._service[0]

    @property
    def services(self) -> tuple:
        return self._service[1]

    @cached_property
    def _rank(self) -> tuple[np.ndarray, np.ndarray]:
        return int_column(self.table, "rank")

    @property
    def rank(self) -> np.ndarray:
        return self._rank[0]

    @property
    def has_rank(self) -> np.ndarray:
        return self._rank[1]

    def bucketed_category(self, rows: np.ndarray) -> np.ndarray:
        """Efficiency category codes (-1: none) of ``rows``."""
        return self.category[rows]

    # -- the tree ----------------------------------------------------------------------------

    @property
    def parents(self) -> np.ndarray:
        """Parent row of every span (-1: root or orphan)."""
        return self.links.get().row

    @property
    def has_parent(self) -> np.ndarray:
        return self.links.get().has_parent

    @property
    def orphan(self) -> np.ndarray:
        """Spans that name a parent which is not in the table (same trace)."""
        return self.orphans.get()

    def parent_of(self, rows: np.ndarray) -> np.ndarray:
        """Parent row of each of ``rows`` (-1: root or orphan)."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) == 0:
            return np.zeros(0, dtype=np.int64)
        return np.asarray(self.links.get().of(rows), dtype=np.int64)

    def walk_up(self, rows: np.ndarray, *, ancestors: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For ``rows``: (attributed iteration, whether one was found, nearest bucketed ancestor or -1).

        The iteration is the row's own ``rl.iteration``, else the nearest stamped ancestor's
        (parent links join across processes through carriers); a walk stops at a root or orphan.
        Only rows still missing something climb, so stamped spans cost nothing unless
        ``ancestors`` asks for every bucketed ancestor (the nested-bucket finding).
        """
        own = self.has_iteration[rows]
        need = np.arange(len(rows)) if ancestors else np.flatnonzero(~own)
        if need.size == 0:
            return self.iteration[rows].copy(), own.copy(), np.full(len(rows), -1, dtype=np.int64)
        walked = climb(self.parent_of(rows[need]), self.parent_of, self.has_iteration, self.iteration,
                       bucketed=self.has_bucket if ancestors else None, stamped=own[need])
        iteration, found = self.iteration[rows].copy(), own.copy()
        take = walked.stamped & ~own[need]
        iteration[need[take]], found[need[take]] = walked.iteration[take], True
        bucketed_ancestor = np.full(len(rows), -1, dtype=np.int64)
        bucketed_ancestor[need] = walked.ancestor
        return iteration, found, bucketed_ancestor

    # -- names, runs, resources ----------------------------------------------------------------

    def rows_of_names(self, regex: str) -> np.ndarray:
        """Boolean mask (read-only) of the rows whose name matches ``regex``: made once per regex,
        as the step spans are asked for by the census, the numbering and the rules alike."""
        mask = self._name_masks.get(regex)
        if mask is None:
            mask = code_mask(self.name, codes_matching(self.names, regex), len(self.names))
            mask.setflags(write=False)
            self._name_masks[regex] = mask
        return mask

    @cached_property
    def _name_masks(self) -> dict[str, np.ndarray]:
        return {}

    def run_names(self, keep: np.ndarray) -> list[tuple[int, int]]:
        """The distinct (run code, name code) pairs of the ``keep`` rows (whole runs), sorted."""
        runs = self._kept_runs(keep)
        return sorted(p for p in self.pairs.get().names if runs is None or p[0] in runs)

    def run_resources(self, key: str, keep: np.ndarray) -> set[tuple[int, str]]:
        """The distinct (run code, value) pairs of resource attribute ``key`` (one of
        :data:`RUN_RESOURCES`) over the ``keep`` rows (whole runs)."""
        runs = self._kept_runs(keep)
        return {p for p in self.pairs.get().resources[key] if runs is None or p[0] in runs}

    def _kept_runs(self, keep: np.ndarray) -> set[int] | None:
        """The run codes ``keep`` selects (None: every row); pairs are gathered per run, so
        ``keep`` is a selection of whole runs (a run filter)."""
        if keep.all():
            return None
        runs = np.flatnonzero(np.bincount(self.run[keep].astype(np.intp) + 1, minlength=1)) - 1
        if not np.array_equal(keep, code_mask(self.run, runs, len(self.runs))):
            raise ValueError("run pairs are read for a selection of whole runs only")
        return {int(r) for r in runs}

    # -- ids, for messages -------------------------------------------------------------------

    def span_id(self, rows) -> list[str]:
        return self._ids("span_id", "span_key", rows)

    def trace_id(self, rows) -> list[str]:
        return self._ids("trace_id", "trace_key", rows)

    def _ids(self, column: str, key: str, rows) -> list[str]:
        """Hex ids of ``rows``: the id column where ``table`` holds it, else from the uint64 keys
        (exact: a span id is its key, a trace id its key and ``trace_low``)."""
        rows = np.asarray(rows, dtype=np.int64)
        if column in self.table.column_names:
            return [str(row_value(self.table.column(column), r)) for r in rows]
        keys = column_rows(self.table.column(key), rows, 0)
        if key == "trace_key" and TRACE_LOW in self.table.column_names:
            return trace_hex(keys.astype(np.uint64), column_rows(self.table.column(TRACE_LOW), rows, 0).astype(np.uint64))
        return [f"{int(k):016x}" for k in keys]
