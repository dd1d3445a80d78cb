"""Importing nemo_telemetry.analysis and calling its public functions, or running a command through
the Typer app in the caller's process, leaves that process as it was: its environment variables,
how pyarrow converts pandas objects, Arrow's default memory pool and thread pools, numpy's page
setting, the import hooks and the signal handlers. The console script applies settings to its own
process only: a child process it starts sees the environment the command started with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

STEPS = (1, 2, 3)

# What the child process observes: everything a library call could change for the rest of the
# process. The pandas conversions are read last, after every call, in a process that had not
# imported pandas before them: pyarrow asks whether pandas is there once, on its first conversion.
_STATE = r'''
def process_state(conversions=False):
    import os, signal, sys
    state = {
        "environ": dict(os.environ),
        "signals": {s.name: repr(signal.getsignal(s)) for s in signal.valid_signals() if isinstance(s, signal.Signals)},
        "meta_path": [type(f).__qualname__ for f in sys.meta_path],
        "pandas_loaded": "pandas" in sys.modules,
        "gc_frozen": __import__("gc").get_freeze_count(),
    }
    if "pyarrow" in sys.modules:
        import pyarrow as pa
        state["arrow"] = {"pool": pa.default_memory_pool().backend_name, "cpus": pa.cpu_count(),
                          "io_threads": pa.io_thread_count()}
    if "numpy" in sys.modules:
        import numpy
        huge = numpy._core.multiarray._set_madvise_hugepage(True)
        numpy._core.multiarray._set_madvise_hugepage(huge)
        state["numpy_huge_pages"] = bool(huge)
    if conversions:
        import math
        import pandas as pd
        import pyarrow as pa
        state["nan"] = pa.array(pd.Series([1.0, math.nan])).to_pylist()
        try:
            state["nullable_int"] = pa.array(pd.Series([1, None], dtype="Int64")).to_pylist()
        except pa.ArrowInvalid as exc:
            state["nullable_int"] = f"ArrowInvalid: {exc}"
    return state
'''

_CALLS = _STATE + r'''
import json, sys, pathlib
dumps, work, plain = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
import pyarrow, numpy  # the caller's own imports (not pandas): the state is read with them loaded
before = process_state()

import nemo_telemetry.analysis as nt
from typer.testing import CliRunner
from nemo_telemetry.cli.app import app

dataset = work / "dataset"
called = set()
def call(name, *args, **kwargs):
    called.add(name)
    return getattr(nt, name)(*args, **kwargs)

# the commands first, while pyarrow has not asked for pandas (what goodput and check would hide it
# from), over a dataset without metrics (whose reader would load pandas for real)
runner = CliRunner()
cli = {}
for args in (["goodput", str(plain), "--format", "json", "--threads", "1", "--memory-budget", "1"],
             ["goodput", str(plain), "--format", "json"], ["check", str(plain), "--format", "json"]):
    result = runner.invoke(app, args)
    cli[" ".join(args[:1] + args[2:])] = (result.exit_code, result.output[:2000])
after_commands = process_state(conversions=True)  # before a reader of metrics imports pandas for real
call("ingest", [dumps], out=dataset)

call("ingest_with_engine", [dumps], out=work / "dataset2")
call("dump_files", [dumps])
tables = call("load_traces", dumps)
spans = call("read_spans", dataset)
call("read_events", dataset)
call("read_links", dataset)
call("read_for_analysis", dataset)
call("read_for_analysis", dumps)
call("spans_table", [{"trace_id": "ab" * 16, "span_id": "cd" * 8, "name": "x", "start_ns": 1, "end_ns": 2}])
call("parent_indices", spans)
call("attributed_iterations", spans)
call("with_id_keys", spans)
runs = call("run_goodput", spans)
call("run_goodput", spans, by="rank")
call("goodput_by_step", spans)
call("compare_runs", runs[0], runs[0])
call("goodput_document", runs, baseline=runs)
call("goodput_with_engine", dataset)
call("goodput_with_engine", dataset, memory_budget=1, threads=1)
call("goodput_with_engine", dataset, by="rank", memory_budget=1)
call("check_run", spans)
call("check_with_engine", dataset)
call("check_with_engine", dataset, threads=1, memory_budget=1)
call("span_census", dataset)
call("merge_intervals", numpy.array([1, 2]), numpy.array([3, 4]))
call("waterfall", spans)
call("critical_path", spans, step=2)
call("to_chrome_trace", spans)
call("to_html", spans)
metrics = call("read_metrics", dumps)
steps = call("step_windows", spans)
call("metrics_by_step", metrics, steps)
call("efficiency_by_step", metrics, steps)
call("with_efficiency_columns", runs[0].steps, metrics)
call("stitch_vllm_spans", spans)
logs = call("read_logs", dumps)
call("to_otlp_traces", spans)
call("to_otlp_logs", logs)
call("to_otlp_metrics", metrics)
call("run_goodput", spans, by="fleet,step", metrics=metrics)
call("write_goodput_plot", runs, work / "plot.html")
call("lint_paths", [nt.__file__])
call("verify_dataset", dataset)
call("repair_dataset", dataset)
call("kernels_compiling")
call("warm_up_kernels")
(work / "token").write_text("a-token-of-sixteen-or-more-characters\n")
call("read_token_file", work / "token")
call("run_collector", work / "collected", port=0, on_ready=lambda server: stop.set(),
     stop=(stop := __import__("threading").Event()))
call("run_monitor", follow=dumps, until_idle_s=0.2, poll_s=0.05, grace_s=0.0)
nt.ReadSettings.from_machine()

after = process_state(conversions=True)
print(json.dumps({"before": before, "after_commands": after_commands, "after": after, "called": sorted(called),
                  "cli": cli}))
'''

_REFERENCE = _STATE + r'''
import json
import pyarrow, numpy
print(json.dumps(process_state(conversions=True)))
'''

_CONSOLE_SCRIPT = _STATE + r'''
import json, os, subprocess, sys
started = dict(os.environ)
from nemo_telemetry.cli.app import main
sys.argv = ["nemo-telemetry", *sys.argv[1:]]
try:
    main()
    code = 0
except SystemExit as exc:
    code = exc.code or 0
finally:
    # a child started after the command had imported numpy and pyarrow (as Ray's workers are)
    child = subprocess.run([sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"],
                           capture_output=True, text=True, check=True).stdout
print(json.dumps({"exit": code, "started": started, "after": dict(os.environ), "child": json.loads(child),
                  "numpy": "numpy" in sys.modules}), file=sys.stderr)
'''

# Analysis functions that need what a small dataset in a test cannot give: none at present.
_NOT_CALLED: set[str] = set()


def _dumps(root, *, metrics: bool = True):
    from nemo_telemetry.instrument import (RLSpanGroup, flush_metrics, init_telemetry_driver, iteration_scope,
                                           managed_span, shutdown_telemetry, tee_metrics, umbrella_span)

    init_telemetry_driver({"enabled": True, "span_groups": "per_step", "exporter": "dump", "dump_dir": str(root)},
                          algorithm="grpo")
    for step in STEPS:
        with iteration_scope(step), umbrella_span(RLSpanGroup.U_STEP, "rl.grpo.step"):
            with managed_span(RLSpanGroup.GENERATION, "rl.vllm.generate"):
                time.sleep(0.005)
            if metrics:
                tee_metrics("efficiency", {"idle/buffer_starvation": 0.1 * step})
                assert flush_metrics()
    shutdown_telemetry()
    return root


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    return _dumps(tmp_path_factory.mktemp("side_effects") / "dumps")


@pytest.fixture(scope="module")
def plain_dataset(tmp_path_factory):
    """A dataset of spans alone (no metrics)."""
    from nemo_telemetry.analysis import ingest

    root = tmp_path_factory.mktemp("side_effects_plain")
    ingest([_dumps(root / "dumps", metrics=False)], out=root / "dataset")
    return root / "dataset"


def _env() -> dict:
    # numpy's and OpenBLAS's variables unset, as on a machine where nobody chose them
    return {k: v for k, v in os.environ.items()
            if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "NPY_ENABLE_CPU_FEATURES",
                         "NPY_DISABLE_CPU_FEATURES", "NUMPY_MADVISE_HUGEPAGE", "NEMO_TELEMETRY_PROCESS_TUNING")}


def test_public_api_and_in_process_commands_leave_the_process_as_it_was(dumps, plain_dataset, tmp_path):
    out = subprocess.run([sys.executable, "-c", _CALLS, str(dumps), str(tmp_path), str(plain_dataset)], env=_env(),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    reference = json.loads(subprocess.run([sys.executable, "-c", _REFERENCE], env=_env(), capture_output=True,
                                          text=True, check=True, timeout=120).stdout)

    import nemo_telemetry.analysis as nt

    functions = {n for n in nt.__all__ if callable(getattr(nt, n)) and not isinstance(getattr(nt, n), type)}
    assert functions - set(seen["called"]) == _NOT_CALLED  # every public function was called
    assert {code for code, _ in seen["cli"].values()} == {0}, seen["cli"]

    before = seen["before"]
    assert not before["pandas_loaded"]  # the calls began where pyarrow had not asked for pandas yet
    for after in (seen["after_commands"], seen["after"]):
        assert after["environ"] == before["environ"]
        assert after["signals"] == before["signals"]
        assert after["meta_path"] == before["meta_path"]
        assert after["arrow"] == before["arrow"] == reference["arrow"]
        assert after["numpy_huge_pages"] == before["numpy_huge_pages"] == reference["numpy_huge_pages"]
        # the two conversions a process that hid pandas from pyarrow's first probe gets wrong
        assert after["nan"] == reference["nan"] == [1.0, None]
        assert after["nullable_int"] == reference["nullable_int"] == [1, None]


@pytest.mark.parametrize("command", ["goodput", "check"])
def test_a_child_of_the_console_script_inherits_the_environment_it_started_with(plain_dataset, command):
    out = subprocess.run([sys.executable, "-c", _CONSOLE_SCRIPT, command, str(plain_dataset), "--format", "json"],
                         env=_env(), capture_output=True, text=True, timeout=300)
    seen = json.loads(out.stderr.strip().splitlines()[-1])
    assert seen["exit"] == 0 and seen["numpy"], out.stdout[-2000:]
    assert seen["after"] == seen["started"]
    assert seen["child"] == seen["started"]
