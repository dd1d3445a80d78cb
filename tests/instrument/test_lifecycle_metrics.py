"""The rl.* metrics go where the spans go: started, flushed and shut down with telemetry."""

from __future__ import annotations

import os

from nemo_telemetry.analysis import read_metrics
from nemo_telemetry.instrument import (
    flush_telemetry,
    init_telemetry_driver,
    record_metrics,
    shutdown_telemetry,
)
from nemo_telemetry.instrument.environment_variables import NEMO_TELEMETRY_RUN_ID
from nemo_telemetry.instrument.metrics import SETUP_DURATION, record_setup_durations


def test_driver_metrics_land_in_dump_files_with_the_run_id(tmp_path):
    cfg = init_telemetry_driver({"enabled": True, "span_groups": "default", "exporter": "dump",
                                 "dump_dir": str(tmp_path)}, algorithm="grpo")
    assert cfg.enabled
    assert record_setup_durations({"total_setup": 12.5, "ray_init": 3.0}) == 2
    assert flush_telemetry(timeout_s=5)
    assert shutdown_telemetry(timeout_s=5)

    files = sorted(p.name for p in tmp_path.glob("metrics-*.jsonl"))
    assert files, "no metrics dump written"
    table = read_metrics(tmp_path).to_pylist()
    setup = {tuple(sorted(dict(r["attributes"]).items())): r["value"] for r in table if r["name"] == SETUP_DURATION}
    assert setup[(("phase", "total_setup"),)] == 12.5
    assert setup[(("phase", "ray_init"),)] == 3.0
    assert {r["run_id"] for r in table} == {os.environ[NEMO_TELEMETRY_RUN_ID]}


def test_metrics_stop_with_telemetry(tmp_path):
    init_telemetry_driver({"enabled": True, "exporter": "dump", "dump_dir": str(tmp_path)})
    shutdown_telemetry(timeout_s=5)
    # After shutdown, recording goes to the global no-op provider: nothing raises, nothing is written.
    record_metrics({SETUP_DURATION: 1.0}, attributes={"phase": "late"})
    assert not [r for r in read_metrics(tmp_path).to_pylist() if dict(r["attributes"]).get("phase") == "late"]
