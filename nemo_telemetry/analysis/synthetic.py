"""A synthetic RL run as OTLP requests, and writers for every dump format ingest reads.

For benchmarks and tests that need many spans fast: GRPO-like steps per rank, each with
generation, logprob, training, weight refit and idle waits, bucketed and stamped with
``rl.iteration`` as the instrumentation would. Requests are OTLP/JSON dicts (hex ids, int64
as strings, as the Collector writes them); :func:`to_protobuf` turns one into protobuf.
"""

from __future__ import annotations

import gzip
import random
import struct
from pathlib import Path
from typing import Iterable, Iterator

import orjson
import zstandard

__all__ = [
    "synthetic_requests",
    "to_protobuf",
    "write_json_lines",
    "write_length_prefixed",
]

# (name, rl.bucket or None, rl.efficiency.category or None, share of the step)
_STEP_SPANS = (
    ("rl.generation.generate", "productive", None, 0.40),
    ("rl.generation.request", "productive", None, 0.02),
    ("rl.policy.logprob", "productive", None, 0.08),
    ("rl.reference.logprob", "productive", None, 0.06),
    ("rl.policy.train", "productive", None, 0.25),
    ("rl.weights.refit", "overhead", None, 0.05),
    ("rl.data.collate", "overhead", None, 0.02),
    ("rl.efficiency.wait", "idle", "generation_straggler", 0.04),
    ("rl.efficiency.wait", "idle", "data_loader", 0.01),
    ("rl.checkpoint.save", "overhead", None, 0.03),
)
_STEP_NS = 30_000_000_000
_T0 = 1_767_225_600_000_000_000  # 2026-01-01


def _kv(key: str, value) -> dict:
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": value}}


def _resource(rank: int, world: int, run_id: str) -> dict:
    return {
        "attributes": [
            _kv("service.name", "grpo-trainer" if rank == 0 else "policy-worker"),
            _kv("nemo.run.id", run_id),
            _kv("rl.algorithm", "grpo"),
            _kv("nv.dl.rank", rank),
            _kv("nv.dl.world_size", world),
            _kv("host.name", f"node-{rank // 8}"),
        ]
    }


def _spans(rng: random.Random, total: int, ranks: int) -> Iterator[tuple[int, dict]]:
    """(rank, span) pairs: per iteration and rank, a step span and its children."""
    per_step = 1 + len(_STEP_SPANS)
    made = 0
    iteration = 0
    while made < total:
        for rank in range(ranks):
            trace = rng.getrandbits(128).to_bytes(16, "big").hex()
            step_id = rng.getrandbits(64).to_bytes(8, "big").hex()
            start = _T0 + iteration * _STEP_NS + rank * 1_000
            yield rank, {
                "traceId": trace,
                "spanId": step_id,
                "name": "rl.grpo.step",
                "kind": 1,
                "startTimeUnixNano": str(start),
                "endTimeUnixNano": str(start + _STEP_NS - 1_000_000),
                "attributes": [_kv("rl.iteration", iteration), _kv("rl.algorithm", "grpo")],
                "status": {},
            }
            offset = start
            for name, bucket, category, share in _STEP_SPANS:
                length = int(_STEP_NS * share * rng.uniform(0.8, 1.0))
                attributes = [_kv("rl.bucket", bucket), _kv("rl.iteration", iteration)]
                if category:
                    attributes.append(_kv("rl.efficiency.category", category))
                attributes.append(_kv("rl.microbatch", rng.randrange(16)))
                yield rank, {
                    "traceId": trace,
                    "spanId": rng.getrandbits(64).to_bytes(8, "big").hex(),
                    "parentSpanId": step_id,
                    "name": name,
                    "kind": 1,
                    "startTimeUnixNano": str(offset),
                    "endTimeUnixNano": str(offset + length),
                    "attributes": attributes,
                    "status": {},
                }
                offset += length
            made += per_step
            if made >= total:
                return
        iteration += 1


def synthetic_requests(
    spans: int, *, spans_per_request: int = 512, ranks: int = 8, run_id: str = "synthetic-run", seed: int = 0
) -> Iterator[dict]:
    """OTLP/JSON ``ExportTraceServiceRequest`` dicts holding ``spans`` spans in all (or a few more).

    Each request holds one rank's spans, as one process's batch span processor would send.
    """
    rng = random.Random(seed)
    pending: dict[int, list] = {rank: [] for rank in range(ranks)}
    for rank, span in _spans(rng, spans, ranks):
        pending[rank].append(span)
        if len(pending[rank]) >= spans_per_request:
            yield _request(rank, ranks, run_id, pending[rank])
            pending[rank] = []
    for rank, batch in pending.items():
        if batch:
            yield _request(rank, ranks, run_id, batch)


def _request(rank: int, world: int, run_id: str, spans: list) -> dict:
    scope = {"name": "nemo_telemetry", "version": "0.1.0"}
    return {
        "resourceSpans": [
            {"resource": _resource(rank, world, run_id), "scopeSpans": [{"scope": scope, "spans": spans}]}
        ]
    }


