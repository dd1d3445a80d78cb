"""The compiled JSON-lines scan passes over strings eight bytes at a time and copies them out
as it goes: escapes, multi-byte characters and odd ids anywhere in a string (at every offset
of a word) read as orjson reads them, and what is not JSON is still left to orjson."""

from __future__ import annotations

import copy

import orjson
import pytest

from nemo_telemetry.analysis.ingestion._columns import SpanColumns
from nemo_telemetry.analysis.ingestion._otlp_json import decode_json_request
from nemo_telemetry.analysis.ingestion._otlp_json_fast import LINE_FALLBACK, LINE_OK, decode_json_lines
from nemo_telemetry.analysis.synthetic import synthetic_requests

from test_ingest_json_scan import _orjson_path

# Tests of the compiled kernels: they take them on these small inputs too, as auto would not.
pytestmark = pytest.mark.usefixtures("compiled_kernels")


@pytest.fixture(scope="module")
def request_dict():
    return next(synthetic_requests(3, spans_per_request=3, ranks=1))


def _spans(request):
    return request["resourceSpans"][0]["scopeSpans"][0]["spans"]


def _assert_scan_equals_orjson(lines):
    fast, status = decode_json_lines(lines)
    assert status.tolist() == [LINE_OK] * len(lines)
    slow = _orjson_path(lines)
    for name in ("spans", "events", "links"):
        assert getattr(fast, name).to_pylist() == getattr(slow, name).to_pylist(), name
    return fast


@pytest.mark.parametrize("piece", ['"', "\\", "\n", "é", "\u2603", "\\u", "\U0001f600"])
def test_escapes_and_wide_characters_at_every_offset(request_dict, piece):
    """``piece`` at each position of strings 0-24 characters long, in every string field the
    scan copies (name, trace state, status message, attribute key and value)."""
    lines = []
    for length in range(25):
        for at in range(0, length + 1, 3 if length > 12 else 1):
            text = ("abcdefghijklmnopqrstuvwxy"[:at] + piece + "ABCDEFGHIJKLMNOPQRSTUVWXY"[at:length])
            request = copy.deepcopy(request_dict)
            span = _spans(request)[1]
            span["name"] = span["traceState"] = text
            span["status"] = {"code": 2, "message": text}
            span["attributes"].append({"key": text, "value": {"stringValue": text}})
            lines.append(orjson.dumps(request))
    fast = _assert_scan_equals_orjson(lines)
    assert any(piece + "ABC" in name for name in fast.spans.column("name").to_pylist())


def test_strings_at_the_very_end_of_a_line(request_dict):
    """A string value that ends within the last 8 bytes of its line (no room for a whole
    word after it), with and without a trailing CRLF."""
    request = copy.deepcopy(request_dict)
    request["resourceSpans"][0]["schemaUrl"] = "https://x"
    line = orjson.dumps(request)
    _assert_scan_equals_orjson([line, line + b"\r\n", b" " + line + b"\n"])


@pytest.mark.parametrize("broken", [
    b"raw\x01control character in a long string value",
    b"raw tab\tin a long string value",
    b"short\x1f",
])
def test_control_characters_in_strings_are_left_to_orjson(request_dict, broken):
    request = copy.deepcopy(request_dict)
    _spans(request)[0]["name"] = "PLACEHOLDER"
    line = orjson.dumps(request).replace(b"PLACEHOLDER", broken)
    good = orjson.dumps(request_dict)
    tables, status = decode_json_lines([good, line, good])
    assert status.tolist() == [LINE_OK, LINE_FALLBACK, LINE_OK]
    assert tables.spans.num_rows == 2 * len(_spans(request_dict))


@pytest.mark.parametrize("cut", range(1, 30))
def test_a_line_cut_inside_a_string_is_left_to_orjson(request_dict, cut):
    line = orjson.dumps(request_dict)
    at = line.index(b'"name":"') + 8 + cut  # inside (or just past) the first span's name
    _, status = decode_json_lines([line[:at]])
    assert status.tolist() == [LINE_FALLBACK]


