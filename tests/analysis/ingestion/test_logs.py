"""Logs end to end: a real run with ``logs_enabled`` and the dump exporter, ingest, ``read_logs``, HTML."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

import nemo_telemetry.analysis as analysis
from nemo_telemetry.analysis import ingest, read_logs, read_spans, to_html
from nemo_telemetry.analysis.views.html_view import waterfall_json
from nemo_telemetry.instrument import (
    RLSpanGroup,
    init_telemetry_driver,
    iteration_scope,
    managed_span,
    shutdown_telemetry,
    umbrella_span,
)

EVIL = "<img src=x onerror=alert(1)> & </script>"


def _hex(span, what: str) -> str:
    ctx = span.get_span_context()
    return format(ctx.trace_id, "032x") if what == "trace" else format(ctx.span_id, "016x")


WORKER = textwrap.dedent("""
    import logging
    from nemo_telemetry.instrument import RLSpanGroup, init_telemetry_worker, managed_span
    assert init_telemetry_worker(rank=1, world_size=2, service_name="policy-worker")
    log = logging.getLogger("worker"); log.setLevel(logging.INFO)
    with managed_span(RLSpanGroup.POLICY_UPDATE, "rl.grpo.policy_training") as span:
        log.info("worker trained")
    print(format(span.get_span_context().span_id, "016x"))