def to_protobuf(request: dict) -> bytes:
    """One OTLP/JSON request dict (hex ids) serialized as protobuf.

    The fields :func:`synthetic_requests` writes are encoded by hand (fast enough for a
    million spans); a dict with any other field goes through ``json_format.ParseDict``.
    """
    try:
        return b"".join(_len(1, _resource_spans(rs)) for rs in request["resourceSpans"])
    except _Unsupported:
        pass
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    message = ExportTraceServiceRequest()
    json_format.ParseDict(_ids_to_base64(request), message)
    return message.SerializeToString()


class _Unsupported(Exception):
    """A field the hand encoder does not know."""


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _len(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _known(obj: dict, keys: set) -> dict:
    if not keys.issuperset(obj):
        raise _Unsupported(sorted(set(obj) - keys))
    return obj


def _any_value(value: dict) -> bytes:
    (kind, v), = _known(value, {"stringValue", "intValue", "boolValue", "doubleValue"}).items()
    if kind == "stringValue":
        return _len(1, v.encode())
    if kind == "boolValue":
        return _varint(2 << 3) + _varint(int(v))
    if kind == "intValue":
        return _varint(3 << 3) + _varint(int(v))
    return _varint(4 << 3 | 1) + struct.pack("<d", float(v))


def _key_values(kvs: list) -> list[bytes]:
    return [_len(1, kv["key"].encode()) + _len(2, _any_value(kv["value"])) for kv in kvs]


def _resource_spans(rs: dict) -> bytes:
    _known(rs, {"resource", "scopeSpans"})
    out = b""
    if "resource" in rs:
        out += _len(1, b"".join(_len(1, kv) for kv in _key_values(_known(rs["resource"], {"attributes"})["attributes"])))
    for ss in rs.get("scopeSpans", ()):
        _known(ss, {"scope", "spans"})
        body = b""
        if "scope" in ss:
            scope = _known(ss["scope"], {"name", "version"})
            body += _len(1, _len(1, scope.get("name", "").encode()) + _len(2, scope.get("version", "").encode()))
        body += b"".join(_len(2, _span(span)) for span in ss.get("spans", ()))
        out += _len(2, body)
    return out


_SPAN_KEYS = {"traceId", "spanId", "parentSpanId", "traceState", "name", "kind", "startTimeUnixNano",
              "endTimeUnixNano", "attributes", "status"}


def _span(span: dict) -> bytes:
    _known(span, _SPAN_KEYS)
    out = _len(1, bytes.fromhex(span["traceId"])) + _len(2, bytes.fromhex(span["spanId"]))
    if span.get("traceState"):
        out += _len(3, span["traceState"].encode())
    if span.get("parentSpanId"):
        out += _len(4, bytes.fromhex(span["parentSpanId"]))
    out += _len(5, span.get("name", "").encode())
    if span.get("kind"):
        out += _varint(6 << 3) + _varint(int(span["kind"]))
    out += _varint(7 << 3 | 1) + struct.pack("<Q", int(span.get("startTimeUnixNano", 0)))
    out += _varint(8 << 3 | 1) + struct.pack("<Q", int(span.get("endTimeUnixNano", 0)))
    out += b"".join(_len(9, kv) for kv in _key_values(span.get("attributes", ())))
    status = _known(span.get("status") or {}, {"code", "message"})
    body = (_len(2, status["message"].encode()) if status.get("message") else b"") + (
        _varint(3 << 3) + _varint(int(status["code"])) if status.get("code") else b""
    )
    return out + _len(15, body)


def _ids_to_base64(obj):
    """Protobuf's JSON parser wants bytes fields in base64; OTLP/JSON writes ids in hex."""
    import base64

    if isinstance(obj, list):
        return [_ids_to_base64(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    out = {}
    for key, value in obj.items():
        if key in ("traceId", "spanId", "parentSpanId") and isinstance(value, str):
            value = base64.b64encode(bytes.fromhex(value)).decode()
        out[key] = _ids_to_base64(value)
    return out


def write_json_lines(path: str | Path, requests: Iterable[dict], *, compress: str | None = None) -> Path:
    """Collector file-exporter JSON lines; ``compress`` is None, ``gzip`` or ``zstd`` (whole file)."""
    path = Path(path)
    with _open_out(path, compress) as out:
        for request in requests:
            out.write(orjson.dumps(request) + b"\n")
    return path


def write_length_prefixed(
    path: str | Path, payloads: Iterable[bytes], *, zstd_records: bool = False, compress: str | None = None
) -> Path:
    """The Collector's length-prefixed protobuf: 4-byte big-endian length, then each payload."""
    path = Path(path)
    compressor = zstandard.ZstdCompressor() if zstd_records else None
    with _open_out(path, compress) as out:
        for payload in payloads:
            if compressor is not None:
                payload = compressor.compress(payload)
            out.write(struct.pack(">I", len(payload)) + payload)
    return path


def _open_out(path: Path, compress: str | None):
    if compress is None:
        return open(path, "wb")
    if compress == "gzip":
        return gzip.open(path, "wb", compresslevel=1)
    if compress == "zstd":
        return zstandard.ZstdCompressor().stream_writer(open(path, "wb"), closefd=True)
    raise ValueError(f"compress must be None, 'gzip' or 'zstd', not {compress!r}")
