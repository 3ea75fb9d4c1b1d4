"""Scaling: time and peak memory of PrivTrace (synthesize) and the counting releases, in-memory path vs out of core.

    python benchmarks/scale.py --source geolife_beijing.parquet --sizes 1e6,1e7          # prints a table
    python benchmarks/scale.py --source geolife_beijing.parquet --sizes 1e8,3e8 --cases privtrace-new,count-new

The source table is not shipped: pass its path with ``--source`` or in the environment variable
``DUCKMOB_SCALE_SOURCE``. Data: geolife_beijing (3.5 M fixes; columns user_id, traj_id, ts, lat, lon) replicated
with fresh user and trajectory ids and a jitter of up to 0.0005 degrees per copy, cut to each size, written once to
``DIR/points_<n>.parquet`` (and the cell sequences of each trajectory on the public 32 x 32 grid to
``DIR/cells_<n>.parquet``, for mob_transitions). Each case runs in a fresh subprocess; wall time is the release
alone (the table is a view over the Parquet file), CPU time the process's user + system time over the release (all
threads: on a machine shared with other work it is the steadier figure), peak RSS the process's VmHWM (DuckDB's
buffers included).

Cases: ``privtrace-old`` (the synthesize macro over a TEMP table: the whole table gathered as lists),
``privtrace-new`` (over a view: read out of core by the release, duckmob.source), ``privtrace-fit`` (its statistics
stage alone: ``mob_fit`` over the view, no sampling; ``stats-sql`` is plain SQL computing comparable counts, and the
table ends with each PrivTrace case's wall and CPU ratio to it), ``count-old`` / ``count-new`` /
``count-sql`` (the mob_noisy_count macro over a TEMP table: its pairs gathered as one list / duckmob.noisy_count /
the macro over a view: counted out of core), ``transitions-old`` / ``transitions-new`` / ``transitions-sql`` (the
same three for mob_transitions and duckmob.transitions), ``hrnet-prep-old`` / ``hrnet-prep-new`` (HRNet's data
preparation, stay points to training arrays, without training: the table in memory / batch by batch), and the
same for clean-slate (cell visits to trips) and PateGail (the fixes its episodes read, to episodes), and issue
31's streamed output: ``synthesize-parquet`` (``COPY (FROM synthesize(...)) TO`` Parquet with the default n, a
synthetic table as large as the real one; ``out`` is its rows) and ``sample-parquet`` (``COPY (FROM mob_sample('m',
n := 300000)) TO`` Parquet of a model fitted on the table first; wall and CPU time are the sample's alone, rows a
second = out / wall_s). eps 1, seed 1, the default PrivTrace parameters, bbox of HRNet's Beijing box.
Delete DIR afterwards (``--clean`` does it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time

# Where the source table is when --source is not given (see the module docstring).
SOURCE_VARIABLE = "DUCKMOB_SCALE_SOURCE"
BBOX = [39.8477, 116.1956, 40.1133, 116.4880]
CASES = ["privtrace-old", "privtrace-new", "count-old", "count-new", "count-sql", "transitions-old",
         "transitions-new", "transitions-sql", "hrnet-prep-old", "hrnet-prep-new", "cleanslate-prep-old",
         "cleanslate-prep-new", "pategail-prep-old", "pategail-prep-new", "synthesize-parquet", "sample-parquet",
         "stats-sql", "privtrace-fit"]
# issue 31's streamed output: n of the sample-parquet case (mob_sample of a model fitted on the table)
SAMPLE_N = 300_000
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# Disk a size needs, in bytes a fix, measured at 1 B fixes (docs/scale.md): the generated points as Parquet (14),
# and at the peak of a release the raw buckets its scan writes under TMPDIR (32; the cleaned ones, 18.5, replace them
# one by one, and are deleted before the output is written, which takes about 10).
POINTS_BYTES = 15
BUCKET_BYTES = 34


def disk_needed_gb(size: int, folder: str) -> float:
    """Disk (GB) the cases of ``size`` fixes need at their peak: the buckets, and the points unless generated
    already (assumes TMPDIR on the same disk as ``folder``)."""
    made = os.path.exists(os.path.join(folder, f"points_{size}.parquet"))
    return size * (BUCKET_BYTES + (0 if made else POINTS_BYTES)) / 1e9


def generate(folder: str, n: int, source: str, cells_too: bool = True) -> tuple[str, str]:
    """``DIR/points_<n>.parquet`` and ``DIR/cells_<n>.parquet`` (made once; the cells only with ``cells_too``)."""
    import duckdb

    points = os.path.join(folder, f"points_{n}.parquet")
    cells = os.path.join(folder, f"cells_{n}.parquet")
    # DuckDB within 4 GB, spilling to the folder: an ordered COPY ... LIMIT n of a billion rows had buffered to 19.7
    # GB (80% of the machine, its default) and could not spill within 4 GB, so the rows are cut by the source's own
    # row numbers instead (every copy of the source in full, then the first rows of one more, by the source's row
    # order), written in any order (the releases read a table in any physical order)
    con = duckdb.connect(config={"memory_limit": "4GB", "temp_directory": os.path.join(folder, "tmp"),
                                 "preserve_insertion_order": False})
    if not os.path.exists(points):
        base = con.sql(f"SELECT count(*) FROM '{source}'").fetchall()[0][0]
        copies = -(-n // base)
        con.execute(f"""COPY (SELECT (user_id + r * 1000)::BIGINT AS user_id,
                     traj_id::BIGINT + r * 100000000 AS traj_id,
                     ts, lat + ((hash(r, traj_id) % 1000)::BIGINT - 500) * 1e-6 AS lat,
                     lon + ((hash(traj_id, r) % 1000)::BIGINT - 500) * 1e-6 AS lon
                     FROM read_parquet('{source}', file_row_number = true), range({copies}) t(r)
                     WHERE r * {base} + file_row_number < {n}) TO '{points}' (FORMAT parquet)""")
    if cells_too and not os.path.exists(cells):
        a, b, c, d = BBOX
        con.execute(f"""COPY (SELECT traj_id, any_value(user_id) AS user_id, list(cell ORDER BY ts) AS cells FROM (
                     SELECT traj_id, user_id, ts, least(floor((lat - {a}) / {c - a} * 32), 31)::BIGINT * 32
                            + least(floor((lon - {b}) / {d - b} * 32), 31)::BIGINT AS cell
                     FROM '{points}' WHERE lat BETWEEN {a} AND {c} AND lon BETWEEN {b} AND {d})
                     GROUP BY traj_id) TO '{cells}' (FORMAT parquet)""")
    con.close()
    return points, cells


def child(case: str, points: str, cells: str) -> dict:
    """Run one case in this process; return its wall time (s) and peak RSS (MB)."""
    import duckdb

    sys.path.insert(0, ROOT)
    import duckmob

    con = duckdb.connect()
    duckmob.register(con)
    # -old: a TEMP table, which the macros gather as lists (a TEMP view is refused from SQL: what it reads cannot be
    # seen from a UDF); otherwise a view over the Parquet file, read out of core
    kind = "TEMP TABLE" if case.endswith("-old") else "VIEW"
    con.execute(f"CREATE {kind} trips AS FROM '{points}'")
    names = ["trips"]
    if case.startswith("transitions"):
        con.execute(f"CREATE {kind} seqs AS FROM '{cells}'")
        names.append("seqs")
    for name in names:
        con.execute(f"FROM mob_set_budget('{name}', eps := 100, delta := 1e-5)").fetchall()
    start = time.perf_counter()
    use = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = use.ru_utime + use.ru_stime
    if case == "synthesize-parquet":   # the default n (the noisy count): a synthetic copy as large as the table
        out = _copy(con, f"FROM synthesize('trips', eps := 1.0, bbox := {BBOX}, seed := 1)", points)
    elif case == "sample-parquet":     # the fit is timed apart: wall_s and cpu_s are the streamed sample alone
        con.execute(f"FROM mob_fit('trips', 'm', eps := 1.0, bbox := {BBOX}, seed := 1)").fetchall()
        start = time.perf_counter()
        use = resource.getrusage(resource.RUSAGE_SELF)
        cpu0 = use.ru_utime + use.ru_stime
        out = _copy(con, f"FROM mob_sample('m', n := {SAMPLE_N}, seed := 2)", points)
    elif case == "stats-sql":          # plain DuckDB SQL computing counts comparable to PrivTrace's statistics
        out = con.sql(STATS_SQL.format(a=BBOX[0], b=BBOX[1], c=BBOX[2], d=BBOX[3], w=64)).fetchall()[0][0]
    elif case == "privtrace-fit":      # PrivTrace's statistics stage alone: mob_fit over the view, no sampling
        out = len(con.sql(f"FROM mob_fit('trips', 'm', eps := 1.0, bbox := {BBOX}, seed := 1)").fetchall())
    elif case.startswith("privtrace"):
        out = con.sql(f"SELECT count(*) FROM synthesize('trips', eps := 1.0, bbox := {BBOX}, seed := 1, "
                      "n := 1000)").fetchall()[0][0]
    elif case in ("count-old", "count-sql"):   # the macro over a TEMP view (lists) / a view (out of core)
        out = con.sql("FROM mob_noisy_count('trips', eps := 1.0, seed := 1)").fetchall()[0][0]
    elif case == "count-new":
        out = duckmob.noisy_count(con, "trips", eps=1.0, seed=1)
    elif case in ("transitions-old", "transitions-sql"):
        out = con.sql("SELECT count(*) FROM mob_transitions('seqs', eps := 1.0, n_states := 1024, w := 32, "
                      "support := 'neighbours', markov_order := 2, seed := 1)").fetchall()[0][0]
    elif "-prep-" in case:
        out = prep(con, case.split("-")[0], case.endswith("-new"))
    else:
        out = int((duckmob.transitions(con, "seqs", order=2, eps=1.0, n_states=1024, w=32, support="neighbours",
                                      seed=1)[1] > 0).sum())
    wall = time.perf_counter() - start
    use = resource.getrusage(resource.RUSAGE_SELF)
    cpu = use.ru_utime + use.ru_stime - cpu0
    con.close()
    return {"case": case, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "peak_mb": peak_rss_mb(),
            "out": float(out)}


# Issue 31's yardstick for the statistics stage: cells of a 64 x 64 grid, length-normalised cell counts (each
# trajectory's mass 1 spread over its points) and first-order transitions between consecutive points' cells, in one
# query over the same view, no noise. PrivTrace's fit computes more (two grid levels, second order, a length
# histogram, the fine stage), so the ratio privtrace-new / stats-sql is an upper bound of the overhead.
STATS_SQL = """
WITH p AS (SELECT traj_id, user_id, ts,
                  least(floor((lat - {a}) / ({c} - {a}) * {w}), {w} - 1)::BIGINT * {w}
                  + least(floor((lon - {b}) / ({d} - {b}) * {w}), {w} - 1)::BIGINT AS cell
           FROM trips WHERE lat BETWEEN {a} AND {c} AND lon BETWEEN {b} AND {d}),
     n AS (SELECT *, count(*) OVER (PARTITION BY traj_id, user_id) AS len,
                  lag(cell) OVER (PARTITION BY traj_id, user_id ORDER BY ts) AS prev FROM p),
     cells AS (SELECT cell, sum(1.0 / len) AS mass FROM n GROUP BY cell),
     moves AS (SELECT prev, cell, sum(1.0 / len) AS mass FROM n WHERE prev IS NOT NULL GROUP BY prev, cell)
