"""The id key index of a spans table, and the orphan test over it.

Each span's id and its parent reference are mixed with its trace into one uint64 apiece
(:func:`~nemo_telemetry.analysis.model.tree.mixed_key`), which the joins sort and search on.
The span index holds those keys with the row number packed in the low bits, sorted, for the
walks' parent lookups; the orphan test looks up the parent references no neighbouring row
answers (:func:`distinct_parents`) in it. A mixed key is 64 bits of a 192-bit identity, so two
identities can share one (by chance, or built to: the mix is invertible); every match the
mixed keys propose is confirmed on the whole identity (``trace_key``, ``trace_low`` and the span
id, which the mixed key gives back for a given trace), and a reference whose mixed key a span
of another identity holds takes the exact path (:func:`_exact_orphans`). Built a block of rows at a time, so no temporary is as
large as the table; the sorts and searches run in worker threads, which numpy lets go of the GIL for.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from nemo_telemetry.analysis.model.columns import LOOKUP_ROWS, filled, valid_rows
from nemo_telemetry.analysis.model.tree import SPAN_SPREAD, trace_mix

__all__ = ["BLOCK_ROWS", "SortedSet", "LowBitsFilter", "isin_sorted", "key_index", "sort_index", "build_index", "index_parents",
           "index_orphans", "distinct_parents", "orphan_mask", "in_threads", "parent_rows", "NO_PARENT",
           "PARENT_ELSEWHERE", "local_parent_rows"]

_SEARCH_STRETCH = 1024  # sorted queries searched together within one slice of the sorted values
_FEW_LEFT_OUT = 0.9  # a first block that still looks up more than this share of its references ends the neighbour pass
BLOCK_ROWS = 1 << 16  # the index is built this many rows at a time, so its temporaries stay in cache
NO_PARENT = -1  # local_parent_rows: the span names no parent
PARENT_ELSEWHERE = -2  # local_parent_rows: the parent the span names is not in its file


def isin_sorted(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """``np.isin(values, sorted_set)`` for uint64 keys and a small sorted set (:class:`SortedSet`)."""
    out = np.zeros(len(values), dtype=bool)
    if sorted_set.size == 0 or len(values) == 0:
        return out
    members = SortedSet(sorted_set)
    for lo in range(0, len(values), LOOKUP_ROWS):  # a block at a time: no temporary as large as ``values``
        members.contains(values[lo:lo + LOOKUP_ROWS], out=out[lo:lo + LOOKUP_ROWS])
    return out


class LowBitsFilter:
    """A first, cheap membership test of uint64 keys against a few members, by their low bits: a
    table of flags, one per value of the low bits, set where a member has them. Every member
    passes, and about ``members / 2**bits`` of the other keys; the caller tests the few that pass
    exactly (:class:`SortedSet`). One mask and one lookup in a table that stays in cache per key,
    where the exact test costs several passes over every key.

    Keys that share their low bits (hand-built ids 1, 2, 3... do not) only make more of them pass:
    the answer is the exact test's either way.
    """

    def __init__(self, members: np.ndarray) -> None:
        bits = max(16, min(22, (64 * max(len(members), 1)).bit_length()))  # about 1 in 64 others passes
        self.mask = np.uint64((1 << bits) - 1)
        self.flags = np.zeros(1 << bits, dtype=bool)
        self.flags[(np.asarray(members, dtype=np.uint64) & self.mask).view(np.int64)] = True

    def passing(self, block: np.ndarray, *, low: np.ndarray, flags: np.ndarray) -> np.ndarray:
        """The positions in ``block`` of the keys that pass (``low``, ``flags``: scratch as long as it)."""
        np.bitwise_and(block, self.mask, out=low)  # in the table's range: mode="clip" checks nothing
        return np.flatnonzero(np.take(self.flags, low.view(np.int64), out=flags, mode="clip"))


class SortedSet:
    """Membership in a small sorted set of uint64 keys, tested block by block.

    A table indexed by the top bits of a key (at least 65,536 slots, and two to four per member
    up to 4M) holds the set's only member with those bits, so one cache-resident lookup and a
    comparison decide almost every value, whether it is in the set or not; only values whose
    slot holds several members are binary-searched.
    """

    def __init__(self, sorted_set: np.ndarray) -> None:
        self.values = sorted_set
        bits = min(22, max(16, (2 * len(sorted_set)).bit_length()))
        self.shift = np.uint64(64 - bits)
        prefix = (sorted_set >> self.shift).astype(np.intp)
        members = np.bincount(prefix, minlength=1 << bits)
        # An empty (or crowded) slot holds a number from the neighbouring slot: no value of its own slot equals it.
        self.only = (np.arange(1 << bits, dtype=np.uint64) ^ np.uint64(1)) << self.shift
        single = members[prefix] == 1
        self.only[prefix[single]] = sorted_set[single]
        self.crowded = members > 1
        self.some_crowded = bool(self.crowded.any())

    def contains(self, block: np.ndarray, *, out: np.ndarray) -> np.ndarray:
        """Into ``out``: whether each of ``block`` is in the set."""
        if self.values.size == 0:
            out[:] = False
            return out
        slot = (block >> self.shift).astype(np.intp)
        np.equal(self.only[slot], block, out=out)
        if self.some_crowded:
            maybe = np.flatnonzero(self.crowded[slot])
            at = np.minimum(np.searchsorted(self.values, block[maybe]), self.values.size - 1)
            out[maybe] = self.values[at] == block[maybe]
        return out


def _mix_into(span_key: np.ndarray, trace_key: np.ndarray, parent_key: np.ndarray,
              own: np.ndarray, wanted: np.ndarray) -> None:
    """:func:`~nemo_telemetry.analysis.model.tree.mixed_key` of each span and of its parent, into
    ``own`` and ``wanted`` (written in place, a block at a time, with one trace mix for both).

    Spread span ids keep hand-built traces (spans 1, 2, 3...) from sharing their high bits,
    which would turn every lookup in the sorted index into a linear walk.
    """
    mix = trace_mix(trace_key)
    with np.errstate(over="ignore"):
        np.multiply(span_key, SPAN_SPREAD, out=own)
        np.multiply(parent_key, SPAN_SPREAD, out=wanted)
    own ^= mix
    wanted ^= mix


def distinct_parents(has_parent: np.ndarray, wanted: np.ndarray, own: np.ndarray | None = None) -> np.ndarray:
    """The distinct parent references (mixed keys) left to look up, sorted: many children share a parent.

    With ``own`` (the rows' own mixed keys), a reference that the row just before or after it
    holds is found already and left out, and a reference equal to the one before it is taken
    once, before the sort: spans are stored as their process exported them, as they ended, so a
    parent sequential work opens often sits next to its last child, and siblings next to each
    other. How much that leaves out depends on the run: the demo's runs look up two thirds of
    their references; a step of concurrent per-prompt spans that end together (the benchmark's
    run) leaves nothing out, and there the first block's count stops the pass (which would cost
    0.07 s at 10M spans).
    """
    if own is None or len(wanted) < 2:
        ordered = wanted[has_parent]
    else:
        n = len(wanted)
        left, previous = [], None  # per block: its references left to look up; the last one kept
        for lo in range(0, n, LOOKUP_ROWS):  # a block at a time: small temporaries, reused
            hi = min(lo + LOOKUP_ROWS, n)
            if lo and len(left) == 1 and len(left[0]) > _FEW_LEFT_OUT * int(has_parent[:lo].sum()):
                left.append(wanted[lo:][has_parent[lo:]])  # the first block left out almost nothing
                break
            ask = has_parent[lo:hi].copy()
            if lo:  # the row before the block's first
                ask &= wanted[lo:hi] != own[lo - 1:hi - 1]
            else:
                ask[1:] &= wanted[1:hi] != own[:hi - 1]
            last = min(hi, n - 1)  # the row after each, up to the table's last row
            ask[:last - lo] &= wanted[lo:last] != own[lo + 1:last + 1]
            block = wanted[lo:hi][ask]
            if block.size:
                fresh = np.empty(len(block), dtype=bool)
                fresh[0] = previous is None or block[0] != previous
                np.not_equal(block[1:], block[:-1], out=fresh[1:])
                previous = block[-1]
                left.append(block[fresh])
        ordered = np.concatenate(left) if left else wanted[:0].copy()
    ordered.sort()
    if ordered.size:
        distinct = np.empty(len(ordered), dtype=bool)
        distinct[0] = True
        np.not_equal(ordered[1:], ordered[:-1], out=distinct[1:])
        ordered = ordered[distinct]
    return ordered


def orphan_mask(has_parent: np.ndarray, mixed: tuple[np.ndarray, np.ndarray],
                sorted_spans: tuple[np.ndarray, np.ndarray, int], ordered: np.ndarray | None = None, *,
                traces: tuple[np.ndarray, np.ndarray] | None = None, threads: int = 1) -> np.ndarray:
    """Spans that name a parent which is not in the table (same trace), from the key index.

    With ``traces`` (every row's ``trace_key`` and ``trace_low``, :func:`build_index`'s), the test
    is exact: :func:`_exact_orphans`. Without (keys whose trace is ``trace_key`` alone), each
    distinct parent reference (``ordered``: :func:`distinct_parents`, which a caller may have
    sorted in another thread meanwhile) is looked up once, in sorted order, in the sorted span
    index the walks use; the full mixed key confirms what the high bits propose. Only references
    whose first candidate shares its high bits without being it (duplicated ids, equal high bits)
    take further rounds.
    """
    if traces is not None:
        return _exact_orphans(has_parent, mixed, sorted_spans, traces, threads)
    out = np.zeros(len(has_parent), dtype=bool)
    if len(sorted_spans[1]) == 0:
        return out
    ordered = distinct_parents(has_parent, mixed[1], mixed[0]) if ordered is None else ordered
    holders = _holders(ordered, sorted_spans, threads)
    missing = ordered[holders < 0]
    if missing.size:  # rare: back from the distinct parents to the spans that name them
        out = has_parent & isin_sorted(mixed[1], missing)
    return out


def _holders(ordered: np.ndarray, sorted_spans: tuple[np.ndarray, np.ndarray, int], threads: int) -> np.ndarray:
    """:func:`_parent_holders` of ``ordered`` a block at a time: the positions and candidates of
    every reference at once would double the test's memory at its peak. The blocks spread over
    ``threads``: the searches and gathers release the GIL."""
    own, packed, bits = sorted_spans
    high = ~np.uint64((1 << bits) - 1)
    blocks = [ordered[lo:lo + LOOKUP_ROWS] for lo in range(0, len(ordered), LOOKUP_ROWS)]
    found = in_threads(lambda block: _parent_holders(block, own, packed, high), blocks, threads)
    return np.concatenate(found) if found else np.zeros(0, np.int64)


def _exact_orphans(has_parent: np.ndarray, mixed: tuple[np.ndarray, np.ndarray],
                   sorted_spans: tuple[np.ndarray, np.ndarray, int], traces: tuple[np.ndarray, np.ndarray],
                   threads: int) -> np.ndarray:
    """The orphan test on the whole identity. A span whose row neighbour holds its reference (same
    mixed key, same trace key and low half: spans are stored as their process exported them, so a
    parent often sits next to its last child) has its parent. The others' references are sorted
    once with their positions packed in the low bits, each distinct one looked up once in the span
    index (:func:`_parent_holders`), and the holder found is confirmed on each span's trace: no
    holder, an orphan; a holder of the same trace, a parent. A holder of another trace (another
    identity with the reference's mixed key: by chance, or built to) sends the span to the exact
    lookup (:func:`parent_rows`), or it holds its reference itself."""
    own, wanted = mixed
    trace, low = traces
    n = len(has_parent)
    out = np.zeros(n, dtype=bool)
    if n == 0:
        return out
    ask = has_parent.copy()
    if n > 1:
        ask[1:] &= ~((wanted[1:] == own[:-1]) & (trace[1:] == trace[:-1]) & (low[1:] == low[:-1]))
        ask[:-1] &= ~((wanted[:-1] == own[1:]) & (trace[:-1] == trace[1:]) & (low[:-1] == low[1:]))
    rest = np.flatnonzero(ask)
    del ask
    if rest.size == 0:
        return out
    bits = max(1, (len(rest) - 1).bit_length())
    low_bits = np.uint64((1 << bits) - 1)
    references = wanted[rest]
    order = (references & ~low_bits) | np.arange(len(rest), dtype=np.uint64)
    order.sort()  # by the references' high bits: finer than the span index's, so its searches stream
    at = (order & low_bits).astype(np.intp)
    del order
    references = references[at]
    fresh = np.empty(len(references), dtype=bool)
    fresh[0] = True
    np.not_equal(references[1:], references[:-1], out=fresh[1:])
    holder = np.empty(len(rest), dtype=np.int64)
    holder[at] = _holders(references[fresh], sorted_spans, threads)[np.cumsum(fresh) - 1]  # back in row order
    del references, fresh, at
    held = holder >= 0
    out[rest[~held]] = True  # no span holds even the mixed key
    rest, holder = rest[held], holder[held]
    doubt = rest[(trace[holder] != trace[rest]) | (low[holder] != low[rest])]
    if doubt.size:
        out[doubt] = ~((own[doubt] == wanted[doubt]) | (parent_rows(sorted_spans, wanted[doubt], doubt, traces) >= 0))
    return out


def in_threads(work, items: list, threads: int) -> list:
    """``[work(item) for item in items]``, the items dealt round-robin over ``threads`` threads
    (this one included): for numpy work that lets go of the GIL."""
    threads = max(1, min(int(threads), len(items)))
    if threads < 2:
        return [work(item) for item in items]
    out: list = [None] * len(items)

    def run(indices) -> None:
        for i in indices:
            out[i] = work(items[i])

    with ThreadPoolExecutor(max_workers=threads - 1) as helpers:
        others = [helpers.submit(run, range(t, len(items), threads)) for t in range(1, threads)]
        run(range(0, len(items), threads))
        for other in others:
            other.result()
    return out


def _parent_holders(ordered: np.ndarray, own: np.ndarray, packed: np.ndarray, high: np.uint64) -> np.ndarray:
    """For each reference of ``ordered`` (sorted mixed parent keys), a row of the index that holds
    it, or -1."""
    ordered_high = ordered & high
    pos = _search_sorted(packed, ordered_high)
    np.minimum(pos, len(packed) - 1, out=pos)
    candidate = packed[pos]
    same_high = (candidate & high) == ordered_high
    del ordered_high
    row = (candidate & ~high).astype(np.intp)
    found = same_high & (own[row] == ordered)
    holders = np.where(found, row, -1)
    pending = np.flatnonzero(same_high & ~found)
    del candidate, same_high
    while pending.size:  # further rounds only for equal high bits or duplicated ids
        pos[pending] += 1
        pending = pending[pos[pending] < len(packed)]
        candidate = packed[pos[pending]]
        same_high = (candidate & high) == (ordered[pending] & high)
        pending, candidate = pending[same_high], candidate[same_high]
        row = (candidate & ~high).astype(np.intp)
        hit = own[row] == ordered[pending]
        holders[pending[hit]] = row[hit]
        pending = pending[~hit]
    return holders


def _search_sorted(values: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """``np.searchsorted(values, queries)`` for sorted ``queries``, a stretch of them at a time.

    Each stretch's binary searches run within the slice of ``values`` its first and the next
    stretch's first query bound, which stays in the cache; over the whole array every search
    starts with misses (4M references into 10M spans: 0.19 s against 0.26-0.37 s).
    """
    n = len(queries)
    if n < 4 * _SEARCH_STRETCH:
        return np.searchsorted(values, queries)
    cuts = np.arange(0, n, _SEARCH_STRETCH)
    lo = np.searchsorted(values, queries[cuts])
    hi = np.append(lo[1:], len(values))
    out = np.empty(n, dtype=np.intp)
    for first, start, stop in zip(cuts, lo, hi):
        last = min(first + _SEARCH_STRETCH, n)
        np.add(np.searchsorted(values[start:stop], queries[first:last]), start, out=out[first:last])
    return out


def key_index(table: pa.Table, *, sort: bool = True) -> dict:
    """The mixed id keys, the sorted span index and which spans name a parent,
    of a table that already has its key columns (for the read seam's parents,
    :mod:`nemo_telemetry.analysis.decode`).

    Independent of the other columns, so a caller can build it in a second thread while
    the read seam decodes the rest (numpy sorts
    without the GIL). Built a block of rows at a time straight from the Arrow key columns: the
    three key columns are never copied whole, and no temporary is larger than a block.
    ``sort=False`` leaves the span index unsorted, for :func:`sort_index` to finish while another
    thread uses the mixed keys.
    """
    names = ["span_key", "trace_key", "parent_key", *(["trace_low"] if "trace_low" in table.column_names else [])]
    keys = table.select(names)
    blocks = ([filled(column, 0).astype(np.uint64, copy=False) for column in batch.columns]
              for batch in keys.to_batches(max_chunksize=BLOCK_ROWS))
    has_parent = (valid_rows(table.column("parent_span_id"))
                  if "parent_span_id" in table.column_names else None)
    index = build_index(blocks, table.num_rows, has_parent)
    return sort_index(index) if sort else index


def sort_index(index: dict, *, threads: int = 1) -> dict:
    """Sort the span index of a ``key_index(..., sort=False)`` in place; the index, for chaining.

    With ``threads`` > 1, a large index is split at its median first (a linear partition in
    place), and the two halves sort in two threads (numpy sorts without the GIL).
    """
    packed = index["_sorted_spans"][1]
    if len(packed) < LOOKUP_ROWS or threads < 2:
        packed.sort()
        return index
    middle = len(packed) // 2
    packed.partition(middle)
    in_threads(np.ndarray.sort, [packed[:middle], packed[middle:]], threads)
    return index


def build_index(blocks, n: int, has_parent: np.ndarray | None) -> dict:
    """:func:`key_index` from (span, trace, parent[, trace_low]) key blocks in row order
    (without ``trace_low``, 0: the trace is its key); ``has_parent`` None: a span has a parent
    when its parent key is not 0. The index keeps each row's trace (key and low half) to confirm
    matches on."""
    own, wanted = np.empty(n, np.uint64), np.empty(n, np.uint64)
    traces, lows = np.empty(n, np.uint64), np.zeros(n, np.uint64)
    packed = np.empty(n, np.uint64)
    named = np.empty(n, dtype=bool) if has_parent is None else has_parent
    bits = max(1, (n - 1).bit_length())
    high = ~np.uint64((1 << bits) - 1)
    start = 0
    for span_key, trace_key, parent_key, *low in blocks:
        traces[start:start + len(span_key)] = trace_key
        if low:
            lows[start:start + len(span_key)] = low[0]
        for lo in range(0, len(span_key), BLOCK_ROWS):
            at = slice(start + lo, start + min(lo + BLOCK_ROWS, len(span_key)))
            block = slice(lo, lo + BLOCK_ROWS)
            _mix_into(span_key[block], trace_key[block], parent_key[block], own[at], wanted[at])
            if has_parent is None:
                np.not_equal(parent_key[block], 0, out=named[at])
            np.bitwise_and(own[at], high, out=packed[at])  # row number in the low bits
            packed[at] |= np.arange(at.start, at.stop, dtype=np.uint64)
        start += len(span_key)
    return {"_mixed": (own, wanted), "_sorted_spans": (own, packed, bits), "has_parent": named,
            "_traces": (traces, lows)}


def parent_rows(sorted_spans: tuple[np.ndarray, np.ndarray, int], wanted: np.ndarray, rows: np.ndarray,
                traces: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Parent row of each of ``rows`` (-1: not in the index), ``wanted`` their mixed parent
    references (rows that name a parent only): the lowest other row of the sorted span index whose
    identity is the reference's. The high bits propose; the mixed key and the trace (``traces``:
    every row's ``trace_key`` and ``trace_low``, as the index keeps them) confirm, which with the
    mixed key is the span id as well. Only equal high bits, duplicated ids or another identity
    of the same mixed key take a further round."""
    trace, low = traces
    own, packed, bits = sorted_spans
    out = np.full(len(rows), -1, dtype=np.int64)
    if len(packed) == 0:
        return out
    low_bits = np.uint64((1 << bits) - 1)
    if len(wanted) <= 1 << bits:
        # searched in sorted order (each search starts where the last one ended in the cache): the
        # references' high bits with their positions packed in the low bits, as the index holds rows
        ordered = (wanted & ~low_bits) | np.arange(len(wanted), dtype=np.uint64)
        ordered.sort()
        pos = np.empty(len(wanted), dtype=np.intp)
        pos[(ordered & low_bits).astype(np.intp)] = np.searchsorted(packed, ordered & ~low_bits)
    else:  # more references than the low bits number (rows asked more than once)
        pos = np.searchsorted(packed, wanted & ~low_bits)
    pending = np.arange(len(rows))
    while pending.size:
        at = pos[pending]
        pending, at = pending[at < len(packed)], at[at < len(packed)]
        found = packed[at]
        same_high = (found & ~low_bits) == (wanted[pending] & ~low_bits)
        pending, found = pending[same_high], found[same_high]
        row = (found & low_bits).astype(np.int64)
        child = rows[pending]
        hit = (own[row] == wanted[pending]) & (row != child) & (trace[row] == trace[child]) & (low[row] == low[child])
        out[pending[hit]] = row[hit]
        pending = pending[~hit]
        pos[pending] += 1
    return out


def local_parent_rows(span_key: np.ndarray, trace_key: np.ndarray, parent_key: np.ndarray,
                      trace_low: np.ndarray | None = None) -> np.ndarray:
    """Per span of one spans file, the row of its parent in that file (int32), else
    :data:`NO_PARENT` (a parent key of 0) or :data:`PARENT_ELSEWHERE`: the parent is the lowest
    other row whose span id and trace are the reference's (:func:`parent_rows`), as a lookup in
    the whole dataset finds it, since ingest writes each (trace, span id) once.

    Ingest writes it beside the keys (``parent_row``), so ``check`` joins only the references
    a file does not answer itself, instead of sorting and searching every span's.
    """
    n = len(span_key)
    out = np.full(n, NO_PARENT, dtype=np.int32)
    if n == 0:
        return out
    keys = (span_key, trace_key, parent_key, *(() if trace_low is None else (trace_low,)))
    index = sort_index(build_index([keys], n, None))
    rows = np.flatnonzero(index["has_parent"])
    found = parent_rows(index["_sorted_spans"], index["_mixed"][1][rows], rows, index["_traces"])
    out[rows] = np.where(found >= 0, found, PARENT_ELSEWHERE)
    return out


def index_parents(index: dict) -> np.ndarray:
    """:func:`distinct_parents` of a :func:`key_index` (sorted or not)."""
    own, wanted = index["_mixed"]
    return distinct_parents(index["has_parent"], wanted, own)


def index_orphans(index: dict, parents: np.ndarray | None = None, *, threads: int = 1) -> dict:
    """The orphan test over a sorted :func:`key_index` (for
    the read seam's parents, like the index);
    ``parents`` from :func:`index_parents`, when another thread has sorted them already.

    It needs nothing but the index: a caller runs it in other threads while the rest is decoded
    and analysed.
    """
    return {"orphan": orphan_mask(index["has_parent"], index["_mixed"], index["_sorted_spans"], parents,
                                  traces=index["_traces"], threads=threads)}
