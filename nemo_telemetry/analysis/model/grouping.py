"""Group-bys over numpy key arrays, for the small tables the rules merge and finish.

Merged partials, per-step tables and per-trace counts are thousands of rows: a sort or a dense
code table over their integer keys groups them, and importing pandas would cost each command
more start-up than the work itself. A table here is :data:`Columns`, a dict of equal-length
numpy arrays. Keys are integer (or bool) arrays; strings are coded first (:func:`string_codes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Columns", "Groups", "group_by", "first_rows", "find_keys", "take", "concat", "string_codes"]

Columns = dict  # column name -> numpy array, every array the same length

_DENSE_SLACK = 1 << 16  # a key range up to 4 x rows + this is coded through a table, without a sort


@dataclass(frozen=True, eq=False)
class Groups:
    """Rows grouped by equal keys: ``codes`` numbers each row's group, groups in ascending key
    order (the first key most significant); ``first`` is each group's first row."""

    codes: np.ndarray
    first: np.ndarray

    def __len__(self) -> int:
        return len(self.first)

    @cached_property
    def _order(self) -> tuple[np.ndarray, np.ndarray]:
        order = np.argsort(self.codes, kind="stable")
        return order, np.searchsorted(self.codes[order], np.arange(len(self.first)))

    def reduce(self, ufunc: np.ufunc, values: np.ndarray) -> np.ndarray:
        """``ufunc`` over each group's values (``np.add``, ``np.minimum``, ``np.maximum``...)."""
        values = np.asarray(values)
        if len(self.first) == 0:
            return np.zeros(0, values.dtype)
        order, heads = self._order
        return ufunc.reduceat(values[order], heads)

    def size(self) -> np.ndarray:
        return np.bincount(self.codes, minlength=len(self.first)).astype(np.int64)

    def key(self, values: np.ndarray) -> np.ndarray:
        """``values`` (one per row, equal within a group) per group."""
        return np.asarray(values)[self.first]

    def members(self) -> list[np.ndarray]:
        """Each group's rows, ascending."""
        order, heads = self._order
        return np.split(order, heads[1:]) if len(heads) else []


def _one_key(keys: tuple[np.ndarray, ...]) -> np.ndarray | None:
    """One int64 per row that sorts as the rows' keys do, or None when their ranges are too wide."""
    combined, width = np.zeros(len(keys[0]), np.int64), 1
    for key in reversed(keys):
        key = np.asarray(key)
        if key.dtype == bool:
            key = key.astype(np.int64)
        low, high = key.min(), key.max()
        span = int(high) - int(low) + 1
        if span * width >= 1 << 62:
            return None
        offset = (key - low).astype(np.int64) if key.dtype.kind == "u" else key.astype(np.int64) - int(low)
        combined += offset * width
        width *= span
    return combined


def group_by(*keys: np.ndarray) -> Groups:
    """The groups of rows with equal ``keys`` (integer or bool arrays of one length)."""
    n = len(keys[0])
    if n == 0:
        return Groups(np.zeros(0, np.int64), np.zeros(0, np.int64))
    combined = _one_key(keys)
    if combined is not None and int(combined.max()) < 4 * n + _DENSE_SLACK:
        present = np.zeros(int(combined.max()) + 1, bool)
        present[combined] = True
        codes = (np.cumsum(present) - 1)[combined]
        first = np.full(int(present.sum()), n, np.int64)
        np.minimum.at(first, codes, np.arange(n))
        return Groups(codes.astype(np.int64), first)
    order = np.argsort(combined, kind="stable") if combined is not None else np.lexsort(keys[::-1])
    change = np.zeros(n, bool)
    change[0] = True
    for key in keys if combined is None else (combined,):
        k = np.asarray(key)[order]
        change[1:] |= k[1:] != k[:-1]
    codes = np.empty(n, np.int64)
    codes[order] = np.cumsum(change) - 1
    return Groups(codes, order[change])


def first_rows(*keys: np.ndarray) -> np.ndarray:
    """The first row of each distinct key, in row order (what a drop-duplicates keeps)."""
    return np.sort(group_by(*keys).first)


def find_keys(index: tuple[np.ndarray, ...], wanted: tuple[np.ndarray, ...]) -> np.ndarray:
    """Position in ``index`` (distinct keys, one array per key column) of each ``wanted`` key, or -1."""
    m = len(index[0])
    if m == 0 or len(wanted[0]) == 0:
        return np.full(len(wanted[0]), -1, np.int64)
    both = group_by(*(np.concatenate([np.asarray(i), np.asarray(w)]) for i, w in zip(index, wanted)))
    position = np.full(len(both), -1, np.int64)
    position[both.codes[:m]] = np.arange(m)
    return position[both.codes[m:]]


def take(columns: Columns, rows: np.ndarray) -> Columns:
    """The ``rows`` (positions or a mask) of every column."""
    return {name: values[rows] for name, values in columns.items()}


def concat(parts: list[Columns], empty: Columns) -> Columns:
    """Tables of the same columns one after the other (``empty`` gives the columns and types)."""
    parts = [p for p in parts if len(next(iter(p.values()), ()))]
    if not parts:
        return {name: values[:0] for name, values in empty.items()}
    return {name: np.concatenate([np.asarray(p[name], values.dtype) for p in parts]) for name, values in empty.items()}


def string_codes(values, order: tuple | list | None = None) -> tuple[np.ndarray, tuple]:
    """Codes of strings (a numpy object array, a list or an Arrow array; None: -1), and the values
    the codes number: ``order`` when given (a value not in it: -1), else first appearance."""
    array = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(
        np.asarray(values, dtype=object) if not isinstance(values, list) else values, pa.string())
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks else pa.array([], array.type)
    if not pa.types.is_dictionary(array.type):
        array = pc.dictionary_encode(array)
    distinct = array.dictionary.to_pylist()
    if order is None:
        lookup, out = np.arange(len(distinct), dtype=np.int64), tuple(distinct)
    else:
        position = {v: i for i, v in enumerate(order)}
        lookup, out = np.array([position.get(v, -1) for v in distinct], np.int64), tuple(order)
    indices = pc.fill_null(array.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    none = position.get(None, -1) if order is not None else -1
    return np.append(lookup, none)[indices], out
