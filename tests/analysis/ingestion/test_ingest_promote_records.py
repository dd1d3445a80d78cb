"""Promotion straight from the protobuf walk's attribute records (``_promote.promote_records``) gives
the tables upb gives: every value kind on a promoted key, keys given twice, text that is not
ASCII, and the fallbacks (a promoted column with too many distinct values for the compiled
dictionary), none of which may keep a view of the buffers a thread reuses.
"""

from __future__ import annotations

import struct

import pytest

from nemo_telemetry.analysis.ingestion._columns import SpanColumns
from nemo_telemetry.analysis.ingestion._otlp_proto import decode_proto_request
from nemo_telemetry.analysis.ingestion._otlp_wire import WireError, decode_batch, decode_requests

# Tests of the compiled kernels: they take them on these small inputs too, as auto would not.
pytestmark = pytest.mark.usefixtures("compiled_kernels")

TRACE = bytes(range(1, 17))
SPAN = bytes(range(0xA0, 0xA8))


def varint(value: int) -> bytes:
    value &= 2**64 - 1
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def text(number: int, payload: bytes | str) -> bytes:
    payload = payload.encode() if isinstance(payload, str) else payload
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def attribute(key: str, any_value: bytes) -> bytes:
    return text(9, text(1, key) + text(2, any_value))


def string(value: str | bytes) -> bytes:
    return text(1, value)


def integer(value: int) -> bytes:
    return varint(3 << 3) + varint(value)


def boolean(value: bool) -> bytes:
    return varint(2 << 3) + varint(int(value))


def double(value: float) -> bytes:
    return varint(4 << 3 | 1) + struct.pack("<d", value)


def raw_bytes(value: bytes) -> bytes:
    return text(7, value)


def span(index: int, *attributes: bytes) -> bytes:
    span_id = SPAN[:-2] + index.to_bytes(2, "big")
    times = varint(7 << 3 | 1) + struct.pack("<Q", 1_000) + varint(8 << 3 | 1) + struct.pack("<Q", 2_000)
    return text(1, TRACE) + text(2, span_id) + text(5, "rl.step") + times + b"".join(attributes)


def request(*spans: bytes) -> bytes:
    resource = text(1, text(1, "service.name") + text(2, string("trainer")))
    scope_spans = text(1, text(1, "scope")) + b"".join(text(2, s) for s in spans)
    return text(1, text(1, resource) + text(2, scope_spans))


def upb(payloads: list[bytes]):
    cols = SpanColumns()
    for payload in payloads:
        decode_proto_request(payload, cols)
    return cols.to_tables()


def assert_same_as_upb(payloads: list[bytes]):
    fast, slow = decode_requests(payloads), upb(payloads)
    for name in ("spans", "events", "links"):
        assert getattr(fast, name).equals(getattr(slow, name)), name
    return fast.spans


DIGITS_IN_HEX = bytes.fromhex("1234")  # bytes whose schema string (hex) is all digits


def test_every_value_kind_on_every_promoted_key_reads_as_upb_reads_it():
    values = [
        string("productive"), string("42"), string("-7"), string("007"), string(""), string("+5"),
        integer(5), integer(-5), integer(10**18 - 1), integer(10**18), integer(-(10**18) + 1), integer(-(2**63)),
        boolean(True), boolean(False), double(2.0), double(0.5), raw_bytes(DIGITS_IN_HEX), raw_bytes(b"\xff"),
        b"",  # no value: null
    ]
    keys = ["rl.iteration", "rl.bucket", "rl.efficiency.category", "other"]
    spans = [span(i, attribute(key, value)) for i, (key, value) in enumerate((k, v) for k in keys for v in values)]
    table = assert_same_as_upb([request(*spans[:40]), request(*spans[40:])])
    iteration = table.column("rl.iteration").to_pylist()[: len(values)]  # ASCII: no fallback
    assert iteration[:4] == [None, 42, -7, 7] and iteration[6:12] == [5, -5, 10**18 - 1, None, -(10**18) + 1, None]
    assert iteration[16] == 1234  # the bytes' hex is a decimal integer
    bucket = table.column("rl.bucket").to_pylist()[len(values) : 2 * len(values)]
    assert bucket[:7] == ["productive", "42", "-7", "007", "", "+5", "5"] and bucket[12:14] == ["true", "false"]


