"""A seeded mutation fuzzer over valid JSON-lines and length-prefixed protobuf dumps.

The base dump is small and realistic: several requests (records), each of two resources of
two scopes of three spans, with events, links and every kind of attribute value. A case
mutates one record (never the first: the first record tells the file's format) with a
seeded RNG: bit flips, truncations, field-type swaps (JSON), deep nesting, huge lengths and
varints, wrong wire types (protobuf), duplicated fields. Every case is read on both decoder
paths (the compiled one and the reference one, switched by ``NEMO_TELEMETRY_COMPILED``),
which must agree, and then:

- nothing but ``IngestError`` is raised;
- every span of every record the mutation did not touch is kept exactly (its row, events
  and links as in the unmutated dump);
- every span kept from the mutated record is one the record really holds (its ids), with
  the record's own timestamps: none negative, 0 or wrapped, never an end before its start
  that the input does not have;
- when spans of the mutated record are missing, ``rejected_records`` counts something.

Garbage cases mutate the whole file (framing and first record included): ``IngestError`` or
a summary, with sane timestamps. On failure the assertion names the seed and the case.
"""

from __future__ import annotations

import ast
import base64
import copy
import random
import struct

import orjson
import pytest
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from nemo_telemetry.analysis import load_traces
from nemo_telemetry.analysis.ingestion.anyvalue import MAX_VALUE_DEPTH
from nemo_telemetry.analysis.synthetic import to_protobuf
from nemo_telemetry.errors import IngestError

RECORDS = 4
CASES = 800  # per format; each case is read on both paths
GARBAGE_CASES = 250
SEED = 20261201
TOP = 1 << 63


# ---------------------------------------------------------------- the base dump


def _kv(key: str, value: dict) -> dict:
    return {"key": key, "value": value}


def _every_value_kind(tag: str) -> list[dict]:
    return [
        _kv("rl.bucket", {"stringValue": "productive"}),
        _kv("rl.iteration", {"intValue": "3"}),
        _kv("flag", {"boolValue": True}),
        _kv("ratio", {"doubleValue": 0.25}),
        _kv("blob", {"bytesValue": base64.b64encode(b"\x00\x01" + tag.encode()).decode()}),
        _kv("list", {"arrayValue": {"values": [{"stringValue": "a"}, {"intValue": "7"}, {"arrayValue": {"values": [{"boolValue": False}]}}]}}),
        _kv("map", {"kvlistValue": {"values": [_kv("inner", {"stringValue": tag}), _kv("n", {"doubleValue": 1.5})]}}),
        _kv("größe", {"stringValue": "ünïcode ✓ " + tag}),
    ]


def _base_requests() -> list[dict]:
    """RECORDS requests; the ids of each request are its own (trace ids differ in the record
    number), so no mutation of one can make a duplicate of another's span."""
    requests = []
    t0 = 1_767_225_600_000_000_000
    for r in range(RECORDS):
        resource_spans = []
        for res in range(2):
            scope_spans = []
            for sc in range(2):
                spans = []
                for k in range(3):
                    n = (res * 2 + sc) * 3 + k
                    trace = f"{r + 1:02x}{res:02x}" + "5e" * 14
                    start = t0 + r * 10**9 + n * 10**7
                    spans.append({
                        "traceId": trace,
                        "spanId": f"{r + 1:02x}{n:02x}" + "c3" * 6,
                        "parentSpanId": "" if k == 0 else f"{r + 1:02x}{n - 1:02x}" + "c3" * 6,
                        "name": f"rl.grpo.{['generate', 'train', 'sync'][k]}",
                        "kind": 1 + k,
                        "startTimeUnixNano": str(start),
                        "endTimeUnixNano": str(start + 5_000_000 + k),
                        "attributes": _every_value_kind(f"{r}.{n}"),
                        "events": [{"timeUnixNano": str(start + 1000), "name": "mark", "attributes": [_kv("e", {"intValue": str(n)})]}],
                        "links": [{"traceId": "77" * 16, "spanId": f"{n:02x}" * 8, "attributes": [_kv("why", {"stringValue": "follows"})]}],
                        "status": {"code": 2, "message": "boom"} if k == 2 else {},
                    })
                scope_spans.append({"scope": {"name": f"nemo.{sc}", "version": "1.0"}, "spans": spans})
            resource = {"attributes": [
                _kv("service.name", {"stringValue": f"svc-{res}"}),
                _kv("nemo.run.id", {"stringValue": "fuzz-run"}),
                _kv("nv.dl.rank", {"intValue": str(res)}),
                _kv("nemo.telemetry.span_groups", {"stringValue": "step,generation" if res else "default"}),
            ]}
            resource_spans.append({"resource": resource, "scopeSpans": scope_spans})
        requests.append({"resourceSpans": resource_spans})
    return requests


