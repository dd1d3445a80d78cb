"""``nemo-telemetry --help`` starts fast: defining the commands loads no numpy, pandas or pyarrow,
and every command's help still lists the options the CLI contract pins."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import typer
from typer.testing import CliRunner

from nemo_telemetry.cli.app import app

HEAVY = ("numpy", "pandas", "pyarrow", "ray", "matplotlib")

# The options of each command in the CLI contract, short forms included (``--help`` aside).
PINNED_OPTIONS = {
    "resolve": {"--namespace", "-n", "--json"},
    "groups": {"--json"},
    "ingest": {"--out", "-o", "--format", "-f", "--quiet", "-q", "--json", "--engine"},
    "collect": {"--out", "-o", "--host", "--port", "-p", "--max-request-mib", "--max-connections",
                "--read-timeout-s"},
    "warmup": set(),
    "goodput": {"--format", "-f", "--run", "--by", "--plot", "--baseline", "--engine"},
    "check": {"--format", "-f", "--fail-on", "--unattributed-threshold", "--overlap-tolerance", "--run", "--engine"},
    "waterfall": {"--run", "--trace", "--step", "--depth", "--min-duration", "--collapse", "--expand", "--export"},
    "demo": {"--out", "--steps", "--mode", "--span-groups", "--seed", "--no-carrier"},
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


def _numpy_huge_pages(env: dict) -> str:
    """Whether numpy asks for huge pages in a fresh process started as the console script starts
    (numpy reads ``NUMPY_MADVISE_HUGEPAGE`` once, when imported)."""
    code = ("from nemo_telemetry.cli.app import prefer_small_pages; prefer_small_pages(); import numpy; "
            "core = getattr(numpy, '_core', None) or numpy.core; "
            "print(int(core.multiarray._set_madvise_hugepage(False)))")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_entry_point_gives_numpy_small_pages_unless_the_user_chose():
    env = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    assert _numpy_huge_pages(env) == "0"
    assert _numpy_huge_pages({**env, "NUMPY_MADVISE_HUGEPAGE": "1"}) == "1"
