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
    "goodput": {"--format", "-f", "--run", "--by", "--plot", "--baseline", "--engine"},
    "check": {"--format", "-f", "--fail-on", "--unattributed-threshold", "--overlap-tolerance", "--run", "--engine"},
    "waterfall": {"--run", "--trace", "--step", "--depth", "--min-duration", "--collapse", "--expand", "--export"},
    "demo": {"--out", "--steps", "--mode", "--span-groups", "--seed", "--no-carrier", "--trainer"},
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


def _numpy_started(env: dict) -> dict:
    """How numpy starts in a fresh process started as the console script starts (numpy reads its
    settings once, when imported): whether it asks for huge pages, its dispatch targets in use."""
    code = ("import json, os\n"
            "from nemo_telemetry.cli.startup import prepare_numpy\n"
            "prepare_numpy()\n"
            "import numpy\n"
            "core = getattr(numpy, '_core', None) or numpy.core\n"
            "um = core._multiarray_umath\n"
            "print(json.dumps({'huge_pages': int(core.multiarray._set_madvise_hugepage(False)),\n"
            "                  'threads': len(os.listdir('/proc/self/task')),\n"
            "                  'dispatch': [f for f in um.__cpu_dispatch__ if um.__cpu_features__.get(f)],\n"
            "                  'disabled': os.environ.get('NPY_DISABLE_CPU_FEATURES')}))\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def _env_without(*names: str) -> dict:
    return {k: v for k, v in os.environ.items() if k not in names}


def test_the_entry_point_gives_numpy_small_pages_unless_the_user_chose():
    env = _env_without("NUMPY_MADVISE_HUGEPAGE")
    assert _numpy_started(env)["huge_pages"] == 0
    assert _numpy_started({**env, "NUMPY_MADVISE_HUGEPAGE": "1"})["huge_pages"] == 1


def test_the_entry_point_keeps_numpy_from_starting_blas_threads_unless_the_user_chose():
    env = _env_without("OPENBLAS_NUM_THREADS")
    assert _numpy_started(env)["threads"] == 1
    if (os.cpu_count() or 1) > 1:
        assert _numpy_started({**env, "OPENBLAS_NUM_THREADS": "2"})["threads"] > 1


ZEN4 = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
        "model name\t: AMD EPYC 9R14\nflags\t\t: fpu sse4_2 avx2 avx512f avx512dq avx512vl\n")


@pytest.mark.parametrize("cpuinfo, zen4", [
    (ZEN4, True),
    (ZEN4.replace(" avx512f avx512dq avx512vl", ""), False),  # Zen 3: family 19h without AVX-512
    (ZEN4.replace("cpu family\t: 25", "cpu family\t: 26"), False),  # Zen 5 runs the AVX-512 sort fast
    (ZEN4.replace("AuthenticAMD", "GenuineIntel").replace(": 25", ": 6"), False),
    ("", False),  # no /proc/cpuinfo
], ids=["zen4", "zen3", "zen5", "intel", "none"])
def test_only_zen4_is_told_apart_for_the_avx2_sort(cpuinfo, zen4):
    assert startup._is_zen4(cpuinfo) is zen4


def test_the_entry_point_sorts_with_avx2_on_zen4_unless_the_user_chose():
    """Where this machine is Zen 4 and numpy names its targets as 2.4 does, numpy starts without its
    AVX-512 targets (whose sort is microcoded there); elsewhere, and where the user set numpy's own
    variables, numpy starts as it would have."""
    env = _env_without("NPY_DISABLE_CPU_FEATURES", "NPY_ENABLE_CPU_FEATURES")
    started = _numpy_started(env)
    applies = startup._is_zen4(startup._cpuinfo_head()) and startup._numpy_version() >= (2, 4)
    if applies:
        assert started["disabled"] == startup.ZEN4_DISABLED_NUMPY_FEATURES
        assert not {"X86_V4", "AVX512_ICL", "AVX512_SPR"} & set(started["dispatch"])
    else:
        assert started["disabled"] is None
    chosen = _numpy_started({**env, "NPY_DISABLE_CPU_FEATURES": ""})
    assert chosen["disabled"] == ""
    if applies:
        assert "X86_V4" in chosen["dispatch"]


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


def _fresh_command(args: list[str]) -> tuple[dict, str]:
    """``nemo-telemetry ARGS`` through the console script's ``main`` in a fresh interpreter: its exit
    code and whether pandas was loaded when it ended, and its stdout."""
    code = ("import json, sys\n"
            "from nemo_telemetry.cli.app import main\n"
            f"sys.argv = ['nemo-telemetry', *{args!r}]\n"
            "try:\n"
            "    main()\n"
            "    code = 0\n"
            "except SystemExit as exc:\n"
            "    code = exc.code or 0\n"
            "print(json.dumps({'exit': code, 'pandas': 'pandas' in sys.modules}), file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
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
    assert ended == {"exit": 0, "pandas": False}, stdout
    if args == ["goodput", "--format", "json"]:
        (run,) = json.loads(stdout)["runs"]
        assert [s["iteration"] for s in run["steps"]] == list(STEPS)
    if args == ["check", "--format", "json"]:
        assert json.loads(stdout)["counts"]["error"] == 0


def test_goodput_still_loads_pandas_where_the_metrics_need_it(tmp_path):
    """pyarrow is told pandas is absent until something needs it: the efficiency metrics (pandas)
    beside each step come out as in a process where pandas was loaded first."""
    ended, stdout = _fresh_command(["goodput", str(_dumps(tmp_path / "dumps", metrics=True)), "--format", "json"])
    assert ended == {"exit": 0, "pandas": True}, stdout
    (run,) = json.loads(stdout)["runs"]
    assert {s["iteration"]: s["efficiency/idle/buffer_starvation_s"] for s in run["steps"]} == STEPS
