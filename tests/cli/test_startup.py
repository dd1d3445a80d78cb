"""``nemo-telemetry --help`` starts fast: defining the commands loads no numpy, pandas or pyarrow,
and every command's help still lists the options the CLI contract pins; ``goodput`` and ``check``
over a dataset load no pandas."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import typer
from typer.testing import CliRunner

from nemo_telemetry.cli import startup
from nemo_telemetry.cli.app import app

HEAVY = ("numpy", "pandas", "pyarrow", "ray", "matplotlib")

# The options of each command in the CLI contract, short forms included (``--help`` aside).
PINNED_OPTIONS = {
    "resolve": {"--namespace", "-n", "--json"},
    "groups": {"--json"},
    "ingest": {"--out", "-o", "--format", "-f", "--quiet", "-q", "--json", "--engine", "--max-request-mib",
               "--stall-timeout-s"},
    "collect": {"--out", "-o", "--host", "--port", "-p", "--max-request-mib", "--max-connections",
                "--read-timeout-s", "--token-file", "--tls-cert", "--tls-key", "--insecure"},
    "warmup": set(),
    "goodput": {"--format", "-f", "--run", "--by", "--plot", "--baseline", "--engine", "--threads", "--memory-budget"},
    "check": {"--format", "-f", "--fail-on", "--unattributed-threshold", "--overlap-tolerance", "--run", "--engine",
              "--threads", "--memory-budget"},
    "waterfall": {"--run", "--trace", "--step", "--depth", "--min-duration", "--collapse", "--expand", "--export"},
    "demo": {"--out", "--steps", "--mode", "--span-groups", "--seed", "--no-carrier", "--trainer", "--placement"},
    "lint": {"--format", "-f"},
}


def _commands() -> dict[str, object]:
    return typer.main.get_command(app).commands


def test_help_of_every_command_loads_no_numpy_pandas_or_pyarrow():
    code = (
        "import json, sys\n"
        "import typer\n"
        "from typer.testing import CliRunner\n"
        "from nemo_telemetry.cli.app import app\n"
        "runner = CliRunner()\n"
        "names = [[]] + [[name] for name in typer.main.get_command(app).commands]\n"
        "codes = {' '.join(n) or '(top)': runner.invoke(app, n + ['--help']).exit_code for n in names}\n"
        f"print(json.dumps({{'codes': codes, 'heavy': [m for m in {HEAVY!r} if m in sys.modules]}}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    result = json.loads(out.stdout)
    assert set(result["codes"]) >= {"(top)", *PINNED_OPTIONS}
    assert set(result["codes"].values()) == {0}, result["codes"]
    assert result["heavy"] == []


def test_top_level_help_lists_every_command():
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0, result.output
    for name in PINNED_OPTIONS:
        assert name in result.output


def test_each_command_keeps_its_pinned_options_and_shows_them_in_help():
    runner = CliRunner()
    commands = _commands()
    for name, pinned in PINNED_OPTIONS.items():
        declared = {opt for param in commands[name].params for opt in (*param.opts, *param.secondary_opts)
                    if opt.startswith("-")}
        assert declared - {"--help"} == pinned, name
        shown = runner.invoke(app, [name, "--help"], terminal_width=200)
        assert shown.exit_code == 0, (name, shown.output)
        for option in pinned:
            assert option in shown.output, (name, option)


def _numpy_started(env: dict, settings: dict | None = None) -> dict:
    """How numpy starts in a fresh process started as the console script starts (numpy reads its
    settings once, when imported): whether it asks for huge pages, the threads running after the
    import, its dispatch targets in use and its baseline, the environment the process and a child
    it starts see afterwards. ``settings``: what numpy imports under instead of the machine's."""
    prepare = ("startup.console_script_process()\n" if settings is None
               else f"startup.prepare_numpy({settings!r})\n")
    code = ("import json, os, subprocess, sys\n"
            "from nemo_telemetry.cli import startup\n"
            + prepare +
            "import importlib.util\n"
            "assert importlib.util.find_spec('numpy')  # a library asking where numpy is imports nothing\n"
            "import numpy\n"
            "core = getattr(numpy, '_core', None) or numpy.core\n"
            "um = core._multiarray_umath\n"
            "names = ('OPENBLAS_NUM_THREADS', 'NPY_ENABLE_CPU_FEATURES', 'NPY_DISABLE_CPU_FEATURES',\n"
            "         'NUMPY_MADVISE_HUGEPAGE')\n"
            "child = subprocess.run([sys.executable, '-c', 'import json, os; print(json.dumps(dict(os.environ)))'],\n"
            "                       capture_output=True, text=True, check=True).stdout\n"
            "print(json.dumps({'huge_pages': int(core.multiarray._set_madvise_hugepage(False)),\n"
            "                  'threads': len(os.listdir('/proc/self/task')),\n"
            "                  'dispatch': [f for f in um.__cpu_dispatch__ if um.__cpu_features__.get(f)],\n"
            "                  'baseline': list(um.__cpu_baseline__),\n"
            "                  'environ': {n: os.environ.get(n) for n in names},\n"
            "                  'child': {n: json.loads(child).get(n) for n in names}}))\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def _env_without(*names: str) -> dict:
    return {k: v for k, v in os.environ.items() if k not in names}


def _plain_numpy(env: dict) -> dict:
    """The same, without the console script's settings (NEMO_TELEMETRY_PROCESS_TUNING=0)."""
    return _numpy_started({**env, "NEMO_TELEMETRY_PROCESS_TUNING": "0"})


NUMPY_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "NPY_ENABLE_CPU_FEATURES", "NPY_DISABLE_CPU_FEATURES",
                   "NUMPY_MADVISE_HUGEPAGE")


