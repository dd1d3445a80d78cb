"""Driver and worker start-up, resource attributes, exporter choice, bounded flush/shutdown, log bridge."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from nemo_telemetry.instrument import (
    RLSpanGroup,
    TelemetryConfig,
    enabled_span_groups,
    flush_telemetry,
    get_tracer_provider,
    init_telemetry_driver,
    init_telemetry_worker,
    managed_span,
    resolve,
    shutdown_telemetry,
    telemetry_active,
    umbrella_span,
)
from nemo_telemetry.instrument import environment_variables as env
from nemo_telemetry.instrument._lifecycle import make_span_exporter, otlp_protocol

G = RLSpanGroup


def _dump_config(tmp_path, **extra) -> dict:
    return {"enabled": True, "span_groups": "per_step", "exporter": "dump", "dump_dir": str(tmp_path), **extra}


def _read_dump_spans(directory) -> list[tuple[dict, dict]]:
    """(resource attributes, span) for every span in every dump file under ``directory``."""
    out = []
    for name in sorted(os.listdir(directory)):
        for line in open(os.path.join(directory, name)):
            for rs in json.loads(line)["resourceSpans"]:
                resource = {a["key"]: next(iter(a["value"].values())) for a in rs["resource"]["attributes"]}
                out += [(resource, s) for ss in rs["scopeSpans"] for s in ss["spans"]]
    return out


# -- driver -------------------------------------------------------------------------------------


def test_driver_resolves_config_into_the_environment_before_workers_start(tmp_path):
    cfg = init_telemetry_driver(_dump_config(tmp_path, logs_enabled=True), algorithm="grpo")
    assert cfg.enabled and cfg.exporter == "dump"
    assert os.environ[env.NEMO_TELEMETRY_ENABLED] == "1"
    assert os.environ[env.NEMO_TELEMETRY_SPAN_GROUPS] == "per_step"  # raw spec: workers resolve it
    assert os.environ[env.NEMO_TELEMETRY_EXPORTER] == "dump"
    assert os.environ[env.NEMO_TELEMETRY_DUMP_DIR] == str(tmp_path)
    assert os.environ[env.NEMO_TELEMETRY_ALGORITHM] == "grpo"
    assert os.environ[env.NEMO_TELEMETRY_LOGS_ENABLED] == "1"
    assert len(os.environ[env.NEMO_TELEMETRY_RUN_ID]) == 32
    assert enabled_span_groups() == resolve("per_step")
    assert telemetry_active()


def test_driver_keeps_an_inherited_run_id_and_raw_environment_wins(tmp_path, monkeypatch):
    monkeypatch.setenv(env.NEMO_TELEMETRY_RUN_ID, "run-from-launcher")
    monkeypatch.setenv(env.NEMO_TELEMETRY_SPAN_GROUPS, "generation")
    init_telemetry_driver(_dump_config(tmp_path))
    assert os.environ[env.NEMO_TELEMETRY_RUN_ID] == "run-from-launcher"
    assert enabled_span_groups() == {"generation"}


def test_pending_span_group_names_are_reported_with_did_you_mean(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
        init_telemetry_driver(_dump_config(tmp_path, span_groups="per_step,generaton"))
    assert "unknown span group 'generaton'" in caplog.text
    assert "did you mean 'generation'" in caplog.text
    assert enabled_span_groups() == resolve("per_step")  # the run goes on with what resolved


def test_disabled_config_emits_nothing(tmp_path):
    cfg = init_telemetry_driver({"enabled": False, "exporter": "dump", "dump_dir": str(tmp_path)})
    assert not cfg.enabled and os.environ[env.NEMO_TELEMETRY_ENABLED] == "0"
    assert enabled_span_groups() == frozenset() and not telemetry_active()
    with managed_span(G.GENERATION, "rl.vllm.generate") as span:
        assert span is None
    assert shutdown_telemetry() is True
    assert os.listdir(tmp_path) == []


def test_bad_config_value_warns_once_and_the_run_goes_on(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
        cfg = init_telemetry_driver(_dump_config(tmp_path, logs_enabled="sometimes"))
    assert cfg.enabled and cfg.logs_enabled is False
    assert len([r for r in caplog.records if "logs_enabled" in r.getMessage()]) == 1


# -- resource attributes, driver and worker -------------------------------------------------------


WORKER = textwrap.dedent("""
    from nemo_telemetry.instrument import RLSpanGroup, init_telemetry_worker, managed_span
    assert init_telemetry_worker(rank=2, world_size=4, local_rank=0)
    with managed_span(RLSpanGroup.POLICY_UPDATE, "rl.grpo.policy_training"):
        pass
    # no shutdown_telemetry(): the atexit handler must flush the dump
