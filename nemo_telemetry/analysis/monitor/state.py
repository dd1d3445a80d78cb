"""The monitor's state: goodput per step while spans arrive, in bounded memory.

Spans come in batches, in any order (a child usually ends, and so arrives, before its parent).
Each batch goes through the goodput rules (``rules``) once:

- *walks*: an unstamped bucketed span takes its nearest stamped ancestor's iteration. The walk is
  climbed over the recent spans (``context``: those that end within ``horizon_s`` of the newest
  end seen) plus the batch; a span whose walk stops at an ancestor that has not arrived yet is
  *pending* and waits (``horizon_s`` of the clock at most, and at most ``max_pending`` spans; then
  it counts as unstamped, as offline when the ancestor never comes);
- *partials*: the settled spans give one partial each batch, merged per (run, iteration);
- *steps*: a step whose window ended ``grace_s`` ago is reported; a later partial of the same step
  (a checkpoint finalize, a slow worker's flush) reports it again, ``revised``;
- *folding*: past ``keep_steps`` reported steps per run the oldest are folded into the run's totals
  and leave the state; a span of a folded step that still arrives is counted, not applied. Rows of
  iterations with no step span (validation at iteration 0, a run whose step group is off) are
  kept for the newest ``keep_steps`` such iterations only, and counted when dropped.

Every span is in exactly one partial, so once every step is reported (:meth:`MonitorState.finish`)
the per-step figures equal offline ``goodput`` on the same spans (while no step was folded away
before its last span came).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.goodput.steps import BUCKETS
from nemo_telemetry.analysis.model.columns import valid_rows
from nemo_telemetry.analysis.model.schema import BUCKET
from nemo_telemetry.analysis.monitor import rules
from nemo_telemetry.errors import MonitorError

__all__ = ["StepRecord", "RunStatus", "MonitorState", "SUM_FIELDS"]

SUM_FIELDS = ("wall_s", *(f"{b}_s" for b in BUCKETS), "covered_s", "unattributed_s", "double_counted_s")
_NS = 1_000_000_000


@dataclass(frozen=True)
class StepRecord:
    """One finished step as ``monitor --format json`` prints it: the fields of a step of
    ``goodput --format json`` with ``run_id``, and ``revised`` when it was reported before."""

    run_id: str | None
    iteration: int
    figures: dict[str, Any]
    revised: bool = False

    def to_dict(self) -> dict[str, Any]:
        out = {"run_id": self.run_id, "iteration": self.iteration, **self.figures}
        if self.revised:
            out["revised"] = True
        return out


@dataclass(frozen=True)
class RunStatus:
    """A run so far: its reported steps' totals and the goodput of its last ``rolling_steps``."""

    run_id: str | None
    steps: int
    total: dict[str, Any]  # SUM_FIELDS summed, and goodput = productive_s / wall_s
    rolling_goodput: float | None
    rolling_steps: int  # how many steps rolling_goodput covers
    last_iteration: int | None


@dataclass
class _Run:
    folded: dict = field(default_factory=lambda: dict.fromkeys(SUM_FIELDS, 0.0))
    folded_steps: int = 0
    folded_below: int | None = None  # iterations <= this are folded
    reported: dict = field(default_factory=dict)  # iteration -> figures (retained steps)


def _check_seconds(name: str, value: float) -> float:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise MonitorError(f"{name}={value!r}: give a finite number of seconds >= 0")
    return float(value)