def test_a_key_given_twice_promotes_its_last_value_and_drops_both():
    spans = [
        span(0, attribute("rl.bucket", string("first")), attribute("a", integer(1)), attribute("rl.bucket", string("last"))),
        span(1, attribute("rl.iteration", integer(3)), attribute("rl.iteration", string("three"))),
        span(2, attribute("rl.iteration", string("x")), attribute("rl.iteration", integer(4))),
        span(3, attribute("rl.bucket", string("only")), attribute("rl.bucket", b"")),
    ]
    table = assert_same_as_upb([request(*spans)])
    assert table.column("rl.bucket").to_pylist() == ["last", None, None, None]
    assert table.column("rl.iteration").to_pylist() == [None, None, 4, None]
    assert table.column("attributes").to_pylist()[:3] == [[("a", "1")], [("rl.iteration", "3"), ("rl.iteration", "three")], []]


@pytest.mark.parametrize("where", ["kept value", "kept key", "promoted value", "shadowed promoted value"])
def test_text_that_is_not_ascii_is_checked_as_utf8_wherever_it_lies(where):
    def spans_with(raw: bytes) -> list[bytes]:
        attributes = {
            "kept value": [attribute("k", string(raw))],
            "kept key": [text(9, text(1, raw) + text(2, integer(1)))],
            "promoted value": [attribute("rl.bucket", string(raw))],
            "shadowed promoted value": [attribute("rl.bucket", string(raw)), attribute("rl.bucket", string("later"))],
        }[where]
        return [span(0, attribute("rl.iteration", integer(1))), span(1, *attributes)]

    valid = request(*spans_with("größe ✓".encode()))
    assert_same_as_upb([valid])
    invalid = request(*spans_with(b"ok\xff\xfe"))
    with pytest.raises(WireError, match="UTF-8"):
        decode_requests([valid, invalid])
    tables, rejected = decode_batch([valid, invalid])
    assert [index for index, _ in rejected] == [1] and tables.spans.num_rows == 2


@pytest.mark.parametrize(
    "distinct",
    [
        pytest.param(lambda i: f"bucket-{i}", id="more values than the dictionary's slots"),
        pytest.param(lambda i: f"{i:04d}" + "x" * 1000, id="more bytes than the dictionary's room"),
    ],
)
def test_a_full_dictionary_falls_back_and_keeps_nothing_of_the_reused_buffers(distinct):
    """Two batches decoded back to back on one thread: the first one's tables (built by the
    fallback, from arrays cut out of the reused buffer and records) do not change."""
    def batch(tag: str) -> list[bytes]:
        spans = [span(i, attribute("rl.bucket", string(tag + distinct(i))), attribute("k", string(tag))) for i in range(2100)]
        return [request(*spans[:1000]), request(*spans[1000:])]

    first = batch("a")
    tables = decode_requests(first)
    decode_requests(batch("b"))
    expected = upb(first)
    assert tables.spans.equals(expected.spans)
    assert tables.spans.column("rl.bucket").to_pylist()[:2] == ["a" + distinct(0), "a" + distinct(1)]


def test_spans_without_attributes_and_a_batch_without_any():
    bare = [span(i) for i in range(3)]
    table = assert_same_as_upb([request(*bare)])
    assert table.column("attributes").to_pylist() == [[], [], []]
    mixed = assert_same_as_upb([request(*bare), request(span(7, attribute("rl.bucket", string("x"))))])
    assert mixed.column("rl.bucket").to_pylist() == [None, None, None, "x"]
