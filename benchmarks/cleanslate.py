"""The clean-slate method (issue 18) against PrivTrace, HRNet and the baseline on GeoLife, and its speed.

Setting (as benchmarks/fidelity.py, whose loading and table helpers this reuses): the fixes of
/work/shared/data/geolife_beijing.parquet inside HRNet's box [39.8477, 116.1956, 40.1133, 116.4880] (public,
declared), trajectories with >= 2 distinct timestamps there; ``--limit N`` keeps a fixed public draw of N. Each
method is fitted through ``duckmob.synthesize`` at each ``--eps`` once per seed (seeded: reproducible, not for
release), sampling as many trajectories as the real table has, and compared with it by ``duckmob.evaluate``
(families lestyan, privtrace, adatrace; the lestyan metrics on the 32 x 32 grid, Lestyan et al. §8.4). The
table shows the mean over the seeds:

    size      lestyan_trip_size_jsd          trip size (cells of the 32 x 32 collapsed sequence), pooled, nats
    size/h    lestyan_trip_size_jsd_hourly   the same per start hour, mean over hours (needs time)
    OD EMD    lestyan_od_emd_m               source-destination EMD, metres, pooled
    OD/h      lestyan_od_emd_hourly_m        the same per start hour (needs time)
    patt TP   lestyan_pattern_tp_ratio       share of the top-100 real frequent patterns found (1 is best)
    length    privtrace_length_jsd           travel distance
    diameter  privtrace_diameter_jsd
    trip      adatrace_trip_jsd              (start, end) cells of a 6 x 6 grid

    python benchmarks/cleanslate.py                                  # all four methods, eps 1 and 2, 3 seeds
    python benchmarks/cleanslate.py --methods cleanslate,privtrace --limit 2000 --seeds 1 --eps 1
    python benchmarks/cleanslate.py --timing-only                    # fit 10,000, sample 10,000
    python benchmarks/cleanslate.py --methods cleanslate --params '{"hop_cost": 0}'   # cleanslate params

HRNet and its baseline (DP-SGD, minutes per 1,000 trajectories on a shared 2-core machine) fit on at most
``--neural-limit`` trajectories (default 1,000, the same public draw) and are compared with that table (column
``n real``). PrivTrace models no time, so its hourly columns are empty. ``--timing`` adds the speed figures:
cleanslate's fit on 10,000 trajectories and sampling 10,000 (targets: fit < 5 min on 2 cores, sample < 30 s).
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

FAMILIES = ["lestyan", "privtrace", "adatrace"]
COLUMNS = [("size", "lestyan_trip_size_jsd"), ("size/h", "lestyan_trip_size_jsd_hourly"),
           ("OD EMD", "lestyan_od_emd_m"), ("OD/h", "lestyan_od_emd_hourly_m"),
           ("patt TP", "lestyan_pattern_tp_ratio"), ("length", "privtrace_length_jsd"),
           ("diameter", "privtrace_diameter_jsd"), ("trip", "adatrace_trip_jsd")]
METHODS = ("cleanslate", "privtrace", "hrnet", "baseline")
NEURAL = ("hrnet", "baseline")


def run(methods: list[str], seeds: list[int], epsilons: list[float], limit: int | None,
        neural_limit: int | None, params: dict | None = None) -> dict:
    import duckmob
    from duckmob.evaluate import evaluate, load_side, table_points

    con = duckmob.connect()
    t0 = time.perf_counter()
    source = {m: "trips_neural" if m in NEURAL else "trips" for m in methods}
    limits = {"trips": limit, "trips_neural": cap(limit, neural_limit)}
    sizes = load_real(con, {t: limits[t] for t in dict.fromkeys(source.values())})
    reals = {}
    for name, n_real in sizes.items():
        n_fits = len(seeds) * sum(1 for t in source.values() if t == name)
        con.execute(f"FROM mob_set_budget('{name}', eps := {sum(epsilons) * n_fits + 1}, "
                    f"delta := {DELTA * n_fits * len(epsilons) * 10})").fetchall()
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
                                           **({"params": params} if method == "cleanslate" and params else {}))
                fit_s = time.perf_counter() - t1
                rows = evaluate(reals[table_name], synth, BOX, families=FAMILIES)
                metrics = {r["metric"]: r["value"] for r in rows}
                runs.append(dict(method=method, eps=eps, seed=seed, n_real=sizes[table_name], fit_sample_s=fit_s,
                                 metrics=metrics))
                print(f"eps {eps} {method} seed {seed}: fit + sample {fit_s:.0f} s; "
                      + ", ".join(f"{short} {fmt(metrics.get(m))}" for short, m in COLUMNS), flush=True)
    con.close()
    return dict(seeds=seeds, code=code_version(), runs=runs, params=params or {})


def table(result: dict) -> str:
    extra = f", cleanslate params {json.dumps(result['params'])}" if result.get("params") else ""
    lines = [f"GeoLife in HRNet's box, 32 x 32 grid, mean of {len(result['seeds'])} seeded fits, code "
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


def timing(n: int = 10_000) -> str:
    """cleanslate: fit on a public draw of ``n`` trajectories and sample ``n`` (wall seconds, this machine)."""
    import duckmob
    from duckmob.synth.cleanslate import CleanSlate
    from duckmob.privacy.noise import NoiseSource
    from duckmob.evaluate import table_points
    from duckmob.trajectories import from_points

    con = duckmob.connect()
    load_real(con, {"timing": n})
    data, _ = from_points(table_points(con, "timing"), bbox=BOX, outside="drop", private=True)
    con.close()
    synth = CleanSlate(BOX, progress=False)
    t0 = time.perf_counter()
    model = synth.fit(data, 1.0, DELTA, NoiseSource(1))
    fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    model.sample(n, np.random.default_rng(2))
    sample_s = time.perf_counter() - t0
    t = model.timings
    return (f"cleanslate speed, {data.n_trajectories:,} trajectories ({data.n_points:,} fixes), eps 1, defaults, "
            f"{os.cpu_count()} CPU cores, {__import__('torch').get_num_threads()} torch thread(s), load average {os.getloadavg()[0]:.1f}: fit {fit_s:.0f} s (target < 300; "
            f"prepare {t['prepare_s']:.0f} s, TI {t['ti_s']:.0f} s, TPG {t['tpg_s']:.0f} s), sample {n:,} "
            f"{sample_s:.1f} s (target < 30)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated, of " + ", ".join(METHODS))
    parser.add_argument("--seeds", default="1,2,3", help="one seeded fit per seed; the table shows the mean")
    parser.add_argument("--eps", default="1,2", help="comma-separated epsilons")
    parser.add_argument("--limit", type=int, default=None, help="at most this many real trajectories")
    parser.add_argument("--neural-limit", type=int, default=1000,
                        help="at most this many for hrnet and baseline; 0 = no cap")
    parser.add_argument("--params", default="", help="cleanslate params as JSON, e.g. '{\"hop_cost\": 0}'")
    parser.add_argument("--timing", action="store_true", help="also time a 10,000-trajectory fit and sample")
    parser.add_argument("--timing-only", action="store_true", help="only the timing")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: on a machine shared beyond its cores, 2 threads ran DP-SGD "
                             "steps 4-5x slower than 1 here, from OpenMP spin contention)")
    args = parser.parse_args()
    os.environ.setdefault("CI", "1")   # no progress bars in logs
    import torch

    torch.set_num_threads(args.threads)
    methods = [m.strip().lower() for m in args.methods.split(",") if m.strip()]
    bad = sorted(set(methods) - set(METHODS))
    if bad:
        parser.error(f"unknown methods {bad}: use {', '.join(METHODS)}")
    if not args.timing_only:
        result = run(methods, [int(s) for s in args.seeds.split(",")], [float(e) for e in args.eps.split(",")],
                     args.limit, args.neural_limit or None, json.loads(args.params) if args.params else None)
        print(table(result))
    if args.timing or args.timing_only:
        print(timing())


if __name__ == "__main__":
    main()
