"""Evaluation in bounded memory (issue 42, item 6): time and peak memory of mob_evaluate and mob_plot_density on a
replicated GeoLife table against a PrivTrace synthetic table of the same size, beside the release that made it.

    python benchmarks/evaluate_memory.py --sizes 1e6,3e6,5e6
    python benchmarks/evaluate_memory.py --sizes 1e6 --code /tmp/exp/old     # the same cases on another checkout

Tables: ``benchmarks/scale.py``'s replicated GeoLife (``DIR/points_<n>.parquet``, made once from ``--source`` or
$DUCKMOB_SCALE_SOURCE). Cases, each in a fresh subprocess (peak RSS = the process's VmHWM, DuckDB's buffers
included; wall = the statement alone):

* ``release``: ``COPY (FROM synthesize('real', eps := 1, bbox := ..., seed := 1)) TO DIR/synth_<n>.parquet`` (the
  default n: a synthetic table as large as the real one), kept for the next cases; its wall time is the release's.
* ``evaluate``: ``FROM mob_evaluate('real', 'synth', bbox := ...)`` (every family, reference and baseline on),
  both tables views over the Parquet files.
* ``plot-density``: ``FROM mob_plot_density('real', 'synth', path := ..., bbox := ...)``.

The table ends with each evaluation case's wall time over the release's at the same size (issue 42's target: within
3x) and the machine's load (``uptime``) when the run began and ended.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from scale import BBOX, SOURCE_VARIABLE, generate, peak_rss_mb  # noqa: E402

CASES = ["release", "evaluate", "plot-density"]


def child(case: str, points: str, synth: str) -> dict:
    """Run one case in this process: its wall time (s), CPU time (s) and peak RSS (MB)."""
    import resource

    import duckdb

    import duckmob

    con = duckdb.connect()
    duckmob.register(con)
    con.execute(f"CREATE VIEW real AS FROM '{points}'")
    start = time.perf_counter()
    use = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = use.ru_utime + use.ru_stime
    if case == "release":
        con.execute("FROM mob_set_budget('real', eps := 100, delta := 1e-5)").fetchall()
        start = time.perf_counter()
        con.execute(f"COPY (FROM synthesize('real', eps := 1.0, bbox := {BBOX}, seed := 1)) TO '{synth}' "
                    "(FORMAT parquet)")
        out = con.sql(f"SELECT count(*) FROM '{synth}'").fetchall()[0][0]
    else:
        con.execute(f"CREATE VIEW synth AS FROM '{synth}'")
        if case == "evaluate":
            rows = con.sql(f"SELECT metric, value FROM mob_evaluate('real', 'synth', bbox := {BBOX})").fetchall()
            out = len(rows)
        else:
            path = synth + ".png"
            con.sql(f"FROM mob_plot_density('real', 'synth', path := '{path}', bbox := {BBOX})").fetchall()
            out = os.path.getsize(path)
    wall = time.perf_counter() - start
    use = resource.getrusage(resource.RUSAGE_SELF)
    return {"case": case, "wall_s": round(wall, 2), "cpu_s": round(use.ru_utime + use.ru_stime - cpu0, 2),
            "peak_mb": peak_rss_mb(), "out": out}


def uptime() -> str:
    with open("/proc/loadavg") as f:
        return "load " + " ".join(f.read().split()[:3])


def run_case(case: str, points: str, synth: str, code: str, timeout: float) -> dict:
    env = {**os.environ, "PYTHONPATH": code}
    try:
        done = subprocess.run([sys.executable, __file__, "--child", case, points, synth], capture_output=True,
                              text=True, timeout=timeout, env=env)
        if done.returncode == 0:
            return json.loads(done.stdout.strip().splitlines()[-1])
        return {"case": case, "error": (done.stderr.strip().splitlines() or ["failed"])[-1][:200]}
    except subprocess.TimeoutExpired:
        return {"case": case, "error": f"timeout {timeout:.0f} s"}


def table(rows: list[dict]) -> list[str]:
    lines = [f"{'fixes':>12} {'case':<13} {'code':<10} {'wall s':>8} {'CPU s':>8} {'peak RSS MB':>12} "
             f"{'/ release: wall, CPU':>21}"]
    release = {r["fixes"]: r for r in rows if r["case"] == "release" and "wall_s" in r}
    for r in rows:
        if "error" in r:
            lines.append(f"{r['fixes']:>12,} {r['case']:<13} {r['code']:<10} ({r['error']})")
            continue
        base = release.get(r["fixes"]) if r["case"] != "release" else None
        ratio = f"{r['wall_s'] / base['wall_s']:.2f}x, {r['cpu_s'] / base['cpu_s']:.2f}x" if base else ""
        lines.append(f"{r['fixes']:>12,} {r['case']:<13} {r['code']:<10} {r['wall_s']:>8.1f} {r['cpu_s']:>8.1f} "
                     f"{r['peak_mb']:>12} {ratio:>21}")
    return lines


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", default=os.environ.get(SOURCE_VARIABLE, "/work/shared/data/geolife_beijing.parquet"))
    p.add_argument("--dir", default="/tmp/duckmob-evaluate")
    p.add_argument("--sizes", default="1e6,3e6")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--code", default=ROOT, help="the checkout whose duckmob runs the cases (PYTHONPATH)")
    p.add_argument("--label", default="this", help="name of --code in the table")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--out", help="append the table to this file")
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(*a.child)))
        return
    os.makedirs(a.dir, exist_ok=True)
    rows, load0 = [], uptime()
    for size in [int(float(s)) for s in a.sizes.split(",")]:
        points = generate(a.dir, size, a.source, cells_too=False)[0]
        synth = os.path.join(a.dir, f"synth_{size}.parquet")
        for case in a.cases.split(","):
            if case != "release" and not os.path.exists(synth):
                rows.append({"case": "release", "code": a.label, "fixes": size,
                             **run_case("release", points, synth, a.code, a.timeout)})
            res = {**run_case(case, points, synth, a.code, a.timeout), "code": a.label, "fixes": size}
            rows.append(res)
            print(json.dumps(res), file=sys.stderr)
    lines = table(rows) + [f"machine: {os.cpu_count()} cores; {load0} at the start, {uptime()} at the end"]
    print("\n".join(lines))
    if a.out:
        with open(a.out, "a") as f:
            f.write(f"# python benchmarks/evaluate_memory.py --sizes {a.sizes} --cases {a.cases} --label {a.label} "
                    f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n" + "\n".join(lines) + "\n\n")


if __name__ == "__main__":
    main()
