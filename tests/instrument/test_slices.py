"""Exporters encode a batch in slices and give the GIL back between them; the output is the unsliced one."""

from __future__ import annotations

import http.server
import json
import logging
import sys
import threading
import warnings

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from nemo_telemetry.instrument import DumpSpanExporter
from nemo_telemetry.instrument._config import TelemetryConfig
from nemo_telemetry.instrument._dump import encode_line, spans_to_otlp_json
from nemo_telemetry.instrument._lifecycle import make_span_exporter
from nemo_telemetry.instrument._slices import SlicePacer, hurried, merge_requests, sliced_span_exporter


class _Clock:
    """A settable monotonic clock; ``sleep`` advances it and records each rest."""

    def __init__(self) -> None:
        self.now = 100.0
        self.rests: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.rests.append(seconds)
        self.now += seconds


def _spans(count: int) -> list:
    """``count`` finished spans from two resources and two scopes, interleaved (as a batch can be)."""
    memory = InMemorySpanExporter()
    providers = []
    for rank in (0, 1):
        provider = TracerProvider(resource=Resource.create({"service.name": f"trainer-{rank}", "nv.dl.rank": rank,
                                                            "nemo.run.id": "run-1"}))
        provider.add_span_processor(SimpleSpanProcessor(memory))
        providers.append(provider)
    tracers = [provider.get_tracer(scope, "1.0") for provider in providers for scope in ("nemo_telemetry", "other")]
    for i in range(count):
        tracer = tracers[(i * 7 + i // 5) % len(tracers)]
        with tracer.start_as_current_span(f"rl.span.{i % 9}", attributes={"rl.iteration": i, "rl.bucket": "productive",
                                                                           "rl.ratio": i / 7, "rl.name": f"é{i}"}):
            pass
    return list(memory.get_finished_spans())


def test_every_item_is_handed_out_once_in_order_in_more_than_one_slice():
    clock = _Clock()
    pacer = SlicePacer(clock=clock, cpu_clock=clock, sleep=clock.sleep)
    items = list(range(1000))
    slices = list(pacer.slices(items))
    assert [item for chunk in slices for item in chunk] == items
    assert len(slices) > 1 and pacer.slices_yielded == len(slices)
    assert len(clock.rests) == len(slices) - 1  # the GIL is released between every two slices
    assert list(pacer.slices([])) == []


def test_a_batch_is_spread_over_the_idle_time_before_it_at_most_max_spread():
    clock = _Clock()
    pacer = SlicePacer(clock=clock, cpu_clock=clock, sleep=clock.sleep, max_spread_s=1.0)
    clock.now += 0.6  # idle for 0.6 s: this batch may take 0.6 s
    for _ in pacer.slices(list(range(200))):
        pass
    assert 0.6 * 0.8 <= sum(clock.rests) <= 0.6
    clock.rests.clear()
    for _ in pacer.slices(list(range(200))):  # back to back (a backlog, a flush): not paced
        pass
    assert clock.rests and set(clock.rests) == {0.0}
    clock.rests.clear()
    clock.now += 3600  # an hour idle: spread over max_spread_s, not half an hour
    for _ in pacer.slices(list(range(200))):
        pass
    assert 0.8 <= sum(clock.rests) <= 1.0


class _BackwardClock(_Clock):
    """A clock running back an hour at every reading: every rest the pacer works out is hours long."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def __call__(self) -> float:
        self.now -= 3600.0
        return self.now


def _export_in_thread(items: list, started: threading.Event) -> tuple[threading.Thread, list]:
    out: list = []

    def export() -> None:
        for chunk in SlicePacer(clock=_BackwardClock()).slices(items):
            out.extend(chunk)
            started.set()

    thread = threading.Thread(target=export, daemon=True)
    thread.start()
    return thread, out


def test_inside_hurried_a_pacer_does_not_rest_and_an_ongoing_rest_is_cut_short():
    items = list(range(300))
    with hurried():  # hours of rests due, none taken
        thread, out = _export_in_thread(items, threading.Event())
        thread.join(60)
    assert not thread.is_alive() and out == items

    started = threading.Event()
    thread, out = _export_in_thread(items, started)
    assert started.wait(10)
    thread.join(0.2)
    assert thread.is_alive() and len(out) < len(items)  # resting, an hour to go
    with hurried():  # as flush_telemetry / shutdown_telemetry do: the rest in progress ends now
        thread.join(60)
    assert not thread.is_alive() and out == items


def test_slices_are_sized_from_the_cpu_time_an_item_takes():
    clock = _Clock()
    cpu = _Clock()
    pacer = SlicePacer(clock=clock, cpu_clock=cpu, sleep=clock.sleep, slice_fraction=0.2)
    sizes = []
    for chunk in pacer.slices(list(range(5000))):
        sizes.append(len(chunk))
        cpu.now += len(chunk) * 2**-16  # about 15 us of CPU an item (a binary fraction: exact sums)
        clock.now += len(chunk) * 2**-10  # while the wall clock, waiting for the GIL, runs 64x faster
    expected = int(sys.getswitchinterval() * 0.2 / 2**-16)
    assert sizes[0] == 16 and set(sizes[1:-1]) == {expected}


def test_the_dump_line_is_the_unsliced_encoding(tmp_path):
    spans = _spans(700)
    exporter = DumpSpanExporter(tmp_path)
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    exporter.shutdown()
    assert exporter.pacer.slices_yielded > 1
    (line,) = (tmp_path / exporter.path.rsplit("/", 1)[1]).read_bytes().splitlines(keepends=True)
    whole = spans_to_otlp_json(spans)
    assert line == encode_line(whole)  # byte-identical to encoding the batch in one piece
    assert json.loads(line) == json.loads(json.dumps(whole, separators=(",", ":")))
    assert len(whole["resourceSpans"]) == 2 and all(len(r["scopeSpans"]) == 2 for r in whole["resourceSpans"])


def test_merging_slices_regroups_by_resource_and_scope_in_first_appearance_order():
    spans = _spans(90)
    parts = [spans_to_otlp_json(spans[i:i + 7]) for i in range(0, 90, 7)]
    assert merge_requests(parts, "resourceSpans", "scopeSpans", "spans") == spans_to_otlp_json(spans)
    assert merge_requests(parts[:1], "resourceSpans", "scopeSpans", "spans") == parts[0]


def test_a_competing_thread_runs_between_the_slices_of_one_batch(tmp_path):
    """Between every two slices the exporter lets a thread that needs the GIL run Python code."""
    spans = _spans(600)
    gap, ran = threading.Event(), threading.Event()
    timeline: list[str] = []
    stop = False

    def competitor() -> None:
        while not stop:
            if gap.wait(0.05):
                gap.clear()
                timeline.append("competitor")
                ran.set()

    def rest(seconds: float) -> None:
        timeline.append("rest")
        gap.set()
        assert ran.wait(10), "the competing thread did not run between two slices"
        ran.clear()

    exporter = DumpSpanExporter(tmp_path)
    exporter.pacer = SlicePacer(sleep=rest)
    thread = threading.Thread(target=competitor, daemon=True)
    thread.start()
    try:
        assert exporter.export(spans) is SpanExportResult.SUCCESS
    finally:
        stop = True
        thread.join(5)
    exporter.shutdown()
    assert exporter.pacer.slices_yielded > 1
    assert timeline == ["rest", "competitor"] * (exporter.pacer.slices_yielded - 1)
    (line,) = (tmp_path / exporter.path.rsplit("/", 1)[1]).read_bytes().splitlines()
    assert json.loads(line) == spans_to_otlp_json(spans)


def test_the_log_dump_line_is_the_unsliced_encoding(tmp_path):
    from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor

    try:
        from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter as InMemoryLogExporter
    except ImportError:  # pragma: no cover - older SDKs
        from opentelemetry.sdk._logs.export import InMemoryLogExporter

    from nemo_telemetry.instrument._log_dump import DumpLogExporter, logs_to_otlp_json

    memory = InMemoryLogExporter()
    provider = LoggerProvider(resource=Resource.create({"service.name": "trainer"}), shutdown_on_exit=False)
    provider.add_log_record_processor(SimpleLogRecordProcessor(memory))
    log = logging.getLogger("test_slices.records")
    log.propagate = False
    log.setLevel(logging.INFO)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the SDK handler, as the lifecycle's bridge uses
        handler = LoggingHandler(logger_provider=provider)
    log.addHandler(handler)
    try:
        for i in range(300):
            log.info("record %d", i)
    finally:
        log.removeHandler(handler)
        provider.shutdown()
    records = list(memory.get_finished_logs())
    assert len(records) == 300
    exporter = DumpLogExporter(tmp_path)
    exporter.export(records)
    exporter.shutdown()
    assert exporter.pacer.slices_yielded > 1
    (line,) = (tmp_path / exporter.path.rsplit("/", 1)[1]).read_bytes().splitlines(keepends=True)
    assert line == encode_line(logs_to_otlp_json(records))


@pytest.fixture()
def otlp_server():
    """An OTLP/HTTP endpoint keeping every request body; answers ``status[0]`` (200 unless a test sets it)."""
    received: list[bytes] = []
    status = [200]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # the http.server interface
            received.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            self.send_response(status[0])
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", received, status
    server.shutdown()
    server.server_close()


def _span_ids(bodies: list[bytes]) -> list[bytes]:
    ids = []
    for body in bodies:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        ids += [s.span_id for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    return ids


def test_the_otlp_exporter_sends_a_batch_in_slices_each_span_once(otlp_server):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    url, received, _ = otlp_server
    spans = _spans(500)
    exporter = sliced_span_exporter(OTLPSpanExporter, min_items=64)(endpoint=url, timeout=5)
    assert isinstance(exporter, OTLPSpanExporter)
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    exporter.shutdown()
    assert len(received) == exporter.pacer.slices_yielded > 1
    assert all(len(_span_ids([body])) >= 64 for body in received[:-1])
    sent = _span_ids(received)
    assert sorted(sent) == sorted(s.context.span_id.to_bytes(8, "big") for s in spans)


def test_the_first_failing_slice_ends_the_batch(otlp_server):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    url, received, status = otlp_server
    status[0] = 400  # not retryable: one request, then the batch is given up, as an unsliced one is
    exporter = sliced_span_exporter(OTLPSpanExporter, min_items=64)(endpoint=url, timeout=5)
    assert exporter.export(_spans(500)) is SpanExportResult.FAILURE
    exporter.shutdown()
    assert len(received) == 1


def test_the_lifecycles_otlp_exporter_is_sliced(monkeypatch):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    exporter = make_span_exporter(TelemetryConfig(exporter="otlp"))
    assert isinstance(exporter, OTLPSpanExporter) and isinstance(exporter.pacer, SlicePacer)
    exporter.shutdown()


def test_ingest_reads_the_sliced_dump_as_it_reads_the_whole_batch_encoding(tmp_path):
    """The analysis sees the same spans and the same goodput from the sliced dump as from the unsliced one."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from nemo_telemetry.analysis import goodput_by_step, ingest, read_spans

    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "trainer", "nemo.run.id": "run-s",
                                                        "nv.dl.rank": 0}))
    sliced_dir, whole_dir = tmp_path / "sliced", tmp_path / "whole"
    provider.add_span_processor(BatchSpanProcessor(DumpSpanExporter(sliced_dir), max_export_batch_size=512))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("nemo_telemetry")
    for step in range(1, 101):  # 800 spans: a full 512-span batch and a partial one
        with tracer.start_as_current_span("rl.grpo.step", attributes={"rl.iteration": step}):
            for phase, bucket in enumerate(("productive", "overhead", "productive", "idle", "overhead", "productive",
                                            "overhead")):
                with tracer.start_as_current_span(f"rl.grpo.phase{phase}",
                                                  attributes={"rl.iteration": step, "rl.bucket": bucket}):
                    pass
    provider.shutdown()
    spans = list(memory.get_finished_spans())
    whole_dir.mkdir()
    with open(whole_dir / "traces-trainer-1-reference.jsonl", "w", encoding="utf-8") as reference:
        for i in range(0, len(spans), 512):
            reference.write(json.dumps(spans_to_otlp_json(spans[i:i + 512]), separators=(",", ":")) + "\n")

    tables = {}
    for name, directory in (("sliced", sliced_dir), ("whole", whole_dir)):
        ingest([str(directory)], out=tmp_path / f"{name}.dataset")
        tables[name] = read_spans(str(tmp_path / f"{name}.dataset"))
    sliced, whole = (tables[n].sort_by("span_id") for n in ("sliced", "whole"))
    assert sliced.num_rows == whole.num_rows == 800
    assert sliced.column_names == whole.column_names and sliced.equals(whole)
    assert goodput_by_step(tables["sliced"]).sort_by("iteration").equals(
        goodput_by_step(tables["whole"]).sort_by("iteration"))


