"""A receiver offered beyond loopback: a bearer token checked on every request (401 otherwise)
and TLS, for ``collect`` and ``monitor --port``. The real SDK exporter with its own ``headers``
and ``certificate_file`` settings, against a self-signed certificate made here; raw sockets for
what the exporter cannot send."""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import socket
import ssl
import time

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from google.rpc.status_pb2 import Status
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult

from nemo_telemetry.analysis import ReceiverSecurityError, read_spans, read_token_file
from nemo_telemetry.analysis.ingestion.collect import CollectorServer
from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf
from _monitor_receiver import monitor_receiver

TOKEN = "s3cr3t-token-0123456789abcdef"
PROTOBUF = {"Content-Type": "application/x-protobuf"}


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1 and localhost, and its key (PEM files)."""
    folder = tmp_path_factory.mktemp("tls")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nemo-telemetry test receiver")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=False,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture(autouse=True)
def _no_ca_bundle_override(monkeypatch):
    """requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE (set on many machines) override a
    session's ``verify``, so the exporter's ``certificate_file`` is ignored where they are set."""
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)


@pytest.fixture()
def guarded(tmp_path, certificate):
    cert, key = certificate
    server = CollectorServer(tmp_path / "ds", port=0, token=TOKEN, tls_cert=cert, tls_key=key,
                             read_timeout_s=5).start()
    yield server
    server.stop()


def _export(url: str, n: int, **settings) -> tuple[SpanExportResult, set]:
    """Export ``n`` spans with the real SDK exporter configured by ``settings``; its last result
    and the ids it sent."""
    results, ids = [], set()

    class Exporter(OTLPSpanExporter):
        def export(self, spans):
            ids.update((f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}") for s in spans)
            results.append(super().export(spans))
            return results[-1]

    provider = TracerProvider(resource=Resource.create({"service.name": "trainer", "nemo.run.id": "guarded"}))
    provider.add_span_processor(SimpleSpanProcessor(Exporter(endpoint=url, timeout=3, **settings)))
    tracer = provider.get_tracer("test")
    for step in range(n):
        with tracer.start_as_current_span("rl.grpo.step", attributes={"rl.iteration": step}):
            pass
    provider.shutdown()
    assert len(set(results)) == 1, results
    return results[0], ids


def _stored(path) -> set:
    if not (path / "spans").is_dir():
        return set()
    spans = read_spans(path)
    return set(zip(spans.column("trace_id").to_pylist(), spans.column("span_id").to_pylist()))


def test_the_sdk_exporter_with_its_token_header_and_certificate_file_is_stored(guarded, certificate, tmp_path):
    assert guarded.traces_url.startswith("https://127.0.0.1:")
    result, sent = _export(guarded.traces_url, 20, headers={"Authorization": f"Bearer {TOKEN}"},
                           certificate_file=str(certificate[0]))
    assert result is SpanExportResult.SUCCESS
    guarded.stop()
    assert _stored(tmp_path / "ds") == sent and len(sent) == 20


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {TOKEN}x"},
                                     {"Authorization": f"Bearer {TOKEN[:-1]}"}, {"Authorization": f"Basic {TOKEN}"},
                                     {"Authorization": TOKEN}],
                         ids=["none", "wrong", "longer", "shorter", "basic-scheme", "no-scheme"])
def test_a_request_without_the_token_is_401_and_stores_nothing(guarded, certificate, tmp_path, headers):
    result, _ = _export(guarded.traces_url, 3, headers=headers, certificate_file=str(certificate[0]))
    assert result is SpanExportResult.FAILURE
    response = httpx.post(guarded.traces_url, content=to_protobuf(next(synthetic_requests(5, ranks=1))),
                          headers={**PROTOBUF, **headers}, verify=ssl.create_default_context(cafile=certificate[0]))
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert "bearer token" in Status.FromString(response.content).message
    guarded.stop()
    assert guarded.summary().rejected_requests == 4  # the SDK's 3 spans, one request each, and httpx's
    assert _stored(tmp_path / "ds") == set()


def test_the_scheme_name_is_case_insensitive(guarded, certificate):
    verify = ssl.create_default_context(cafile=certificate[0])
    body = to_protobuf(next(synthetic_requests(5, ranks=1)))
    response = httpx.post(guarded.traces_url, content=body, verify=verify,
                          headers={**PROTOBUF, "Authorization": f"bearer   {TOKEN}"})
    assert response.status_code == 200


def test_an_exporter_that_does_not_trust_the_certificate_or_speaks_plain_http_is_not_served(
        guarded, certificate, tmp_path):
    result, _ = _export(guarded.traces_url, 1, headers={"Authorization": f"Bearer {TOKEN}"})  # the system CAs only
    assert result is SpanExportResult.FAILURE
    plain = guarded.traces_url.replace("https://", "http://")
    with pytest.raises(httpx.HTTPError):
        httpx.post(plain, content=b"x", headers={**PROTOBUF, "Authorization": f"Bearer {TOKEN}"}, timeout=5)
    result, sent = _export(guarded.traces_url, 2, headers={"Authorization": f"Bearer {TOKEN}"},
                           certificate_file=str(certificate[0]))
    assert result is SpanExportResult.SUCCESS  # still serving
    guarded.stop()
    summary = guarded.summary()
    assert summary.failed_handshakes >= 2 and summary.spans == 2
    assert _stored(tmp_path / "ds") == sent


def test_stop_is_not_held_up_by_a_tls_client_stalled_inside_its_body(guarded, certificate, capfd):
    context = ssl.create_default_context(cafile=certificate[0])
    host, port = guarded._httpd.server_address[:2]
    body = to_protobuf(next(synthetic_requests(11, ranks=1)))
    with socket.create_connection((host, port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
        head = (f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                f"Authorization: Bearer {TOKEN}\r\nContent-Length: {len(body)}\r\n\r\n")
        sock.sendall(head.encode() + body[:30])  # and nothing more
        time.sleep(0.3)
        began = time.monotonic()
        guarded.stop()
        assert time.monotonic() - began < 3
        # its TLS session ended with its reads, the connection is closed unanswered: the exporter retries
        with pytest.raises((ssl.SSLError, ConnectionError, http.client.RemoteDisconnected)):
            http.client.HTTPResponse(sock).begin()
    assert guarded.summary().unavailable_requests == 1
    assert "Traceback" not in capfd.readouterr().err


def test_an_idle_tls_connection_is_closed_at_the_read_timeout(tmp_path, certificate, capfd):
    cert, key = certificate
    context = ssl.create_default_context(cafile=cert)
    body = to_protobuf(next(synthetic_requests(5, ranks=1)))
    with CollectorServer(tmp_path / "ds", port=0, token=TOKEN, tls_cert=cert, tls_key=key, read_timeout_s=0.5) as server:
        host, port = server._httpd.server_address[:2]
        with socket.create_connection((host, port), timeout=10) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            head = (f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                    f"Authorization: Bearer {TOKEN}\r\nContent-Length: {len(body)}\r\n\r\n")
            sock.sendall(head.encode() + body)
            response = http.client.HTTPResponse(sock)
            response.begin()
            assert response.status == 200
            response.read()
            began = time.monotonic()
            assert sock.recv(100) == b""  # closed by the server, idle past its read timeout
            assert time.monotonic() - began < 5
        with socket.create_connection((host, port), timeout=10) as silent:  # no handshake at all
            assert silent.recv(100) == b""
    assert server.summary().failed_handshakes == 1
    assert "Traceback" not in capfd.readouterr().err


def test_a_token_without_tls_guards_plain_http(tmp_path):
    with CollectorServer(tmp_path / "ds", port=0, token=TOKEN) as server:
        body = to_protobuf(next(synthetic_requests(5, ranks=1)))
        assert httpx.post(server.traces_url, content=body, headers=PROTOBUF).status_code == 401
        assert httpx.post(server.traces_url, content=body,
                          headers={**PROTOBUF, "Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_monitor_port_with_a_token_and_tls_takes_the_sdk_exporters_spans(tmp_path, certificate):
    cert, key = certificate
    with monitor_receiver(tmp_path / "ds", token=TOKEN, tls_cert=cert, tls_key=key) as (where, summaries):
        assert where["traces_url"].startswith("https://") and where["unguarded"] is False
        denied, _ = _export(where["traces_url"], 2, certificate_file=str(cert))
        result, sent = _export(where["traces_url"], 10, headers={"Authorization": f"Bearer {TOKEN}"},
                               certificate_file=str(cert))
    assert (denied, result) == (SpanExportResult.FAILURE, SpanExportResult.SUCCESS)
    assert summaries[0].spans == 10 and summaries[0].receiver.rejected_requests == 2
    assert _stored(tmp_path / "ds") == sent


def test_beyond_loopback_without_a_token_is_refused_unless_insecure(tmp_path):
    with pytest.raises(ReceiverSecurityError, match="without a bearer token.*--token-file.*--insecure"):
        CollectorServer(tmp_path / "ds", host="0.0.0.0", port=0)
    assert not (tmp_path / "ds").exists()  # refused before anything is written
    with CollectorServer(tmp_path / "ds", host="0.0.0.0", port=0, insecure=True) as server:
        assert server.unguarded
    with CollectorServer(tmp_path / "ds", host="0.0.0.0", port=0, token=TOKEN) as server:
        assert not server.unguarded
    for loopback in ("127.0.0.1", "localhost", "127.0.0.2"):
        with CollectorServer(tmp_path / "ds", host=loopback, port=0) as server:
            assert not server.unguarded


@pytest.mark.parametrize(("text", "problem"), [("", "empty"), ("\n\n", "empty"), ("has space\n", "printable ASCII"),
                                                ("t\u00f6ken", "printable ASCII")])
def test_a_token_file_without_a_usable_token_is_refused_naming_it(tmp_path, text, problem):
    path = tmp_path / "token"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ReceiverSecurityError, match=problem) as raised:
        read_token_file(path)
    assert str(path) in str(raised.value)


def test_a_token_file_holds_the_token_on_its_first_line(tmp_path):
    path = tmp_path / "token"
    path.write_text(f"  {TOKEN}  \n# comment\n")
    assert read_token_file(path) == TOKEN
    with pytest.raises(ReceiverSecurityError, match="cannot read"):
        read_token_file(tmp_path / "missing")


def test_a_certificate_without_its_key_or_unloadable_is_refused(tmp_path, certificate):
    cert, key = certificate
    with pytest.raises(ReceiverSecurityError, match="together"):
        CollectorServer(tmp_path / "ds", port=0, tls_cert=cert)
    with pytest.raises(ReceiverSecurityError, match="cannot load"):
        CollectorServer(tmp_path / "ds", port=0, tls_cert=key, tls_key=cert)
