"""A mistyped field of one JSON span costs that span only, on both decoder paths (the compiled
scan and the reference one, switched by ``NEMO_TELEMETRY_COMPILED``), which agree: ``events`` or
``links`` that are not lists, a timestamp of 5,000 digits (as a number or a string), and an
``intValue`` that is not an integer (never truncated: 1.5 is no iteration 1)."""

from __future__ import annotations

import copy

import orjson
import pytest
from test_ingest_fuzz import BASE

from nemo_telemetry.analysis import load_traces


def _span(request: dict, index: int = 0) -> dict:
    """The request's span ``index`` (0-11: two resources of two scopes of three spans)."""
    return [s for rs in request["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]][index]


def _set_iteration(value):
    def mutate(span: dict) -> None:
        for kv in span["attributes"]:
            if kv["key"] == "rl.iteration":
                kv["value"] = {"intValue": value}
    return mutate


HUGE = "9" * 5000
MISTYPES = {
    "events a number": (lambda s: s.update(events=5), "events is not a list (5)"),
    "events true": (lambda s: s.update(events=True), "events is not a list (True)"),
    "links false": (lambda s: s.update(links=False), "links is not a list (False)"),
    "links a number": (lambda s: s.update(links=3), "links is not a list (3)"),
    "start of 5,000 digits": (lambda s: s.update(startTimeUnixNano="HUGE-NUMBER"),
                              "startTimeUnixNano is not an integer (<a number of 5000 characters>)"),
    "end of 5,000 digits as text": (lambda s: s.update(endTimeUnixNano=HUGE), "endTimeUnixNano is out of range"),
    "iteration 1.5": (_set_iteration(1.5), "attributes[1].value is not an AnyValue (ValueError: intValue 1.5 is "
                                           "not an integer)"),
    "iteration '1.5'": (_set_iteration("1.5"), "intValue '1.5' is not an integer"),
    "iteration past int64": (_set_iteration(str(1 << 63)), "intValue 9223372036854775808 does not fit in int64"),
}


def _dump(requests: list[dict]) -> bytes:
    return b"".join(orjson.dumps(r).replace(b'"HUGE-NUMBER"', HUGE.encode()) + b"\n" for r in requests)


def _rows(table) -> dict:
    return {(row["trace_id"], row["span_id"]): row for row in table.to_pylist()}


@pytest.fixture(params=[True, False], ids=["compiled", "reference"])
def compiled(request, monkeypatch) -> bool:
    monkeypatch.setenv("NEMO_TELEMETRY_COMPILED", "1" if request.param else "0")
    return request.param


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("mistypes") / "base.jsonl"
    path.write_bytes(_dump(BASE[:2]))
    read = load_traces(path)
    assert read.summary.rejected_records == 0 and read.spans.num_rows == 24
    return {"spans": _rows(read.spans), "events": read.events.num_rows, "links": read.links.num_rows}


@pytest.mark.parametrize("name", list(MISTYPES))
def test_a_mistyped_span_field_rejects_that_span_alone(name, compiled, baseline, tmp_path):
    mutate, problem = MISTYPES[name]
    requests = copy.deepcopy(BASE[:2])
    bad = _span(requests[1])
    mutate(bad)
    path = tmp_path / "case.jsonl"
    path.write_bytes(_dump(requests))
    read = load_traces(path)
    assert read.summary.rejected_records == 1
    (warning,) = read.summary.warnings
    assert warning.startswith(f"{path}:2: span 0 rejected: ") and problem in warning
    kept = _rows(read.spans)
    rejected = (bad["traceId"], bad["spanId"])
    assert rejected not in kept
    assert kept == {key: row for key, row in baseline["spans"].items() if key != rejected}
    assert (read.events.num_rows, read.links.num_rows) == (baseline["events"] - 1, baseline["links"] - 1)


def test_both_paths_agree_on_every_mistype(monkeypatch, tmp_path):
    requests = copy.deepcopy(BASE[:2])
    for index, (mutate, _) in enumerate(MISTYPES.values()):
        mutate(_span(requests[index % 2], index // 2))
    path = tmp_path / "all.jsonl"
    path.write_bytes(_dump(requests))
    reads = {}
    for mode in ("1", "0"):
        monkeypatch.setenv("NEMO_TELEMETRY_COMPILED", mode)
        reads[mode] = load_traces(path)
    assert reads["1"].summary == reads["0"].summary and reads["1"].summary.rejected_records == len(MISTYPES)
    for table in ("spans", "events", "links"):
        assert getattr(reads["1"], table).to_pylist() == getattr(reads["0"], table).to_pylist()
    assert reads["1"].spans.num_rows == 24 - len(MISTYPES)


@pytest.mark.parametrize("value", [3, "3", 3.0])
def test_an_integral_int_value_is_read_exactly(value, compiled, tmp_path):
    requests = copy.deepcopy(BASE[:1])
    _set_iteration(value)(_span(requests[0]))
    path = tmp_path / "ok.jsonl"
    path.write_bytes(_dump(requests))
    read = load_traces(path)
    assert read.summary.rejected_records == 0
    assert read.spans.column("rl.iteration").to_pylist() == [3] * 12