def test_the_entry_point_leaves_numpy_its_huge_pages():
    """Small pages help only on a host whose free memory is fragmented, which cannot be told in
    advance: numpy asks for huge pages as it would without the entry point."""
    env = _env_without(*NUMPY_VARIABLES)
    assert _numpy_started(env)["huge_pages"] == _plain_numpy(env)["huge_pages"]


def test_the_entry_point_keeps_numpy_from_starting_blas_threads_and_no_child_inherits_it():
    env = _env_without(*NUMPY_VARIABLES)
    started = _numpy_started(env)
    assert started["threads"] == 1
    assert started["environ"]["OPENBLAS_NUM_THREADS"] is None  # gone once numpy is imported
    assert started["child"]["OPENBLAS_NUM_THREADS"] is None
    if (os.cpu_count() or 1) > 1:
        assert _plain_numpy(env)["threads"] > 1  # what it keeps from happening
        chosen = _numpy_started({**env, "OPENBLAS_NUM_THREADS": "2"})
        assert chosen["threads"] > 1 and chosen["child"]["OPENBLAS_NUM_THREADS"] == "2"


ZEN4_FLAGS = ("fpu sse4_2 movbe popcnt avx f16c abm fma bmi1 avx2 bmi2 avx512f avx512dq avx512cd avx512bw "
              "avx512vl avx512_vbmi2")
ZEN4 = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
        f"model name\t: AMD EPYC 9R14\nflags\t\t: {ZEN4_FLAGS}\n")


@pytest.mark.parametrize("cpuinfo, zen4", [
    (ZEN4, True),
    (ZEN4.replace(" avx512f avx512dq avx512cd avx512bw avx512vl avx512_vbmi2", ""), False),  # Zen 3: no AVX-512
    (ZEN4.replace("cpu family\t: 25", "cpu family\t: 26"), False),  # Zen 5 runs the AVX-512 sort fast
    (ZEN4.replace("AuthenticAMD", "GenuineIntel").replace(": 25", ": 6"), False),
    (ZEN4.replace(" bmi2", ""), False),  # a VM that hides a feature numpy's X86_V3 needs
    ("", False),  # no /proc/cpuinfo
], ids=["zen4", "zen3", "zen5", "intel", "no-bmi2", "none"])
def test_only_zen4_is_told_apart_for_the_avx2_sort(cpuinfo, zen4):
    assert startup._is_zen4(cpuinfo) is zen4


