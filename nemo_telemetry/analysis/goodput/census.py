"""What a spans source holds, before any rule reads it: spans, spans with an ``rl.*`` attribute and
step spans, per run.

``goodput`` and ``check`` answer about an instrumented RL run. On data that is not one (an empty
dataset, an HTTP service's traces, a run whose ``step`` group was off) an empty breakdown with no
finding would read as "consistent"; the census lets them say what they found instead. It is one
rule in the partial -> merge -> finish shape: :func:`census_partial` of a batch (counts per run),
:func:`merge_census` of any number of them (sums per run), finished as a :class:`SpanCensus`,
whose :meth:`~SpanCensus.notes` word each case once for every caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import numpy as np
import pyarrow as pa

from nemo_telemetry.analysis.decode import NO_BUCKET, SpanArrays, span_arrays
from nemo_telemetry.analysis.goodput.rules import STEP_SPAN_REGEX
from nemo_telemetry.analysis.model.columns import valid_rows
from nemo_telemetry.analysis.model.grouping import Columns, concat
from nemo_telemetry.analysis.model.schema import BUCKET, EFFICIENCY_CATEGORY, ITERATION, NO_RUN, SPAN_GROUP
from nemo_telemetry.analysis.settings.machine import ReadSettings
from nemo_telemetry.analysis.store.read import reading_errors, scan_span_files, span_source_files
from nemo_telemetry.errors import UnknownRunError

__all__ = ["RL_ATTRIBUTES", "CENSUS_CODES", "NOT_A_RUN_CODES", "RunCensus", "SpanCensus", "census_partial",
           "merge_census", "census_of_arrays", "CENSUS_COLUMNS", "span_census"]

RL_ATTRIBUTES = (BUCKET, ITERATION, EFFICIENCY_CATEGORY, SPAN_GROUP)
"""The ``rl.*`` span attributes the analysis reads: a span with none of them is not an RL span to it."""

CENSUS_CODES = ("no-spans", "no-rl-attributes", "no-step-spans")
"""What the census can find wrong with a source, worst first (finding codes of ``check``)."""
NOT_A_RUN_CODES = CENSUS_CODES[:2]
"""The census codes of a source without a single RL span: no step or bucket rule can fire beside them."""

_EMPTY: Columns = {"run": np.zeros(0, object), "spans": np.zeros(0, np.int64), "rl_spans": np.zeros(0, np.int64),
                   "step_spans": np.zeros(0, np.int64)}


@dataclass(frozen=True)
class RunCensus:
    """One run's counts (``run_id`` None: spans without ``nemo.run.id``)."""

    run_id: str | None
    spans: int
    rl_spans: int  # spans carrying at least one of RL_ATTRIBUTES
    step_spans: int  # spans named rl.<algo>.step

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "spans": self.spans, "rl_spans": self.rl_spans, "step_spans": self.step_spans}


@dataclass(frozen=True)
class SpanCensus:
    """What a source (or the selected run of it) holds, per run: the census's finished form."""

    runs: tuple[RunCensus, ...]  # runs in the order of their names, spans without a run id first

    @property
    def spans(self) -> int:
        return sum(r.spans for r in self.runs)

    @property
    def rl_spans(self) -> int:
        return sum(r.rl_spans for r in self.runs)

    @property
    def step_spans(self) -> int:
        return sum(r.step_spans for r in self.runs)

    @property
    def found(self) -> str:
        """``no-spans``, ``no-rl-attributes``, ``no-step-spans`` (no run has a step span), or
        ``steps`` (some run has; :meth:`runs_without_steps` names those that have none)."""
        if self.spans == 0:
            return "no-spans"
        if self.rl_spans == 0:
            return "no-rl-attributes"
        return "steps" if self.step_spans else "no-step-spans"

    def runs_without_steps(self) -> tuple[RunCensus, ...]:
        """Runs with RL spans and no step span: per-step goodput has nothing to divide them by."""
        return tuple(r for r in self.runs if r.rl_spans and not r.step_spans)

    def notes(self) -> list[tuple[str, str | None, str]]:
        """(code of :data:`CENSUS_CODES`, run id, one sentence saying what was found and what to do),
        worst first; empty for a source whose every run with RL spans has step spans."""
        found = self.found
        if found == "no-spans":
            return [("no-spans", None, "the source holds no spans, so there is nothing to check or sum: ingest "
                     "every process's dump files (nemo-telemetry ingest DUMPS... --out DATASET), and flush the "
                     "processes (flush_telemetry) before they exit")]
        if found == "no-rl-attributes":
            return [("no-rl-attributes", None, (
                f"{self.spans:,} span(s), none carrying an rl.* attribute ({', '.join(RL_ATTRIBUTES)}): these are "
                "not the spans of an instrumented RL run, so there are no steps or buckets to sum or check; "
                "instrument the run with nemo_telemetry (span_groups: per_step) to measure its goodput"))]
        return [("no-step-spans", r.run_id, (
            f"{_run_words(r.run_id)}: {r.rl_spans:,} of its {r.spans:,} span(s) carry rl.* attributes but none is a "
            "step span (rl.<algo>.step), so there are no steps to divide its time by and no step to check: enable "
            "the step group (span_groups: per_step, or add step to the spec)"))
            for r in self.runs_without_steps()]

    def to_dict(self) -> dict[str, Any]:
        return {"spans": self.spans, "rl_spans": self.rl_spans, "step_spans": self.step_spans, "found": self.found,
                "runs": [r.to_dict() for r in self.runs],
                "notes": [{"code": code, "run_id": run, "message": message} for code, run, message in self.notes()]}


