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
