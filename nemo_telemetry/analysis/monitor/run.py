"""``run_monitor``: spans in (a followed dump directory, or the OTLP/HTTP receiver), steps and metrics out.

The loop polls its source every ``poll_s``: the new spans go into :class:`MonitorState`, the steps
it reports go to ``on_step``, rolling goodput is checked against ``alert_below``, and the metrics
are refreshed. It ends on ``stop``, SIGINT/SIGTERM, ``until_idle_s`` without a new span, or the
first alert with ``exit_on_alert``; then every step still open is reported.

As a receiver the monitor is ``collect``'s server (same durability: 200 only once committed),
writing the dataset at ``out`` (a temporary one, removed at the end, when ``out`` is None); the
state sees each span once it is committed. Restarted with the same ``out``, it first reads what
that dataset holds, so its figures cover the whole run.
"""

from __future__ import annotations

import queue
import shutil
import signal
import tempfile
import threading
import time
import warnings
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pyarrow as pa

from nemo_telemetry.analysis.settings.choices import DEFAULT_MAX_REQUEST_BYTES
from nemo_telemetry.analysis.findings.checks import BATCH_FINDING_CODES, check_batch
from nemo_telemetry.analysis.findings.report import FINDING_CODES, Finding
from nemo_telemetry.analysis.ingestion.collect import CollectorServer, CollectSummary
from nemo_telemetry.analysis.ingestion.follow import DumpFollower, FollowCounts
from nemo_telemetry.analysis.ingestion.ingest import read_spans
from nemo_telemetry.analysis.monitor.export import OtlpMetricsPush, PrometheusEndpoint, metrics_snapshot
from nemo_telemetry.analysis.monitor.state import MonitorState, RunStatus, StepRecord
from nemo_telemetry.errors import IncompleteDatasetWarning, MonitorError

__all__ = ["Alert", "MonitorView", "MonitorSummary", "LOCAL_FINDING_CODES", "run_monitor"]

# The findings a batch of spans shows on its own; the rest need the whole run: `check` the dataset.
LOCAL_FINDING_CODES = BATCH_FINDING_CODES
_NEWEST_FINDINGS = 5


@dataclass(frozen=True)
class Alert:
    """Rolling goodput of a run fell below the threshold."""

    run_id: str | None
    goodput: float
    threshold: float
    steps: int
    last_iteration: int | None

    @property
    def message(self) -> str:
        return (f"ALERT: run {self.run_id or '(no run id)'}: goodput over the last {self.steps} steps is "
                f"{self.goodput:.3f}, below {self.threshold:g} (up to iteration {self.last_iteration})")


@dataclass(frozen=True)
class MonitorView:
    """What the live view shows: the runs, each run's last steps, the newest findings, the rate."""

    runs: tuple[RunStatus, ...]
    recent: dict  # run_id -> list of StepRecord, oldest first
    findings: tuple  # newest Finding objects
    findings_by_code: dict
    spans: int
    spans_per_s: float
    pending_spans: int


@dataclass(frozen=True)
class MonitorSummary:
    """How a monitor ended: runs' totals, counts, alerts, and what the source read or rejected."""

    runs: tuple[RunStatus, ...]
    spans: int
    steps_reported: int
    revisions: int
    late_spans: int
    alerts: tuple[Alert, ...]
    findings_by_code: dict
    follow: FollowCounts | None = None
    receiver: CollectSummary | None = None
    resumed_spans: int = 0  # read back from --out at the start


