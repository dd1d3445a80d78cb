"""``nemo-telemetry monitor --follow`` as a real process on dumps that a writer grows while it runs: its
steps equal ``nemo-telemetry goodput --format json`` on the final files."""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
import threading
import time

import zstandard

from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf


def _cli(*args: str, **popen) -> subprocess.Popen:
    command = [sys.executable, "-c", "from nemo_telemetry.cli.app import main; main()", *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **popen)


def _steps(lines) -> dict:
    out = {}
    for doc in lines:
        doc = dict(doc)
        doc.pop("revised", None)
        out[(doc.pop("run_id"), doc["iteration"])] = doc
    return out


def test_monitor_follows_a_growing_protobuf_dump_and_a_streamed_zstd_dump_to_offline_goodput(tmp_path):
    """The Collector's file exporter grows a protobuf dump record by record; a streaming compressor grows
    a zstd one block by block. Each append is cut at a random byte; the monitor polls meanwhile."""
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    requests = list(synthetic_requests(3000, ranks=2, spans_per_request=20, seed=5))
    frames = b"".join(struct.pack(">I", len(p)) + p for p in map(to_protobuf, requests[::2]))
    lines = b"".join(json.dumps(r).encode() + b"\n" for r in requests[1::2])
    rng = random.Random(1)

    def write() -> None:
        compressor = zstandard.ZstdCompressor().compressobj()
        cuts_pb = sorted(rng.sample(range(1, len(frames)), 40))
        cuts_zst = sorted(rng.sample(range(1, len(lines)), 40))
        with open(dumps / "traces.pb", "wb") as pb, open(dumps / "traces.jsonl.zst", "wb") as zst:
            pieces = zip(zip([0, *cuts_pb], [*cuts_pb, len(frames)]), zip([0, *cuts_zst], [*cuts_zst, len(lines)]))
            for index, ((a, b), (c, d)) in enumerate(pieces):
                pb.write(frames[a:b])
                pb.flush()
                zst.write(compressor.compress(lines[c:d]) + compressor.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK))
                zst.flush()
                time.sleep(1.2 if index % 10 == 5 else 0.05)  # at times still for two polls (0.5 s each)
            zst.write(compressor.flush())

    monitor = _cli("monitor", "--follow", str(dumps), "--format", "json", "--grace", "0", "--until-idle", "4")
    writer = threading.Thread(target=write)
    writer.start()
    out, err = monitor.communicate(timeout=300)
    writer.join()
    assert monitor.returncode == 0, err
    followed = _steps(json.loads(line) for line in out.splitlines())
    offline = _cli("goodput", str(dumps), "--format", "json")
    document, goodput_err = offline.communicate(timeout=300)
    assert offline.returncode == 0, goodput_err
    runs = json.loads(document)["runs"]
    expected = {(run["run_id"], step["iteration"]): step for run in runs for step in run["steps"]}
    assert len(expected) > 50
    assert followed == expected
    assert "rejected" not in err


def test_max_request_mib_bounds_the_receiver_as_collect_and_a_bad_one_exits_2(tmp_path):
    import threading
    import urllib.error
    import urllib.request

    from typer.testing import CliRunner

    from nemo_telemetry.analysis import run_monitor
    from nemo_telemetry.cli.app import app

    bad = CliRunner().invoke(app, ["monitor", "--follow", str(tmp_path), "--max-request-mib", "0"])
    assert bad.exit_code == 2 and "--max-request-mib" in bad.output
    ready, stop, box = threading.Event(), threading.Event(), {}

    def on_ready(where: dict) -> None:
        box.update(where)
        ready.set()

    thread = threading.Thread(target=lambda: box.update(summary=run_monitor(
        port=0, max_request_bytes=1024, on_ready=on_ready, stop=stop, poll_s=0.05)))
    thread.start()
    try:
        assert ready.wait(120)
        body = json.dumps(next(synthetic_requests(50, ranks=1, spans_per_request=50))).encode()
        assert len(body) > 1024
        request = urllib.request.Request(box["traces_url"], data=body, headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=30)
            status = 200
        except urllib.error.HTTPError as exc:
            status = exc.code
        assert status == 413
    finally:
        stop.set()
        thread.join(60)