def test_a_line_orjson_refuses_is_written_by_the_standard_encoder():
    document = {"resourceSpans": [], "big": 2**70, "name": "é"}
    assert encode_line(document) == (json.dumps(document, separators=(",", ":")) + "\n").encode()
    assert json.loads(encode_line({"name": "é", "n": [1, 2.5]})) == {"name": "é", "n": [1, 2.5]}


def test_the_dump_exporters_load_their_encoders_when_built_not_on_the_first_export(tmp_path):
    """Imports on the export thread would hold the GIL (and the import lock) through a step."""
    import subprocess

    script = (
        "import sys\n"
        "from nemo_telemetry.instrument._dump import DumpSpanExporter\n"
        "from nemo_telemetry.instrument._log_dump import DumpLogExporter\n"
        "from nemo_telemetry.instrument._metrics_dump import DumpMetricExporter\n"
        "wanted = ['google.protobuf.json_format', 'orjson',\n"
        "          'opentelemetry.exporter.otlp.proto.common.trace_encoder',\n"
        "          'opentelemetry.exporter.otlp.proto.common._log_encoder',\n"
        "          'opentelemetry.exporter.otlp.proto.common.metrics_encoder']\n"
        "before = [m for m in wanted if m in sys.modules]\n"
        f"directory = {str(tmp_path)!r}\n"
        "DumpSpanExporter(directory), DumpLogExporter(directory), DumpMetricExporter(directory)\n"
        "print(before, [m for m in wanted if m not in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded_early, missing = done.stdout.strip().rsplit("] [", 1)
    assert missing == "]", f"not loaded by the exporters' construction: {missing}"
    assert "json_format" not in loaded_early  # importing the modules alone does not load it
