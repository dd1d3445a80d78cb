"""The monitor's state and sources as a library: exact against offline goodput, late spans, bounds,
a followed directory, the Prometheus text (parsed with prometheus_client's parser)."""

from __future__ import annotations

import os
import time
import urllib.request

import numpy as np
import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

from nemo_telemetry.analysis import (
    DumpFollower,
    MonitorError,
    MonitorState,
    goodput_document,
    load_traces,
    run_goodput,
    run_monitor,
    spans_table,
)
from nemo_telemetry.analysis.synthetic import synthetic_requests, write_json_lines

S = 1_000_000_000


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


@pytest.fixture(scope="module")
def synthetic_spans(tmp_path_factory) -> pa.Table:
    path = write_json_lines(tmp_path_factory.mktemp("syn") / "traces.jsonl",
                            synthetic_requests(4000, ranks=3, spans_per_request=40, seed=3))
    return load_traces(path).spans


def test_streamed_in_shuffled_batches_the_steps_equal_offline_goodput(synthetic_spans):
    order = np.random.default_rng(0).permutation(synthetic_spans.num_rows)
    state, records = MonitorState(grace_s=0), []
    for chunk in np.array_split(order, 37):
        state.add(synthetic_spans.take(pa.array(chunk)))
        records += state.finished_steps()
    records += state.finish()
    assert _latest(records) == _offline(synthetic_spans)
    assert state.runs()[0].steps == len(_offline(synthetic_spans))


def _tree() -> pa.Table:
    """A step, an unbucketed child, an unstamped bucketed grandchild; a span whose parent never comes."""
    return spans_table([
        {"trace_id": "a" * 32, "span_id": "1" * 16, "name": "rl.grpo.step", "start_ns": 0, "end_ns": 10 * S,
         "iteration": 1, "run_id": "r"},
        {"trace_id": "a" * 32, "span_id": "2" * 16, "parent_span_id": "1" * 16, "name": "rl.actor.call",
         "start_ns": 0, "end_ns": 4 * S, "run_id": "r"},
        {"trace_id": "a" * 32, "span_id": "3" * 16, "parent_span_id": "2" * 16, "name": "rl.policy.train",
         "start_ns": 1 * S, "end_ns": 3 * S, "bucket": "productive", "run_id": "r"},
        {"trace_id": "a" * 32, "span_id": "4" * 16, "parent_span_id": "9" * 16, "name": "rl.data.wait",
         "start_ns": 1 * S, "end_ns": 2 * S, "bucket": "idle", "run_id": "r"},
    ])


def test_a_child_that_arrives_before_its_stamped_ancestor_waits_and_takes_its_iteration():
    tree = _tree()
    state = MonitorState(grace_s=0)
    for row in (2, 3):
        state.add(tree.slice(row, 1))
    assert state.finished_steps() == []
    assert state.size()["pending_rows"] == 2
    state.add(tree.slice(1, 1))
    state.add(tree.slice(0, 1))
    records = state.finished_steps() + state.finish()
    assert _latest(records) == _offline(tree)
    assert records[0].figures["productive_s"] == 2.0


def test_a_late_span_revises_the_printed_step_and_the_revision_is_exact():
    tree = _tree()
    late = spans_table([{"trace_id": "a" * 32, "span_id": "5" * 16, "parent_span_id": "1" * 16,
                         "name": "rl.checkpoint.save", "start_ns": 8 * S, "end_ns": 12 * S, "bucket": "overhead",
                         "iteration": 1, "run_id": "r"}])
    state = MonitorState(grace_s=0)
    state.add(tree)
    first = state.finished_steps()
    assert [(r.iteration, r.revised) for r in first] == [(1, False)]
    state.add(late)
    second = state.finished_steps()
    assert [(r.iteration, r.revised) for r in second] == [(1, True)]
    assert second[0].to_dict()["revised"] is True and "revised" not in first[0].to_dict()
    assert _latest(second) == _offline(pa.concat_tables([tree, late]))
    assert state.finished_steps() == []  # nothing new: nothing printed again


def test_a_step_is_not_reported_before_its_grace_period(synthetic_spans):
    state = MonitorState(grace_s=5)
    state.add(synthetic_spans)
    end = int(np.max(synthetic_spans.column("end_ns").to_numpy()))
    assert all(r.figures["end_ns"] <= end - 5 * S for r in state.finished_steps(end))


def test_folded_steps_leave_the_state_and_the_totals_keep_them(synthetic_spans):
    state, records = MonitorState(grace_s=0, keep_steps=20, rolling_steps=5), []
    for chunk in np.array_split(np.arange(synthetic_spans.num_rows), 50):
        state.add(synthetic_spans.take(pa.array(chunk)))
        records += state.finished_steps()
    records += state.finish()
    offline = _offline(synthetic_spans)
    assert _latest(records) == offline
    assert state.size()["reported_steps"] == 20
    total = run_goodput(synthetic_spans)[0].total
    assert state.runs()[0].total["wall_s"] == pytest.approx(total["wall_s"], rel=1e-12)
    assert state.runs()[0].total["goodput"] == pytest.approx(total["goodput"], rel=1e-12)


def test_bad_settings_are_refused_with_the_option_named():
    with pytest.raises(MonitorError, match="grace_s"):
        MonitorState(grace_s=-1)
    with pytest.raises(MonitorError, match="exactly one source"):
        run_monitor()
    with pytest.raises(MonitorError, match="--alert-below"):
        run_monitor(follow=".", alert_below=2)