""")


@pytest.fixture()
def run(tmp_path):
    """A driver and a worker process, logging inside and outside spans; their dump directory and ids."""
    dump = tmp_path / "dump"
    init_telemetry_driver({"enabled": True, "span_groups": "per_step", "exporter": "dump", "dump_dir": str(dump),
                           "logs_enabled": True}, algorithm="grpo", service_name="grpo-driver")
    log = logging.getLogger("trainer.logs_test")
    log.setLevel(logging.INFO)
    with iteration_scope(1), umbrella_span(RLSpanGroup.U_STEP, "rl.grpo.step") as step:
        with managed_span(RLSpanGroup.GENERATION, "rl.grpo.generation") as generation:
            log.warning("generation said %s", EVIL)
        log.info("step done", extra={"rl.step_note": "ok"})
    log.info("after the step")
    assert shutdown_telemetry(timeout_s=5)
    out = subprocess.run([sys.executable, "-c", WORKER], env=dict(os.environ), check=True, timeout=120,
                         capture_output=True, text=True)
    ids = {"step": _hex(step, "span"), "generation": _hex(generation, "span"), "trace": _hex(step, "trace"),
           "worker": out.stdout.strip().splitlines()[-1]}
    return dump, ids


def test_log_dumps_are_written_beside_the_traces_in_collector_format(run):
    dump, ids = run
    names = sorted(p.name for p in dump.iterdir())
    assert [n for n in names if n.startswith("logs-grpo_driver-")] and [n for n in names if n.startswith("traces-")]
    line = json.loads(next(p for p in dump.iterdir() if p.name.startswith("logs-grpo_driver-")).read_text()
                      .splitlines()[0])
    record = line["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]
    assert record["traceId"] == ids["trace"] and record["spanId"] == ids["generation"]  # hex, as the Collector
    assert isinstance(record["severityNumber"], int)


def test_ingest_reads_log_dumps_into_the_logs_table(run, tmp_path):
    dump, ids = run
    summary = ingest([dump], out=tmp_path / "ds")
    assert summary.logs == 4 and summary.rejected_records == 0
    assert summary.skipped_records == 0  # only metrics requests count as skipped: none were recorded
    logs = read_logs(tmp_path / "ds")
    assert logs.schema == analysis.LOGS_SCHEMA
    by_body = {r["body"]: r for r in logs.to_pylist()}
    assert set(by_body) == {f"generation said {EVIL}", "step done", "after the step", "worker trained"}

    generation = by_body[f"generation said {EVIL}"]
    assert (generation["trace_id"], generation["span_id"]) == (ids["trace"], ids["generation"])
    assert (generation["severity"], generation["severity_number"]) == ("WARN", 13)
    assert (generation["service_name"], generation["rank"]) == ("grpo-driver", 0)
    step = by_body["step done"]
    assert step["span_id"] == ids["step"] and dict(step["attributes"])["rl.step_note"] == "ok"
    assert (by_body["after the step"]["trace_id"], by_body["after the step"]["span_id"]) == (None, None)
    worker = by_body["worker trained"]
    assert (worker["span_id"], worker["service_name"], worker["rank"]) == (ids["worker"], "policy-worker", 1)
    assert generation["run_id"] == worker["run_id"] == read_spans(tmp_path / "ds").column("run_id")[0].as_py()
    assert not any(k.startswith("otel") for k, _ in generation["attributes"])  # ids travel as ids

    again = ingest([dump], out=tmp_path / "ds")
    assert again.logs == 4 and read_logs(tmp_path / "ds").num_rows == 4  # re-ingesting replaces, not adds


def test_read_logs_reads_raw_dumps_too(run):
    dump, _ = run
    assert read_logs(dump).num_rows == 4
    assert read_logs(next(p for p in dump.iterdir() if p.name.startswith("traces-"))).num_rows == 0


def test_a_bad_log_record_costs_only_itself_and_is_named(tmp_path):
    good = {"timeUnixNano": "1700000000000000000", "severityText": "INFO", "body": {"stringValue": "fine"},
            "traceId": "AB" * 16, "spanId": "cd" * 8}
    bad = {"timeUnixNano": "soon", "body": {"stringValue": "broken"}}
    request = {"resourceLogs": [{"resource": {"attributes": []}, "scopeLogs": [{"logRecords": [good, bad]}]}]}
    path = tmp_path / "collector-logs.json"
    not_a_resource = {"resourceLogs": ["a string where a ResourceLogs object belongs"]}
    path.write_text(json.dumps(request) + "\n" + "not json\n" + json.dumps(not_a_resource) + "\n")
    with pytest.warns(UserWarning, match=r"collector-logs.json:1: resourceLogs\[0\]\.scopeLogs\[0\]\."
                                         r"logRecords\[1\]: timeUnixNano 'soon'") as caught:
        table = read_logs(path)
    message = str(caught[0].message)
    assert message.startswith("3 log record(s) left out")
    assert "collector-logs.json:2: not JSON" in message
    assert "collector-logs.json:3: resourceLogs[0]: not an OTLP ResourceLogs object" in message
    (row,) = table.to_pylist()
    assert (row["body"], row["trace_id"], row["span_id"]) == ("fine", "ab" * 16, "cd" * 8)


def test_log_attribute_values_read_as_span_attributes_do(tmp_path):
    """One AnyValue encoding for spans and logs: bytes as hex, a bool given as text, snake_case
    field names, and the same nesting bound (a value nested past it costs only its record)."""
    deep = {"stringValue": "x"}
    for _ in range(40):
        deep = {"arrayValue": {"values": [deep]}}
    snake = {"resource_logs": [{"resource": {"attributes": [{"key": "service.name", "value": {"string_value": "svc"}}]},
                                "scope_logs": [{"log_records": [{
                                    "time_unix_nano": "5", "body": {"bool_value": "false"},
                                    "attributes": [{"key": "raw", "value": {"bytes_value": "AQI="}}]}]}]}]}
    camel = {"resourceLogs": [{"scopeLogs": [{"logRecords": [
        {"timeUnixNano": "6", "body": {"stringValue": "deep"}, "attributes": [{"key": "d", "value": deep}]}]}]}]}
    path = tmp_path / "logs-values.jsonl"
    path.write_text(json.dumps(snake) + "\n" + json.dumps(camel) + "\n")
    with pytest.warns(UserWarning, match=r"logs-values.jsonl:2: .*nested more than 32 deep"):
        table = read_logs(path)
    (row,) = table.to_pylist()
    assert (row["body"], row["attributes"], row["service_name"]) == ("false", [("raw", "0102")], "svc")


def test_the_html_waterfall_lists_a_spans_log_records_escaped(run, tmp_path):
    dump, ids = run
    ingest([dump], out=tmp_path / "ds")
    spans, logs = read_spans(tmp_path / "ds"), read_logs(tmp_path / "ds")
    data = waterfall_json(spans, logs=logs)
    row_of = {span_id: i for i, span_id in enumerate(data["rows"]["id"])}
    listed = {(row, body) for row, body in zip(data["logs"]["row"], data["logs"]["body"])}
    assert (row_of[ids["generation"]], f"generation said {EVIL}") in listed
    assert (row_of[ids["worker"]], "worker trained") in listed
    assert "after the step" not in data["logs"]["body"]  # logged in no span
    page = to_html(spans, logs=logs)
    assert "<img" not in page and "generation said \\u003cimg src=x onerror=alert(1)\\u003e" in page


def test_logs_are_public_analysis_names():
    assert {"read_logs", "LOGS_SCHEMA"} <= set(analysis.__all__)


def test_a_chatty_span_lists_its_first_records_and_counts_the_rest():
    from nemo_telemetry.analysis import LOGS_SCHEMA, spans_table
    from nemo_telemetry.analysis.views.html_view import MAX_LOGS_PER_SPAN

    import pyarrow as pa

    trace, sid = "a" * 32, "b" * 16
    spans = spans_table([{"trace_id": trace, "span_id": sid, "parent_span_id": None, "name": "rl.grpo.step",
                          "start_ns": 0, "end_ns": 10**9, "iteration": 1}])
    count = MAX_LOGS_PER_SPAN + 10
    logs = pa.Table.from_pylist([{"trace_id": trace, "span_id": sid, "time_ns": count - i, "body": f"record {i}"}
                                 for i in range(count)], schema=LOGS_SCHEMA)
    listed = waterfall_json(spans, logs=logs)["logs"]
    assert listed["body"][:2] == [f"record {count - 1}", f"record {count - 2}"]  # in time order
    assert len(listed["body"]) == MAX_LOGS_PER_SPAN and listed["more"] == {"0": 10}