def test_ids_in_any_case_of_the_right_length_or_not(request_dict):
    """Upper- and mixed-case hex ids read as orjson reads them; ids of the wrong length, with a
    non-hex digit or empty go to the exact path, which rejects those spans alone and names the
    field."""
    lines = []
    for change in (str.upper, lambda s: s[:5].upper() + s[5:]):
        request = copy.deepcopy(request_dict)
        for span in _spans(request):
            for field in ("traceId", "spanId", "parentSpanId"):
                if field in span:
                    span[field] = change(span[field])
        lines.append(orjson.dumps(request))
    for line in lines:
        fast = _assert_scan_equals_orjson([line])
        assert all(i == i.lower() for i in fast.spans.column("span_id").to_pylist())
    _assert_scan_equals_orjson(lines)
    for field in ("traceId", "spanId", "parentSpanId"):
        for change in (lambda s: s[:-1], lambda s: s + "0", lambda s: s[:-1] + "g", lambda s: ""):
            request = copy.deepcopy(request_dict)
            span = next(s for s in _spans(request) if field in s)
            span[field] = change(span[field])
            if field == "parentSpanId" and span[field] == "":
                continue  # no parent: a root span, kept
            tables, status = decode_json_lines([orjson.dumps(request_dict), orjson.dumps(request)])
            # the scan sees a wrong length in its line; a non-hex digit only when it converts
            # the block's ids, and then the whole block goes to the exact path
            bad_digit = span[field].endswith("g")
            assert status.tolist() == [LINE_FALLBACK if bad_digit else LINE_OK, LINE_FALLBACK]
            cols = SpanColumns()
            decode_json_request(request, cols)
            assert len(cols) == len(_spans(request)) - 1, (field, span[field])
            assert len(cols.rejected) == 1 and f"malformed trace/span ids: {field}" in cols.rejected[0]


@pytest.mark.parametrize("field", ["name", "traceState", "status message", "attribute key", "attribute value"])
@pytest.mark.parametrize("bad_bytes", [b"bad \xff\xfe byte in a long string", b"\xc3", b"\xe2\x98"])
def test_invalid_utf8_in_a_string_sends_the_block_to_the_exact_path(request_dict, field, bad_bytes):
    """Strings copied out by the scan are UTF-8 checked: a bad byte in any copied field, in a
    long string or a short one (a cut multi-byte character), is caught."""
    request = copy.deepcopy(request_dict)
    span = _spans(request)[1]
    if field == "status message":
        span["status"] = {"message": "PLACEHOLDER"}
    elif field.startswith("attribute"):
        span["attributes"].append({"key": "PLACEHOLDER" if field == "attribute key" else "k",
                                   "value": {"stringValue": "PLACEHOLDER" if field == "attribute value" else "v"}})
    else:
        span[field] = "PLACEHOLDER"
    bad = orjson.dumps(request).replace(b"PLACEHOLDER", bad_bytes)
    _, status = decode_json_lines([orjson.dumps(request_dict), bad])
    assert status.tolist() == [LINE_FALLBACK, LINE_FALLBACK]


@pytest.mark.parametrize("quoted", [True, False])
def test_integers_of_every_length(request_dict, quoted):
    """Timestamps and int values of 1 to 19 digits (read eight digits a step where eight are
    there), negative ones, and int64's largest, as strings (protobuf's JSON mapping) or numbers."""
    values = [int("9" * n) for n in range(1, 19)] + [int("1" + "0" * (n - 1)) for n in range(1, 20)]
    values += [0, -1, -12345678, -123456789012345678, 2**63 - 1, -(2**63 - 1), 1767225610221400200]
    lines = []
    for value in values:
        request = copy.deepcopy(request_dict)
        span = _spans(request)[0]
        written = str(value) if quoted else value
        start, end = abs(value) or 1, abs(value) // 3 or 1  # 0: absent, which the scan leaves alone
        span["startTimeUnixNano"] = str(start) if quoted else start
        span["endTimeUnixNano"] = str(end) if quoted else end
        span["attributes"].append({"key": "n", "value": {"intValue": written}})
        lines.append(orjson.dumps(request))
    fast = _assert_scan_equals_orjson(lines)
    assert str(-(2**63 - 1)) in [v for row in fast.spans.column("attributes").to_pylist() for k, v in row if k == "n"]


