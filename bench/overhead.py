"""What an instrumentation site costs, against baselines measured in the same run.

    .venv/bin/python bench/overhead.py [--loops 20000] [--repeats 60] [--steps 200] [--rounds 3]
                                       [--only sites|jitter] [--together]

Prints ns per call (min and median over repeats) and the ratios the instrument side is held to,
each the median of per-repeat ratios (the cases run back to back within a repeat, so load from
other processes hits both sides of a pair alike):

- disabled ``with managed_span(...)``     vs ``with contextlib.nullcontext()``   target <= 1.0x
- ``if is_span_group_enabled(...)``         vs ``with contextlib.nullcontext()``   target <= 0.2x
- enabled leaf ``managed_span`` (bucket)  vs the SDK's ``tracer.start_as_current_span(name,
  attributes={"rl.bucket": ..., "rl.span_group": ...})`` (the attributes the site sets) on the same
  provider and a no-op processor   target <= 1.10x

and what recording the span's group costs an enabled span: the SDK's span with ``rl.bucket`` and
``rl.span_group`` less the same span with ``rl.bucket`` alone, in ns per span (the disabled site
never builds the attribute dict, so it pays nothing for it).

Then step-time jitter (``--only jitter`` for this part alone, ``--only sites`` for the part above):
a training loop of ``--steps`` steps (default 200), each one ``rl.grpo.step`` umbrella around 7
leaf spans (8 spans a step), each leaf a fixed amount of CPU work that holds the GIL part of the
time (a numpy sort, which releases it, and a pure-Python loop, which holds it), traced with the
public ``nemo_telemetry.instrument`` API. Each configuration runs in a fresh subprocess:

- ``none``: telemetry off (``enabled: false``), the baseline;
- ``dump``: the dump exporter (``traces-*.jsonl``; metrics and, with ``logs_enabled``, one log
  record a step into ``logs-*.jsonl``);
- ``otlp``: the real ``OTLPSpanExporter`` (HTTP protobuf) against a receiver on 127.0.0.1 in this
  process (a ``ThreadingHTTPServer`` answering 200 to every request).

Prints p50 and p99 step time per configuration and round, and each exporter's p50 / p99 over
the baseline's of the same round (the configurations of a round run back to back), as the median
over ``--rounds`` and its spread (min-max). Target: p99 ratio <= 1.2x, p50 ratio ~1.0x. On a
machine other work shares, ``--together`` starts a round's configurations at the same moment, so
the load they meet is the same (each is then one of three loops on the cores).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import timeit

from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

from nemo_telemetry.instrument import (
    RLSpanGroup,
    get_tracer,
    is_span_group_enabled,
    managed_span,
    set_enabled_span_groups,
    set_tracer_provider,
)

GROUP = RLSpanGroup.GENERATION
NAME = "rl.vllm.generate"


class _DropProcessor(SpanProcessor):
    """Receives every span and keeps none, so exporting does not dominate the figures."""

    def on_start(self, span, parent_context=None) -> None:
        return None

    def on_end(self, span) -> None:
        return None


def _statements(raw_tracer) -> tuple[dict[str, str], dict]:
    """Each site inline in timeit's loop (no wrapper function diluting the ratios)."""
    namespace = {
        "nullcontext": contextlib.nullcontext,
        "managed_span": managed_span,
        "is_span_group_enabled": is_span_group_enabled,
        "raw_tracer": raw_tracer,
        "GROUP": GROUP,
        "NAME": NAME,
    }
    statements = {
        "nullcontext": "with nullcontext(): pass",
        "managed_span": "with managed_span(GROUP, NAME): pass",
        "guarded": "if is_span_group_enabled(GROUP): pass",
        "raw_sdk": "with raw_tracer.start_as_current_span(NAME, attributes={'rl.bucket': 'productive'}): pass",
        "raw_sdk_group": "with raw_tracer.start_as_current_span(NAME, attributes={'rl.bucket': 'productive', "
                         "'rl.span_group': 'generation'}): pass",
    }
    return statements, namespace


def _measure(statements: dict[str, str], namespace: dict, loops: int, repeats: int) -> dict[str, list[float]]:
    """ns per call, one sample per repeat and case; cases alternate within a repeat (paired samples)."""
    timers = {name: timeit.Timer(stmt, globals=namespace) for name, stmt in statements.items()}
    samples: dict[str, list[float]] = {name: [] for name in statements}
    for _ in range(repeats):
        for name, timer in timers.items():
            samples[name].append(timer.timeit(number=loops) / loops * 1e9)
    return samples