def test_the_avx2_sort_is_asked_for_on_zen4_with_numpy_2_4_unless_the_user_chose(monkeypatch):
    for name in NUMPY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    asked = startup.numpy_import_settings(cpuinfo=ZEN4, numpy_version=(2, 4))
    assert asked == {"OPENBLAS_NUM_THREADS": "1", "NPY_ENABLE_CPU_FEATURES": startup.ZEN4_ENABLED_NUMPY_FEATURES}
    assert "NPY_ENABLE_CPU_FEATURES" not in startup.numpy_import_settings(cpuinfo=ZEN4, numpy_version=(2, 3))
    assert startup.numpy_import_settings(cpuinfo=ZEN4.replace(": 25", ": 26"), numpy_version=(2, 4)) == {
        "OPENBLAS_NUM_THREADS": "1"}
    monkeypatch.setenv("NPY_DISABLE_CPU_FEATURES", "")
    assert "NPY_ENABLE_CPU_FEATURES" not in startup.numpy_import_settings(cpuinfo=ZEN4, numpy_version=(2, 4))


def _numpy_2_4_on_x86_v3() -> bool:
    version = startup._numpy_version()
    flags = set(ZEN4_FLAGS.split()) - {"avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512_vbmi2"}
    return version >= (2, 4) and flags <= set(startup._cpuinfo_head().partition("flags")[2].split())


@pytest.mark.skipif(not _numpy_2_4_on_x86_v3(), reason="the Zen 4 setting names numpy 2.4's x86 targets")
def test_numpy_imports_under_the_zen4_setting_without_avx512_and_gives_it_back():
    """What a Zen 4 machine's command gets, on this machine: numpy's AVX-512 targets off, its
    baseline (named in the setting too) accepted, and the variable gone before any child starts."""
    env = _env_without(*NUMPY_VARIABLES)
    started = _numpy_started(env, {"NPY_ENABLE_CPU_FEATURES": startup.ZEN4_ENABLED_NUMPY_FEATURES})
    assert not set(startup.ZEN4_DISABLED_NUMPY_FEATURES.split()) & set(started["dispatch"])
    assert started["environ"]["NPY_ENABLE_CPU_FEATURES"] is None
    assert started["child"]["NPY_ENABLE_CPU_FEATURES"] is None
    assert set(started["baseline"]) & set(startup.ZEN4_ENABLED_NUMPY_FEATURES.split())  # a baseline feature named


def test_the_entry_point_starts_numpy_as_it_would_where_the_user_set_its_variables():
    env = {**_env_without(*NUMPY_VARIABLES), "NPY_DISABLE_CPU_FEATURES": "", "OPENBLAS_NUM_THREADS": "2"}
    started, plain = _numpy_started(env), _plain_numpy(env)
    assert started["dispatch"] == plain["dispatch"]
    assert started["environ"] == plain["environ"] == started["child"]


# -- goodput and check load no pandas ----------------------------------------------------------

STEPS = {1: 0.25, 2: 0.5, 3: 1.5}  # step -> seconds of buffer starvation the "driver" reports


