"""The ingest summary counts what a user checks first: spans, distinct traces and runs,
duplicates dropped, in both formats and across batches."""

from __future__ import annotations

import importlib

import pytest

from nemo_telemetry.analysis import ingest, load_traces
from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf, write_json_lines, write_length_prefixed


def _expected(requests: list[dict]) -> tuple[int, int, int]:
    spans = [
        (s["traceId"], s["spanId"], next(
            (kv["value"]["stringValue"] for kv in rs["resource"]["attributes"] if kv["key"] == "nemo.run.id"), None))
        for request in requests for rs in request["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]
    ]
    return len({(t, s) for t, s, _ in spans}), len({t for t, _, _ in spans}), len({r for _, _, r in spans})


@pytest.mark.usefixtures("kernel_path")  # the compiled kernels, then the reference paths
@pytest.mark.parametrize("fmt", ["jsonl", "proto"])
def test_summary_counts_distinct_traces_and_runs_over_batches_and_duplicates(fmt, tmp_path, monkeypatch):
    ingest_module = importlib.import_module("nemo_telemetry.analysis.ingestion.ingest")
    detect_module = importlib.import_module("nemo_telemetry.analysis.ingestion._detect")
    # many small batches, so that a trace and a run span several
    monkeypatch.setattr(ingest_module, "BATCH_PROTOBUF_BYTES", 20_000)
    monkeypatch.setattr(ingest_module, "BATCH_JSON_BYTES", 20_000)
    monkeypatch.setattr(detect_module, "JSON_BLOCK_BYTES", 20_000)
    requests = list(synthetic_requests(1500, spans_per_request=100, run_id="run-a"))
    requests += list(synthetic_requests(700, spans_per_request=100, run_id="run-b", seed=1))
    spans, traces, runs = _expected(requests)
    assert traces > 2 and runs == 2
    doubled = requests + requests[:5]  # a re-sent tail: duplicates of spans already read
    if fmt == "jsonl":
        path = write_json_lines(tmp_path / "t.jsonl", doubled)
    else:
        path = write_length_prefixed(tmp_path / "t.pb", [to_protobuf(r) for r in doubled])
    for summary in (load_traces(path).summary, ingest([path], out=tmp_path / f"ds-{fmt}")):
        assert (summary.spans, summary.traces, summary.runs) == (spans, traces, runs)
        assert summary.duplicates_dropped == sum(len(s["spans"]) for r in requests[:5]
                                                 for rs in r["resourceSpans"] for s in rs["scopeSpans"])


@pytest.mark.usefixtures("compiled_kernels")  # the walk's own id words
def test_protobuf_decoder_id_words_equal_the_parsed_hex_ids():
    """The protobuf walk hands the deduplicator each span's id words read from the bytes; they
    must be what parsing the table's hex ids gives, or duplicates would slip through."""
    from nemo_telemetry.analysis.ingestion._otlp_wire import decode_requests
    from nemo_telemetry.analysis.store.dataset import span_keys

    tables = decode_requests([to_protobuf(r) for r in synthetic_requests(2000, spans_per_request=300)])
    assert tables.span_words is not None
    assert (tables.span_words == span_keys(tables.spans)).all()


@pytest.mark.usefixtures("kernel_path")
def test_the_same_spans_in_another_format_are_duplicates(tmp_path):
    """Dedup keys agree between the JSON scan (hex text) and the protobuf walk (bytes)."""
    requests = list(synthetic_requests(1200, spans_per_request=200))
    jsonl = write_json_lines(tmp_path / "t.jsonl", requests)
    proto = write_length_prefixed(tmp_path / "t.pb", [to_protobuf(r) for r in requests])
    first = ingest([jsonl], out=tmp_path / "ds")
    again = ingest([proto], out=tmp_path / "ds")
    assert first.spans >= 1200 and (again.spans, again.duplicates_dropped) == (0, first.spans)
    both = load_traces([proto, jsonl]).summary
    assert (both.spans, both.duplicates_dropped) == (first.spans, first.spans)
