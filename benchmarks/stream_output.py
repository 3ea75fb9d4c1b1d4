"""Streamed output (issue 31): time and peak memory of ``COPY (FROM mob_sample(...)) TO 'x.parquet'`` and of the
Python reader, against what the whole output takes in memory, on a PrivTrace model of the shipped sample.

    python benchmarks/stream_output.py --n 300000          # prints one JSON line per case

Each case runs in a fresh subprocess: the model is fitted (eps 1, seed 1), a small sample warms the code paths,
then the case runs; ``grew_mb`` is the growth of the process's peak RSS over the case (ru_maxrss), ``whole_mb`` the
output as Arrow columns (40 bytes a row), ``rows_s`` rows written a second. ``table`` materialises the whole output
(``duckmob.sample(..., stream=False)``), for comparison.

Issue 42 (the route cache, drawing on threads), on a larger model:

    python benchmarks/stream_output.py --cases route-cache --n 20480 --replicas 30

fits PrivTrace once (eps 1, seed 1) on the shipped sample replicated ``replicas`` times (fresh ids, a jitter of up to
0.0005 degrees a copy: 30 copies are 3.7 M fixes and give a model of several hundred states), stores it in a
temporary database file, then times ``COPY (FROM mob_sample('m', n := N, seed := 9)) TO`` Parquet in a fresh process
per case: the route cache on and off (``DUCKMOB_ROUTE_CACHE``; ``--modes on`` for on only) under ``SET threads = 1``
and 2, and the first block alone (``n := 2048``: its route tables), in a process's first query and in its second
(the stored model is then the one the first query loaded, its route tables kept).
Wall and CPU seconds are the query's alone; ``load`` is the machine's one-minute load average when the case started.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

BBOX = [39.8477, 116.1956, 40.1133, 116.4880]

CASES = {
    "copy": "con.execute(f\"COPY (FROM mob_sample('m', n := {n}, seed := 9)) TO '{out}/x.parquet'\")",
    "reader": "r = duckmob.sample(con, 'm', {n}, seed=9, stream=True)\n"
              "con.execute(f\"COPY (FROM r) TO '{out}/y.parquet'\")",
    "table": "t = duckmob.sample(con, 'm', {n}, seed=9)",
}


def run(case: str, n: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        body = CASES[case].format(n=n, out=out)
        script = textwrap.dedent(f"""
            import json, resource, time
            import duckmob
            con = duckmob.connect()
            con.execute("CREATE TABLE trips AS FROM mob_geolife_sample()")
            con.execute("FROM mob_set_budget('trips', eps := 10, delta := 1e-5)").fetchall()
            con.execute("FROM mob_fit('trips', 'm', eps := 1.0, bbox := {BBOX}, seed := 1)").fetchall()
            con.sql("FROM mob_sample('m', n := 3000, seed := 2)").fetchall()
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            start = time.perf_counter()
        """) + body.replace("{out}", out) + textwrap.dedent(f"""
            seconds = time.perf_counter() - start
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            rows = con.sql("SELECT count(*) FROM mob_sample('m', n := {n}, seed := 9)").fetchall()[0][0]
            con.close()
            print(json.dumps({{"case": "{case}", "n": {n}, "rows": rows, "seconds": round(seconds, 1),
                              "rows_s": round(rows / seconds), "grew_mb": round((peak - before) / 1024),
                              "peak_mb": round(peak / 1024), "whole_mb": round(rows * 40 / 2 ** 20)}}))
        """)
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(proc.stderr[-3000:])
        return json.loads(proc.stdout.strip().splitlines()[-1])


def fit_replicated(path: str, replicas: int) -> None:
    """A PrivTrace model 'm' of the shipped sample replicated ``replicas`` times, stored in the database ``path``."""
    script = textwrap.dedent(f"""
        import duckmob
        con = duckmob.connect({path!r})
        con.execute("CREATE TABLE base AS FROM mob_geolife_sample()")
        con.execute(\"\"\"CREATE TABLE trips AS SELECT (user_id + r * 1000)::BIGINT AS user_id,
            traj_id::BIGINT + r * 100000000 AS traj_id, ts,
            lat + ((hash(r, traj_id) % 1000)::BIGINT - 500) * 1e-6 AS lat,
            lon + ((hash(traj_id, r) % 1000)::BIGINT - 500) * 1e-6 AS lon
            FROM base, range({int(replicas)}) t(r)\"\"\")
        con.execute("FROM mob_set_budget('trips', eps := 10, delta := 1e-5)").fetchall()
        con.execute("FROM mob_fit('trips', 'm', eps := 1.0, bbox := {BBOX}, seed := 1)").fetchall()
        con.close()
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])