def _dumps(root, *, metrics: bool):
    """Dump files of a three-step GRPO-shaped run, written by the instrument side's dump exporter."""
    from nemo_telemetry.instrument import (RLSpanGroup, flush_metrics, init_telemetry_driver, iteration_scope,
                                           managed_span, shutdown_telemetry, tee_metrics, umbrella_span)

    init_telemetry_driver({"enabled": True, "span_groups": "per_step", "exporter": "dump", "dump_dir": str(root)},
                          algorithm="grpo")
    for step, seconds in STEPS.items():
        with iteration_scope(step), umbrella_span(RLSpanGroup.U_STEP, "rl.grpo.step"):
            with managed_span(RLSpanGroup.GENERATION, "rl.vllm.generate"):
                time.sleep(0.01)
            if metrics:
                tee_metrics("efficiency", {"idle/buffer_starvation": seconds})
                assert flush_metrics()
    shutdown_telemetry()
    return root


def _fresh_command(args: list[str], env: dict | None = None) -> tuple[dict, str]:
    """``nemo-telemetry ARGS`` through the console script's ``main`` in a fresh interpreter (``env``:
    its environment): its exit code, whether pandas was loaded when it ended and how many objects
    the collector holds frozen then, and its stdout."""
    code = ("import json, sys\n"
            "from nemo_telemetry.cli.app import main\n"
            f"sys.argv = ['nemo-telemetry', *{args!r}]\n"
            "try:\n"
            "    main()\n"
            "    code = 0\n"
            "except SystemExit as exc:\n"
            "    code = exc.code or 0\n"
            "import gc\n"
            "print(json.dumps({'exit': code, 'pandas': 'pandas' in sys.modules, 'frozen': gc.get_freeze_count()}),\n"
            "      file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    return json.loads(out.stderr.strip().splitlines()[-1]), out.stdout


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    from nemo_telemetry.analysis import ingest

    root = tmp_path_factory.mktemp("startup")
    ingest([_dumps(root / "dumps", metrics=False)], out=root / "dataset")
    return root / "dataset"


@pytest.mark.parametrize("args", [["goodput"], ["goodput", "--format", "json"], ["goodput", "--by", "rank"],
                                  ["check"], ["check", "--format", "json"]], ids=" ".join)
def test_goodput_and_check_over_a_dataset_load_no_pandas(ingested, args):
    ended, stdout = _fresh_command([*args, str(ingested)])
    assert {k: ended[k] for k in ("exit", "pandas")} == {"exit": 0, "pandas": False}, stdout
    if args == ["goodput", "--format", "json"]:
        (run,) = json.loads(stdout)["runs"]
        assert [s["iteration"] for s in run["steps"]] == list(STEPS)
    if args == ["check", "--format", "json"]:
        assert json.loads(stdout)["counts"]["error"] == 0


def test_the_console_script_freezes_the_collector_once_its_command_is_done(ingested):
    """Shutting down, the interpreter runs full collections over every object the imports made;
    frozen, they are skipped. Only the console script's own process, after its command (exit code
    kept), and not with NEMO_TELEMETRY_PROCESS_TUNING=0."""
    ended, stdout = _fresh_command(["check", str(ingested)])
    assert ended["exit"] == 0 and ended["frozen"] > 10_000, (ended, stdout)
    ended, _ = _fresh_command(["check", str(ingested), "--run", "no-such-run"])
    assert ended["exit"] == 2 and ended["frozen"] > 10_000, ended
    ended, _ = _fresh_command(["check", str(ingested)], env={**os.environ, "NEMO_TELEMETRY_PROCESS_TUNING": "0"})
    assert ended == {"exit": 0, "pandas": True, "frozen": 0}, ended


def test_goodput_still_loads_pandas_where_the_metrics_need_it(tmp_path):
    """pyarrow is told pandas is absent until something needs it: the efficiency metrics (pandas)
    beside each step come out as in a process where pandas was loaded first."""
    ended, stdout = _fresh_command(["goodput", str(_dumps(tmp_path / "dumps", metrics=True)), "--format", "json"])
    assert {k: ended[k] for k in ("exit", "pandas")} == {"exit": 0, "pandas": True}, stdout
    (run,) = json.loads(stdout)["runs"]
    assert {s["iteration"]: s["efficiency/idle/buffer_starvation_s"] for s in run["steps"]} == STEPS
