"""JSON lines are read in blocks: line numbers, blank lines and lines longer than a block
come out as they would line by line; the protobuf walk grows its arrays as it goes."""

from __future__ import annotations

import importlib

import orjson
import pytest

from nemo_telemetry.analysis import ingest, load_traces

from nemo_telemetry.analysis.ingestion import _detect
from nemo_telemetry.analysis.ingestion._otlp_wire import decode_requests
from nemo_telemetry.analysis.store.dataset import SpanDeduplicator, drop_duplicates
from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf

from test_ingest_wire import _upb

# Tests of the compiled kernels: they take them on these small inputs too, as auto would not.
pytestmark = pytest.mark.usefixtures("compiled_kernels")


@pytest.fixture(scope="module")
def requests():
    return list(synthetic_requests(44, spans_per_request=11, ranks=1))


@pytest.mark.parametrize("block_bytes", [64, 1000, 1 << 20])
def test_blocks_keep_line_numbers_blank_lines_and_long_lines(requests, tmp_path, monkeypatch, block_bytes):
    monkeypatch.setattr(_detect, "JSON_BLOCK_BYTES", block_bytes)  # every line spans several blocks
    lines = [orjson.dumps(r) for r in requests]
    body = b"\n".join([lines[0], b"", b"  \t ", lines[1], b"garbage {", lines[2], b"\r"]) + b"\n" + lines[3][:-30]
    path = tmp_path / "blocks.jsonl"
    path.write_bytes(body)
    summary = ingest([path], out=tmp_path / "ds")
    assert (summary.spans, summary.rejected_records) == (33, 2)
    assert summary.warnings[0].startswith(f"{path}:5: malformed JSON line")
    assert summary.warnings[1].startswith(f"{path}:8: truncated last record")
    whole = tmp_path / "whole.jsonl"
    whole.write_bytes(b"\n".join(lines[:3]) + b"\n")
    assert load_traces(path).spans.to_pylist() == load_traces(whole).spans.to_pylist()


def test_protobuf_walk_grows_past_its_first_guess():
    """Many attributes per span and many requests: the first arrays are too small."""
    requests = list(synthetic_requests(600, spans_per_request=3, ranks=2))
    for request in requests:
        for span in request["resourceSpans"][0]["scopeSpans"][0]["spans"]:
            span["attributes"] += [{"key": f"k{i}", "value": {"intValue": str(i)}} for i in range(40)]
    payloads = [to_protobuf(r) for r in requests]
    fast = decode_requests(payloads)
    slow = _upb(payloads)
    assert fast.spans.num_rows >= 600
    for name in ("spans", "events", "links"):
        assert getattr(fast, name).to_pylist() == getattr(slow, name).to_pylist(), name


def test_escaped_strings_and_rare_values_read_from_a_file_block(tmp_path):
    """The block path (a buffer read in place) decodes what the line path decodes."""
    from test_ingest_json_scan import _orjson_path, _sdk_lines

    lines = [line if line.endswith(b"\n") else line + b"\n" for line in _sdk_lines()]
    path = tmp_path / "escaped.jsonl"
    path.write_bytes(b"".join(lines))
    loaded = load_traces(path)
    every = _orjson_path(lines)
    expected = drop_duplicates(every, SpanDeduplicator())  # three of the lines carry the same ids
    dropped = every.spans.num_rows - expected.spans.num_rows
    assert dropped > 0 and (loaded.summary.rejected_records, loaded.summary.duplicates_dropped) == (0, dropped)
    for name in ("spans", "events", "links"):
        assert getattr(loaded, name).to_pylist() == getattr(expected, name).to_pylist(), name


def test_reused_scan_matrices_carry_nothing_from_the_batch_before():
    """The kernels' matrices are reused per thread: a plain batch decoded right after a rich
    one (every value kind, statuses, escapes) equals its exact decode."""
    from test_ingest_json_scan import _orjson_path, _sdk_lines
    from test_ingest_wire import _with_every_value_type

    from nemo_telemetry.analysis.ingestion._otlp_json_fast import decode_json_lines

    plain = list(synthetic_requests(22, spans_per_request=11, ranks=1))
    decode_requests([_with_every_value_type()] * 50)
    wire = decode_requests([to_protobuf(r) for r in plain])
    decode_json_lines(_sdk_lines() * 50)
    lines = [orjson.dumps(r) for r in plain]
    scanned, _ = decode_json_lines(lines)
    for fast, exact in ((wire, _upb([to_protobuf(r) for r in plain])), (scanned, _orjson_path(lines))):
        for name in ("spans", "events", "links"):
            assert getattr(fast, name).to_pylist() == getattr(exact, name).to_pylist(), name


def test_decoding_in_the_calling_thread_gives_what_the_workers_give(requests, tmp_path, monkeypatch):
    """``decode_ahead=0`` (no worker threads, as a Ray task may want) changes nothing."""
    ingest_module = importlib.import_module("nemo_telemetry.analysis.ingestion.ingest")  # the package exports ingest()
    monkeypatch.setattr(_detect, "JSON_BLOCK_BYTES", 2000)  # several batches
    monkeypatch.setattr(ingest_module, "BATCH_JSON_BYTES", 4000)
    lines = [orjson.dumps(r) for r in requests]
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n".join(lines + [b"garbage"] + lines[:2]) + b"\n")
    results = []
    for ahead in (0, 2):
        tables = []
        pipeline = ingest_module.IngestPipeline(lambda t: tables.append(t) or t, decode_ahead=ahead)
        pipeline.add_file(path, None)
        results.append((pipeline.summary(), [t.spans.to_pylist() for t in tables]))
    assert results[0] == results[1]
    assert results[0][0].rejected_records == 1 and len(results[0][1]) > 1


@pytest.mark.parametrize("lines", [
    [b"x" * 300] * 3 + [b""] * 200 + [b"y" * 1000, b"z"],  # long lines, then short ones
    [b"a", b"", b"bb"] * 100 + [b"c" * 5000],  # short from the start, then a long one
    [b"q" * 70_000] * 5,  # long lines only
])
@pytest.mark.parametrize("newline_at_end", [True, False])
def test_block_line_bounds_match_a_split_on_newlines(lines, newline_at_end):
    """Line bounds come from memchr for long lines and numpy for short ones; either way each
    line (its newline included) and its number are the ones a plain split gives."""
    body = b"\n".join(lines) + (b"\n" if newline_at_end else b"")
    record = _detect._block(_detect.Path("f.jsonl"), bytearray(body), len(body), 7)
    block = record.payload
    expected = body.splitlines(keepends=True)
    assert [block.line(i)[1] for i in range(len(block.starts))] == expected
    assert [block.line(i)[0] for i in range(len(block.starts))] == [f"f.jsonl:{7 + i}" for i in range(len(expected))]
