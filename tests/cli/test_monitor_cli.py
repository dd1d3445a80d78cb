"""``nemo-telemetry monitor`` as a real process: a followed directory, alerts and exit codes, and the
receiver fed by the real SDK exporter, killed with SIGKILL and restarted on the dataset it wrote."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from typer.testing import CliRunner

from nemo_telemetry.analysis import goodput_document, load_traces, read_spans, run_goodput
from nemo_telemetry.analysis.synthetic import synthetic_requests, write_json_lines
from nemo_telemetry.cli.app import app

runner = CliRunner()


class _Monitor:
    """A ``nemo-telemetry monitor`` process; its stdout lines are collected as they come."""

    def __init__(self, *options: str) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
        command = [sys.executable, "-c", "from nemo_telemetry.cli.app import main; main()", "monitor", *options]
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        self.lines: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(json.loads(line))

    def traces_url(self) -> str:
        line = self.proc.stderr.readline()
        match = re.search(r"(http://\S+/v1/traces)", line)
        assert match, line + self.proc.stderr.read()
        return match.group(1)

    def wait_for(self, iterations: set[int], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not iterations <= {line["iteration"] for line in self.lines}:
            assert time.monotonic() < deadline, self.lines
            time.sleep(0.1)

    def finish(self, timeout: float = 120.0) -> tuple[int, str]:
        rc = self.proc.wait(timeout)
        self._reader.join(10)
        return rc, self.proc.stderr.read()


def _final(lines: list[dict]) -> dict:
    out = {}
    for line in lines:
        line = dict(line)
        line.pop("revised", None)
        out[(line.pop("run_id"), line["iteration"])] = line
    return out


def _offline(spans) -> dict:
    return {(run["run_id"], step["iteration"]): step for run in goodput_document(run_goodput(spans))["runs"]
            for step in run["steps"]}


def test_follow_prints_one_json_line_per_step_equal_to_offline_goodput(tmp_path):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    path = write_json_lines(dumps / "traces-0.jsonl", synthetic_requests(600, ranks=2, spans_per_request=30))
    result = runner.invoke(app, ["monitor", "--follow", str(dumps), "--until-idle", "0.5", "--format", "json",
                                 "--grace", "0"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert _final(lines) == _offline(load_traces(path).spans)
    offline_keys = list(goodput_document(run_goodput(load_traces(path).spans))["runs"][0]["steps"][0])
    assert list(lines[0]) == ["run_id", *offline_keys]


def test_alert_below_with_exit_on_alert_exits_1_with_a_clear_message(tmp_path):
    write_json_lines(tmp_path / "traces.jsonl", synthetic_requests(400, ranks=1, spans_per_request=20))
    result = runner.invoke(app, ["monitor", "--follow", str(tmp_path), "--until-idle", "0.5", "--format", "json",
                                 "--grace", "0", "--alert-below", "0.95", "--over", "3", "--exit-on-alert"])
    assert result.exit_code == 1, result.output
    assert re.search(r"ALERT: run synthetic-run: goodput over the last 3 steps is 0\.\d+, below 0\.95",
                     result.stderr)
    quiet = runner.invoke(app, ["monitor", "--follow", str(tmp_path), "--until-idle", "0.5", "--format", "json",
                                "--grace", "0", "--alert-below", "0.1", "--over", "3", "--exit-on-alert"])
    assert quiet.exit_code == 0 and "ALERT" not in quiet.stderr


def test_bad_usage_exits_2_and_says_what_to_give(tmp_path):
    both = runner.invoke(app, ["monitor", "--follow", str(tmp_path), "--port", "0"])
    assert both.exit_code == 2 and "exactly one source" in both.stderr
    out_without_port = runner.invoke(app, ["monitor", "--follow", str(tmp_path), "--out", str(tmp_path / "ds")])
    assert out_without_port.exit_code == 2 and "use it with --port" in out_without_port.stderr
    bad_format = runner.invoke(app, ["monitor", "--follow", str(tmp_path), "--format", "xml"])
    assert bad_format.exit_code == 2 and "choose table or json" in bad_format.stderr
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("x")
    not_dir = runner.invoke(app, ["monitor", "--follow", str(a_file), "--until-idle", "1"])
    assert not_dir.exit_code == 2 and "not a directory" in not_dir.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = runner.invoke(app, ["monitor", "--port", str(taken.getsockname()[1]), "--until-idle", "1"])
    assert busy.exit_code == 2 and "cannot listen on 127.0.0.1" in busy.stderr


def _train(url: str, iterations: range, run_id: str) -> None:
    """Steps with bucketed children (one unstamped, attributed through its parent), exported by the SDK."""
    exporter = OTLPSpanExporter(endpoint=url, timeout=5)
    provider = TracerProvider(resource=Resource.create({"service.name": "trainer", "nemo.run.id": run_id}))
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=100))
    tracer = provider.get_tracer("test")
    for i in iterations:
        with tracer.start_as_current_span("rl.grpo.step", attributes={"rl.iteration": i}):
            with tracer.start_as_current_span("rl.policy.generate", attributes={"rl.bucket": "productive",
                                                                               "rl.iteration": i}):
                time.sleep(0.03)
            with tracer.start_as_current_span("rl.actor.call"):
                with tracer.start_as_current_span("rl.policy.train", attributes={"rl.bucket": "productive"}):
                    time.sleep(0.02)
            with tracer.start_as_current_span("rl.weights.refit", attributes={"rl.bucket": "overhead",
                                                                             "rl.iteration": i}):
                time.sleep(0.01)
    provider.force_flush(10_000)
    provider.shutdown()


def test_receiver_killed_with_sigkill_then_restarted_resumes_from_its_dataset(tmp_path):
    dataset = tmp_path / "ds"
    first = _Monitor("--port", "0", "--out", str(dataset), "--format", "json", "--grace", "0")
    _train(first.traces_url(), range(0, 4), "run-kill")
    first.wait_for({0, 1, 2, 3})
    first.proc.send_signal(signal.SIGKILL)
    first.finish()
    second = _Monitor("--port", "0", "--out", str(dataset), "--format", "json", "--grace", "0", "--until-idle", "3")
    _train(second.traces_url(), range(4, 7), "run-kill")
    rc, stderr = second.finish()
    assert rc == 0, stderr
    final = _final(second.lines)
    assert {it for _, it in final} == set(range(7))
    assert final == _offline(read_spans(dataset))
    assert final[("run-kill", 0)]["productive_s"] > 0.04  # the unstamped train span counts in its step


def _request(spans: list[dict]) -> dict:
    resource = {"attributes": [{"key": "nemo.run.id", "value": {"stringValue": "run-late"}}]}
    return {"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": spans}]}]}


def _span(span_id: str, name: str, start_s: float, end_s: float, **attributes) -> dict:
    base = 1_767_225_600_000_000_000
    attrs = [{"key": k.replace("_", "."), "value": {"intValue": str(v)} if isinstance(v, int) else {"stringValue": v}}
             for k, v in attributes.items()]
    return {"traceId": "ab" * 16, "spanId": span_id, "parentSpanId": "" if name.endswith(".step") else "1" * 16,
            "name": name, "kind": 1, "startTimeUnixNano": str(base + int(start_s * 1e9)),
            "endTimeUnixNano": str(base + int(end_s * 1e9)), "attributes": attrs}


def test_a_late_span_appended_to_a_followed_file_prints_the_step_again_revised(tmp_path):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    live = dumps / "traces-trainer-1.jsonl"
    step = [_span("1" * 16, "rl.grpo.step", 0, 10, rl_iteration=1),
            _span("2" * 16, "rl.policy.train", 0, 6, rl_iteration=1, rl_bucket="productive")]
    live.write_text(json.dumps(_request(step)) + "\n")
    monitor = _Monitor("--follow", str(dumps), "--format", "json", "--grace", "0", "--until-idle", "4")
    monitor.wait_for({1})
    late = [_span("3" * 16, "rl.checkpoint.save", 9, 12, rl_iteration=1, rl_bucket="overhead")]
    with open(live, "a") as handle:
        handle.write(json.dumps(_request(late))[:40])  # the writer mid-line: waited for, not rejected
        handle.flush()
        time.sleep(1.0)
        handle.write(json.dumps(_request(late))[40:] + "\n")
    rc, stderr = monitor.finish()
    assert rc == 0, stderr
    assert [(line["iteration"], line.get("revised", False)) for line in monitor.lines] == [(1, False), (1, True)]
    assert monitor.lines[0]["overhead_s"] == 0.0 and monitor.lines[1]["overhead_s"] == 3.0
    assert _final(monitor.lines) == _offline(load_traces(live).spans)
    assert "rejected" not in stderr


def test_help_names_both_sources_and_shows_an_example():
    result = runner.invoke(app, ["monitor", "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0
    for option in ("--follow", "--port", "--out", "--until-idle", "--format", "--alert-below", "--over",
                   "--exit-on-alert", "--metrics-port", "--otlp-metrics"):
        assert option in result.stdout
    assert "Example: nemo-telemetry monitor --follow" in result.stdout


def test_live_view_renders_the_last_steps_with_run_and_rolling_goodput(tmp_path):
    import io

    from rich.console import Console

    from nemo_telemetry.analysis import run_monitor
    from nemo_telemetry.cli.render import render_monitor

    write_json_lines(tmp_path / "traces.jsonl", synthetic_requests(200, ranks=1, spans_per_request=20))
    views = []
    run_monitor(follow=tmp_path, until_idle_s=0.3, grace_s=0, poll_s=0.1, rolling_steps=3, on_view=views.append)
    out = io.StringIO()
    Console(file=out, width=100, color_system=None).print(render_monitor(views[-1], bar_width=10))
    text = out.getvalue()
    run = views[-1].runs[0]
    assert f"run synthetic-run: {run.steps} steps, goodput {run.total['goodput']:.1%}, last 3 steps " \
           f"{run.rolling_goodput:.1%}" in text
    assert re.search(r"^\s+17\s+30\.00\s+\d+\.\d+", text, re.M)  # the newest step, its wall and productive time
    assert "spans received" in text