def test_follower_reads_appended_lines_waits_for_a_partial_line_and_follows_rotation(tmp_path):
    data = write_json_lines(tmp_path / "src", synthetic_requests(600, ranks=1, spans_per_request=20)).read_bytes()
    lines = data.splitlines(keepends=True)
    dumps = tmp_path / "dumps"
    follower = DumpFollower(dumps)  # not there yet: waited for
    assert follower.poll() is None
    dumps.mkdir()
    live = dumps / "traces-a.jsonl"
    live.write_bytes(b"".join(lines[:10]) + lines[10][:30])
    assert follower.poll().num_rows == 200
    with open(live, "ab") as handle:
        handle.write(lines[10][30:] + b"{not json\n")
    assert follower.poll().num_rows == 20
    os.rename(live, dumps / "traces-a.1.jsonl")
    live.write_bytes(b"".join(lines[11:]))
    got = follower.poll()
    assert follower.close() is None
    counts = follower.counts()
    assert got.num_rows + 220 == load_traces(tmp_path / "src").spans.num_rows
    assert counts.rejected_records == 1 and counts.warnings[0].startswith(f"{live}:12: malformed JSON line")


def test_prometheus_endpoint_serves_rl_goodput_series(tmp_path, synthetic_spans):
    (tmp_path / "dumps").mkdir()
    path = write_json_lines(tmp_path / "dumps" / "traces.jsonl", synthetic_requests(400, ranks=1, spans_per_request=40))
    seen = {}

    def on_view(view):
        if view.runs and "text" not in seen:
            with urllib.request.urlopen(seen["url"], timeout=5) as reply:
                seen["text"] = reply.read().decode()

    summary = run_monitor(follow=path.parent, until_idle_s=0.5, grace_s=0, poll_s=0.1, metrics_port=0,
                          rolling_steps=3, on_ready=lambda where: seen.update(url=where["metrics_url"]),
                          on_view=on_view)
    assert seen["url"].startswith("http://127.0.0.1:")
    families = {f.name: f for f in text_string_to_metric_families(seen["text"])}
    ratio = families["rl_goodput_step_ratio"].samples
    assert ratio and {"run_id", "iteration"} <= set(ratio[0].labels)
    buckets = {s.labels["bucket"] for s in families["rl_goodput_step_seconds"].samples}
    assert buckets == {"productive", "overhead", "idle", "wasted", "unattributed", "double_counted"}
    assert families["rl_goodput_rolling_ratio"].samples[0].value > 0
    assert families["rl_goodput_spans"].samples[0].value > 0
    assert summary.steps_reported == len(_offline(load_traces(path).spans))


def test_otlp_metrics_push_reaches_the_standard_endpoint(tmp_path, monkeypatch):
    """A real HTTP server on 127.0.0.1 receives the SDK's OTLP/HTTP metrics push."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    bodies = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self):
            bodies.append((self.path, self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    (tmp_path / "dumps").mkdir()
    write_json_lines(tmp_path / "dumps" / "traces.jsonl", synthetic_requests(200, ranks=1, spans_per_request=20))
    try:
        run_monitor(follow=tmp_path / "dumps", until_idle_s=0.3, grace_s=0, poll_s=0.1, otlp_metrics=True,
                    otlp_interval_s=60)
    finally:
        server.shutdown()
    assert bodies and {path for path, _ in bodies} == {"/v1/metrics"}
    names, points = set(), {}
    for _, body in bodies:
        request = ExportMetricsServiceRequest.FromString(body)
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    names.add(metric.name)
                    data = metric.gauge if metric.HasField("gauge") else metric.sum
                    points[metric.name] = [{a.key: a.value.string_value for a in p.attributes} for p in data.data_points]
    assert {"rl.goodput.step.ratio", "rl.goodput.rolling.ratio", "rl.goodput.steps", "rl.goodput.spans"} <= names
    assert {"run_id", "iteration"} <= set(points["rl.goodput.step.ratio"][0])


def test_iterations_without_a_step_span_stay_bounded():
    """A run whose step group is off: bucketed stamped spans, no step span; the state keeps the newest
    ``keep_steps`` such iterations and counts the spans it dropped."""
    rows = [{"trace_id": f"{i + 1:032x}", "span_id": f"{i + 1:016x}", "name": "rl.policy.train", "run_id": "r",
             "start_ns": i * S, "end_ns": i * S + S // 2, "iteration": i, "bucket": "productive"} for i in range(60)]
    state = MonitorState(grace_s=0, keep_steps=10, rolling_steps=2)
    for i in range(0, 60, 5):
        state.add(spans_table(rows[i:i + 5]))
        assert state.finished_steps() == []
    assert state.size()["merged_rows"] <= 2 * 10 + 2
    assert state.outside_spans_dropped == 50


def test_a_span_whose_ancestor_never_comes_is_released_unstamped_after_the_horizon():
    tree = _tree()  # row 3's parent is in no batch
    state = MonitorState(grace_s=0, horizon_s=0.2)
    state.add(tree.slice(3, 1))
    assert state.size()["pending_rows"] == 1
    time.sleep(0.3)
    state.add(tree.slice(0, 3))
    assert state.size()["pending_rows"] == 0 and state.released_unresolved == 1
    assert _latest(state.finished_steps() + state.finish()) == _offline(tree)