def _run_words(run_id: str | None) -> str:
    return f"run {run_id}" if run_id is not None else "the spans without a run id (nemo.run.id)"


def census_partial(arrays: SpanArrays, keep: np.ndarray) -> Columns:
    """The batch's counts per run over its ``keep`` rows: ``run`` (names, None for no run id),
    ``spans``, ``rl_spans``, ``step_spans``."""
    step = arrays.rows_of_names(STEP_SPAN_REGEX)
    grouped = arrays.table.column(SPAN_GROUP) if SPAN_GROUP in arrays.table.column_names else None
    if grouped is not None and grouped.null_count == 0:  # every span opened in a span group: each is one
        spans, step_spans = _counts_per_run(arrays.run, len(arrays.runs), keep, step)
        rl_spans = spans
    else:
        rl = (arrays.bucket != NO_BUCKET) | arrays.has_iteration | (arrays.category >= 0) | step
        if grouped is not None:
            rl |= valid_rows(grouped)
        spans, rl_spans, step_spans = _counts_per_run(arrays.run, len(arrays.runs), keep, rl, step)
    present = np.flatnonzero(spans)
    names = np.array([None, *arrays.runs], dtype=object)
    return {"run": names[present], "spans": spans[present].astype(np.int64),
            "rl_spans": rl_spans[present].astype(np.int64), "step_spans": step_spans[present].astype(np.int64)}


_FEW_RUNS = 8  # up to this many run codes, a comparison per code costs less than one count of every row


def _counts_per_run(run: np.ndarray, runs: int, keep: np.ndarray, *masks: np.ndarray) -> list[np.ndarray]:
    """Per run code (slot 0: no run id, then the runs), how many ``keep`` rows it has, and how
    many of them each mask of ``masks`` holds. A few runs: a comparison and a count per run, on
    the codes as they are; many: one count of (run, masks) slots, which first widens every code."""
    everything = bool(keep.all())
    if runs + 1 <= _FEW_RUNS:
        out = [np.zeros(runs + 1, np.int64) for _ in range(len(masks) + 1)]
        for code in range(-1, runs):
            rows = run == code
            if not everything:
                rows &= keep
            out[0][code + 1] = np.count_nonzero(rows)
            for counts, mask in zip(out[1:], masks):
                counts[code + 1] = np.count_nonzero(rows & mask) if out[0][code + 1] else 0
        return out
    bins = runs + 2  # the last: rows not kept
    slot = run.astype(np.int64) + 1
    if not everything:
        slot = np.where(keep, slot, bins - 1)
    width = 1 << len(masks)
    slot *= width
    for bit, mask in enumerate(masks):
        slot += mask.astype(np.int64) << bit
    slots = np.bincount(slot, minlength=width * bins).reshape(bins, width)[:-1]
    held = np.arange(width)
    return [slots.sum(axis=1), *(slots[:, (held >> bit) & 1 == 1].sum(axis=1) for bit in range(len(masks)))]


def merge_census(parts: Iterable[Columns]) -> SpanCensus:
    """The census of every batch's :func:`census_partial` (a run's counts summed over its batches)."""
    rows = concat(list(parts), _EMPTY)
    totals: dict[str | None, np.ndarray] = {}
    for i, run in enumerate(rows["run"]):  # a row per run and batch: few
        run = None if run == NO_RUN else run
        counts = np.array([rows["spans"][i], rows["rl_spans"][i], rows["step_spans"][i]], np.int64)
        totals[run] = totals.get(run, 0) + counts
    order = sorted(totals, key=lambda r: (r is not None, r or ""))
    return SpanCensus(tuple(RunCensus(r, *(int(v) for v in totals[r])) for r in order))


def census_of_arrays(arrays: SpanArrays, keep: np.ndarray) -> SpanCensus:
    """The census of one batch that is the whole source."""
    return merge_census([census_partial(arrays, keep)])


CENSUS_COLUMNS = ("name", "run_id", *RL_ATTRIBUTES, "trace_key", "span_key", "parent_key")  # the decode wants keys
"""What :func:`span_census` reads of a source."""


def span_census(source, *, run_id: str | None = None, settings: ReadSettings | None = None) -> SpanCensus:
    """The census of a dataset or dump files (of run ``run_id`` alone, when given), read batch by
    batch: what ``goodput`` says when it has no step to report, where ``check`` finds it on its own
    read (:attr:`CheckReport.census`)."""
    root, files = span_source_files(source)
    parts, runs = [], set()
    with reading_errors(root):
        for batch in _batches(source, files, settings):
            arrays = span_arrays(batch)
            runs.update(arrays.runs)
            keep = np.ones(len(arrays), bool) if run_id is None else arrays.run == (
                arrays.runs.index(run_id) if run_id in arrays.runs else -2)
            parts.append(census_partial(arrays, keep))
    UnknownRunError.unless_present(run_id, tuple(sorted(runs)))
    return merge_census(parts)


def _batches(source, files: list[str], settings: ReadSettings | None) -> Iterator[pa.Table]:
    """:data:`CENSUS_COLUMNS` of a dataset's files batch by batch, or of dump files whole."""
    if not files:
        from nemo_telemetry.analysis.ingestion.read import read_for_analysis

        yield read_for_analysis(source, columns=CENSUS_COLUMNS)
        return
    settings = settings or ReadSettings.from_machine()
    for batch in scan_span_files(files, columns=CENSUS_COLUMNS, batch_rows=settings.batch_rows,
                                 threads=settings.threads):
        yield pa.Table.from_batches([batch])
