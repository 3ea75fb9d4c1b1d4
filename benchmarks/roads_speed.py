"""Time of a PrivTrace release with roads against the same release without, side by side (issue 39, item 7).

Data: ``--trips`` trips simulated on the shipped downtown SF roads (``benchmarks/roads_sim.py``, the "real A" of
``benchmarks/roads.py``: city seed 0, trips seed 101), or a Parquet copy of them (``--table``; written there
when missing, so a second run skips the 80 s simulation). Each seed releases the table twice, eps 1, default n
(one synthetic trip per real one), the issue's downtown box as bbox: without roads, then with ``roads := 'roads'``
(the shipped SF roads), one right after the other so both see the same machine load. Before the seeds, one
untimed release of 10 trips without roads pays the imports; then ``cold``, the first release with roads, also
builds what a database keeps per network (the cut network, its graph and chains, the junction distance table);
the seeds after it find them built, as every later release on that database does.

Columns: wall seconds (``time.perf_counter``) and CPU seconds of the process (``time.process_time``: every thread;
less moved by other people's load on a shared machine) of each release, their ratios with / without roads, and
the first 12 hex digits of a SHA-1 of the rows with roads (lat, lon), to check that a change left them alone.

    python benchmarks/roads_speed.py --table /tmp/roads_a_20k.parquet                 # 20,000 trips, seeds 1,2,3
    python benchmarks/roads_speed.py --trips 2000 --seeds 1 --table /tmp/roads_a_2k.parquet   # a quick check
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

BOX = [37.76, -122.45, 37.80, -122.38]          # min_lat, min_lon, max_lat, max_lon (benchmarks/roads.py)
EPS = 1.0


def real_table(trips: int, path: str | None):
    import pyarrow.parquet as pq

    if path and os.path.exists(path):
        return pq.read_table(path)
    from roads_sim import City

    table = City(seed=0).trips(trips, 101)
    if path:
        pq.write_table(table, path)
    return table


def rows_digest(table) -> str:
    cols = [np.ascontiguousarray(table.column(c).to_numpy()) for c in ("lat", "lon")]
    return hashlib.sha1(b"".join(c.tobytes() for c in cols)).hexdigest()[:12]


def timed(con, seed: int, n: int, **kw):
    import duckmob

    wall, cpu = time.perf_counter(), time.process_time()
    out = duckmob.synthesize(con, "real_a", EPS, "privtrace", bbox=BOX, seed=seed, n=n, **kw)
    return time.perf_counter() - wall, time.process_time() - cpu, out


def load() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "uptime: unavailable"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trips", type=int, default=20000)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--table", default=None, help="a Parquet copy of the simulated trips (read, or written)")
    parser.add_argument("--params", default=None, help="JSON params of the release with roads, e.g. "
                        "'{\"road_weight\": 0.5}' (the one without roads keeps the defaults)")
    args = parser.parse_args()
    import duckmob

    table = real_table(args.trips, args.table)
    n = int(np.unique(table.column("traj_id").to_numpy()).size)
    print(f"{table.num_rows:,} fixes of {n:,} simulated trips; {load()}", flush=True)
    from roads import release_db

    con = release_db(table)
    duckmob.synthesize(con, "real_a", EPS, "privtrace", bbox=BOX, seed=10**6, n=10)      # imports, untimed
    print(f"{'seed':>6s} {'without s':>10s} {'with s':>8s} {'ratio':>6s} {'without cpu':>12s} {'with cpu':>9s} "
          f"{'ratio':>6s} {'rows':>6s} {'rows with roads':>16s}", flush=True)
    rows = []
    for seed in ["cold"] + [int(s) for s in args.seeds.split(",")]:
        s = 10**6 + 1 if seed == "cold" else seed
        w0, c0, _ = timed(con, s, n)
        w1, c1, out = timed(con, s, n, roads="roads", **({"params": json.loads(args.params)} if args.params else {}))
        rows.append((seed, w0, w1, c0, c1))
        print(f"{seed!s:>6s} {w0:10.2f} {w1:8.2f} {w1 / w0:6.2f} {c0:12.2f} {c1:9.2f} {c1 / c0:6.2f} "
              f"{out.num_rows:>6,d} {rows_digest(out):>16s}", flush=True)
    warm = [r for r in rows if r[0] != "cold"]
    if warm:
        w0, w1, c0, c1 = (float(np.mean([r[i] for r in warm])) for i in range(1, 5))
        print(f"{'mean':>6s} {w0:10.2f} {w1:8.2f} {w1 / w0:6.2f} {c0:12.2f} {c1:9.2f} {c1 / c0:6.2f}  "
              f"(seeds {args.seeds}; ratio of the means)")
    print(load())
    con.close()


if __name__ == "__main__":
    main()