BASE = _base_requests()
JSON_RECORDS = [orjson.dumps(r) for r in BASE]
PROTO_RECORDS = [to_protobuf(r) for r in BASE]


def _json_file(records: list[bytes]) -> bytes:
    return b"".join(r + b"\n" for r in records)


def _proto_file(records: list[bytes]) -> bytes:
    return b"".join(struct.pack(">I", len(r)) + r for r in records)


# ---------------------------------------------------------------- JSON mutations


def _nodes(obj, path=()):
    """Every (path, value) in a parsed JSON document."""
    yield path, obj
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _nodes(value, path + (key,))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield from _nodes(value, path + (i,))


def _replace(obj, path, value):
    if not path:
        return value
    out = copy.deepcopy(obj)
    node = out
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return out


def _other_value(rng: random.Random):
    return rng.choice([
        None, True, False, 0, -1, 5, -(2**63), 2**63, 2**64 - 1, 1.5, -0.0, 1e300, "", "abc", "12", "-12",
        str(2**63), "0", "zz" * 16, "AAAA", [], [1, "x"], {}, {"stringValue": 1}, {"intValue": "x"},
    ])


def _nested_json(depth: int) -> bytes:
    """An AnyValue of ``depth`` nested arrays as JSON text (orjson writes at most 255 levels)."""
    return b'{"arrayValue":{"values":[' * depth + b'{"stringValue":"deep"}' + b"]}}" * depth


def _dumps_with_duplicate(obj, target, key, extra) -> bytes:
    """``obj`` as JSON with the object at ``target`` holding ``key`` twice: ``extra`` first."""
    def dump(node, path):
        if isinstance(node, dict):
            items = [orjson.dumps(k) + b":" + dump(v, path + (k,)) for k, v in node.items()]
            if path == target:
                items.insert(0, orjson.dumps(key) + b":" + orjson.dumps(extra))
            return b"{" + b",".join(items) + b"}"
        if isinstance(node, list):
            return b"[" + b",".join(dump(v, path + (i,)) for i, v in enumerate(node)) + b"]"
        return orjson.dumps(node)
    return dump(obj, ())


def _mutate_json(record: bytes, rng: random.Random) -> tuple[str, bytes]:
    kind = rng.choice(["bit flips", "truncation", "type swap", "type swap", "deep nesting", "duplicate field", "splice"])
    doc = orjson.loads(record)
    if kind == "bit flips":
        data = bytearray(record)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(data))
            data[at] ^= 1 << rng.randrange(8)
            if data[at] == 0x0A:  # a newline would end the line: it stays in the record
                data[at] = 0x20
        return kind, bytes(data)
    if kind == "truncation":
        return kind, record[: rng.randrange(len(record))]
    if kind == "type swap":
        path, _ = rng.choice(list(_nodes(doc))[1:])
        return f"{kind} at {path}", orjson.dumps(_replace(doc, path, _other_value(rng)))
    if kind == "deep nesting":
        values = [p for p, v in _nodes(doc) if p and p[-1] == "value" and isinstance(v, dict)]
        depth = rng.choice([MAX_VALUE_DEPTH, MAX_VALUE_DEPTH + 1, 100, 400])
        path = rng.choice(values)
        text = orjson.dumps(_replace(doc, path, "NESTED-HERE"))
        return f"{kind} {depth} at {path}", text.replace(b'"NESTED-HERE"', _nested_json(depth))
    if kind == "duplicate field":
        objects = [(p, v) for p, v in _nodes(doc) if isinstance(v, dict) and v]
        path, node = rng.choice(objects)
        key = rng.choice(list(node))
        other = rng.choice([node[key], _other_value(rng)])
        return f"{kind} {key!r} at {path}", _dumps_with_duplicate(doc, path, key, other)
    # splice: a piece of the record copied over another place in it
    a, b = sorted(rng.sample(range(len(record)), 2))
    at = rng.randrange(len(record))
    return kind, (record[:at] + record[a:b] + record[at + (b - a):]).replace(b"\n", b" ")