def site_figures(args: argparse.Namespace) -> None:
    """ns per instrumentation site, disabled and enabled, against same-run baselines."""
    provider = TracerProvider()
    provider.add_span_processor(_DropProcessor())
    raw_tracer = provider.get_tracer("bench")
    statements, namespace = _statements(raw_tracer)

    set_tracer_provider(None)
    set_enabled_span_groups(())
    disabled = _measure({k: statements[k] for k in ("nullcontext", "managed_span", "guarded")}, namespace,
                        args.loops, args.repeats)

    set_tracer_provider(provider)
    set_enabled_span_groups([GROUP])
    assert get_tracer() is not None
    enabled_loops = max(1, args.loops // 20)
    enabled = _measure({k: statements[k] for k in ("raw_sdk", "raw_sdk_group", "managed_span")}, namespace,
                       enabled_loops, args.repeats)
    set_enabled_span_groups(())
    set_tracer_provider(None)

    def row(label: str, samples: list[float]) -> None:
        print(f"  {label:<58} min {min(samples):9.1f} ns   median {statistics.median(samples):9.1f} ns")

    def ratio(label: str, num: list[float], den: list[float], target: float) -> None:
        # The verdict uses the median of per-repeat ratios: each pair ran back to back, so load
        # from other processes hits both sides of a pair alike; the ratio of mins is shown too.
        paired = statistics.median(n / d for n, d in zip(num, den))
        of_mins = min(num) / min(den)
        verdict = "ok" if paired <= target else "OVER TARGET"
        print(f"  {label:<58} {paired:5.2f}x (paired median)  {of_mins:5.2f}x (of mins)   "
              f"target <= {target:.2f}x  {verdict}")

    print(f"loops={args.loops} (enabled: {enabled_loops}), repeats={args.repeats}")
    print("disabled site (telemetry off):")
    row("with contextlib.nullcontext()", disabled["nullcontext"])
    row("with managed_span(GENERATION, name)", disabled["managed_span"])
    row("if is_span_group_enabled(GENERATION)", disabled["guarded"])
    print("enabled leaf span (no-op span processor):")
    row("with tracer.start_as_current_span(name, attributes=bucket)", enabled["raw_sdk"])
    row("  ... attributes=bucket and span group", enabled["raw_sdk_group"])
    row("with managed_span(GENERATION, name)", enabled["managed_span"])
    group_ns = [g - b for g, b in zip(enabled["raw_sdk_group"], enabled["raw_sdk"])]
    print(f"  {'recording the span group (rl.span_group), per enabled span':<58} median {statistics.median(group_ns):9.1f} "
          f"ns   ({statistics.median(g / b for g, b in zip(enabled['raw_sdk_group'], enabled['raw_sdk'])):.3f}x "
          "the SDK span without it, paired median)")
    print("ratios:")
    ratio("disabled managed_span / nullcontext", disabled["managed_span"], disabled["nullcontext"], 1.0)
    ratio("guarded site / nullcontext", disabled["guarded"], disabled["nullcontext"], 0.2)
    ratio("enabled managed_span / raw SDK start_as_current_span", enabled["managed_span"], enabled["raw_sdk_group"],
          1.10)



# -- step-time jitter ---------------------------------------------------------------------------

JITTER_CONFIGS = ("none", "dump", "otlp")
LEAVES = (  # (group attribute on RLSpanGroup, span name): 7 leaves + the step umbrella = 8 spans a step
    ("DATA_PROCESSING", "rl.grpo.data_processing"),
    ("GENERATION", "rl.vllm.generate"),
    ("REWARD", "rl.grpo.reward_calculation"),
    ("LOGPROB", "rl.grpo.policy_and_reference_logprobs"),
    ("ADVANTAGE", "rl.grpo.advantage_calculation"),
    ("POLICY_UPDATE", "rl.grpo.policy_training"),
    ("DATA_PLANE", "rl.data_plane.put"),
)


def _leaf_work(array, python_iterations: int) -> int:
    """One phase's CPU work: a numpy sort (releases the GIL) and a pure-Python loop (holds it)."""
    import numpy as np

    np.sort(array)
    total = 0
    for i in range(python_iterations):
        total += i * i
    return total


def _run_delay_s() -> float:
    """Seconds this thread has been runnable but waiting for a core (Linux schedstat); 0 where unknown.

    A thread waiting for the GIL sleeps on a condition variable, so this counts other processes'
    load and not the GIL: a step's wall time less it is the step the loop would take on idle
    cores, GIL waits included.
    """
    try:
        with open("/proc/thread-self/schedstat", "rb") as stat:
            return int(stat.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def _jitter_child(config: str, steps: int, warmup: int, sort_size: int, python_iterations: int,
                  dump_dir: str, endpoint: str | None) -> None:
    """One configuration in this (fresh) process; prints one JSON line of step times in ms."""
    import json
    import logging
    import time

    import numpy as np

    from nemo_telemetry.instrument import (RLSpanGroup, init_telemetry_driver, iteration_scope, managed_span,
                                           shutdown_telemetry, umbrella_span)

    if config == "none":
        telemetry = {"enabled": False}
    elif config == "dump":
        telemetry = {"enabled": True, "span_groups": "per_step", "exporter": "dump", "dump_dir": dump_dir,
                     "logs_enabled": True}
    else:
        telemetry = {"enabled": True, "span_groups": "per_step", "exporter": "otlp", "otlp_endpoint": endpoint,
                     "otlp_protocol": "http/protobuf"}
    init_telemetry_driver(telemetry, algorithm="grpo", service_name=f"bench-{config}")
    log = logging.getLogger("bench.trainer")
    log.setLevel(logging.INFO)
    log.propagate = True
    array = np.random.default_rng(0).random(sort_size)
    leaves = [(getattr(RLSpanGroup, group), name) for group, name in LEAVES]
    step_ms: list[float] = []
    cpu_ms: list[float] = []  # the training thread's own CPU time a step: what the loop itself costs
    core_wait_ms: list[float] = []  # time it was runnable but had no core (other work on the machine)
    try:
        for step in range(1, warmup + steps + 1):
            start, cpu_start, wait_start = time.perf_counter(), time.thread_time(), _run_delay_s()
            with iteration_scope(step), umbrella_span(RLSpanGroup.U_STEP, "rl.grpo.step"):
                for group, name in leaves:
                    with managed_span(group, name):
                        _leaf_work(array, python_iterations)
                log.info("step %d done", step)
            if step > warmup:
                step_ms.append((time.perf_counter() - start) * 1e3)
                cpu_ms.append((time.thread_time() - cpu_start) * 1e3)
                core_wait_ms.append((_run_delay_s() - wait_start) * 1e3)
    finally:
        shutdown_telemetry()
    written = sum(1 for name in os.listdir(dump_dir) if name.endswith(".jsonl")) if os.path.isdir(dump_dir) else 0
    print(json.dumps({"config": config, "step_ms": step_ms, "cpu_ms": cpu_ms, "core_wait_ms": core_wait_ms,
                      "dump_files": written}))


class _Receiver:
    """An OTLP/HTTP receiver on 127.0.0.1 answering 200 to every POST, in a thread of this process."""

    def __init__(self) -> None:
        import http.server
        import threading

        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # the http.server name
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                receiver.requests += 1
                receiver.bytes += len(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                return None

        self.requests = 0
        self.bytes = 0
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _percentile(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(np.asarray(values), q))


def _run_children(configs: tuple[str, ...], args: argparse.Namespace, endpoint: str,
                  together: bool) -> dict[str, dict]:
    """Each configuration in a fresh subprocess: one after another, or all started at once (``together``)."""
    import json
    import subprocess
    import sys
    import tempfile

    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    for name in [k for k in env if k.startswith(("NEMO_TELEMETRY_", "OTEL_"))]:
        del env[name]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="nemo-jitter-") as root:
        def start(config: str) -> subprocess.Popen:
            dump_dir = os.path.join(root, config)
            command = [sys.executable, __file__, "--jitter-child", config, "--steps", str(args.steps),
                       "--warmup", str(args.warmup), "--sort-size", str(args.sort_size),
                       "--python-iterations", str(args.python_iterations), "--dump-dir", dump_dir,
                       "--endpoint", endpoint]
            return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        def finish(config: str, child: subprocess.Popen) -> None:
            out, err = child.communicate(timeout=600)
            if child.returncode != 0:
                raise SystemExit(f"jitter child {config} failed ({child.returncode}):\n{err}")
            results[config] = json.loads(out.strip().splitlines()[-1])

        if together:
            children = {config: start(config) for config in configs}
            for config, child in children.items():
                finish(config, child)
        else:
            for config in configs:
                finish(config, start(config))
    return results


def _quantiles(values: list[float]) -> dict[str, float]:
    return {"p50": _percentile(values, 50), "p99": _percentile(values, 99), "max": max(values)}


def _print_ratios(rounds: list[dict[str, dict[str, dict[str, float]]]], measure: str) -> None:
    for config in JITTER_CONFIGS:
        cells = []
        for quantile in ("p50", "p99"):
            values = [r[config][measure][quantile] for r in rounds]
            cells.append(f"{quantile} {statistics.median(values):6.2f} ms [{min(values):.2f}-{max(values):.2f}]")
        if config != "none":
            for quantile, target in (("p50", None), ("p99", 1.2)):
                ratios = [r[config][measure][quantile] / r["none"][measure][quantile] for r in rounds]
                median = statistics.median(ratios)
                verdict = "" if target is None else ("  ok" if median <= target else "  OVER TARGET")
                cells.append(f"{quantile} {median:4.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]"
                             + (f" target <= {target:.1f}x{verdict}" if target else ""))
        print(f"    {config:<5} " + "   ".join(cells))


def jitter_figures(args: argparse.Namespace) -> None:
    """p50 / p99 step time with no exporter, the dump exporter and OTLP, and same-round ratios.

    Two measures of a step: its wall time, and its wall time less the time the training thread
    was runnable with no free core (``/proc/thread-self/schedstat``), which takes out the load of
    other processes and keeps the GIL waits the exporters cause.
    """
    receiver = _Receiver()
    rounds: list[dict[str, dict[str, dict[str, float]]]] = []
    try:
        print(f"step-time jitter: {args.steps} steps (+{args.warmup} warm-up) of 8 spans, "
              f"{args.rounds} rounds, configurations in fresh subprocesses "
              f"({'started together' if args.together else 'one after another'}); load {os.getloadavg()[0]:.2f}; "
              f"nemo_telemetry from {os.path.dirname(os.path.dirname(__import__('nemo_telemetry').__file__))}")
        for number in range(1, args.rounds + 1):
            figures: dict[str, dict[str, dict[str, float]]] = {}
            turn = (number - 1) % len(JITTER_CONFIGS)  # rotate the order, so no configuration always runs first
            order = JITTER_CONFIGS[turn:] + JITTER_CONFIGS[:turn]
            results = _run_children(order, args, receiver.endpoint, args.together)
            for config in order:
                result = results[config]
                on_core = [wall - wait for wall, wait in zip(result["step_ms"], result["core_wait_ms"])]
                figures[config] = {"wall": _quantiles(result["step_ms"]), "on_core": _quantiles(on_core),
                                   "cpu": _quantiles(result["cpu_ms"])}
                wall, core, cpu = figures[config]["wall"], figures[config]["on_core"], figures[config]["cpu"]
                print(f"  round {number}  {config:<5} wall p50 {wall['p50']:7.2f} p99 {wall['p99']:7.2f} "
                      f"max {wall['max']:7.2f} ms   less core waits p50 {core['p50']:6.2f} p99 {core['p99']:6.2f} "
                      f"max {core['max']:6.2f} ms   training thread's CPU p50 {cpu['p50']:6.2f} ms   "
                      f"files {result['dump_files']}")
            rounds.append(figures)
    finally:
        receiver.close()
    print(f"  OTLP receiver: {receiver.requests} requests, {receiver.bytes / 1e6:.1f} MB; "
          f"load {os.getloadavg()[0]:.2f}")
    print("ratios to no exporter (same round), median [min-max] over rounds:")
    print("  step wall time:")
    _print_ratios(rounds, "wall")
    print("  step time less the training thread's waits for a core (other processes' load):")
    _print_ratios(rounds, "on_core")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--only", choices=("sites", "jitter"), default=None)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sort-size", type=int, default=400_000, help="floats each leaf sorts (numpy)")
    parser.add_argument("--python-iterations", type=int, default=40_000, help="each leaf's pure-Python loop")
    parser.add_argument("--together", action="store_true",
                        help="start a round's configurations at once, so load from other work hits all alike")
    parser.add_argument("--jitter-child", choices=JITTER_CONFIGS, help=argparse.SUPPRESS)
    parser.add_argument("--dump-dir", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.jitter_child:
        _jitter_child(args.jitter_child, args.steps, args.warmup, args.sort_size, args.python_iterations,
                      args.dump_dir, args.endpoint)
        return
    if args.only in (None, "sites"):
        site_figures(args)
    if args.only in (None, "jitter"):
        jitter_figures(args)


if __name__ == "__main__":
    main()