def sample_case(path: str, n: int, cache: str, threads: int, again: bool = False) -> dict:
    """``COPY (FROM mob_sample('m', n := n)) TO`` Parquet from the stored model, in a fresh process (``again``: the
    second such query of the process, timed alone)."""
    with tempfile.TemporaryDirectory() as out:
        script = textwrap.dedent(f"""
            import json, os, time
            import duckmob
            con = duckmob.connect({path!r})
            con.execute("SET threads = {int(threads)}")
            if {again}:
                con.execute("COPY (FROM mob_sample('m', n := {int(n)}, seed := 9)) TO '{out}/x.parquet'")
            load = os.getloadavg()[0]
            wall, cpu = time.perf_counter(), time.process_time()
            con.execute("COPY (FROM mob_sample('m', n := {int(n)}, seed := 9)) TO '{out}/x.parquet'")
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            rows = con.sql("SELECT count(*) FROM '{out}/x.parquet'").fetchall()[0][0]
            con.close()
            print(json.dumps({{"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "rows": rows,
                              "load": round(load, 2)}}))
        """)
        env = dict(os.environ, DUCKMOB_ROUTE_CACHE=cache)
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
        if proc.returncode:
            raise SystemExit(proc.stderr[-3000:])
        got = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"case": f"mob_sample n={n} cache {cache}, threads {threads}{', second query' if again else ''}", **got}


def route_cache(n: int, replicas: int, modes: list[str]) -> None:
    """Issue 42's cases (see the module docstring) for the cache ``modes`` ('on', 'off'): one JSON line each, then
    the ratios of wall and CPU time (1 thread over 2; cache off over on)."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.duckdb")
        fit_replicated(path, replicas)
        print(json.dumps(sample_case(path, 2048, "on", 1)), flush=True)
        print(json.dumps(sample_case(path, 2048, "on", 1, again=True)), flush=True)
        got = {}
        for cache in modes:
            for threads in (1, 2):
                got[cache, threads] = sample_case(path, n, cache, threads)
                print(json.dumps(got[cache, threads]), flush=True)
        ratios = {}
        for what in ("wall_s", "cpu_s"):
            for cache in modes:
                ratios[f"{what} threads 1/2, cache {cache}"] = round(got[cache, 1][what] / got[cache, 2][what], 2)
            if len(modes) == 2:
                for threads in (1, 2):
                    ratios[f"{what} cache off/on, threads {threads}"] = round(
                        got["off", threads][what] / got["on", threads][what], 2)
        print(json.dumps(ratios))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300_000)
    ap.add_argument("--cases", default="copy,reader,table", help="copy,reader,table, or route-cache alone")
    ap.add_argument("--replicas", type=int, default=30, help="route-cache: copies of the shipped sample")
    ap.add_argument("--modes", default="on,off", help="route-cache: the route cache on, off or both")
    args = ap.parse_args()
    if args.cases == "route-cache":
        route_cache(args.n, args.replicas, args.modes.split(","))
        return
    for case in args.cases.split(","):
        print(json.dumps(run(case, args.n)), flush=True)


if __name__ == "__main__":
    main()