# ---------------------------------------------------------------- protobuf mutations

# message fields by (message, field number): the fields that hold messages, to walk into
_MESSAGES = {
    ("request", 1): "resource_spans", ("resource_spans", 1): "resource", ("resource_spans", 2): "scope_spans",
    ("resource", 1): "key_value", ("scope_spans", 1): "scope", ("scope_spans", 2): "span",
    ("scope", 3): "key_value", ("span", 9): "key_value", ("span", 11): "event", ("span", 13): "link",
    ("span", 15): "status", ("event", 3): "key_value", ("link", 4): "key_value", ("key_value", 2): "any_value",
    ("any_value", 5): "array_value", ("any_value", 6): "kvlist_value", ("array_value", 1): "any_value",
    ("kvlist_value", 1): "key_value",
}


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def _parse(data: bytes, message: str) -> list:
    """A valid message as a list of [field, wire, value]; sub-messages parsed in turn."""
    fields, pos = [], 0
    while pos < len(data):
        tag, pos = _read_varint(data, pos)
        field, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _read_varint(data, pos)
        elif wire == 1:
            value, pos = data[pos : pos + 8], pos + 8
        elif wire == 5:
            value, pos = data[pos : pos + 4], pos + 4
        else:
            length, pos = _read_varint(data, pos)
            value, pos = data[pos : pos + length], pos + length
            if (message, field) in _MESSAGES:
                value = _parse(value, _MESSAGES[(message, field)])
        fields.append([field, wire, value])
    return fields


def _serialize(fields: list) -> bytes:
    out = bytearray()
    for field, wire, value, *length in fields:
        out += _varint(field << 3 | wire)
        if wire == 0:
            out += _varint(value)
        elif wire in (1, 5):
            out += value
        else:
            body = _serialize(value) if isinstance(value, list) else value
            out += _varint(length[0] if length else len(body)) + body
    return bytes(out)


def _all_fields(fields: list, path=()):
    """Every (path, owner list, index) of a parsed message tree."""
    for i, entry in enumerate(fields):
        yield path + (i,), fields, i
        if isinstance(entry[2], list):
            yield from _all_fields(entry[2], path + (i,))


def _nested_any_value(depth: int) -> bytes:
    """An AnyValue of ``depth`` nested arrays around a string, serialized (built inside out)."""
    value = b"\x0a\x04deep"
    for _ in range(depth):
        values = b"\x0a" + _varint(len(value)) + value  # ArrayValue.values
        value = b"\x2a" + _varint(len(values)) + values  # AnyValue.array_value
    return value


