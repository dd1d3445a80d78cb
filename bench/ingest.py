"""Ingest throughput and peak memory against the loops a user writes by hand, in one run.

    python bench/ingest.py [--spans 1000000] [--data bench/out/ingest] [--repeat 3] [--only NAME]
    python bench/ingest.py --crossover [--repeat 3]   # where the compiled path starts to pay

Generates a synthetic GRPO run (bench/out/, reused when present) as Collector JSON lines and
as length-prefixed protobuf, then runs every measurement in its own subprocess so each peak RSS
(``ru_maxrss``, which sees Arrow's allocations where tracemalloc does not) is its own:

- hand-written JSON: ``json.loads`` per line, flatten to dicts, ``pandas.DataFrame``;
- hand-written protobuf: ``ParseFromString`` per request, Python loop over spans, ids to hex,
  ``pandas.DataFrame``;
- bare parsers, no flattening: ``pyarrow.json.read_json`` with an explicit schema, and upb's
  ``ParseFromString``;
- nemo-telemetry: ``load_traces`` (decode to Arrow in memory) and ``ingest`` (to Parquet).

Each measurement runs ``--repeat`` times (default 3), taking turns with the others, and the
fastest run is reported with every run's wall time beside it: on a shared machine the
slow runs are other work on the cores, and the fastest is the closest to what the code costs.
Peak memory is reported as the RSS high-water mark above the process's RSS after imports,
next to the size of the resulting Arrow spans table. The compiled kernels (numba,
``cache=True``) are loaded before the clock starts, as any run after the first on a machine
loads them; the one-time compile (an empty cache) is measured and printed on its own. The load
average is printed before and after: on a shared 2-core machine, wall figures taken under load
are low, the spans/cpu-s figures less so.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _peak_rss_mib() -> float:
    """This process's RSS high-water mark. /proc's VmHWM starts afresh at exec; ru_maxrss
    would carry the parent's peak over into the child."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---------------------------------------------------------------- the measurements (in a child)


def hand_json(data: Path) -> int:
    import pandas as pd

    rows = []
    with open(data / "traces.jsonl", "rb") as f:
        for line in f:
            request = json.loads(line)
            for rs in request["resourceSpans"]:
                res = {kv["key"]: next(iter(kv["value"].values())) for kv in rs["resource"]["attributes"]}
                for ss in rs["scopeSpans"]:
                    for s in ss["spans"]:
                        row = {
                            "trace_id": s["traceId"],
                            "span_id": s["spanId"],
                            "parent_span_id": s.get("parentSpanId"),
                            "name": s["name"],
                            "start_ns": int(s["startTimeUnixNano"]),
                            "end_ns": int(s["endTimeUnixNano"]),
                            "service_name": res.get("service.name"),
                            "run_id": res.get("nemo.run.id"),
                        }
                        for kv in s.get("attributes", ()):
                            row[kv["key"]] = next(iter(kv["value"].values()))
                        rows.append(row)
    return len(pd.DataFrame(rows))


def _frames(path: Path):
    with open(path, "rb") as f:
        while prefix := f.read(4):
            yield f.read(int.from_bytes(prefix, "big"))


