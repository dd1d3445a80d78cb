"""The rl.* metrics registry: every registration rule, teeing, record-time safety, the shipped series.

Values are read back through the SDK's InMemoryMetricReader on a real MeterProvider.
"""

from __future__ import annotations

import logging
import math

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from nemo_telemetry.errors import RegistryError
from nemo_telemetry.instrument import metrics as m
from nemo_telemetry.instrument.metrics import (
    METRICS,
    TeedMetric,
    VllmCounterDeltas,
    map_efficiency_seconds,
    record_host_memory,
    record_metrics,
    register_teed_metrics,
    set_meter_provider,
    tee_metrics,
)


@pytest.fixture()
def reader():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    set_meter_provider(provider)
    yield reader
    set_meter_provider(None)
    provider.shutdown()


@pytest.fixture()
def rows():
    """Register test rows; unregistered afterwards so tests stay independent."""
    added: list[str] = []

    def register(*new):
        register_teed_metrics(new)
        added.extend(r.name for r in new)

    yield register
    METRICS.unregister(added)


def points(reader) -> dict[str, list[tuple[dict, float]]]:
    """{series name: [(attributes, value), ...]} from one collection."""
    out: dict[str, list] = {}
    data = reader.get_metrics_data()
    if data is None:
        return out
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for p in metric.data.data_points:
                    out.setdefault(metric.name, []).append((dict(p.attributes), p.value))
    return out


# -- registration rules (raise at start-up) ---------------------------------------------------


def test_a_dl_name_is_refused_with_the_reason(rows):
    with pytest.raises(RegistryError) as info:
        rows(TeedMetric("grad_norm", "dl.grad_norm", "gauge", "1", ""))
    message = str(info.value)
    assert "dl.grad_norm" in message and "Megatron" in message and "rl." in message


@pytest.mark.parametrize("name", ["grad_norm", "nemo.grad_norm", "rl", "rl.", "RL.Loss", "rl.policy loss"])
def test_a_name_outside_rl_scope_is_refused(rows, name):
    with pytest.raises(RegistryError, match="rl.<subsystem>.<metric>"):
        rows(TeedMetric("k", name, "gauge", "1", ""))


def test_the_deliberate_single_segment_spellings_are_accepted(rows):
    rows(TeedMetric("norm_of_grads", "rl.test_norm", "gauge", "1", ""))
    assert METRICS.row_for_key("norm_of_grads").name == "rl.test_norm"
    assert METRICS.row_for_key("train/grad_norm").name == "rl.grad_norm"  # the shipped training row


def test_a_duplicate_logger_key_raises(rows):
    rows(TeedMetric("test_loss", "rl.test.loss", "gauge", "1", ""))
    with pytest.raises(RegistryError, match="logger key 'test_loss'"):
        rows(TeedMetric("test_loss", "rl.value.test_loss", "gauge", "1", ""))


def test_a_duplicate_series_name_raises(rows):
    rows(TeedMetric("test_loss", "rl.test.loss", "gauge", "1", ""))
    with pytest.raises(RegistryError, match="rl.test.loss"):
        rows(TeedMetric("other_loss", "rl.test.loss", "gauge", "1", ""))


def test_duplicates_inside_one_batch_raise_and_register_nothing(rows):
    with pytest.raises(RegistryError):
        rows(TeedMetric("a", "rl.test.a", "gauge", "1", ""), TeedMetric("a", "rl.test.b", "gauge", "1", ""))
    assert METRICS.row("rl.test.a") is None and METRICS.row("rl.test.b") is None


def test_reregistering_the_identical_row_is_a_no_op(rows):
    row = TeedMetric("reward_of_test", "rl.test.reward", "gauge", "1", "mean reward")
    rows(row)
    register_teed_metrics([row])  # a module imported twice
    assert METRICS.row("rl.test.reward") == row


def test_an_unknown_kind_raises(rows):
    with pytest.raises(RegistryError, match="kind"):
        rows(TeedMetric("k", "rl.test.k", "meter", "1", ""))


def test_the_shipped_series_are_registered():
    names = {r.name for r in METRICS.rows()}
    assert {"rl.efficiency.seconds", "rl.setup.duration", "rl.host.memory.used",
            "rl.vllm.generation_tokens"} <= names
    assert all(n.startswith(("rl.", "gen_ai.")) for n in names)


# -- teeing -----------------------------------------------------------------------------------


def test_tee_records_only_teed_keys_with_values(reader):
    n = tee_metrics("train", {"loss": 0.5, "reward": None, "untracked": 3.0})
    assert n == 1
    got = points(reader)
    assert got["rl.policy.loss"] == [({}, 0.5)]
    assert "rl.reward.mean" not in got


def test_a_prefixed_row_wins_over_the_bare_key(reader, rows):
    rows(TeedMetric("test_accuracy", "rl.test.accuracy", "gauge", "1", ""),
         TeedMetric("validation/test_accuracy", "rl.validation.test_accuracy", "gauge", "1", ""))
    tee_metrics("validation", {"test_accuracy": 0.9})
    tee_metrics("train", {"test_accuracy": 0.7})
    got = points(reader)
    assert got["rl.validation.test_accuracy"] == [({}, 0.9)]
    assert got["rl.test.accuracy"] == [({}, 0.7)]


