"""Log dumps: reading them into the logs table, against the span reader on as many spans, in one run.

    python bench/logs.py [--records 200000] [--repeat 3]

Writes a log dump as the dump exporter does (JSON lines of 512 records, the
BatchLogRecordProcessor's batch) and a trace dump with as many spans, both with ids and a few
attributes, then times ``read_log_dumps`` (pure Python per record) and ``read_spans`` (the
compiled scan) on them, taking the fastest of ``--repeat`` runs, and prints records/s and the
ratio of the two. The load average is printed beside the figures: on a shared machine the
ratio is the steadier number.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BATCH = 512
T0 = 1_700_000_000_000_000_000


def _value(text: str) -> dict:
    return {"stringValue": text}


def write_dumps(directory: Path, records: int) -> tuple[Path, Path]:
    resource = {"attributes": [{"key": "service.name", "value": _value("bench-driver")},
                               {"key": "nemo.run.id", "value": _value("bench-run")},
                               {"key": "nv.dl.rank", "value": {"intValue": "0"}}]}
    logs, traces = directory / "logs-bench.jsonl", directory / "traces-bench.jsonl"
    with open(logs, "w") as log_file, open(traces, "w") as trace_file:
        for first in range(0, records, BATCH):
            ids = range(first, min(first + BATCH, records))
            log_records = [{
                "timeUnixNano": str(T0 + i * 1000), "observedTimeUnixNano": str(T0 + i * 1000 + 5),
                "severityNumber": 9, "severityText": "INFO", "body": _value(f"step {i // 1000} sample {i} done"),
                "attributes": [{"key": "code.file.path", "value": _value("trainer.py")},
                               {"key": "code.line.number", "value": {"intValue": str(100 + i % 50)}}],
                "flags": 1, "traceId": f"{i // 1000 + 1:032x}", "spanId": f"{i + 1:016x}",
            } for i in ids]
            spans = [{
                "traceId": f"{i // 1000 + 1:032x}", "spanId": f"{i + 1:016x}", "name": "rl.gym.run_rollouts",
                "kind": 1, "startTimeUnixNano": str(T0 + i * 1000), "endTimeUnixNano": str(T0 + i * 1000 + 900),
                "attributes": [{"key": "code.file.path", "value": _value("trainer.py")},
                               {"key": "rl.iteration", "value": {"intValue": str(i // 1000)}}],
                "status": {},
            } for i in ids]
            log_file.write(json.dumps({"resourceLogs": [{"resource": resource, "scopeLogs": [
                {"scope": {"name": "trainer"}, "logRecords": log_records}]}]}) + "\n")
            trace_file.write(json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [
                {"scope": {"name": "nemo_telemetry"}, "spans": spans}]}]}) + "\n")
    return logs, traces


def fastest(action, repeat: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return min(times), times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from nemo_telemetry.analysis import read_spans
    from nemo_telemetry.analysis.ingestion.logs import read_log_dumps

    with tempfile.TemporaryDirectory() as tmp:
        logs, traces = write_dumps(Path(tmp), args.records)
        read_spans(traces)  # compiled kernels loaded before the clock starts
        print(f"load average before: {os.getloadavg()[0]:.2f}")
        log_s, log_runs = fastest(lambda: read_log_dumps([logs]), args.repeat)
        span_s, span_runs = fastest(lambda: read_spans(traces), args.repeat)
        assert read_log_dumps([logs]).table.num_rows == args.records
        print(f"read_log_dumps: {args.records / log_s:,.0f} records/s "
              f"(fastest of {', '.join(f'{t:.2f}' for t in log_runs)} s)")
        print(f"read_spans:     {args.records / span_s:,.0f} spans/s "
              f"(fastest of {', '.join(f'{t:.2f}' for t in span_runs)} s)")
        print(f"logs take {log_s / span_s:.1f}x the time of as many spans")
        print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