def hand_proto(data: Path) -> int:
    import pandas as pd
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    rows = []
    for payload in _frames(data / "traces.pb"):
        request = ExportTraceServiceRequest()
        request.ParseFromString(payload)
        for rs in request.resource_spans:
            res = {kv.key: kv.value.string_value or kv.value.int_value for kv in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    row = {
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent_span_id": s.parent_span_id.hex() or None,
                        "name": s.name,
                        "start_ns": s.start_time_unix_nano,
                        "end_ns": s.end_time_unix_nano,
                        "service_name": res.get("service.name"),
                        "run_id": res.get("nemo.run.id"),
                    }
                    for kv in s.attributes:
                        value = kv.value
                        row[kv.key] = getattr(value, value.WhichOneof("value"))
                    rows.append(row)
    return len(pd.DataFrame(rows))


def bare_pyarrow_json(data: Path) -> int:
    import pyarrow as pa
    import pyarrow.json as pj

    value = pa.struct([("stringValue", pa.string()), ("intValue", pa.string())])
    attrs = pa.list_(pa.struct([("key", pa.string()), ("value", value)]))
    span = pa.struct(
        [
            ("traceId", pa.string()),
            ("spanId", pa.string()),
            ("parentSpanId", pa.string()),
            ("name", pa.string()),
            ("kind", pa.int64()),
            ("startTimeUnixNano", pa.string()),
            ("endTimeUnixNano", pa.string()),
            ("attributes", attrs),
        ]
    )
    scope_spans = pa.list_(pa.struct([("scope", pa.struct([("name", pa.string())])), ("spans", pa.list_(span))]))
    schema = pa.schema([("resourceSpans", pa.list_(pa.struct([("resource", pa.struct([("attributes", attrs)])), ("scopeSpans", scope_spans)])))])
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    table = pj.read_json(data / "traces.jsonl", parse_options=options, read_options=pj.ReadOptions(block_size=64 << 20))
    spans = table.column("resourceSpans").combine_chunks().flatten().field("scopeSpans").flatten().field("spans").flatten()
    return len(spans)


def bare_upb(data: Path) -> int:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    n = 0
    for payload in _frames(data / "traces.pb"):
        request = ExportTraceServiceRequest.FromString(payload)
        n += sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
    return n


def _ours_memory(path: Path) -> int:
    from nemo_telemetry.analysis import load_traces

    spans = load_traces(path).spans
    _ours_memory.nbytes = spans.nbytes
    return spans.num_rows


def _ours_ingest(path: Path, out: Path) -> int:
    from nemo_telemetry.analysis import ingest

    shutil.rmtree(out, ignore_errors=True)
    summary = ingest([path], out=out)
    return summary.spans


MEASUREMENTS = {
    "hand-written JSON loop": hand_json,
    "hand-written protobuf loop": hand_proto,
    "pyarrow.json, explicit schema (parse only)": bare_pyarrow_json,
    "upb ParseFromString (parse only)": bare_upb,
    "nemo-telemetry JSON lines -> Arrow": lambda d: _ours_memory(d / "traces.jsonl"),
    "nemo-telemetry protobuf -> Arrow": lambda d: _ours_memory(d / "traces.pb"),
    "nemo-telemetry JSON lines -> Parquet": lambda d: _ours_ingest(d / "traces.jsonl", d / "ds-json"),
    "nemo-telemetry protobuf -> Parquet": lambda d: _ours_ingest(d / "traces.pb", d / "ds-pb"),
}


def _child(name: str, data: Path) -> None:
    import numpy  # noqa: F401 - imports are not what is measured
    import pandas  # noqa: F401
    import pyarrow  # noqa: F401

    import nemo_telemetry.analysis  # noqa: F401

    if name.startswith("nemo-telemetry"):
        _warm_up()  # load the compiled kernels (numba's on-disk cache), as any later run would
    base = _peak_rss_mib()
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    spans = MEASUREMENTS[name](data)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = (after.ru_utime - cpu.ru_utime) + (after.ru_stime - cpu.ru_stime)
    nbytes = getattr(_ours_memory, "nbytes", None)
    print(json.dumps({"spans": spans, "seconds": seconds, "cpu_s": cpu_s, "peak_mib": _peak_rss_mib() - base,
                      "table_bytes": nbytes}))


def _compile_seconds() -> float:
    """Seconds to compile every kernel from an empty numba cache (a fresh machine's first run)."""
    import tempfile

    with tempfile.TemporaryDirectory() as cache:
        code = "import time, sys; sys.path.insert(0, %r); t = time.perf_counter(); import bench.ingest as b; " \
               "b._warm_up(); print(time.perf_counter() - t)" % str(ROOT)
        env = dict(os.environ, NEMO_TELEMETRY_KERNEL_CACHE_DIR=cache)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    return float(out.strip().splitlines()[-1])


def _warm_up() -> None:
    """Load (or, with an empty cache, compile) every kernel: ``nemo-telemetry warmup``'s work."""
    from nemo_telemetry.analysis import warm_up_kernels

    warm_up_kernels()


def crossover(data: Path, repeat: int) -> None:
    """Where the compiled path (numba imported, kernels loaded from a warm cache) starts to beat
    the reference path, each timed as a whole fresh process reading one dump with ``load_traces``:
    the figure ``compiled.SMALL_BYTES`` cites."""
    from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf, write_json_lines
    from nemo_telemetry.analysis.synthetic import write_length_prefixed

    _warm_up()
    folder = data / "crossover"
    folder.mkdir(parents=True, exist_ok=True)
    code = "import sys; from nemo_telemetry.analysis import load_traces; load_traces(sys.argv[1])"
    print("load average before: %.2f %.2f %.2f" % os.getloadavg())
    for spans in (1_000, 5_000, 20_000, 80_000):
        requests = list(synthetic_requests(spans))
        for path in (write_json_lines(folder / f"{spans}.jsonl", requests),
                     write_length_prefixed(folder / f"{spans}.pb", [to_protobuf(r) for r in requests])):
            walls = {}
            for mode in ("0", "1"):
                env = dict(os.environ, NEMO_TELEMETRY_COMPILED=mode)
                times = []
                for _ in range(repeat):
                    start = time.perf_counter()
                    subprocess.run([sys.executable, "-c", code, str(path)], check=True, env=env)
                    times.append(time.perf_counter() - start)
                walls[mode] = min(times)
            size = path.stat().st_size
            print(f"{path.suffix:7s} {spans:>7,} spans {size / 2**20:7.2f} MiB ({size / spans:.0f} B/span): reference "
                  f"{walls['0']:.2f} s, compiled {walls['1']:.2f} s, compiled/reference {walls['1'] / walls['0']:.2f}")
    print("load average after: %.2f %.2f %.2f" % os.getloadavg())


# ---------------------------------------------------------------- the driver


def _generate(data: Path, spans: int) -> None:
    from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf, write_json_lines
    from nemo_telemetry.analysis.synthetic import write_length_prefixed

    marker = data / f"spans-{spans}"
    if marker.exists():
        return
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    start = time.perf_counter()
    requests = list(synthetic_requests(spans))
    write_json_lines(data / "traces.jsonl", requests)
    write_length_prefixed(data / "traces.pb", (to_protobuf(r) for r in requests))
    marker.touch()
    print(f"generated {spans:,} spans in {time.perf_counter() - start:.0f} s into {data}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--data", type=Path, default=ROOT / "bench" / "out" / "ingest")
    parser.add_argument("--only", help="run only measurements whose name contains this")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of each measurement, in turn; the fastest is reported (default 3)")
    parser.add_argument("--crossover", action="store_true",
                        help="time the reference and compiled paths on small dumps, whole process each")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.crossover:
        crossover(args.data, args.repeat)
        return
    if args.child:
        _child(args.child, args.data)
        return
    _generate(args.data, args.spans)
    sizes = {p.name: p.stat().st_size for p in args.data.iterdir() if p.is_file() and p.suffix}
    print(f"inputs: traces.jsonl {sizes['traces.jsonl'] / 2**20:.0f} MiB, traces.pb {sizes['traces.pb'] / 2**20:.0f} MiB")
    print("load average before: %.2f %.2f %.2f" % os.getloadavg())
    names = [name for name in MEASUREMENTS if not args.only or args.only in name]
    runs: dict[str, list] = {name: [] for name in names}
    for _ in range(args.repeat):  # in turn, so a burst of load on the machine hits each alike
        for name in names:
            command = [sys.executable, __file__, "--child", name, "--data", str(args.data)]
            out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
    results = {}
    for name in names:
        r = results[name] = min(runs[name], key=lambda run: run["seconds"])
        walls = sorted(run["seconds"] for run in runs[name])
        extra = f", Arrow spans table {r['table_bytes'] / 2**20:.0f} MiB" if r["table_bytes"] else ""
        print(
            f"{name:45s} {r['spans'] / r['seconds']:>10,.0f} spans/s {r['seconds']:6.2f} s wall"
            f" {r['spans'] / r['cpu_s']:>10,.0f} spans/cpu-s  peak +{r['peak_mib']:.0f} MiB{extra}"
            f"  (walls {', '.join(f'{w:.2f}' for w in walls)})"
        )
    _ratios(results)
    print("load average after: %.2f %.2f %.2f" % os.getloadavg())
    if not args.only or "compile" in args.only:
        print(f"one-time numba compile of the ingest kernels (empty cache, not in the figures above): "
              f"{_compile_seconds():.1f} s")


def _ratios(results: dict) -> None:
    def rate(name: str) -> float | None:
        r = results.get(name)
        return r["spans"] / r["seconds"] if r else None

    def cpu_rate(name: str) -> float | None:
        r = results.get(name)
        return r["spans"] / r["cpu_s"] if r else None

    pairs = [
        ("nemo-telemetry JSON lines -> Arrow", "hand-written JSON loop"),
        ("nemo-telemetry JSON lines -> Arrow", "pyarrow.json, explicit schema (parse only)"),
        ("nemo-telemetry protobuf -> Arrow", "hand-written protobuf loop"),
        ("nemo-telemetry protobuf -> Arrow", "upb ParseFromString (parse only)"),
        ("nemo-telemetry JSON lines -> Parquet", "hand-written JSON loop"),
        ("nemo-telemetry protobuf -> Parquet", "hand-written protobuf loop"),
    ]
    print()
    for ours, baseline in pairs:
        if rate(ours) and rate(baseline):
            print(
                f"{ours} / {baseline}: {rate(ours) / rate(baseline):.2f}x wall,"
                f" {cpu_rate(ours) / cpu_rate(baseline):.2f}x cpu"
            )
    for name, r in results.items():
        if r.get("table_bytes"):
            print(f"{name}: peak memory / Arrow table = {r['peak_mib'] * 2**20 / r['table_bytes']:.2f}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