def test_counters_add_and_histograms_record(reader, rows):
    rows(TeedMetric(None, "rl.test.count", "counter", "1", ""),
         TeedMetric(None, "rl.test.hist", "histogram", "s", ""))
    record_metrics({"rl.test.count": 2})
    record_metrics({"rl.test.count": 3, "rl.test.hist": 1.5})
    data = reader.get_metrics_data()
    by_name = {mt.name: mt for rm in data.resource_metrics for sm in rm.scope_metrics for mt in sm.metrics}
    assert by_name["rl.test.count"].data.data_points[0].value == 5
    assert by_name["rl.test.hist"].data.data_points[0].sum == 1.5


# -- record time never raises -----------------------------------------------------------------


@pytest.mark.parametrize("bad", ["fast", math.nan, math.inf, True, object()])
def test_a_bad_value_is_warned_about_and_skipped(reader, rows, caplog, bad):
    rows(TeedMetric("x", "rl.test.x", "gauge", "1", ""))
    m._warned.clear()
    with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
        assert record_metrics({"rl.test.x": bad}) == 0
        assert tee_metrics("train", {"x": bad}) == 0
    assert "rl.test.x" in caplog.text
    assert caplog.text.count("rl.test.x") == 1  # once per series, not per call
    assert "rl.test.x" not in points(reader)


def test_a_negative_counter_increment_is_skipped(reader, rows, caplog):
    rows(TeedMetric(None, "rl.test.monotonic", "counter", "1", ""))
    with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
        assert record_metrics({"rl.test.monotonic": -1}) == 0
    assert "negative" in caplog.text


def test_an_unregistered_name_is_warned_about_not_raised(reader, caplog):
    with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
        assert record_metrics({"rl.nobody.declared": 1.0}) == 0
    assert "register_teed_metrics" in caplog.text


def test_a_dict_that_is_not_a_mapping_does_not_raise(reader, caplog):
    with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
        assert tee_metrics("train", ["not", "a", "dict"]) == 0  # type: ignore[arg-type]


# -- the dimensioned series -------------------------------------------------------------------


def test_efficiency_keys_map_to_one_series_with_category_and_measurement():
    mapped = map_efficiency_seconds({"efficiency/idle/buffer_starvation": 1.0,
                                     "efficiency/idle/refit_event_wait": 2.0,
                                     "efficiency/wasted/failed_trajectory": 3.0,
                                     "efficiency/idle/refit_bubble": None,
                                     "loss": 0.1})
    assert mapped == [
        (1.0, {"rl.efficiency.category": "idle/buffer_starvation",
               "rl.efficiency.measurement": "driver_wall_clock"}),
        (2.0, {"rl.efficiency.category": "idle/refit_event_wait",
               "rl.efficiency.measurement": "collector_wall_clock"}),
        (3.0, {"rl.efficiency.category": "wasted/failed_trajectory",
               "rl.efficiency.measurement": "thread_seconds"}),
    ]


def test_tee_of_the_efficiency_prefix_records_rl_efficiency_seconds(reader):
    n = tee_metrics("efficiency", {"idle/refit_bubble": 0.25, "idle/generation_limit_pause": 1.5})
    assert n == 2
    got = sorted(points(reader)["rl.efficiency.seconds"], key=lambda p: p[1])
    assert got == [
        ({"rl.efficiency.category": "idle/refit_bubble", "rl.efficiency.measurement": "driver_wall_clock"}, 0.25),
        ({"rl.efficiency.category": "idle/generation_limit_pause",
          "rl.efficiency.measurement": "collector_wall_clock"}, 1.5),
    ]


def test_timing_setup_tees_to_setup_duration_by_phase(reader):
    assert tee_metrics("timing/setup", {"ray_init": 3.0, "total_setup": 10.0, "extras": None}) == 2
    got = dict((p[0]["phase"], p[1]) for p in points(reader)["rl.setup.duration"])
    assert got == {"ray_init": 3.0, "total_setup": 10.0}


def test_host_memory_is_recorded_per_node(reader):
    import socket

    assert record_host_memory() == 4
    got = points(reader)
    (attrs, used), = got["rl.host.memory.used"]
    assert attrs == {"host.name": socket.gethostname()}
    (_, total), = got["rl.host.memory.total"]
    assert 0 < used <= total


def test_vllm_counters_are_recorded_as_deltas_between_steps(reader):
    deltas = VllmCounterDeltas()
    assert deltas.record({"vllm:generation_tokens": 100, "vllm:prompt_tokens": 40}) == {
        "rl.vllm.generation_tokens": 100, "rl.vllm.prompt_tokens": 40}
    assert deltas.record({"vllm:generation_tokens": 250, "vllm:prompt_tokens": 40}) == {
        "rl.vllm.generation_tokens": 150, "rl.vllm.prompt_tokens": 0}
    # an engine restart: the counter starts over, its new total is the increment
    assert deltas.record({"vllm:generation_tokens": 30})["rl.vllm.generation_tokens"] == 30
    assert points(reader)["rl.vllm.generation_tokens"] == [({}, 280)]  # the cumulative sum exported


def test_importing_metrics_adds_no_heavy_import():
    import subprocess
    import sys

    code = ("import sys, nemo_telemetry.instrument; before = set(sys.modules); "
            "import nemo_telemetry.instrument.metrics; "
            "heavy = ('psutil', 'pandas', 'pyarrow', 'vllm', 'ray', 'opentelemetry.sdk.metrics'); "
            "print(sorted(x for x in set(sys.modules) - before if x.split('.')[0] in heavy "
            "or x.startswith('opentelemetry.sdk.metrics')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