SELECT (SELECT count(*) FROM cells) + (SELECT count(*) FROM moves)
"""


def _copy(con, query: str, points: str) -> int:
    """``COPY (query) TO`` a Parquet file beside ``points`` (removed after); the rows written."""
    target = points + ".synthetic.parquet"
    try:
        con.execute(f"COPY ({query}) TO '{target}' (FORMAT parquet)")
        return con.sql(f"SELECT count(*) FROM '{target}'").fetchall()[0][0]
    finally:
        if os.path.exists(target):
            os.remove(target)


def prep(con, method: str, out_of_core: bool) -> int:
    """A method's data preparation (no training), default parameters; out of core, each batch reduced by the
    method's own per-trajectory reduction (duckmob.source, what mob_fit does on a committed table), else the whole
    table in memory first. HRNet: stay points, cell sequences and training arrays (32 x 32, 5 slots, 16 cells);
    clean-slate: cell visits and trips (16 x 16); PateGail: the fixes its episodes read and the episodes. Returns
    the number of training rows."""
    import numpy as np

    from duckmob.source.schema import Mapping
    from duckmob.source.table import TableSource, prepare
    from duckmob.trajectories import from_points

    if method == "hrnet":
        from duckmob.synth.hrnet import HRNet
        from duckmob.synth.hrnet.train import training_arrays

        synth = HRNet(BBOX)
        config = synth.config
        reduce = synth.stays
        build = lambda d: training_arrays(synth.cell_sequences(d), config.w, config.n_time,  # noqa: E731
                                          config.max_len, zorder=synth.zorder).n
    elif method == "cleanslate":
        from duckmob.synth.cleanslate import CleanSlate
        from duckmob.synth.cleanslate.trips import trips, visits

        config = CleanSlate(BBOX).config
        reduce = lambda d: visits(d, BBOX, config.w)  # noqa: E731
        build = lambda d: trips(d, BBOX, config.w, config.r, config.n_time).n  # noqa: E731
    else:
        from duckmob.synth.pategail import PateGail, mdp

        config = PateGail(BBOX).config
        reduce = lambda d: mdp.episode_fixes(d, config.n_slots, config.max_steps)  # noqa: E731
        build = lambda d: mdp.episodes(d, BBOX, config.w, config.n_slots, config.max_steps,  # noqa: E731
                                       np.arange(d.n_trajectories)).n
    query = prepare(con, "trips", Mapping(), home="memory").select
    if out_of_core:
        source = TableSource(con, query)
        batches = source.batches(bbox=BBOX, time_required=True, privacy_unit="trajectory", k=None,
                                 rng=lambda: np.random.default_rng(0))
        reduced = batches.gather(reduce)
        batches.close()
        source.close()
    else:
        data, _ = from_points(con.sql(query).to_arrow_table(), bbox=BBOX, outside="drop", time_required=True,
                              private=True)
        reduced = reduce(data)
        del data
    return build(reduced)


def ratios(rows: list[dict]) -> list[str]:
    """Issue 31's yardstick: each PrivTrace case's wall and CPU time over stats-sql's at the same size, same run."""
    out = []
    for base in (r for r in rows if r["case"] == "stats-sql" and r.get("cpu_s")):
        for r in rows:
            if r["fixes"] == base["fixes"] and r["case"].startswith("privtrace") and r.get("cpu_s"):
                out.append(f"{r['fixes']:>12,} {r['case']} / stats-sql: wall {r['wall_s'] / base['wall_s']:.1f}x, "
                           f"CPU {r['cpu_s'] / base['cpu_s']:.1f}x")
    return out