class MonitorState:
    """Goodput per step of the spans added so far; see the module docstring for the rules."""

    def __init__(self, *, grace_s: float = 5.0, horizon_s: float = 600.0, keep_steps: int = 256,
                 rolling_steps: int = 10, max_pending: int = 100_000) -> None:
        self.grace_ns = int(_check_seconds("grace_s", grace_s) * _NS)
        self.horizon_ns = int(_check_seconds("horizon_s", horizon_s) * _NS)
        if rolling_steps < 1 or keep_steps < rolling_steps:
            raise MonitorError(f"rolling_steps={rolling_steps}, keep_steps={keep_steps}: keep at least "
                               "1 rolling step and at least as many kept steps as rolling ones")
        self.keep_steps, self.rolling_steps, self.max_pending = int(keep_steps), int(rolling_steps), int(max_pending)
        empty = rules.goodput_columns(pa.table({"trace_id": pa.array([], pa.string()),
                                                "span_id": pa.array([], pa.string()),
                                                "parent_span_id": pa.array([], pa.string())}))
        self._context = empty  # recent spans with rl.bucket cleared: ancestors only
        self._pending = empty  # bucketed spans whose walk waits for an ancestor
        self._pending_since = np.zeros(0)  # when each pending span arrived (time.monotonic)
        self._merged = rules.Merged()
        self._touched: set[tuple] = set()  # (run, iteration) given a partial since the last report
        self._runs: dict[str | None, _Run] = {}
        self._order: list[str | None] = []  # runs by first appearance
        self._newest_end = np.iinfo(np.int64).min
        self.spans = 0
        self.late_spans = 0  # spans of steps already folded away: counted, not applied
        self.released_unresolved = 0  # pending spans that waited past the horizon
        self.outside_spans_dropped = 0  # spans of iterations without a step span, past keep_steps of them
        # (run, iteration) -> the first span that failed it (name, span_id, message, start, spans), kept steps only
        self.failed_spans: dict[tuple, dict[str, Any]] = {}

    # -- input ---------------------------------------------------------------------------------

    def add(self, spans: pa.Table) -> None:
        """Take a batch of spans (the spans table's columns; each span once)."""
        batch = rules.goodput_columns(spans)
        if batch.num_rows == 0:
            return
        self.spans += batch.num_rows
        self._newest_end = max(self._newest_end, int(pc.max(batch.column("end_ns")).as_py()))
        for run in pc.unique(batch.column("run_id")).to_pylist():
            if run not in self._runs:
                self._runs[run] = _Run()
                if run is not None:
                    self._order.append(run)
        now = time.monotonic()
        candidates = pa.concat_tables([self._pending, batch])
        since = np.concatenate([self._pending_since, np.full(batch.num_rows, now)])
        found = rules.walks(pa.concat_tables([self._context, candidates]))
        waiting = found.is_waiting(candidates)
        expired = waiting & (now - since >= self.horizon_ns / _NS)  # waited horizon_s: its ancestor is not coming
        self.released_unresolved += int(expired.sum())
        waiting &= ~expired
        self._pending, self._pending_since = candidates.filter(pa.array(waiting)), since[waiting]
        self._settle(candidates.filter(pa.array(~waiting)), found)
        if self._pending.num_rows > self.max_pending:
            self._release(np.argsort(self._pending_since, kind="stable")[: self._pending.num_rows - self.max_pending],
                          found)
        ancestors = batch.set_column(batch.schema.get_field_index(BUCKET), BUCKET, pa.nulls(batch.num_rows, pa.string()))
        self._context = pa.concat_tables([self._context, ancestors]).combine_chunks()
        self._context = self._context.filter(pa.array(~self._expired(self._context)))

    def _expired(self, table: pa.Table) -> np.ndarray:
        return table.column("end_ns").to_numpy() < self._newest_end - self.horizon_ns

    def _release(self, rows: np.ndarray, found: rules.Walks) -> None:
        keep = np.ones(self._pending.num_rows, bool)
        keep[rows] = False
        self.released_unresolved += int(len(rows))
        released = self._pending.filter(pa.array(~keep))
        self._pending, self._pending_since = self._pending.filter(pa.array(keep)), self._pending_since[keep]
        self._settle(released, found)

    def _settle(self, spans: pa.Table, found: rules.Walks) -> None:
        """One partial of ``spans`` (walks settled) into the merged state; folded steps' rows counted."""
        if spans.num_rows == 0:
            return
        part = rules.partial(spans, found)
        self._note_failed(rules.failed(spans, found))
        late = np.zeros(part.num_rows, bool)
        for run, state in self._runs.items():
            if state.folded_below is not None:
                same = pc.is_null(part["run"]) if run is None else pc.equal(part["run"], run)
                older = pc.less_equal(part["iteration"], state.folded_below)
                late |= pc.fill_null(pc.and_(same, older), False).to_numpy(zero_copy_only=False)
        if late.any():
            dropped = part.filter(pa.array(late))
            sums = pc.equal(dropped["kind"], rules.SUM)
            self.late_spans += int(pc.sum(pc.if_else(sums, dropped["count"], 0)).as_py() or 0)
            part = part.filter(pa.array(~late))
        stamped = part.filter(pc.and_(pc.is_valid(part["iteration"]), pc.not_equal(part["kind"], rules.JOB)))
        self._touched.update(zip(stamped["run"].to_pylist(), stamped["iteration"].to_pylist()))
        self._merged.add(part)

    def _note_failed(self, detail) -> None:
        """Keep, per failed step, its earliest failing span (a later batch may hold an earlier one)."""
        if detail is None:
            return
        for i in range(len(detail["run"])):  # one row per failed step of the batch
            key = (detail["run"][i], int(detail["iteration"][i]))
            row = {k: detail[k][i] for k in ("name", "span_id", "message", "start", "spans")}
            before = self.failed_spans.get(key)
            if before is not None:
                row["spans"] = int(row["spans"]) + int(before["spans"])
                if before["start"] <= row["start"]:
                    row = {**before, "spans": row["spans"]}
            self.failed_spans[key] = row

    # -- output --------------------------------------------------------------------------------

    def finished_steps(self, now_ns: int | None = None) -> list[StepRecord]:
        """Steps whose window ended ``grace_s`` before ``now_ns`` (default: the clock) and that were
        not reported, or changed since, by run and iteration."""
        now_ns = time.time_ns() if now_ns is None else now_ns
        frame = self._merged.frame()
        kind, run_of, stamped, iteration = _merged_columns(frame)
        closed = np.flatnonzero((kind == rules.STEP) & (frame["b"].to_numpy() <= now_ns - self.grace_ns))
        keys = [(run_of[i], int(iteration[i])) for i in closed]
        due = [(run, it) for run, it in keys if it not in self._runs[run].reported or (run, it) in self._touched]
        self._touched.clear()
        if not due:
            self._fold(frame)
            return []
        wanted = set(due)
        member = np.fromiter(((r, int(i)) in wanted for r, i in zip(run_of, iteration)), bool, len(run_of))
        rows = frame.filter(pa.array(member & stamped & (kind != rules.JOB)))
        out = []
        for document in rules.step_documents(rows, self._order):
            run, iteration = document.pop("run_id"), int(document.pop("iteration"))
            state = self._runs[run]
            before = state.reported.get(iteration)
            if before == document:
                continue
            state.reported[iteration] = document
            out.append(StepRecord(run, iteration, document, revised=before is not None))
        self._fold(frame)
        return sorted(out, key=lambda r: (self._order.index(r.run_id) if r.run_id in self._order else len(self._order),
                                          r.iteration))

    def finish(self) -> list[StepRecord]:
        """Release every pending span (now unstamped where no ancestor came) and report every step."""
        if self._pending.num_rows:
            found = rules.walks(pa.concat_tables([self._context, self._pending]))
            counted = self.released_unresolved  # released at the end: not "waited past the horizon"
            self._release(np.arange(self._pending.num_rows), found)
            self.released_unresolved = counted
        return self.finished_steps(np.iinfo(np.int64).max // 2)

    def _fold(self, frame: pa.Table) -> None:
        """Fold the oldest reported steps of each run past ``keep_steps`` into its totals, and drop
        the rows of iterations that have no step span (no step to report them in) past the newest
        ``keep_steps`` of them; ``frame`` is the merged state (``PARTIAL_SCHEMA``)."""
        kind, run_of, stamped, iteration = _merged_columns(frame)
        stamped &= kind != rules.JOB
        iteration = np.where(stamped, iteration, 0)
        count = frame["count"].to_numpy()
        gone = np.zeros(frame.num_rows, bool)
        for run, state in self._runs.items():
            mine = stamped & np.array([r == run for r in run_of], bool)
            extra = len(state.reported) - self.keep_steps
            for old in sorted(state.reported)[:max(extra, 0)]:
                figures = state.reported.pop(old)
                for key in SUM_FIELDS:
                    state.folded[key] += figures[key]
                state.folded_steps += 1
                state.folded_below = old if state.folded_below is None else max(state.folded_below, old)
            if state.folded_below is not None:
                gone |= mine & (iteration <= state.folded_below)
                for key in [k for k in self.failed_spans if k[0] == run and k[1] <= state.folded_below]:
                    del self.failed_spans[key]
            with_step = set(iteration[mine & (kind == rules.STEP)].tolist())
            stepless = sorted(set(iteration[mine & ~gone].tolist()) - with_step)
            if len(stepless) > self.keep_steps:
                dropped = np.isin(iteration, stepless[:-self.keep_steps]) & mine
                self.outside_spans_dropped += int(count[dropped & (kind == rules.SUM)].sum())
                gone |= dropped
        if gone.any():
            self._merged.replace(frame.filter(pa.array(~gone)))

    def runs(self) -> tuple[RunStatus, ...]:
        """Every run seen, in order of appearance (spans with no run id last)."""
        out = []
        for run in [*self._order, *([None] if None in self._runs else [])]:
            state = self._runs[run]
            kept = [state.reported[i] for i in sorted(state.reported)]
            total = {key: state.folded[key] + sum(f[key] for f in kept) for key in SUM_FIELDS}
            total["goodput"] = total["productive_s"] / total["wall_s"] if total["wall_s"] > 0 else None
            window = kept[-self.rolling_steps:]
            wall = sum(f["wall_s"] for f in window)
            rolling = sum(f["productive_s"] for f in window) / wall if wall > 0 else None
            last = max(state.reported) if state.reported else state.folded_below
            out.append(RunStatus(run, state.folded_steps + len(kept), total, rolling, len(window), last))
        return tuple(out)

    def recent_steps(self, run_id: str | None, count: int) -> list[StepRecord]:
        """The last ``count`` reported steps of ``run_id``, oldest first."""
        reported = self._runs[run_id].reported if run_id in self._runs else {}
        return [StepRecord(run_id, i, reported[i]) for i in sorted(reported)[-count:]]

    def size(self) -> dict[str, int]:
        """Rows held, by part: the bound the benchmark measures."""
        return {"context_rows": self._context.num_rows, "pending_rows": self._pending.num_rows,
                "merged_rows": self._merged.frame().num_rows,
                "reported_steps": sum(len(s.reported) for s in self._runs.values())}


def _merged_columns(frame: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(kind, run names, stamped, iteration: -1 where not stamped) of merged partial rows."""
    iteration = frame["iteration"]
    return (frame["kind"].to_numpy(), np.array(frame["run"].to_pylist(), dtype=object),
            valid_rows(iteration), pc.fill_null(iteration, -1).to_numpy())