def _mutate_proto(record: bytes, rng: random.Random) -> tuple[str, bytes]:
    kind = rng.choice(["bit flips", "truncation", "huge length", "huge varint", "wrong wire type",
                       "deep nesting", "duplicate field", "fixed64 past int64"])
    if kind == "bit flips":
        data = bytearray(record)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return kind, bytes(data)
    if kind == "truncation":
        return kind, record[: rng.randrange(len(record))]
    tree = _parse(record, "request")
    entries = list(_all_fields(tree))
    path, owner, i = rng.choice(entries)
    entry = owner[i]
    if kind == "huge length":
        lengths = [(p, o, j) for p, o, j in entries if o[j][1] == 2]
        path, owner, i = rng.choice(lengths)
        owner[i] = owner[i][:3] + [rng.choice([len(_serialize([owner[i]])) + 1, 2**31, 2**32 + 3, 2**63, 2**64 - 1])]
    elif kind == "huge varint":
        varints = [(p, o, j) for p, o, j in entries if o[j][1] == 0]
        if varints:
            path, owner, i = rng.choice(varints)
            owner[i][2] = rng.choice([2**63, 2**64 - 1, 2**32, -1 & (2**64 - 1)])
    elif kind == "wrong wire type":
        entry[1] = rng.choice([w for w in (0, 1, 2, 3, 4, 5, 6, 7) if w != entry[1]])
        if entry[1] in (1, 5) and not isinstance(entry[2], bytes):
            entry[2] = b"\x00" * (8 if entry[1] == 1 else 4)
        elif entry[1] == 0 and not isinstance(entry[2], int):
            entry[2] = 1
        elif entry[1] in (2, 3, 4, 6, 7) and isinstance(entry[2], int):
            entry[2] = b"\x01"
    elif kind == "deep nesting":
        depth = rng.choice([MAX_VALUE_DEPTH, MAX_VALUE_DEPTH + 1, 48, 3000])
        key_values = [(p, o, j) for p, o, j in entries if isinstance(o[j][2], list) and o[j][0] == 9]  # span attributes
        path, owner, i = rng.choice(key_values)
        owner[i][2] = [[1, 2, b"deep"], [2, 2, _nested_any_value(depth)]]
        kind = f"{kind} {depth}"
    elif kind == "duplicate field":
        owner.insert(i + rng.choice([0, 1]), copy.deepcopy(entry))
    else:  # a span's start or end past int64, legal on the wire
        fixed = [(p, o, j) for p, o, j in entries if o[j][1] == 1 and o[j][0] in (7, 8)]
        path, owner, i = rng.choice(fixed)
        owner[i][2] = struct.pack("<Q", rng.choice([2**63, 2**64 - 1, 2**63 + 7]))
    return f"{kind} at {path}", _serialize(tree)


# ---------------------------------------------------------------- what a record holds


def _hex_id(value, width: int) -> str | None:
    if isinstance(value, bytes):
        return value.hex() if len(value) == width else None
    if not isinstance(value, str):
        return None
    try:
        raw = bytes.fromhex(value) if len(value) == 2 * width else base64.b64decode(value, validate=True)
    except ValueError:
        return None
    return raw.hex() if len(raw) == width else None


def _as_int(value):
    if type(value) is int:
        return value
    if type(value) is str and value.lstrip("-").isdigit() and value.isascii():
        return int(value)
    return None


def _json_truth(record: bytes) -> tuple[dict, int] | None:
    """{(trace id, span id): (start, end)} of the spans a JSON record holds, and how many span
    objects it has; None when it is not JSON."""
    try:
        doc = orjson.loads(record)
    except orjson.JSONDecodeError:
        return None
    spans = {}
    count = 0
    for rs in _list(doc.get("resourceSpans") if isinstance(doc, dict) else None):
        for ss in _list(rs.get("scopeSpans") if isinstance(rs, dict) else None):
            for span in _list(ss.get("spans") if isinstance(ss, dict) else None):
                count += 1
                if isinstance(span, dict):
                    key = (_hex_id(span.get("traceId"), 16), _hex_id(span.get("spanId"), 8))
                    spans[key] = (_as_int(span.get("startTimeUnixNano")), _as_int(span.get("endTimeUnixNano")))
    return spans, count


def _list(value) -> list:
    return value if isinstance(value, list) else []


def _proto_truth(record: bytes) -> tuple[dict, int] | None:
    try:
        request = ExportTraceServiceRequest.FromString(record)
    except (DecodeError, RecursionError):
        return None
    spans = {}
    count = 0
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                count += 1
                spans[(_hex_id(span.trace_id, 16), _hex_id(span.span_id, 8))] = (span.start_time_unix_nano, span.end_time_unix_nano)
    return spans, count