def peak_rss_mb() -> int:
    """This process's peak resident memory (MB): VmHWM of /proc/self/status, which starts afresh at exec
    (ru_maxrss keeps the high-water mark of the parent that forked it)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) // 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", default=os.environ.get(SOURCE_VARIABLE),
                   help=f"the Parquet file of GeoLife Beijing fixes the tables are made from "
                        f"(default: ${SOURCE_VARIABLE})")
    p.add_argument("--dir", default="/tmp/duckmob-scale", help="folder for the generated Parquet files")
    p.add_argument("--sizes", default="1e6,1e7", help="fixes per table, e.g. 1e6,1e7,1.5e7,1e8,3e8")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--timeout", type=float, default=1800, help="seconds per case")
    p.add_argument("--out", help="also write the table to this file")
    p.add_argument("--clean", action="store_true", help="delete --dir at the end")
    p.add_argument("--child", nargs=3, metavar=("CASE", "POINTS", "CELLS"), help=argparse.SUPPRESS)
    p.add_argument("--generate", nargs=4, metavar=("DIR", "N", "CELLS", "SOURCE"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.generate:
        generate(a.generate[0], int(a.generate[1]), a.generate[3], cells_too=a.generate[2] == "1")
        return
    if a.child:
        print(json.dumps(child(*a.child)))
        return
    if not a.source:
        p.error(f"no source table: pass --source PATH (a Parquet file of GeoLife Beijing fixes: user_id, traj_id, ts, "
                f"lat, lon) or set {SOURCE_VARIABLE}")
    if not os.path.isfile(a.source):
        p.error(f"the source table {a.source} does not exist (--source or {SOURCE_VARIABLE})")
    os.makedirs(a.dir, exist_ok=True)
    free_gb = shutil.disk_usage(a.dir).free / 1e9
    rows = []
    for size in [int(float(s)) for s in a.sizes.split(",")]:
        need_gb = disk_needed_gb(size, a.dir)
        if need_gb > 0.9 * free_gb:
            print(f"skipping {size:,} fixes: they need about {need_gb:.0f} GB of disk, {free_gb:.0f} GB free in "
                  f"{a.dir} (the temporary buckets go to TMPDIR: see disk_needed_gb)", file=sys.stderr)
            continue
        t = time.perf_counter()
        # in a subprocess, so its memory is not counted in the cases' (forked from this process)
        subprocess.run([sys.executable, __file__, "--generate", a.dir, str(size), str(int("transitions" in a.cases)),
                        a.source],
                       check=True, env={**os.environ, "PYTHONPATH": ROOT})
        points, cells = (os.path.join(a.dir, f"{k}_{size}.parquet") for k in ("points", "cells"))
        print(f"{size:,} fixes generated in {time.perf_counter() - t:.0f} s", file=sys.stderr)
        for case in a.cases.split(","):
            try:
                done = subprocess.run([sys.executable, __file__, "--child", case, points, cells],
                                      capture_output=True, text=True, timeout=a.timeout,
                                      env={**os.environ, "PYTHONPATH": ROOT})
                res = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else \
                    {"case": case, "wall_s": None, "peak_mb": None, "error": done.stderr.strip().splitlines()[-1]}
            except subprocess.TimeoutExpired:
                res = {"case": case, "wall_s": None, "peak_mb": None, "error": f"timeout {a.timeout:.0f} s"}
            res["fixes"] = size
            rows.append(res)
            print(json.dumps(res), file=sys.stderr)
    lines = [f"{'fixes':>12} {'case':<17} {'wall s':>8} {'CPU s':>8} {'peak RSS MB':>12} {'CPU s / M fixes':>16}"]
    for r in rows:
        wall = "-" if r["wall_s"] is None else f"{r['wall_s']:.1f}"
        cpu = "-" if r.get("cpu_s") is None else f"{r['cpu_s']:.1f}"
        rss = "-" if r["peak_mb"] is None else f"{r['peak_mb']}"
        per = "-" if r.get("cpu_s") is None else f"{r['cpu_s'] / (r['fixes'] / 1e6):.2f}"
        lines.append(f"{r['fixes']:>12,} {r['case']:<17} {wall:>8} {cpu:>8} {rss:>12} {per:>16}" +
                     (f"  ({r['error']})" if "error" in r else ""))
    lines += ratios(rows)
    table = "\n".join(lines)
    print(table)
    if a.out:
        with open(a.out, "w") as f:
            f.write(f"# benchmarks/scale.py --sizes {a.sizes} on {os.cpu_count()} cores "
                    f"({time.strftime('%Y-%m-%d')})\n")
            f.write(table + "\n")
    if a.clean:
        shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
