"""``collect`` acknowledges only what is durable: a full filesystem (a real tmpfs) answers 503
with Retry-After, loses nothing it acknowledged, recovers when space is freed, and counts what
it was left holding."""

from __future__ import annotations

import logging

import httpx

from nemo_telemetry.analysis import read_spans
from nemo_telemetry.analysis.ingestion.collect import RETRY_AFTER_S, CollectorServer
from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf

PROTOBUF = {"Content-Type": "application/x-protobuf"}


def _requests(count: int) -> list[bytes]:
    """``count`` protobuf requests of 20 spans each, no span in two of them."""
    return [to_protobuf(r) for r in synthetic_requests(20 * count, spans_per_request=20, ranks=1)][:count]


def test_full_filesystem_is_503_then_recovers_and_nothing_acknowledged_is_lost(small_filesystem, caplog):
    first, during, retried, after = _requests(4)
    dataset = small_filesystem.root / "ds"
    caplog.set_level(logging.WARNING, logger="nemo_telemetry.analysis.ingestion.collect")
    with CollectorServer(dataset, port=0) as server, httpx.Client() as client:
        assert client.post(server.traces_url, content=first, headers=PROTOBUF).status_code == 200
        small_filesystem.fill()
        for body in (during, retried, during):
            response = client.post(server.traces_url, content=body, headers=PROTOBUF)
            assert (response.status_code, response.headers.get("retry-after")) == (503, str(RETRY_AFTER_S))
        small_filesystem.free()
        for body in (retried, after):  # an exporter retrying, and new spans
            assert client.post(server.traces_url, content=body, headers=PROTOBUF).status_code == 200
    summary = server.summary()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "No space left on device" in errors[0].getMessage()  # once, not per request
    assert any("works again" in r.getMessage() for r in caplog.records)
    assert (summary.spans, summary.unavailable_requests) == (60, 3)
    assert summary.unwritten_spans == 20  # ``during``: never retried once space was back
    assert "No space left on device" in summary.write_error
    assert read_spans(dataset).num_rows == 60