# ---------------------------------------------------------------- the checks


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """Blocks of 64 KiB rather than 16 MiB: a fresh 16 MiB read buffer per tiny file would be
    most of each case's time (and a line or request may now end a block short)."""
    monkeypatch.setattr("nemo_telemetry.analysis.ingestion._detect.JSON_BLOCK_BYTES", 1 << 16)
    monkeypatch.setattr("nemo_telemetry.analysis.ingestion._detect.PROTO_BLOCK_BYTES", 1 << 16)


def _read(path, monkeypatch, compiled: bool, where: str):
    monkeypatch.setenv("NEMO_TELEMETRY_COMPILED", "1" if compiled else "0")
    try:
        return load_traces(path)
    except IngestError as exc:
        return exc
    except Exception as exc:  # the finding: named with its case
        path_name = "compiled" if compiled else "reference"
        raise AssertionError(f"{where}: {path_name} path raised {type(exc).__name__}: {exc}") from exc


def _rows(table) -> list:
    return sorted(table.to_pylist(), key=lambda row: (row["trace_id"], row["span_id"], repr(row)))


def _by_span(table) -> dict:
    out: dict = {}
    for row in table.to_pylist():
        out.setdefault((row["trace_id"], row["span_id"]), []).append(row)
    return {key: sorted(rows, key=repr) for key, rows in out.items()}


def _both_paths(path, monkeypatch, where: str):
    compiled, reference = _read(path, monkeypatch, True, where), _read(path, monkeypatch, False, where)
    if isinstance(compiled, IngestError) or isinstance(reference, IngestError):
        assert type(compiled) is type(reference), f"{where}: one path raised, the other did not: {compiled!r} / {reference!r}"
        return compiled
    assert compiled.summary == reference.summary, f"{where}: the paths' summaries differ"
    for table in ("spans", "events", "links"):
        assert _rows(getattr(compiled, table)) == _rows(getattr(reference, table)), f"{where}: the paths' {table} differ"
    return compiled


def _sane_timestamps(spans, where: str) -> None:
    for column in ("start_ns", "end_ns"):
        values = spans.column(column).to_pylist()
        assert all(v is not None and 0 < v < TOP for v in values), f"{where}: a {column} that is null, 0, negative or wrapped"


