"""What the release core's lock, reservation and ledger checks cost per release.

Runs the same public SQL on the shipped GeoLife sample: ``--releases`` noisy counts (the cheapest release, so the
protocol's own cost dominates) and a few PrivTrace ``synthesize`` calls, and prints the time per release. Run it
on two checkouts to get a ratio (e.g. the commit before the release core and after), in one session:

    python benchmarks/release.py                      # this checkout
    git worktree add /tmp/old <commit> && (cd /tmp/old && python /path/to/benchmarks/release.py)

The figures in the closing note of the release-core issue were measured this way, back to back.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import duckmob
from duckmob.demo import HRNET_BBOX, load_sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", type=int, default=100, help="noisy counts to time")
    parser.add_argument("--synth", type=int, default=5, help="synthesize calls to time")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        con = duckmob.connect(os.path.join(tmp, "bench.duckdb"))
        load_sample(con)
        con.sql("FROM mob_set_budget('trips', eps := 1e6, delta := 1e-5)").fetchall()
        count_s = []
        for i in range(args.releases):
            t = time.perf_counter()
            con.execute(f"FROM mob_noisy_count('trips', eps := 0.01, seed := {i})").fetchall()
            count_s.append(time.perf_counter() - t)
        synth_s = []
        for i in range(args.synth):
            t = time.perf_counter()
            con.execute(f"SELECT count(*) FROM synthesize('trips', eps := 1.0, bbox := {HRNET_BBOX}, "
                        f"outside := 'drop', seed := {i})").fetchall()
            synth_s.append(time.perf_counter() - t)
        con.close()
    print(f"duckmob at {os.path.dirname(duckmob.__file__)}")
    print(f"{'release':<28}{'n':>6}{'median ms':>12}{'mean ms':>10}")
    for name, values in (("mob_noisy_count (ledger grows)", count_s), ("synthesize privtrace", synth_s)):
        print(f"{name:<28}{len(values):>6}{statistics.median(values) * 1e3:>12.1f}"
              f"{statistics.fmean(values) * 1e3:>10.1f}")
    first, last = count_s[:10], count_s[-10:]
    print(f"noisy count: first 10 median {statistics.median(first) * 1e3:.1f} ms, last 10 median "
          f"{statistics.median(last) * 1e3:.1f} ms (the check composes every earlier release)")


if __name__ == "__main__":
    main()