@dataclass
class _Loop:
    state: MonitorState
    alert_below: float | None
    on_step: Callable[[StepRecord], None] | None
    on_alert: Callable[[Alert], None] | None
    exports: list
    metric_steps: int
    findings_by_code: dict = field(default_factory=dict)
    newest: deque = field(default_factory=lambda: deque(maxlen=_NEWEST_FINDINGS))
    alerting: set = field(default_factory=set)
    alerts: list = field(default_factory=list)
    reported: int = 0
    revisions: int = 0
    rate: deque = field(default_factory=lambda: deque(maxlen=20))  # (time, spans so far)
    failed: set = field(default_factory=set)  # (run, iteration) of the steps a failed-step finding was given for

    def add(self, spans: pa.Table) -> None:
        self.state.add(spans)
        report = check_batch(spans, max_findings_per_code=_NEWEST_FINDINGS)
        for code in LOCAL_FINDING_CODES:
            n = report.counts["by_code"].get(code, 0)
            if n:
                self.findings_by_code[code] = self.findings_by_code.get(code, 0) + n
        self.newest.extend(f for f in report.findings if f.code in LOCAL_FINDING_CODES)

    def emit(self, records: list[StepRecord]) -> None:
        for record in records:
            self.reported += not record.revised
            self.revisions += record.revised
            if self.on_step is not None:
                self.on_step(record)
            self._failed_step(record)
        if records:
            self._check_alerts()
        snapshot = metrics_snapshot(self.state, self.findings_by_code, metric_steps=self.metric_steps)
        for export in self.exports:
            export.update(snapshot)

    def _failed_step(self, record: StepRecord) -> None:
        """``failed-step`` once per step reported failed, worded as ``check`` words it where the
        monitor kept the span (the trace id is the dataset's to give: ``check`` it)."""
        key = (record.run_id, record.iteration)
        if not record.figures.get("failed") or key in self.failed:
            return
        self.failed.add(key)
        self.findings_by_code["failed-step"] = self.findings_by_code.get("failed-step", 0) + 1
        span = self.state.failed_spans.get(key)
        if span is None:
            what, span_ids = "a span of it ended in error status", ()
        else:
            said = f": {span['message']!r}" if span["message"] else " (no status message)"
            what, span_ids = f"span {span['name']!r} (span {span['span_id']}) ended in error status{said}", (
                span["span_id"],)
        self.newest.append(Finding(
            code="failed-step", severity=FINDING_CODES["failed-step"], iteration=record.iteration,
            message=(f"step {record.iteration} failed: {what}; its bucketed time is counted as wasted_s, kept in "
                     "failed_buckets: fix what raised (`check` the dataset for the span's trace)"),
            trace_id=None, span_ids=span_ids, run_id=record.run_id))

    def _check_alerts(self) -> None:
        if self.alert_below is None:
            return
        for run in self.state.runs():
            low = (run.rolling_goodput is not None and run.rolling_steps >= self.state.rolling_steps
                   and run.rolling_goodput < self.alert_below)
            if low and run.run_id not in self.alerting:
                alert = Alert(run.run_id, run.rolling_goodput, self.alert_below, run.rolling_steps, run.last_iteration)
                self.alerts.append(alert)
                if self.on_alert is not None:
                    self.on_alert(alert)
            (self.alerting.add if low else self.alerting.discard)(run.run_id)

    def view(self) -> MonitorView:
        now = time.monotonic()
        self.rate.append((now, self.state.spans))
        (t0, n0), (t1, n1) = self.rate[0], self.rate[-1]
        runs = self.state.runs()
        return MonitorView(runs, {r.run_id: self.state.recent_steps(r.run_id, 10) for r in runs}, tuple(self.newest),
                           dict(self.findings_by_code), self.state.spans, (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0,
                           self.state.size()["pending_rows"])


def run_monitor(
    *,
    follow: str | Path | None = None,
    port: int | None = None,
    out: str | Path | None = None,
    host: str = "127.0.0.1",
    token: str | None = None,
    tls_cert: str | Path | None = None,
    tls_key: str | Path | None = None,
    insecure: bool = False,
    until_idle_s: float | None = None,
    grace_s: float = 5.0,
    poll_s: float = 0.5,
    rolling_steps: int = 10,
    keep_steps: int = 256,
    horizon_s: float = 600.0,
    alert_below: float | None = None,
    exit_on_alert: bool = False,
    metrics_port: int | None = None,
    otlp_metrics: bool = False,
    otlp_interval_s: float = 10.0,
    metric_steps: int = 10,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    on_step: Callable[[StepRecord], None] | None = None,
    on_alert: Callable[[Alert], None] | None = None,
    on_view: Callable[[MonitorView], None] | None = None,
    on_ready: Callable[[dict], None] | None = None,
    stop: threading.Event | None = None,
) -> MonitorSummary:
    """Monitor a run from ``follow`` (a dump directory) or as a receiver on ``port``, until it ends.

    ``on_ready`` gets ``{"traces_url", "metrics_url"}`` once listening (None where not serving), and
    as a receiver ``"unguarded"``: whether it listens beyond loopback without a token.
    ``max_request_bytes`` bounds one request as ``collect`` does, and one line, record or document
    of a followed file, once decompressed (a longer one is rejected and named).
    ``token``, ``tls_cert`` / ``tls_key`` and ``insecure`` guard the receiver as
    :class:`~nemo_telemetry.analysis.ingestion.collect.CollectorServer` says.
    """
    _check_options(follow, port, out, until_idle_s, poll_s, alert_below)
    if port is None and (token is not None or tls_cert is not None or tls_key is not None or insecure):
        raise MonitorError("--token-file, --tls-cert / --tls-key and --insecure guard the receiver: use them with --port")
    stop = stop or threading.Event()
    state = MonitorState(grace_s=grace_s, horizon_s=horizon_s, keep_steps=keep_steps, rolling_steps=rolling_steps)
    exports: list = []
    loop = _Loop(state, alert_below, on_step, on_alert, exports, metric_steps)
    previous = _on_signals(stop)
    try:
        if metrics_port is not None:
            exports.append(PrometheusEndpoint(host=host, port=metrics_port))
        if otlp_metrics:
            exports.append(OtlpMetricsPush(interval_s=otlp_interval_s))
        guard = dict(token=token, tls_cert=tls_cert, tls_key=tls_key, insecure=insecure)
        return _serve(loop, follow=follow, port=port, out=out, host=host, until_idle_s=until_idle_s, poll_s=poll_s,
                      exit_on_alert=exit_on_alert, on_view=on_view, on_ready=on_ready, stop=stop,
                      max_request_bytes=max_request_bytes, guard=guard)
    finally:
        for export in exports:
            export.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _check_options(follow, port, out, until_idle_s, poll_s, alert_below) -> None:
    if (follow is None) == (port is None):
        raise MonitorError("give exactly one source: --follow DUMP_DIR (dumps the run writes) or --port P "
                           "(an OTLP/HTTP receiver)")
    if out is not None and port is None:
        raise MonitorError("--out writes the dataset the receiver takes in: use it with --port; a followed "
                           "directory is ingested with `nemo-telemetry ingest DUMP_DIR --out DATASET`")
    if until_idle_s is not None and not until_idle_s > 0:
        raise MonitorError(f"--until-idle {until_idle_s!r}: give a number of seconds > 0")
    if not poll_s > 0:
        raise MonitorError(f"poll_s={poll_s!r}: give a number of seconds > 0")
    if alert_below is not None and not 0 <= alert_below <= 1:
        raise MonitorError(f"--alert-below {alert_below!r}: give a goodput between 0 and 1")


def _on_signals(stop: threading.Event) -> dict:
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    return previous


def _serve(loop: _Loop, *, follow, port, out, host, until_idle_s, poll_s, exit_on_alert, on_view, on_ready,
           stop, max_request_bytes, guard: dict) -> MonitorSummary:
    metrics_url = next((e.url for e in loop.exports if isinstance(e, PrometheusEndpoint)), None)
    if follow is not None:
        follower = DumpFollower(Path(follow), max_record_bytes=max_request_bytes)
        if on_ready is not None:
            on_ready({"traces_url": None, "metrics_url": metrics_url})
        _poll_until_done(loop, follower.poll, until_idle_s, poll_s, exit_on_alert, on_view, stop,
                         behind=lambda: follower.behind)
        last = follower.close()
        if last is not None:
            loop.add(last)
        loop.emit(loop.state.finish())
        return _summary(loop, follow=follower.counts())
    temporary = None if out is not None else Path(tempfile.mkdtemp(prefix="nemo-telemetry-monitor-"))
    root = Path(out) if out is not None else temporary / "dataset"
    try:
        resumed = _resume(loop, root)
        arrived: queue.SimpleQueue = queue.SimpleQueue()
        with CollectorServer(root, host=host, port=port, on_commit=arrived.put,
                             max_request_bytes=max_request_bytes, **guard) as server:
            if on_ready is not None:
                on_ready({"traces_url": server.traces_url, "metrics_url": metrics_url, "unguarded": server.unguarded})
            _poll_until_done(loop, lambda: _drain(arrived), until_idle_s, poll_s, exit_on_alert, on_view, stop)
        receiver = server.summary()
        last = _drain(arrived)  # committed while stopping
        if last is not None:
            loop.add(last)
        loop.emit(loop.state.finish())
        return _summary(loop, receiver=receiver, resumed=resumed)
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)


