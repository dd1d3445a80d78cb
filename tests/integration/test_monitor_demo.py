"""The demo run streaming into the monitor in real time: the monitor follows the dump directory the
demo's processes (Ray actors, threads, the HTTP reward server) write while they train."""

from __future__ import annotations

import threading
import time

from nemo_telemetry.analysis import goodput_document, read_spans, run_goodput, run_monitor
from nemo_telemetry.demo import run_demo


def test_demo_followed_while_it_trains_gives_offline_goodput_per_step(tmp_path, ray_cluster):
    out = tmp_path / "demo"
    records, seen_during_run, stop = [], [], threading.Event()
    training = threading.Event()

    def on_view(view):
        if training.is_set() and view.spans:
            seen_during_run.append(view.spans)

    result_box = {}
    monitor = threading.Thread(target=lambda: result_box.update(summary=run_monitor(
        follow=out / "dumps", grace_s=0, poll_s=0.2, on_step=records.append, on_view=on_view, stop=stop)))
    monitor.start()
    training.set()
    result = run_demo(out=out, steps=4, mode="async")
    training.clear()
    time.sleep(1.0)  # a last poll after the dump files' final lines
    stop.set()
    monitor.join(120)
    assert not monitor.is_alive()
    offline = goodput_document(run_goodput(read_spans(result.dataset), run_id=result.run_id))["runs"][0]["steps"]
    final = {}
    for record in records:
        if record.run_id == result.run_id:
            final[record.iteration] = record.figures
    assert final == {step["iteration"]: {k: v for k, v in step.items() if k != "iteration"} for step in offline}
    assert seen_during_run, "the monitor saw no span while the demo trained"
    assert result_box["summary"].follow.rejected_records == 0


def test_demo_exporting_otlp_into_a_monitor_process_gives_offline_goodput_per_step(tmp_path, ray_cluster):
    """The demo's trainer and actors export OTLP/HTTP (the SDK exporter) to ``monitor --port 0 --out``,
    a real process; its JSON lines, read while the run trains, end equal to offline goodput."""
    import dataclasses
    import json
    import os
    import re
    import signal
    import subprocess
    import sys

    from nemo_telemetry.demo.actors import SERVICE_NAMES
    from nemo_telemetry.demo.trainer import DemoSettings, train
    from nemo_telemetry.instrument import init_telemetry_driver, shutdown_telemetry
    from nemo_telemetry.instrument.environment_variables import NEMO_TELEMETRY_RUN_ID

    dataset = tmp_path / "ds"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-c", "from nemo_telemetry.cli.app import main; main()", "monitor", "--port", "0",
               "--out", str(dataset), "--format", "json", "--grace", "0"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    lines, arrival = [], []
    match = re.search(r"(http://\S+)/v1/traces", proc.stderr.readline())
    assert match
    reader = threading.Thread(target=lambda: [(lines.append(json.loads(line)), arrival.append(time.monotonic()))
                                              for line in proc.stdout], daemon=True)
    reader.start()
    config = {"enabled": True, "span_groups": "per_step,per_prompt", "exporter": "otlp",
              "otlp_endpoint": match.group(1), "otlp_protocol": "http/protobuf"}
    # The SDK's batch processor exports every 5 s by default, longer than these steps take: without a
    # shorter delay the spans of the whole run can first leave at shutdown, after it trained.
    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "200"
    init_telemetry_driver(config, algorithm="grpo", service_name=SERVICE_NAMES["driver"])
    run_id = os.environ[NEMO_TELEMETRY_RUN_ID]
    try:
        train(dataclasses.replace(DemoSettings(steps=8, mode="async"), checkpoint_dir=str(tmp_path / "ckpt")))
        trained = time.monotonic()
    finally:
        shutdown_telemetry()
    time.sleep(1.5)  # the monitor's last poll after the final flush
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, proc.stderr.read()
    reader.join(10)
    final = {}
    for line in lines:
        if line["run_id"] == run_id:
            final[line["iteration"]] = {k: v for k, v in line.items() if k not in ("run_id", "revised")}
    offline = goodput_document(run_goodput(read_spans(dataset), run_id=run_id))["runs"][0]["steps"]
    assert final == {step["iteration"]: step for step in offline}
    assert len(offline) == 8
    assert arrival and arrival[0] < trained, "no step was reported while the run trained"
