"""The compiled walk's one-byte fast paths read any valid encoding as upb reads it.

Requests are written byte by byte here (field order, lengths, tags the SDK never writes) and
each is decoded both ways: the fast path (``decode_requests``) and upb (``decode_proto_request``).
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
PARENT = bytes(range(0xF0, 0xF8))


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def tag(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def text(number: int, payload: bytes | str) -> bytes:
    payload = payload.encode() if isinstance(payload, str) else payload
    return tag(number, 2) + varint(len(payload)) + payload


def number(field: int, value: int) -> bytes:
    return tag(field, 0) + varint(value & (2**64 - 1))


def fixed64(field: int, value: int) -> bytes:
    return tag(field, 1) + struct.pack("<Q", value)


def key_value(key: str, any_value: bytes) -> bytes:
    return text(1, key) + text(2, any_value)


def span(*fields: bytes) -> bytes:
    return b"".join(fields)


def request(*spans: bytes, scope: bytes = text(1, "scope") + text(2, "1.0"),
            resource: bytes = text(1, key_value("service.name", text(1, "trainer")))) -> bytes:
    scope_spans = text(1, scope) + b"".join(text(2, s) for s in spans)
    return text(1, text(1, resource) + text(2, scope_spans))


def plain_fields() -> list[bytes]:
    return [
        text(1, TRACE), text(2, SPAN), text(4, PARENT), text(5, "rl.grpo.step"), number(6, 1),
        fixed64(7, 1_000), fixed64(8, 2_500), text(9, key_value("rl.iteration", number(3, 7))),
        text(9, key_value("rl.bucket", text(1, "productive"))), text(15, text(2, "fine") + number(3, 1)),
    ]


def upb(payloads: list[bytes]):
    cols = SpanColumns()
    for payload in payloads:
        decode_proto_request(payload, cols)
    return cols.to_tables()


def assert_same_as_upb(payloads: list[bytes]) -> list[dict]:
    fast, slow = decode_requests(payloads), upb(payloads)
    for name in ("spans", "events", "links"):
        assert getattr(fast, name).to_pylist() == getattr(slow, name).to_pylist(), name
    return fast.spans.to_pylist()


def test_fields_in_reverse_order_read_the_same():
    rows = assert_same_as_upb([request(span(*plain_fields()), span(*reversed(plain_fields())))])
    assert rows[0] == rows[1]
    assert rows[0]["trace_id"] == TRACE.hex() and rows[0]["parent_span_id"] == PARENT.hex()
    assert rows[0]["duration_ns"] == 1_500 and rows[0]["status_message"] == "fine"


def test_multi_byte_lengths_and_padded_tags():
    long_name = "rl." + "x" * 300  # a two-byte length
    fields = [
        text(1, TRACE), text(2, SPAN), text(5, long_name),
        text(9, key_value("k" * 200, text(1, "v" * 1000))),  # long key, long value, long attribute
        b"\xb9\x80\x00" + struct.pack("<Q", 42),  # start_time (7, fixed64) with a padded two-byte tag
        tag(8, 1) + struct.pack("<Q", 43),
    ]
    rows = assert_same_as_upb([request(span(*fields))])
    assert rows[0]["name"] == long_name and rows[0]["start_ns"] == 42
    assert dict(rows[0]["attributes"])["k" * 200] == "v" * 1000


def test_unknown_fields_are_skipped_at_every_level():
    unknown = number(16, 5) + fixed64(17, 9) + text(100, b"\x01\x02") + tag(2000, 5) + b"\0\0\0\0"
    span_fields = plain_fields()
    span_fields.insert(3, unknown)
    span_fields.insert(1, tag(16, 5) + struct.pack("<I", 1))  # Span.flags (fixed32), newer protos
    span_fields.append(text(9, key_value("rl.rank", unknown + number(3, 3) + unknown) + unknown))
    span_fields.append(text(15, unknown + number(3, 2)))
    body = span(*span_fields)
    payload = unknown + text(1, unknown + text(1, unknown) + unknown + text(2, unknown + text(2, body) + unknown))
    rows = assert_same_as_upb([payload, request(span(*plain_fields()))])
    assert dict(rows[0]["attributes"])["rl.rank"] == "3" and rows[0]["status_code"] == "error"


def test_known_field_numbers_with_another_wire_type_are_unknown_fields():
    fields = plain_fields() + [number(5, 3), fixed64(6, 1), number(9, 1), number(1, 0)]
    rows = assert_same_as_upb([request(span(*fields))])
    assert rows[0]["name"] == "rl.grpo.step" and rows[0]["trace_id"] == TRACE.hex()


def test_repeated_fields_last_one_wins():
    fields = plain_fields() + [
        text(5, "rl.second.name"), text(2, PARENT), text(4, b""), fixed64(7, 500), number(6, 3),
        text(9, key_value("mixed", text(1, "text") + number(3, -2))),  # an AnyValue oneof given twice
        text(15, number(3, 2)),  # a second status message merges into the first
    ]
    rows = assert_same_as_upb([request(span(*fields))])
    assert rows[0]["name"] == "rl.second.name" and rows[0]["span_id"] == PARENT.hex()
    assert rows[0]["parent_span_id"] is None and rows[0]["start_ns"] == 500
    assert dict(rows[0]["attributes"])["mixed"] == "-2" and rows[0]["status_message"] == "fine"


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(tag(7, 1) + b"\x01\x02\x03\x04", id="truncated fixed64"),
        pytest.param(text(5, "name")[:-2], id="truncated string"),
        pytest.param(tag(6, 0) + b"\xff\xff", id="truncated varint"),
        pytest.param(b"\xb9", id="truncated tag"),
    ],
)
def test_a_truncated_span_goes_to_upb_which_rejects_its_request(bad):
    good = request(span(*plain_fields()))
    broken = request(span(*plain_fields(), bad))
    with pytest.raises(WireError):
        decode_requests([good, broken])
    tables, rejected = decode_batch([good, broken, good])
    assert [index for index, _ in rejected] == [1]
    assert tables.spans.num_rows == 2


@pytest.mark.parametrize(
    "odd",
    [
        pytest.param(text(9, key_value("k", text(1, "a")) + text(2, number(3, 1))), id="attribute value twice"),
        pytest.param(text(3, "vendor=1") + tag(1, 3) + number(1, 1) + tag(1, 4), id="a group"),
        pytest.param(text(1, TRACE[:5]), id="short trace id"),
    ],
)
def test_encodings_the_fast_path_leaves_to_upb_decode_as_upb_does(odd):
    payloads = [request(span(*plain_fields(), odd)), request(span(*plain_fields()))]
    with pytest.raises(WireError):
        decode_requests(payloads)
    spans_rejected: list = []
    tables, rejected = decode_batch(payloads, spans_rejected)
    cols, expected_rejects = SpanColumns(), []
    for index, payload in enumerate(payloads):
        before = len(cols.rejected)
        try:
            decode_proto_request(payload, cols)
        except ValueError:
            expected_rejects.append(index)  # the whole request
        expected_rejects += [index] * (len(cols.rejected) - before)  # a span of it
    expected = cols.to_tables()
    assert sorted(index for index, _ in rejected + spans_rejected) == expected_rejects
    # the requests upb decodes come after the fast path's: the same rows, in another order
    assert sorted(tables.spans.to_pylist(), key=repr) == sorted(expected.spans.to_pylist(), key=repr)


def test_resource_and_scope_given_twice_merge_as_upb_merges():
    scope_spans = text(1, text(1, "a")) + text(1, text(2, "2.0")) + text(2, span(*plain_fields()))
    resource = text(1, key_value("service.name", text(1, "x")))
    payload = text(1, text(1, resource) + text(1, text(1, key_value("host.name", text(1, "h")))) + text(2, scope_spans))
    with pytest.raises(WireError):
        decode_requests([payload])
    tables, rejected = decode_batch([payload])
    assert rejected == [] and tables.spans.to_pylist() == upb([payload]).spans.to_pylist()
    row = tables.spans.to_pylist()[0]
    assert (row["scope_name"], row["scope_version"]) == ("a", "2.0")


@pytest.mark.parametrize(
    "field",
    [
        pytest.param(lambda raw: text(5, raw), id="name"),
        pytest.param(lambda raw: text(9, key_value("k", text(1, raw))), id="attribute value"),
        pytest.param(lambda raw: text(9, text(1, raw) + text(2, number(3, 1))), id="attribute key"),
        pytest.param(lambda raw: text(15, text(2, raw)), id="status message"),
    ],
)
def test_non_ascii_text_is_checked_as_utf8(field):
    valid = request(span(*plain_fields(), field("größe ✓".encode())))
    assert "größe ✓" in str(assert_same_as_upb([valid]))
    invalid = request(span(*plain_fields(), field(b"ok\xff\xfe")))
    with pytest.raises(WireError, match="UTF-8"):
        decode_requests([valid, invalid])
    tables, rejected = decode_batch([valid, invalid])
    assert [index for index, _ in rejected] == [1] and tables.spans.num_rows == 1


def test_attribute_shapes_near_the_usual_one_read_as_upb_reads_them():
    attributes = {
        "bool": key_value("bool", number(2, 1)),
        "false": key_value("false", number(2, 0)),
        "big": key_value("big", number(3, 300)),  # a two-byte varint
        "negative": key_value("negative", number(3, -7)),  # ten bytes
        "empty value": key_value("empty value", b""),
        "no value": text(1, "no value"),
        "value first": text(2, text(1, "x")) + text(1, "value first"),
        "int then more": key_value("int then more", number(3, 1) + number(3, 2)),
        "key twice": text(1, "first") + text(1, "key twice") + text(2, number(3, 5)),
        "": text(2, text(1, "no key")),
    }
    rows = assert_same_as_upb([request(span(*plain_fields(), *(text(9, a) for a in attributes.values())))])
    got = dict(rows[0]["attributes"])
    assert (got["bool"], got["false"], got["big"], got["negative"]) == ("true", "false", "300", "-7")
    assert got["empty value"] is None and got["no value"] is None
    assert (got["value first"], got["int then more"], got["key twice"], got[""]) == ("x", "2", "5", "no key")


def test_tables_keep_nothing_of_the_reused_buffer():
    """The joined bytes and the walk's matrices are per thread, overwritten by the next batch
    (of the same size here, so each record lands where the first batch's did)."""
    double = text(9, key_value("d", tag(4, 1) + struct.pack("<d", 0.5)))
    first = [request(span(*plain_fields(), double))] * 3
    swapped = [f.replace(TRACE, TRACE[::-1]).replace(SPAN, PARENT).replace(b"grpo", b"sfts") for f in plain_fields()]
    second = [request(span(*swapped, double.replace(b"\x00\xe0?", b"\x00\xe0@")), resource=text(1, key_value("service.name", text(1, "other!!"))))] * 3
    assert len(second[0]) == len(first[0])
    tables = decode_requests(first)
    decode_requests(second)
    expected = upb(first)
    for name in ("spans", "events", "links"):
        assert getattr(tables, name).to_pylist() == getattr(expected, name).to_pylist(), name


@pytest.mark.parametrize("most", [4096, 3])
def test_span_names_dictionary_encoded_as_arrow_encodes_them(monkeypatch, most):
    """Names of every length around the kernel's 8-byte steps, repeated and interleaved; past
    ``most`` distinct names a batch keeps plain strings. Either way the column equals upb's,
    dictionary order included."""
    monkeypatch.setattr("nemo_telemetry.analysis.ingestion._otlp_wire._MOST_NAMES", most)
    names = ["", "a", "rl.step", "rl.steps", "rl.steps!", "rl.steps?", "x" * 16, "x" * 17, "y" * 16, "größe"]
    spans = [span(*plain_fields()[:4], text(5, name), *plain_fields()[5:]) for name in names * 2 + names[::-1]]
    payloads = [request(*spans[:15]), request(*spans[15:])]
    fast, slow = decode_requests(payloads), upb(payloads)
    assert fast.spans.column("name").equals(slow.spans.column("name"))
    assert fast.spans.column("name").to_pylist() == names * 2 + names[::-1]


def test_span_names_numbered_alike_when_the_walk_grows_its_arrays():
    """Tiny spans, many to a request: the first arrays are too small, and the request that
    did not fit is walked again after its new names were numbered."""
    payloads = [
        request(*(span(text(1, TRACE), text(2, SPAN), text(5, f"n{r % 37}.{j % 4}"), fixed64(7, 1), fixed64(8, 2)) for j in range(10)))
        for r in range(300)
    ]
    fast, slow = decode_requests(payloads), upb(payloads)
    assert fast.spans.num_rows == 3000
    assert fast.spans.column("name").equals(slow.spans.column("name"))
    assert fast.spans.column("name").to_pylist() == slow.spans.column("name").to_pylist()
