"""Streamed output (issue 31): time and peak memory of ``COPY (FROM mob_sample(...)) TO 'x.parquet'`` and of the
Python reader, against what the whole output takes in memory, on a PrivTrace model of the shipped sample.

    python benchmarks/stream_output.py --n 300000          # prints one JSON line per case

Each case runs in a fresh subprocess: the model is fitted (eps 1, seed 1), a small sample warms the code paths,
then the case runs; ``grew_mb`` is the growth of the process's peak RSS over the case (ru_maxrss), ``whole_mb`` the
output as Arrow columns (40 bytes a row), ``rows_s`` rows written a second. ``table`` materialises the whole output
(``duckmob.sample(..., stream=False)``), for comparison.
"""

from __future__ import annotations

import argparse
import json
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300_000)
    ap.add_argument("--cases", default="copy,reader,table")
    args = ap.parse_args()
    for case in args.cases.split(","):
        print(json.dumps(run(case, args.n)), flush=True)


if __name__ == "__main__":
    main()