def _resume(loop: _Loop, root: Path) -> int:
    """Feed the spans a previous monitor (or collect) committed to ``root``; how many."""
    if not (root / "spans").is_dir():
        return 0
    with warnings.catch_warnings():  # a killed monitor's session: this receiver's clean close finishes it
        warnings.simplefilter("ignore", IncompleteDatasetWarning)
        spans = read_spans(root)
    if spans.num_rows:
        loop.add(spans)
        loop.emit(loop.state.finished_steps())
    return spans.num_rows


def _drain(arrived: queue.SimpleQueue) -> pa.Table | None:
    parts = []
    while True:
        try:
            parts.append(arrived.get_nowait())
        except queue.Empty:
            break
    return pa.concat_tables(parts, promote_options="permissive") if parts else None


def _poll_until_done(loop: _Loop, poll: Callable[[], pa.Table | None], until_idle_s, poll_s, exit_on_alert,
                     on_view, stop: threading.Event, behind: Callable[[], bool] = lambda: False) -> None:
    """Poll every ``poll_s`` until done; without waiting while ``behind()`` (a backlog the source
    already holds: a monitor started on a long run's dumps replays them at decode speed)."""
    last_span = time.monotonic()
    while not stop.is_set():
        spans = poll()
        if spans is not None and spans.num_rows:
            loop.add(spans)
            last_span = time.monotonic()
        loop.emit(loop.state.finished_steps())
        if on_view is not None:
            on_view(loop.view())
        if exit_on_alert and loop.alerts:
            return
        if until_idle_s is not None and time.monotonic() - last_span >= until_idle_s:
            return
        if not behind():
            stop.wait(poll_s)


def _summary(loop: _Loop, *, follow: FollowCounts | None = None, receiver: CollectSummary | None = None,
             resumed: int = 0) -> MonitorSummary:
    state = loop.state
    return MonitorSummary(state.runs(), state.spans, loop.reported, loop.revisions, state.late_spans,
                          tuple(loop.alerts), dict(loop.findings_by_code), follow, receiver, resumed)
