"""How long ``nemo-telemetry --help`` takes, against ``python -c pass`` measured in the same run.

    .venv/bin/python bench/startup.py [--runs 21]

Each figure is a fresh process (the interpreter, its imports, the command's options); the cases
alternate within each round, so load from other processes hits both alike. Prints the median and
the minimum wall of each, the median ``--help`` minus ``pass`` (what the CLI itself costs), and
the target: ``--help`` under 0.3 s. The package is byte-compiled first, as an installed one is
(``bench/_bytecode.py``), and each case runs once before the clock starts (the page cache).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

CASES = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "nemo-telemetry --help": [sys.executable, "-c", "from nemo_telemetry.cli.app import main; main()", "--help"],
    "nemo-telemetry goodput --help": [sys.executable, "-c", "from nemo_telemetry.cli.app import main; main()",
                                      "goodput", "--help"],
}
TARGET_S = 0.3


def _wall(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21, help="fresh processes per case (the median is printed)")
    args = parser.parse_args()
    from _bytecode import compile_measured_packages  # bench/_bytecode.py (this script's folder is on sys.path)

    compile_measured_packages()
    for command in CASES.values():  # warm the page cache
        _wall(command)
    walls: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.runs):
        for name, command in CASES.items():
            walls[name].append(_wall(command))
    print(f"load average: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs; {args.runs} runs each")
    for name, values in walls.items():
        print(f"{name:32s} median {statistics.median(values) * 1e3:7.1f} ms   min {min(values) * 1e3:7.1f} ms")
    base = statistics.median(walls["python -c pass"])
    helped = statistics.median(walls["nemo-telemetry --help"])
    print(f"--help minus python -c pass: {(helped - base) * 1e3:.1f} ms; "
          f"--help {helped:.3f} s against a target of {TARGET_S} s ({'met' if helped < TARGET_S else 'MISSED'})")


if __name__ == "__main__":
    main()