@pytest.mark.parametrize("value", [str(2**63), str(-(2**63)), "1" * 25])
def test_integers_past_the_scan_are_left_to_orjson(request_dict, value):
    """Past int64, and int64's smallest (rare enough to leave to the exact path)."""
    request = copy.deepcopy(request_dict)
    _spans(request)[0]["attributes"].append({"key": "n", "value": {"intValue": value}})
    _, status = decode_json_lines([orjson.dumps(request), orjson.dumps(request_dict)])
    assert status.tolist() == [LINE_FALLBACK, LINE_OK]


def test_keys_in_any_order_with_spaces_and_skippable_fields(request_dict):
    """Keys are matched as whole words when written ``"key":`` in the usual order; reordered,
    spaced (``json.dumps``' default separators) or skippable ones take the string path."""
    import json

    reordered = copy.deepcopy(request_dict)
    for span in _spans(reordered):
        span.update({"flags": 257, "droppedAttributesCount": 0})
        for attribute in span["attributes"]:
            attribute["droppedAttributesCount"] = 0
        items = list(span.items())[::-1]
        span.clear()
        span.update(items)
        span["attributes"] = [dict(list(a.items())[::-1]) for a in span["attributes"]]
    spaced = json.dumps(request_dict, indent=None).encode()
    assert b'"traceId": "' in spaced
    _assert_scan_equals_orjson([orjson.dumps(reordered), spaced, orjson.dumps(request_dict)])
    unknown = copy.deepcopy(request_dict)
    _spans(unknown)[0]["someNewField"] = 1
    _, status = decode_json_lines([orjson.dumps(unknown)])
    assert status.tolist() == [LINE_FALLBACK]


@pytest.mark.parametrize("attribute", [
    b'{"key":"b","value":{"boolValue":true}}',
    b'{"key":"b","value":{"boolValue":false}}',
    b'{"key":"b","value":{"boolValue":"true"}}',  # not JSON's bool: the long way, as before
    b'{"key":"i","value":{"intValue":-42}}',
    b'{"key":"i","value":{"intValue":"42"}}',
    b'{"key":"d","value":{"doubleValue":0.5}}',
    b'{"key":"s","value":{"stringValue":"a\\"b"}}',
    b'{"key":"k\\u00e9","value":{"stringValue":""}}',
    b'{"value":{"stringValue":"v"},"key":"reversed"}',
    b'{"key":"no value"}',
    b'{"key":"s","value":{}}',
    b'{"key":"s", "value": {"stringValue": "spaced"}}',
    b'{"key":"s","value":{"stringValue":"x","intValue":"1"}}',  # two kinds (not OTLP): the exact path decides
    b'{"key":"s","value":{"stringValue":"x"},"droppedAttributesCount":0}',
])
def test_attributes_written_compactly_or_not(request_dict, attribute):
    """Attributes as writers write them are read in one go; any other shape the long way;
    both as orjson reads them, the odd attribute first in one span and last in another."""
    line = orjson.dumps(request_dict)
    marker = b'"attributes":['
    first = line.index(marker) + len(marker)
    line = line[:first] + attribute + b"," + line[first:]  # the first of the first span's
    last = line.rindex(b'],"status"')
    line = line[:last] + b"," + attribute + line[last:]  # the last of the last span's
    _assert_scan_equals_orjson([line])


def test_id_words_for_the_deduplicator_equal_the_parsed_hex_ids(request_dict):
    """The scan hands the deduplicator each span's id words from the digits it read (any case);
    they must be what parsing the table's hex ids gives, or duplicates would slip through."""
    from nemo_telemetry.analysis.store.dataset import span_keys

    upper = copy.deepcopy(request_dict)
    for span in _spans(upper):
        span["traceId"], span["spanId"] = span["traceId"].upper(), span["spanId"].upper()
    lines = [orjson.dumps(r) for r in synthetic_requests(300, spans_per_request=30, ranks=2)]
    tables, _ = decode_json_lines(lines + [orjson.dumps(upper)])
    assert tables.span_words is not None and tables.span_words.shape == (tables.spans.num_rows, 3)
    assert (tables.span_words == span_keys(tables.spans)).all()
