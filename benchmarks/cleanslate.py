"""The clean-slate method (issue 18) against PrivTrace, HRNet and the baseline on GeoLife, and its speed.

Setting (as benchmarks/fidelity.py, whose loading and table helpers this reuses): the fixes of
/work/shared/data/geolife_beijing.parquet inside HRNet's box [39.8477, 116.1956, 40.1133, 116.4880] (public,
declared), trajectories with >= 2 distinct timestamps there; ``--limit N`` (default 3,000) keeps a fixed public
draw of N, and every method fits on that same table. Each method is fitted through ``duckmob.synthesize`` at each
``--eps`` once per seed (seeded: reproducible, not for release) with its default parameters (delta 1e-5 for
cleanslate, hrnet and baseline; PrivTrace is pure eps-DP), sampling as many trajectories as the real table has,
and compared with it by ``duckmob.evaluate`` (families lestyan, privtrace, adatrace; Lestyan et al. §8.4). The
table shows the mean over the seeds:

    size      lestyan_trip_size_jsd          trip size (cells of the collapsed sequence on the grid), pooled, nats
    size/h    lestyan_trip_size_jsd_hourly   the same per start hour, mean over hours (needs time)
    OD EMD    lestyan_od_emd_m               source-destination EMD (cell centres of the grid), metres, pooled
    OD/h      lestyan_od_emd_hourly_m        the same per start hour (needs time)
    patt TP   lestyan_pattern_tp_ratio       share of the top-100 real frequent patterns found (1 is best)
    length    privtrace_length_jsd           travel distance
    diameter  privtrace_diameter_jsd
    trip      adatrace_trip_jsd              (start, end) cells of a 6 x 6 grid
    step      fine_step_jsd                  metres between consecutive points

``--grid`` (the paper's two settings): ``32`` (default, a 32 x 32 grid over the box) or ``250m`` (square-ish
cells of at most 250 m: w = ceil(the box's longer side / 250 m) = 119 over HRNet's box, 119 x 119). What it is
for each method: the evaluation grid of the lestyan columns (size, OD, patterns) for all four; cleanslate's own
model grid too (its ``w``, unless ``--params`` sets one); NOT PrivTrace's (its own adaptive grid) nor HRNet's and
the baseline's (their default w = 32, a power of two: a 250 m grid is not one), for which it is only the
evaluation grid. The privtrace and adatrace columns use their own fixed grids whatever ``--grid`` says. At
250 m the patt TP column counts patterns of 2-4 cells, not 2-5 (see :func:`fit_patterns`).

    python benchmarks/cleanslate.py                                  # all four methods, eps 1 and 2, 3 seeds
    python benchmarks/cleanslate.py --methods cleanslate,privtrace --seeds 1 --eps 1
    python benchmarks/cleanslate.py --grid 250m --eps 1
    python benchmarks/cleanslate.py --timing-only                    # fit 20,000 taxi-like trips, sample 20,000
    python benchmarks/cleanslate.py --methods cleanslate --params '{"hop_cost": 0}'   # cleanslate params

HRNet and its baseline train with DP-SGD (minutes per fit on 3,000 trajectories on a shared 2-core machine, one
torch thread); ``--neural-limit N`` fits them on a smaller public draw (then compared with that table, column
``n real``); by default they fit on the same table as the others. PrivTrace models no time, so its hourly columns
are empty. ``--timing`` adds the speed figures (issue 32 item 3: fit and sample of 20,000 trajectories under 30 s):
cleanslate's fit on 20,000 taxi-like trips and sampling 20,000, wall and CPU seconds, with the step-length JSD
(:func:`taxi_like`: GeoLife in the box, one fix a minute, cut into trips of 10 fixes; a fixed public draw).
NOT private: the evaluation reads the real table exactly (it is for the data owner).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from fidelity import BOX, DELTA, cap, code_version, fmt, load_real, means  # noqa: E402

from duckmob.grid import haversine_m  # noqa: E402

FAMILIES = ["lestyan", "privtrace", "adatrace", "fine"]
COLUMNS = [("size", "lestyan_trip_size_jsd"), ("size/h", "lestyan_trip_size_jsd_hourly"),
           ("OD EMD", "lestyan_od_emd_m"), ("OD/h", "lestyan_od_emd_hourly_m"),
           ("patt TP", "lestyan_pattern_tp_ratio"), ("length", "privtrace_length_jsd"),
           ("diameter", "privtrace_diameter_jsd"), ("trip", "adatrace_trip_jsd"), ("step", "fine_step_jsd")]
METHODS = ("cleanslate", "privtrace", "hrnet", "baseline")
NEURAL = ("hrnet", "baseline")
GRIDS = ("32", "250m")


def grid_width(grid: str, bbox=BOX) -> int:
    """Cells per side of the evaluation grid: ``'32'`` -> 32; ``'250m'`` -> ceil(longer side of the bbox / 250 m)
    (the bbox's sides measured along its southern edge and its western edge, great-circle metres), so that no
    cell is longer than 250 m: 119 over HRNet's box (29.5 km north-south, 25.0 km east-west)."""
    if grid == "32":
        return 32
    lat0, lon0, lat1, lon1 = bbox
    ns = float(haversine_m(lat0, lon0, lat1, lon0))
    ew = float(haversine_m(lat0, lon0, lat0, lon1))
    return int(np.ceil(max(ns, ew) / 250.0))


def fit_patterns(w: int) -> None:
    """Let the lestyan pattern metric run on a grid too fine for its 5-cell patterns.

    mob_evaluate encodes a pattern of k cells as one 64-bit key (base w*w + 1), so 5-cell patterns stop fitting
    above w = 73; at 250 m (119 x 119) ``lestyan_pattern_tp_ratio`` would raise. Here, for such a grid only, the
    patterns are cut to the longest length that fits (4 cells at 119 x 119), a benchmark-side deviation that the
    table's title states; the other metrics are mob_evaluate's own."""
    from duckmob.metrics import common, lestyan

    longest = int(np.floor((62 - 1e-9) / np.log2(w * w + 1)))
    if longest >= 5:
        return

    def patterns(cs, n_min, n_max, per_trajectory):
        return common.pattern_counts(cs, n_min, min(n_max, longest), per_trajectory)

    lestyan.pattern_counts = patterns


def run(methods: list[str], seeds: list[int], epsilons: list[float], limit: int | None,
        neural_limit: int | None, params: dict | None = None, grid: str = "32") -> dict:
    import duckmob
    from duckmob.metrics import evaluate, load_side, table_points

    w = grid_width(grid)
    cs_params = dict(params or {})
    if grid != "32":
        cs_params.setdefault("w", w)   # cleanslate models on the evaluation grid; the others keep their own
    fit_patterns(w)
    code = code_version()   # at the start: the code this process imported
    con = duckmob.connect()
    t0 = time.perf_counter()
    source = {m: "trips_neural" if m in NEURAL else "trips" for m in methods}
    limits = {"trips": limit, "trips_neural": cap(limit, neural_limit)}
    sizes = load_real(con, {t: limits[t] for t in dict.fromkeys(source.values())})
    reals = {}
    for name, n_real in sizes.items():
        n_fits = len(seeds) * sum(1 for t in source.values() if t == name)
        con.execute(f"FROM mob_set_budget('{name}', eps := {sum(epsilons) * n_fits + 1}, "
                    f"delta := {min(DELTA * n_fits * len(epsilons) * 10, 1e-3)})").fetchall()
        reals[name] = load_side(table_points(con, name), BOX, "real")[0]
        print(f"{name}: {n_real:,} real trajectories ({time.perf_counter() - t0:.0f} s)", flush=True)
    runs = []
    for eps in epsilons:
        for method in methods:
            table_name = source[method]
            for seed in seeds:
                t1 = time.perf_counter()
                synth = duckmob.synthesize(con, table_name, eps=eps, method=method, bbox=BOX, n=sizes[table_name],
                                           seed=seed, outside="drop",
                                           **({} if method == "privtrace" else {"delta": DELTA}),
                                           **({"params": cs_params} if method == "cleanslate" and cs_params else {}))
                fit_s = time.perf_counter() - t1
                rows = evaluate(reals[table_name], synth, BOX, families=FAMILIES, w=w)
                metrics = {r["metric"]: r["value"] for r in rows}
                runs.append(dict(method=method, eps=eps, seed=seed, n_real=sizes[table_name], fit_sample_s=fit_s,
                                 metrics=metrics))
                print(f"eps {eps} {method} seed {seed}: fit + sample {fit_s:.0f} s; "
                      + ", ".join(f"{short} {fmt(metrics.get(m))}" for short, m in COLUMNS), flush=True)
    con.close()
    return dict(seeds=seeds, code=code, runs=runs, params=params or {}, grid=grid, w=w,
                load=os.getloadavg()[0])


def table(result: dict) -> str:
    extra = f", cleanslate params {json.dumps(result['params'])}" if result.get("params") else ""
    w = result.get("w", 32)
    grid = (f"{w} x {w} grid" if result.get("grid", "32") == "32" else f"250 m grid ({w} x {w}; cleanslate's model "
            "grid too, the others' evaluation grid only; patt TP over patterns of 2-4 cells, 5 do not fit "
            "mob_evaluate's 64-bit keys)")
    lines = [f"GeoLife in HRNet's box, {grid}, mean of {len(result['seeds'])} seeded fits, code "
             f"{result['code']}{extra}; JSD in nats (ln 2 max), EMD in metres; lower is better except patt TP",
             f"{'eps':>4s} {'method':10s} {'n real':>6s} {'fit+smp s':>9s} "
             + " ".join(f"{short:>8s}" for short, _ in COLUMNS)]
    for eps in dict.fromkeys(r["eps"] for r in result["runs"]):
        mine = [r for r in result["runs"] if r["eps"] == eps]
        for method, m in means(mine).items():
            secs = np.mean([r["fit_sample_s"] for r in mine if r["method"] == method])
            lines.append(f"{eps:4g} {method:10s} {m['n_real']:6d} {secs:9.0f} "
                         + " ".join(f"{fmt(m.get(k)):>8s}" for _, k in COLUMNS))
    return "\n".join(lines)


def taxi_like(con, name: str = "taxi", n: int = 20_000, interval_s: int = 60, points: int = 10) -> int:
    """A table of taxi-like trips (issue 32's held-out city had 20,000 trips of about 10 points): the fixes of
    GeoLife inside BOX, the first of each ``interval_s`` of every trajectory, cut into consecutive trips of
    ``points`` fixes; those with two or more kept, a fixed public draw of ``n``. Returns the number of trips."""
    from fidelity import DATA, LIMIT_SEED

    lat0, lon0, lat1, lon1 = BOX
    con.execute(f"""CREATE OR REPLACE TEMP TABLE minute_fixes AS
        SELECT user_id, traj_id, ts, lat, lon FROM (
            SELECT *, row_number() OVER (PARTITION BY user_id, traj_id, epoch(ts) // {interval_s} ORDER BY ts) AS k
            FROM read_parquet('{DATA}')
            WHERE lat BETWEEN {lat0} AND {lat1} AND lon BETWEEN {lon0} AND {lon1}) WHERE k = 1""")
    con.execute(f"""CREATE OR REPLACE TEMP TABLE cut AS
        SELECT user_id, traj_id * 10000 + (i // {points}) AS traj_id, ts, lat, lon FROM (
            SELECT *, row_number() OVER (PARTITION BY user_id, traj_id ORDER BY ts) - 1 AS i FROM minute_fixes)""")
    keys = con.execute("SELECT user_id, traj_id FROM cut GROUP BY ALL HAVING count(*) >= 2 ORDER BY ALL").fetchnumpy()
    pick = np.arange(len(keys["traj_id"]))
    if n < len(pick):
        pick = np.sort(np.random.default_rng(LIMIT_SEED).choice(len(pick), n, replace=False))
    con.register("keep_keys", {"user_id": keys["user_id"][pick], "traj_id": keys["traj_id"][pick]})
    con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT c.* FROM cut c SEMI JOIN keep_keys USING (user_id, traj_id) "
                "ORDER BY user_id, traj_id, ts")
    con.unregister("keep_keys")
    con.execute("DROP TABLE minute_fixes; DROP TABLE cut")
    return len(pick)


