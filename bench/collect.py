"""``collect`` throughput with the real OpenTelemetry SDK exporter, before and after, in one run.

    python bench/collect.py [--spans 50000] [--exporters 4] [--repeat 3] [--before main] [--out DIR]

Each measurement starts a collector in this process and ``--exporters`` exporter processes,
each a ``TracerProvider`` with a ``BatchSpanProcessor`` (its default 512-span batches) around
``OTLPSpanExporter`` (HTTP protobuf), emitting ``--spans`` spans each as fast as it can and
flushing. The figure is spans the collector stored per second of wall clock, from the moment
the exporters start emitting to the moment every one has flushed; the exporters' queues are
sized so the SDK drops nothing (the stored count is printed). Beside it, the collector's own
CPU time per span (this process: the receiver's and committer's threads), which the exporters'
load on a small machine affects less than the wall clock.

- *before*: the collector of git ref ``--before`` (default ``main``), loaded from its source
  against this checkout's dataset writer: it acknowledges spans held in memory (flushed every
  2 s or 65,536 spans), so this is the cost of receiving and decoding alone;
- *after*: this checkout's collector, which answers 200 only after the request's spans are
  written, fsync'd and committed (group commit).

Turns alternate and every wall time is printed beside the fastest; the load average is printed
before and after (on a shared machine the slow runs are other work on the cores).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _export(url: str, spans: int, start, done) -> None:
    """One exporter process: wait for the start, emit ``spans`` spans, flush, report."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "bench", "nemo.run.id": "bench",
                                                        "nv.dl.rank": os.getpid() % 8}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url), max_queue_size=spans + 1))
    tracer = provider.get_tracer("bench")
    start.wait()
    for step in range(spans // 8):
        with tracer.start_as_current_span("rl.grpo.step", attributes={"rl.iteration": step}):
            for _ in range(7):
                with tracer.start_as_current_span("rl.generation.generate", attributes={"rl.bucket": "productive"}):
                    pass
    provider.force_flush(600_000)
    provider.shutdown()
    done.put(time.perf_counter())


def _before_module(ref: str) -> types.ModuleType:
    """The collector module as it is at ``ref``, imported under its own name."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:nemo_telemetry/analysis/ingestion/collect.py"],
                            check=True, capture_output=True, text=True).stdout
    module = types.ModuleType("collect_before")
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(compile(source, f"{ref}:collect.py", "exec"), module.__dict__)
    return module


def _measure(server_class, out: Path, *, spans: int, exporters: int) -> tuple[float, float, int]:
    """(wall seconds, the collector's CPU seconds, spans stored) of one measurement."""
    context = multiprocessing.get_context("spawn")
    start, done = context.Event(), context.Queue()
    server = server_class(out, port=0).start()
    try:
        procs = [context.Process(target=_export, args=(server.traces_url, spans, start, done))
                 for _ in range(exporters)]
        for proc in procs:
            proc.start()
        time.sleep(3.0)  # the exporters import the SDK before the clock starts
        began, cpu = time.perf_counter(), time.process_time()
        start.set()
        ended = max(done.get(timeout=600) for _ in procs)
        for proc in procs:
            proc.join()
    finally:
        summary = server.stop()
    return ended - began, time.process_time() - cpu, summary.spans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=50_000, help="spans per exporter process")
    parser.add_argument("--exporters", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--before", default="main", help="git ref of the collector to compare against")
    parser.add_argument("--out", type=Path, default=None, help="folder for the datasets (default: a temporary one)")
    args = parser.parse_args()

    from nemo_telemetry.analysis.ingestion.collect import CollectorServer

    before = _before_module(args.before).CollectorServer
    work = Path(tempfile.mkdtemp(prefix="bench-collect-", dir=args.out))
    walls: dict[str, list[float]] = {"before": [], "after": []}
    cpus: dict[str, list[float]] = {"before": [], "after": []}
    total = args.spans // 8 * 8 * args.exporters
    print(f"load average before: {os.getloadavg()}")
    try:
        for turn in range(args.repeat):
            for name, server_class in (("before", before), ("after", CollectorServer)):
                wall, cpu, stored = _measure(server_class, work / f"{name}-{turn}", spans=args.spans,
                                        exporters=args.exporters)
                walls[name].append(wall)
                cpus[name].append(cpu)
                print(f"  {name:6} turn {turn}: {wall:6.2f} s, {total / wall:9,.0f} spans/s, collector "
                      f"{cpu / total * 1e6:5.1f} CPU-us/span, stored {stored:,} of {total:,}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"load average after: {os.getloadavg()}")
    fastest = {name: min(times) for name, times in walls.items()}
    for name, wall in fastest.items():
        runs = ", ".join(f"{t:.2f}" for t in walls[name])
        print(f"{name:6}: {total / wall:9,.0f} spans/s (fastest; walls {runs} s), "
              f"collector {min(cpus[name]) / total * 1e6:.1f} CPU-us/span (least)")
    print(f"after / before: {fastest['before'] / fastest['after']:.2f}x the throughput, "
          f"{min(cpus['after']) / min(cpus['before']):.2f}x the collector's CPU per span")


if __name__ == "__main__":
    main()