@pytest.fixture(scope="module")
def baselines(tmp_path_factory):
    """The unmutated dumps as read: rows, events and links of each span, by record."""
    out = {}
    directory = tmp_path_factory.mktemp("fuzz-base")
    for fmt, records, dump in (("json", JSON_RECORDS, _json_file), ("proto", PROTO_RECORDS, _proto_file)):
        path = directory / f"base.{fmt}"
        path.write_bytes(dump(records))
        tables = load_traces(path)
        assert tables.summary.rejected_records == 0 and tables.spans.num_rows == RECORDS * 12
        spans, events, links = _by_span(tables.spans), _by_span(tables.events), _by_span(tables.links)
        owners = [{(s["traceId"], s["spanId"]) for rs in r["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]} for r in BASE]
        out[fmt] = (spans, events, links, owners)
    return out


FORMATS = {
    "json": (JSON_RECORDS, _json_file, _mutate_json, _json_truth),
    "proto": (PROTO_RECORDS, _proto_file, _mutate_proto, _proto_truth),
}


def _siblings_kept(how: str, request: dict) -> list:
    """The spans a JSON type swap inside one span's fields (not the span object itself) must leave
    as they are: every other span of the request; a bad field costs only its span."""
    if not how.startswith("type swap at ("):
        return []
    path = ast.literal_eval(how[len("type swap at "):])
    if len(path) <= 6 or path[0] != "resourceSpans" or path[2] != "scopeSpans" or path[4] != "spans":
        return []
    return [(s["traceId"], s["spanId"]) for r, rs in enumerate(request["resourceSpans"])
            for c, ss in enumerate(rs["scopeSpans"]) for k, s in enumerate(ss["spans"]) if (r, c, k) != path[1:6:2]]


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_mutated_record_costs_only_itself(fmt, baselines, tmp_path, monkeypatch):
    records, dump, mutate, truth = FORMATS[fmt]
    spans0, events0, links0, owners = baselines[fmt]
    rng = random.Random(f"{SEED}-{fmt}")
    path = tmp_path / f"case.{fmt}"
    for case in range(CASES):
        seed = rng.randrange(2**32)
        case_rng = random.Random(seed)
        target = case_rng.randrange(1, RECORDS)
        how, mutated = mutate(records[target], case_rng)
        where = f"{fmt} case {case} (seed {seed}): record {target + 1}, {how}"
        path.write_bytes(dump(records[:target] + [mutated] + records[target + 1 :]))
        read = _both_paths(path, monkeypatch, where)
        assert not isinstance(read, IngestError), f"{where}: the file was refused ({read})"
        spans = _by_span(read.spans)
        events, links = _by_span(read.events), _by_span(read.links)
        untouched = set().union(*(owners[r] for r in range(RECORDS) if r != target))
        for key in untouched:
            assert spans.get(key) == spans0[key], f"{where}: untouched span {key} not kept exactly"
            assert events.get(key) == events0.get(key) and links.get(key) == links0.get(key), f"{where}: events/links of {key}"
        _sane_timestamps(read.spans, where)
        held = truth(mutated)
        from_mutated = {key: rows for key, rows in spans.items() if key not in untouched}
        if held is None:
            assert not from_mutated, f"{where}: spans kept from a record that is not {fmt}"
            assert read.summary.rejected_records > 0, f"{where}: an unreadable record not counted"
            continue
        truth_spans, count = held
        for key, rows in from_mutated.items():
            assert key in truth_spans, f"{where}: span {key} is not in the record"
            assert len(rows) == 1, f"{where}: span {key} kept twice"
            start, end = truth_spans[key]
            assert (rows[0]["start_ns"], rows[0]["end_ns"]) == (start, end), f"{where}: span {key} timestamps changed"
        if len(from_mutated) + read.summary.duplicates_dropped < count:
            assert read.summary.rejected_records > 0, f"{where}: spans dropped without a rejection counted"
        for key in _siblings_kept(how, BASE[target]):
            assert spans.get(key) == spans0[key], f"{where}: span {key} lost with the one mistyped field of another"


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_garbage_file_is_an_error_or_a_counted_summary(fmt, tmp_path, monkeypatch):
    records, dump, _, _ = FORMATS[fmt]
    rng = random.Random(f"{SEED}-garbage-{fmt}")
    path = tmp_path / f"garbage.{fmt}"
    whole = dump(records)
    for case in range(GARBAGE_CASES):
        seed = rng.randrange(2**32)
        case_rng = random.Random(seed)
        data = bytearray(whole)
        how = case_rng.choice(["bit flips", "truncation", "random bytes", "zeroed run"])
        if how == "bit flips":
            for _ in range(case_rng.randint(1, 40)):
                data[case_rng.randrange(len(data))] ^= 1 << case_rng.randrange(8)
        elif how == "truncation":
            del data[case_rng.randrange(1, len(data)) :]
        elif how == "random bytes":
            data = bytearray(case_rng.randbytes(case_rng.randrange(1, 2000)))
        else:
            at = case_rng.randrange(len(data))
            data[at : at + case_rng.randrange(1, 64)] = b"\x00" * 16
        where = f"{fmt} garbage case {case} (seed {seed}): {how}"
        path.write_bytes(bytes(data))
        read = _both_paths(path, monkeypatch, where)
        if isinstance(read, IngestError):
            continue
        _sane_timestamps(read.spans, where)
        if bytes(data) != whole and read.spans.num_rows < RECORDS * 12 and not read.summary.rejected_records:
            # fewer spans and nothing counted: only a cut at a record's end reads that way
            assert how == "truncation", f"{where}: spans lost without a rejection counted"