""")


def test_driver_and_worker_spans_carry_the_run_resource_attributes(tmp_path):
    init_telemetry_driver(_dump_config(tmp_path), algorithm="grpo", service_name="grpo-driver")
    with umbrella_span(G.U_STEP, "rl.grpo.step"):
        pass
    assert shutdown_telemetry(timeout_s=5)
    worker_env = {**os.environ, "RANK": "0"}  # an inherited RANK loses to the explicit rank
    subprocess.run([sys.executable, "-c", WORKER], env=worker_env, check=True, timeout=120)

    spans = {s["name"]: (res, s) for res, s in _read_dump_spans(tmp_path)}
    driver_res, _ = spans["rl.grpo.step"]
    worker_res, _ = spans["rl.grpo.policy_training"]
    assert driver_res["service.name"] == "grpo-driver"
    assert worker_res["service.name"] == "nemo_rl-worker"
    assert driver_res["nemo.run.id"] == worker_res["nemo.run.id"] == os.environ[env.NEMO_TELEMETRY_RUN_ID]
    assert driver_res["rl.algorithm"] == worker_res["rl.algorithm"] == "grpo"
    assert (driver_res["nv.dl.rank"], driver_res["nv.dl.world_size"], driver_res["nv.dl.local_rank"]) == ("0", "1", "0")
    assert (worker_res["nv.dl.rank"], worker_res["nv.dl.world_size"], worker_res["nv.dl.local_rank"]) == ("2", "4", "0")
    assert driver_res["process.pid"] == str(os.getpid()) != worker_res["process.pid"]
    assert driver_res["host.name"] == socket.gethostname()
    assert driver_res["nemo.telemetry.span_groups"] == ",".join(sorted(resolve("per_step")))
    assert len(os.listdir(tmp_path)) == 2  # one file per process


def test_worker_reads_rank_from_the_environment_and_stays_off_without_it(monkeypatch):
    assert init_telemetry_worker() is False  # nothing inherited: telemetry stays off
    monkeypatch.setenv(env.NEMO_TELEMETRY_ENABLED, "1")
    monkeypatch.setenv(env.NEMO_TELEMETRY_EXPORTER, "none")
    monkeypatch.setenv(env.NEMO_TELEMETRY_SPAN_GROUPS, "generation")
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert init_telemetry_worker() is True
    attributes = get_tracer_provider().resource.attributes
    assert (attributes["nv.dl.rank"], attributes["nv.dl.world_size"], attributes["nv.dl.local_rank"]) == (5, 8, 1)
    assert attributes["nemo.telemetry.span_groups"] == "generation"


# -- exporters ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("environ", "protocol"), [
    ({}, "http/protobuf"),
    ({env.OTEL_EXPORTER_OTLP_ENDPOINT: "http://collector:4317"}, "grpc"),
    ({env.OTEL_EXPORTER_OTLP_ENDPOINT: "http://collector:4318"}, "http/protobuf"),
    ({env.OTEL_EXPORTER_OTLP_PROTOCOL: "grpc"}, "grpc"),
    ({env.OTEL_EXPORTER_OTLP_PROTOCOL: "grpc", env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: "http/protobuf"},
     "http/protobuf"),
    ({env.OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318", env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "http://c:4317"},
     "grpc"),
])
def test_otlp_protocol_from_the_standard_variables(environ, protocol):
    assert otlp_protocol(environ) == protocol


def test_otlp_exporter_class_follows_the_protocol(monkeypatch):
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    monkeypatch.setenv(env.OTEL_EXPORTER_OTLP_PROTOCOL, "grpc")
    assert isinstance(make_span_exporter(TelemetryConfig(exporter="otlp")), GrpcExporter)
    monkeypatch.setenv(env.OTEL_EXPORTER_OTLP_PROTOCOL, "http/protobuf")
    monkeypatch.setenv(env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, "http://127.0.0.1:9/v1/traces")
    exporter = make_span_exporter(TelemetryConfig(exporter="otlp"))
    assert isinstance(exporter, HttpExporter) and exporter._endpoint == "http://127.0.0.1:9/v1/traces"
    assert make_span_exporter(TelemetryConfig(exporter="none")) is None


@pytest.fixture()
def blackhole_endpoint():
    """A port that accepts TCP connections and never answers: the worst collector to depend on."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    yield server.getsockname()[1]
    server.close()


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_unreachable_endpoint_flush_and_shutdown_return_within_their_bound(monkeypatch, blackhole_endpoint,
                                                                            protocol, caplog):
    monkeypatch.setenv(env.OTEL_EXPORTER_OTLP_PROTOCOL, protocol)
    path = "/v1/traces" if protocol == "http/protobuf" else ""
    monkeypatch.setenv(env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, f"http://127.0.0.1:{blackhole_endpoint}{path}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "2")  # so the abandoned export thread ends soon
    init_telemetry_driver({"enabled": True, "span_groups": "all", "exporter": "otlp"})
    with managed_span(G.GENERATION, "rl.vllm.generate"):
        pass
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
        assert flush_telemetry(timeout_s=0.5) is False
        assert shutdown_telemetry(timeout_s=0.5) is False
    assert time.monotonic() - started < 3.0
    assert "did not finish within" in caplog.text
    assert not telemetry_active() and enabled_span_groups() == frozenset()


def test_unwritable_dump_dir_warns_and_the_run_goes_on(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
        init_telemetry_driver(_dump_config(blocker / "dumps"))
        for _ in range(3):
            with managed_span(G.GENERATION, "rl.vllm.generate"):
                pass
            flush_telemetry(timeout_s=2)
        assert shutdown_telemetry(timeout_s=2)
    assert len([r for r in caplog.records if "cannot write span dumps" in r.getMessage()]) == 1


def test_shutdown_flushes_ended_spans_to_the_dump(tmp_path):
    init_telemetry_driver(_dump_config(tmp_path))
    for i in range(5):
        with managed_span(G.GENERATION, f"rl.vllm.generate.{i}"):
            pass
    assert shutdown_telemetry(timeout_s=5)
    assert sorted(s["name"] for _, s in _read_dump_spans(tmp_path)) == [f"rl.vllm.generate.{i}" for i in range(5)]
    assert shutdown_telemetry() is True  # idempotent


def test_global_tracer_provider_follows_the_current_telemetry_provider(tmp_path):
    from opentelemetry import trace

    init_telemetry_driver(_dump_config(tmp_path / "first"))
    third_party = trace.get_tracer("aiohttp-like")  # taken once, as instrumentors do
    with third_party.start_as_current_span("GET /first") as span:
        assert span.is_recording()
    shutdown_telemetry()
    assert not third_party.start_span("while off").is_recording()
    init_telemetry_driver(_dump_config(tmp_path / "second"))
    third_party.start_span("POST /second").end()
    shutdown_telemetry()
    assert [s["name"] for _, s in _read_dump_spans(tmp_path / "first")] == ["GET /first"]
    assert [s["name"] for _, s in _read_dump_spans(tmp_path / "second")] == ["POST /second"]


# -- log bridge -----------------------------------------------------------------------------------


def test_log_records_carry_the_active_trace_and_span_ids(tmp_path, caplog):
    init_telemetry_driver(_dump_config(tmp_path, logs_enabled=True))
    logger = logging.getLogger("trainer.test")
    with caplog.at_level(logging.INFO, logger="trainer.test"):
        with managed_span(G.GENERATION, "rl.vllm.generate") as span:
            logger.info("inside")
        logger.info("outside")
    inside, outside = caplog.records
    ctx = span.get_span_context()
    assert (inside.otelTraceID, inside.otelSpanID) == (format(ctx.trace_id, "032x"), format(ctx.span_id, "016x"))
    assert (outside.otelTraceID, outside.otelSpanID) == ("0", "0")
    shutdown_telemetry()
    record = logging.getLogRecordFactory()("n", logging.INFO, "f", 1, "m", (), None)
    assert not hasattr(record, "otelTraceID")  # uninstalled with telemetry


def test_log_bridge_is_off_unless_enabled(tmp_path):
    init_telemetry_driver(_dump_config(tmp_path))
    record = logging.getLogRecordFactory()("n", logging.INFO, "f", 1, "m", (), None)
    assert not hasattr(record, "otelTraceID")


def test_config_endpoint_fills_in_only_where_the_environment_has_none(tmp_path, monkeypatch):
    init_telemetry_driver({"enabled": False, "otlp_endpoint": "http://cfg:4317", "otlp_protocol": "grpc"})
    assert os.environ[env.OTEL_EXPORTER_OTLP_ENDPOINT] == "http://cfg:4317"
    assert os.environ[env.OTEL_EXPORTER_OTLP_PROTOCOL] == "grpc"
    monkeypatch.setenv(env.OTEL_EXPORTER_OTLP_ENDPOINT, "http://env:4318")
    monkeypatch.setenv(env.NEMO_TELEMETRY_ALGORITHM, "ppo")
    init_telemetry_driver({"enabled": False, "otlp_endpoint": "http://cfg:4317"}, algorithm="grpo")
    assert os.environ[env.OTEL_EXPORTER_OTLP_ENDPOINT] == "http://env:4318"
    assert os.environ[env.NEMO_TELEMETRY_ALGORITHM] == "grpo"  # explicit argument wins
