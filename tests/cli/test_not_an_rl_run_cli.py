"""``check``, ``goodput`` and ``waterfall`` on OTLP that is not an instrumented RL run: each says what
it found (no spans; spans without an rl.* attribute; no step spans; a caller outside the data)
instead of "no findings: the breakdown is consistent", in the table and in JSON, and tells traces
apart where their ids share a long prefix.

The files are built here in the shapes other tools write: a Jaeger-style trace whose 64-bit ids are
zero-padded to 128 bits, a plain HTTP service's trace, an empty export, a run without step spans,
a server span called by a process whose spans are not in the file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nemo_telemetry.analysis import check_with_engine, read_spans, span_census, waterfall
from nemo_telemetry.analysis.engines.partitioned_check import stream_check
from nemo_telemetry.cli.app import app
from nemo_telemetry.errors import UnknownRunError

S = 1_000_000_000
T0 = 1_700_000_000 * S
PADDED = "0" * 16  # the high half of a 64-bit Jaeger / Zipkin id written as 128 bits


def _value(v):
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    return {"stringValue": v}


def otlp_span(trace: str, span: str, name: str, start: float, end: float, parent: str | None = None, *,
              kind: int = 1, **attributes) -> dict:
    out = {"traceId": trace, "spanId": span, "name": name, "kind": kind,
           "startTimeUnixNano": str(T0 + int(start * S)), "endTimeUnixNano": str(T0 + int(end * S)),
           "attributes": [{"key": k.replace("_", "."), "value": _value(v)} for k, v in attributes.items()]}
    if parent:
        out["parentSpanId"] = parent
    return out


def otlp_file(path: Path, service: str, spans: list[dict], **resource) -> Path:
    attrs = {"service.name": service, **{k.replace("_", "."): v for k, v in resource.items()}}
    doc = {"resourceSpans": [{"resource": {"attributes": [{"key": k, "value": _value(v)} for k, v in attrs.items()]},
                              "scopeSpans": [{"scope": {"name": "outside"}, "spans": spans}]}] if spans else []}
    path.write_text(json.dumps(doc))
    return path


JAEGER_TRACES = (PADDED + "0000000000000001", PADDED + "0000000000000007",
                 "1" * 16 + "0000000000000007")  # the last differs from the second in its high half only


def jaeger(tmp: Path) -> Path:
    one, seven, high = JAEGER_TRACES
    return otlp_file(tmp / "jaeger.json", "frontend", [
        otlp_span(one, "0000000000000011", "some-operation", 0, 2),
        otlp_span(one, "0000000000000012", "some-child", 0.5, 1.5, "0000000000000011"),
        otlp_span(seven, "0000000000000071", "query07-operation", 3, 4),
        otlp_span(seven, "0000000000000072", "query07-child", 3.2, 3.8, "0000000000000071"),
        otlp_span(high, "0000000000000081", "high-operation", 5, 6),
        otlp_span(high, "0000000000000082", "high-child", 5.1, 5.9, "0000000000000081"),
    ])


def http_service(tmp: Path) -> Path:
    """A shop's trace: the server span's caller (a browser) is not instrumented."""
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    return otlp_file(tmp / "http.json", "shop", [
        otlp_span(trace, "00f067aa0ba902b7", "GET /cart", 0, 1, "b7ad6b7169203331", kind=2, http_method="GET"),
        otlp_span(trace, "00f067aa0ba902b8", "SELECT cart", 0.2, 0.6, "00f067aa0ba902b7", kind=3),
    ])


def no_steps(tmp: Path) -> Path:
    """An instrumented run whose step group was off: bucketed, stamped spans and no step span."""
    trace = "5" * 32
    return otlp_file(tmp / "no-steps.json", "trainer", [
        otlp_span(trace, "0000000000000001", "rl.vllm.generate", 0, 4, rl_bucket="productive", rl_iteration=1),
        otlp_span(trace, "0000000000000002", "rl.grpo.policy_training", 4, 9, rl_bucket="productive",
                  rl_iteration=1),
    ], nemo_run_id="bare-run")


def remote_parent(tmp: Path) -> Path:
    """An RL run with steps, whose gym server span was called by a process not in the data, and a
    worker span whose in-process parent was lost (a worker that never flushed)."""
    trace = "6" * 32
    return otlp_file(tmp / "remote.json", "trainer", [
        otlp_span(trace, "0000000000000001", "rl.grpo.step", 0, 10, rl_iteration=1),
        otlp_span(trace, "0000000000000002", "rl.vllm.generate", 0, 10, "0000000000000001", rl_bucket="productive"),
        otlp_span(trace, "0000000000000003", "POST /run", 2, 3, "00000000000000aa", kind=2),
        otlp_span(trace, "0000000000000004", "rl.policy.train", 4, 5, "00000000000000bb"),
    ], nemo_run_id="run-1")


def empty(tmp: Path) -> Path:
    return otlp_file(tmp / "empty.json", "nothing", [])


runner = CliRunner()


def cli(*args) -> object:
    return runner.invoke(app, [*map(str, args)], env={"COLUMNS": "200"})


@pytest.fixture(params=["dumps", "dataset"])
def source(request, tmp_path):
    """A maker of the source of one shape: the dump file itself, or a dataset ingested from it."""
    def make(shape) -> Path:
        dump = shape(tmp_path)
        if request.param == "dumps":
            return dump
        out = tmp_path / f"ds-{dump.stem}"
        done = cli("ingest", dump, "--out", out)
        assert done.exit_code == 0, done.output
        return out
    return make


def check_json(path: Path, *extra) -> tuple[int, dict]:
    done = cli("check", path, "--format", "json", *extra)
    return done.exit_code, json.loads(done.stdout)


def test_an_empty_source_says_it_holds_no_spans(source):
    path = source(empty)
    code, doc = check_json(path)
    assert code == 0 and [f["code"] for f in doc["findings"]] == ["no-spans"]
    assert doc["data"] == {"spans": 0, "rl_spans": 0, "step_spans": 0, "found": "no-spans", "runs": [],
                           "notes": [{"code": "no-spans", "run_id": None, "message": doc["findings"][0]["message"]}]}
    assert check_json(path, "--fail-on", "warning")[0] == 1  # a gate that wants a clean run does not pass it
    table = cli("check", path)
    assert "consistent" not in table.stdout and "no-spans" in table.stdout and "holds no spans" in table.stdout
    goodput = cli("goodput", path)
    assert goodput.exit_code == 0 and "0 spans" in goodput.stdout and "no-spans" in goodput.stdout
    assert json.loads(cli("goodput", path, "--format", "json").stdout)["data"]["found"] == "no-spans"


def test_an_http_service_trace_is_not_an_rl_run_and_its_server_span_has_a_remote_parent(source):
    path = source(http_service)
    code, doc = check_json(path)
    assert code == 0
    assert [(f["code"], f["severity"]) for f in doc["findings"]] == [("no-rl-attributes", "warning"),
                                                                     ("remote-parent", "info")]
    assert doc["data"]["found"] == "no-rl-attributes" and (doc["data"]["spans"], doc["data"]["rl_spans"]) == (2, 0)
    remote = doc["findings"][1]
    assert remote["span_ids"] == ["00f067aa0ba902b7"] and remote["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert "flush" not in remote["message"] and "caller" in remote["message"]
    table = cli("check", path).stdout
    assert "consistent" not in table and "none carrying an rl.* attribute" in table
    assert "checked 2 spans: 0 with an rl.* attribute, 0 step spans; 0 run(s) and spans without a run id" in table
    goodput = cli("goodput", path)
    assert "2 spans, 0 with an rl.* attribute, 0 step spans" in goodput.stdout and "no-rl-attributes" in goodput.stdout
    data = json.loads(cli("goodput", path, "--format", "json").stdout)
    assert data["runs"] == [] and data["data"]["found"] == "no-rl-attributes"
    shown = cli("waterfall", path).stdout
    assert "run None" not in shown and "service shop · trace 4bf92f35" in shown


def test_a_run_without_step_spans_is_named(source):
    path = source(no_steps)
    code, doc = check_json(path)
    assert code == 0 and [(f["code"], f["run_id"]) for f in doc["findings"]] == [("no-step-spans", "bare-run")]
    assert doc["data"]["runs"] == [{"run_id": "bare-run", "spans": 2, "rl_spans": 2, "step_spans": 0}]
    assert "per_step" in cli("check", path).stdout
    goodput = json.loads(cli("goodput", path, "--format", "json").stdout)
    assert goodput["runs"][0]["run_id"] == "bare-run" and goodput["runs"][0]["steps"] == []
    assert goodput["data"]["found"] == "no-step-spans"
    assert goodput["data"]["notes"][0]["run_id"] == "bare-run"
    assert "no step spans in run bare-run" in cli("goodput", path).stdout
    assert span_census(path, run_id="bare-run").found == "no-step-spans"  # the same, from Python
    with pytest.raises(UnknownRunError, match="other-run"):
        span_census(path, run_id="other-run")


def test_orphan_advice_tells_a_remote_caller_from_a_lost_worker_span(source):
    path = source(remote_parent)
    code, doc = check_json(path)
    found = {f["code"]: f for f in doc["findings"]}
    assert code == 0 and doc["data"]["found"] == "steps"
    assert found["remote-parent"]["span_ids"] == ["0000000000000003"] and found["remote-parent"]["severity"] == "info"
    assert found["orphan-span"]["span_ids"] == ["0000000000000004"]
    assert "flush_telemetry" in found["orphan-span"]["message"] and "flush" not in found["remote-parent"]["message"]
    lines = cli("waterfall", path).stdout.splitlines()
    served = next(line for line in lines if "POST /run" in line)
    lost = next(line for line in lines if "rl.policy.train" in line)
    assert "called by 00000000000000aa, a span not in the data (remote parent)" in served and "orphan" not in served
    assert "orphan (parent 00000000000000bb missing)" in lost


def flagged_parents(tmp: Path) -> Path:
    """Orphans whose exporter set the span flags' is-remote bits (0x100: known, 0x200: remote),
    which win over the kind: an internal span continued from a carrier, a server span whose
    parent was in-process."""
    trace = "7" * 32
    carried = otlp_span(trace, "0000000000000003", "rl.worker.call", 2, 3, "00000000000000aa")
    carried["flags"] = 0x300
    local = otlp_span(trace, "0000000000000004", "GET /health", 4, 5, "00000000000000bb", kind=2)
    local["flags"] = 0x100
    return otlp_file(tmp / "flagged.json", "trainer", [
        otlp_span(trace, "0000000000000001", "rl.grpo.step", 0, 10, rl_iteration=1),
        otlp_span(trace, "0000000000000002", "rl.vllm.generate", 0, 10, "0000000000000001", rl_bucket="productive"),
        carried, local,
    ], nemo_run_id="run-1")


def test_the_exporters_is_remote_flags_decide_the_advice_from_a_dataset_too(source):
    found = {f["code"]: f for f in check_json(source(flagged_parents))[1]["findings"]}
    assert found["remote-parent"]["span_ids"] == ["0000000000000003"]
    assert found["orphan-span"]["span_ids"] == ["0000000000000004"]


def test_jaeger_padded_traces_are_told_apart_in_the_waterfall(source):
    """Ids that share 31 digits (the padded low halves) or only their low half: each tree is headed
    by its service and trace, with every digit it takes to tell them apart."""
    path = source(jaeger)
    shown = cli("waterfall", path)
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    headings = [line for line in lines if line.startswith("service ")]
    assert headings == [f"service frontend · trace {t}" for t in JAEGER_TRACES]
    assert "run None" not in shown.stdout and "trace=00000000 " not in shown.stdout
    view = waterfall(read_spans(path))
    assert view.trace_digits == 32 and view.rows.num_rows == 6
    assert view.rows.filter(view.rows.column("depth").to_numpy() == 0).column("heading").to_pylist() == \
        [f"service frontend · trace {t}" for t in JAEGER_TRACES]
    alone = waterfall(read_spans(path), trace_id=JAEGER_TRACES[2])  # one trace: 8 digits tell it
    assert alone.trace_digits == 8 and set(alone.rows.column("heading").drop_null().to_pylist()) == {
        "service frontend · trace 11111111"}
    code, doc = check_json(path)
    assert [f["code"] for f in doc["findings"]] == ["no-rl-attributes"]


@pytest.mark.parametrize("shape", [empty, http_service, no_steps, remote_parent, jaeger])
def test_every_engine_and_span_census_agree_on_what_the_source_holds(tmp_path, shape):
    out = tmp_path / "ds"
    assert cli("ingest", shape(tmp_path), "--out", out).exit_code == 0
    local = check_with_engine(out)
    assert stream_check(out).to_dict() == local.to_dict()
    assert span_census(out) == local.census
