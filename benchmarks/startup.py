"""Start-up time of the shell: ``duckmob -c "SELECT 1"`` against a bare DuckDB start in Python, and the first
statement that needs duckmob's functions (which registers them: the release core and its imports).

    python benchmarks/startup.py [--runs 7]

Prints the median wall time of each command over ``--runs`` fresh processes (the machines are shared and noisy:
the median, not the best, is what a user sees), and each one's ratio to the bare start. The shell runs as
``python -m duckmob``, which is what the ``duckmob`` script runs.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "bare duckdb": [sys.executable, "-c", "import duckdb; duckdb.connect().sql('SELECT 1').fetchall()"],
    'duckmob -c "SELECT 1"': [sys.executable, "-m", "duckmob", "-c", "SELECT 1"],
    'duckmob -c "SELECT mob_cell(...)"': [sys.executable, "-m", "duckmob", "-c",
                                          "SELECT mob_cell(40.0, 116.3, [39.4, 115.4, 41.1, 117.6], 32)"],
}


def wall(command: list[str]) -> float:
    """Seconds from starting ``command`` to its exit (it must succeed)."""
    t0 = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    runs = parser.parse_args().runs
    for command in COMMANDS.values():  # warm the file cache and the .pyc files once
        wall(command)
    times = {name: [] for name in COMMANDS}
    for _ in range(runs):  # interleaved, so that a burst of load on the machine hits every command alike
        for name, command in COMMANDS.items():
            times[name].append(wall(command))
    bare = statistics.median(times["bare duckdb"])
    for name, seconds in times.items():
        median = statistics.median(seconds)
        print(f"{name:<36} median {median:6.3f} s  (min {min(seconds):.3f}, max {max(seconds):.3f}, "
              f"{runs} runs)  {median / bare:5.2f} x bare")


if __name__ == "__main__":
    main()