def timing(n: int = 20_000, seeds=(1,), threads: int | None = None) -> str:
    """cleanslate: fit on ``n`` taxi-like trips (:func:`taxi_like`) and sample ``n`` (wall and CPU seconds, this
    machine), with the step-length JSD of the sample (``fine_step_jsd``) per seed."""
    import duckmob
    from duckmob.metrics import evaluate, table_points
    from duckmob.privacy.noise import NoiseSource
    from duckmob.synth.base import fit_unrecorded
    from duckmob.synth.cleanslate import CleanSlate
    from duckmob.trajectories import from_points

    con = duckmob.connect()
    taxi_like(con, "timing", n)
    data, _ = from_points(table_points(con, "timing"), bbox=BOX, outside="drop", private=True)
    con.close()
    lines = []
    for seed in seeds:
        synth = CleanSlate(BOX, progress=False, threads=threads)
        t0, c0 = time.perf_counter(), time.process_time()
        model = fit_unrecorded(synth, data, 1.0, DELTA, NoiseSource(seed))
        fit_s, fit_c = time.perf_counter() - t0, time.process_time() - c0
        t0, c0 = time.perf_counter(), time.process_time()
        out = model.sample(n, np.random.default_rng(seed + 100))
        sample_s, sample_c = time.perf_counter() - t0, time.process_time() - c0
        step = {r["metric"]: r["value"] for r in evaluate(data, out, BOX, families=["fine"], reference=False)}
        t = model.timings
        lines.append(
            f"cleanslate speed, seed {seed}, {data.n_trajectories:,} taxi-like trips ({data.n_points:,} fixes), eps 1, "
            f"defaults, {os.cpu_count()} CPU cores, {threads or 1} torch thread(s), load "
            f"average {os.getloadavg()[0]:.1f}: fit {fit_s:.1f} s wall / {fit_c:.1f} s CPU (prepare "
            f"{t['prepare_s']:.1f}, TI {t['ti_s']:.1f}, TPG {t['tpg_s']:.1f} s wall), sample {n:,} {sample_s:.1f} s "
            f"wall / {sample_c:.1f} s CPU; total {fit_s + sample_s:.1f} s wall (target < 30); step JSD "
            f"{step['fine_step_jsd']:.4f}, points per trajectory x{step['fine_points_per_traj_ratio']:.2f} the real")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated, of " + ", ".join(METHODS))
    parser.add_argument("--seeds", default="1,2,3", help="one seeded fit per seed; the table shows the mean")
    parser.add_argument("--eps", default="1,2", help="comma-separated epsilons")
    parser.add_argument("--limit", type=int, default=3000,
                        help="at most this many real trajectories (default 3,000); 0 = all")
    parser.add_argument("--neural-limit", type=int, default=0,
                        help="at most this many for hrnet and baseline (default 0: the same table as the others)")
    parser.add_argument("--grid", default="32", choices=GRIDS,
                        help="32: a 32 x 32 grid; 250m: cells of at most 250 m (119 x 119 over HRNet's box); the "
                             "lestyan columns' grid, and cleanslate's w")
    parser.add_argument("--params", default="", help="cleanslate params as JSON, e.g. '{\"hop_cost\": 0}'")
    parser.add_argument("--out", default=None, help="also write the runs as JSON here")
    parser.add_argument("--show", nargs="+", default=None,
                        help="print the table of saved JSON files (their runs pooled: e.g. seeds run apart) and exit")
    parser.add_argument("--timing", action="store_true",
                        help="also time a fit on 20,000 taxi-like trips and sampling 20,000")
    parser.add_argument("--timing-only", action="store_true", help="only the timing")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: on a machine shared beyond its cores, 2 threads ran DP-SGD "
                             "steps 4-5x slower than 1 here, from OpenMP spin contention)")
    args = parser.parse_args()
    if args.show:
        saved = [json.loads(open(path).read()) for path in args.show]
        pooled = dict(saved[0], runs=[r for x in saved for r in x["runs"]],
                      seeds=sorted({r["seed"] for x in saved for r in x["runs"]}),
                      code="/".join(dict.fromkeys(x["code"] for x in saved)))
        print(table(pooled))
        return
    os.environ.setdefault("CI", "1")   # no progress bars in logs
    import torch

    torch.set_num_threads(args.threads)
    methods = [m.strip().lower() for m in args.methods.split(",") if m.strip()]
    bad = sorted(set(methods) - set(METHODS))
    if bad:
        parser.error(f"unknown methods {bad}: use {', '.join(METHODS)}")
    if not args.timing_only:
        result = run(methods, [int(s) for s in args.seeds.split(",")], [float(e) for e in args.eps.split(",")],
                     args.limit or None, args.neural_limit or None,
                     json.loads(args.params) if args.params else None, args.grid)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
        print(table(result))
        print(f"load average at the end {result['load']:.1f}; {os.cpu_count()} CPU cores, {args.threads} torch "
              "thread(s)")
    if args.timing or args.timing_only:
        print(timing(seeds=[int(s) for s in args.seeds.split(",")]))


if __name__ == "__main__":
    main()
