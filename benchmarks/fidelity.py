"""Fine-grained fidelity on GeoLife (issue 16): do synthetic trajectories follow the city's streets and sampling?

Setting: /work/shared/data/geolife_beijing.parquet, the fixes inside HRNet's central-Beijing box
[39.8477, 116.1956, 40.1133, 116.4880] (public, declared), trajectories left with at least 2 distinct timestamps
there (the input contract); ``--limit N`` keeps N of them (drawn with a fixed public seed). Each method is fitted
through the public Python API (``duckmob.connect``, ``mob_set_budget``, ``duckmob.synthesize``) at ``--eps``
(default 1) once per seed (default 3 seeds: 1, 2, 3; seeded fits: reproducible, not for release), sampling as many
synthetic trajectories as the real table has, and compared with the real table by ``duckmob.evaluate`` (families
fine, privtrace and adatrace). The table shows the mean over the seeds:

    pt dens   fine_point_density_jsd       points over a 200 x 200 grid (target < 0.12)
    tr dens   fine_traj_density_jsd        (trajectory, cell holding one of its points) pairs, 100 x 100 grid
                                           (target < 0.08)
    rt dens   fine_route_density_jsd       the same along straight segments between consecutive points
    step      fine_step_jsd                metres between consecutive points, public log bins (target < 0.15)
    pts/traj  fine_points_per_traj_ratio   mean points per trajectory, synthetic / real (target 0.8 - 1.2)
    1-pt      fine_one_point_share_synth   share of one-point synthetic trajectories (real: see the last line)
    length    privtrace_length_jsd         travel distance (issue 16: no worse than before by more than 10 %)
    diameter  privtrace_diameter_jsd       diameter (idem)
    trip      adatrace_trip_jsd            (start, end) cells of a 6 x 6 grid (idem)
    dens ARE  privtrace_density_are        trajectories passing random circles
    patt ARE  privtrace_pattern_are        transition patterns, 20 x 20 grid
    dens 20   point_density_20_jsd         points over a 20 x 20 grid (computed here: the issue-32 table's
                                           "density 20x20")
    empty     empty_cell_share             share of synthetic points in 200 x 200 cells holding no real point
                                           (routes drawn across areas nobody travels; computed here)
    time s    fit_sample_s                 seconds to fit and sample (one synthesize call; noisy on a shared
                                           machine: compare rows of one run)

    python benchmarks/fidelity.py                                   # privtrace and baseline, 3 seeds
    python benchmarks/fidelity.py --methods privtrace,baseline,hrnet --limit 5000
    python benchmarks/fidelity.py --out after.json --before benchmarks/results/fidelity_before.json
    python benchmarks/fidelity.py --show benchmarks/results/fidelity_before.json   # print a saved table
    python benchmarks/fidelity.py --methods privtrace,privtrace-oracle --eps 100   # where the error comes from

``privtrace-cells`` / ``privtrace-points``: PrivTrace with that ``output`` (issue 32 compares the default with
both). ``hrnet-points`` / ``baseline-points``: the method with ``output := 'points'`` (routed points between its cells,
timed between their slots) instead of one placed point per stay.

``privtrace-oracle`` (NOT private, a diagnostic): PrivTrace's fine placement applied to the real trajectories'
own state sequences, so the gap between it and the privtrace row is the coarse model's (its random walks) and
the gap between it and 0 the fine stage's.

HRNet and its baseline train with DP-SGD (the baseline: 1-7 minutes per fit on 1,000 trajectories on a shared 2-core
machine; CUDA when available), so they fit on at most ``--neural-limit`` trajectories (default 1,000, the same fixed
public draw) and are compared with that table; the ``n real`` column says which table a row was measured on. They
output stay-point cell sequences (one point per cell), compared here with the raw GPS fixes like PrivTrace's output.
NOT private: the evaluation reads the real table exactly (it is for the data owner).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

DATA = "/work/shared/data/geolife_beijing.parquet"
BOX = [39.8477, 116.1956, 40.1133, 116.4880]   # HRNet's box (as duckmob.demo.HRNET_BBOX, benchmarks/hrnet.py)
DELTA = 1e-5                                     # hrnet / baseline (PrivTrace is pure eps-DP)
LIMIT_SEED = 2024                                # public: which trajectories --limit keeps
FAMILIES = ["fine", "privtrace", "adatrace"]
COLUMNS = [("pt dens", "fine_point_density_jsd"), ("tr dens", "fine_traj_density_jsd"), ("step", "fine_step_jsd"),
           ("rt dens", "fine_route_density_jsd"), ("pts/traj", "fine_points_per_traj_ratio"),
           ("1-pt", "fine_one_point_share_synth"),
           ("length", "privtrace_length_jsd"), ("diameter", "privtrace_diameter_jsd"),
           ("trip", "adatrace_trip_jsd"), ("dens ARE", "privtrace_density_are"),
           ("patt ARE", "privtrace_pattern_are"), ("dens 20", "point_density_20_jsd"),
           ("empty", "empty_cell_share"), ("time s", "fit_sample_s")]
TARGETS = {"fine_point_density_jsd": "< 0.12", "fine_traj_density_jsd": "< 0.08", "fine_step_jsd": "< 0.15",
           "fine_points_per_traj_ratio": "0.8-1.2", "fine_one_point_share_synth": "0"}


def load_real(con, limits: dict[str, int | None]) -> dict[str, int]:
    """Create one table per cap in ``limits`` (name -> at most this many trajectories, None = all): the fixes
    inside BOX of trajectories with >= 2 distinct timestamps there, a capped table keeping a fixed public draw of
    them. Returns the number of trajectories of each table."""
    lat0, lon0, lat1, lon1 = BOX
    con.execute(f"""CREATE OR REPLACE TEMP TABLE inside AS
        SELECT user_id, traj_id, ts, lat, lon FROM read_parquet('{DATA}')
        WHERE lat BETWEEN {lat0} AND {lat1} AND lon BETWEEN {lon0} AND {lon1}""")
    keys = con.execute("SELECT user_id, traj_id FROM inside GROUP BY ALL HAVING count(DISTINCT ts) >= 2 "
                       "ORDER BY user_id, traj_id").fetchnumpy()
    sizes = {}
    for name, limit in limits.items():
        pick = np.arange(len(keys["traj_id"]))
        if limit is not None and limit < len(pick):
            pick = np.sort(np.random.default_rng(LIMIT_SEED).choice(len(pick), limit, replace=False))
        con.register("keep_keys", {"user_id": np.asarray(keys["user_id"])[pick],
                                   "traj_id": np.asarray(keys["traj_id"])[pick]})
        con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT i.* FROM inside i SEMI JOIN keep_keys k "
                    "USING (user_id, traj_id) ORDER BY user_id, traj_id, ts")
        con.unregister("keep_keys")
        sizes[name] = len(pick)
    con.execute("DROP TABLE inside")
    return sizes


def cap(limit: int | None, neural_limit: int | None) -> int | None:
    return min((v for v in (limit, neural_limit) if v is not None), default=None)


def run(methods: list[str], seeds: list[int], eps: float, limit: int | None, neural_limit: int | None,
        params: dict | None = None) -> dict:
    import duckmob
    from duckmob.metrics import evaluate, load_side, table_points

    import dp_accounting  # noqa: F401  the accountant's import (3 s) would be timed in the first fit otherwise
    import scipy.sparse.csgraph  # noqa: F401

    con = duckmob.connect()
    t0 = time.perf_counter()
    # PrivTrace on `trips` (--limit); the DP-SGD methods on `trips_neural` (--limit and --neural-limit).
    source = {m: "trips" if m.startswith("privtrace") else "trips_neural" for m in methods}
    limits = {"trips": limit, "trips_neural": cap(limit, neural_limit)}
    sizes = load_real(con, {t: limits[t] for t in dict.fromkeys(source.values())})
    reals = {}
    for name, n_real in sizes.items():
        n_fits = len(seeds) * sum(1 for t in source.values() if t == name)
        con.execute(f"FROM mob_set_budget('{name}', eps := {eps * n_fits + 1}, "
                    f"delta := {min(DELTA * n_fits * 10, 1e-3)})"
                    ).fetchall()
        reals[name] = load_side(table_points(con, name), BOX, "real")[0]   # loaded once, derived arrays cached
        print(f"{name}: {n_real:,} real trajectories, {reals[name].traj.n_points:,} fixes inside {BOX} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    runs = []
    for method in methods:
        table_name = source[method]
        for seed in seeds:
            t1 = time.perf_counter()
            if method == "privtrace-oracle":
                synth = oracle_sample(reals[table_name].traj, eps, seed, params)
            else:
                name, _, output = method.partition("-")      # hrnet-points: HRNet with output := 'points'
                synth = duckmob.synthesize(con, table_name, eps=eps, method=name, bbox=BOX, n=sizes[table_name],
                                           seed=seed, outside="drop",
                                           **({} if name == "privtrace" else {"delta": DELTA}),
                                           **({"output": output} if output else {}), **(params or {}))
            fit_s = time.perf_counter() - t1
            t2 = time.perf_counter()
            rows = evaluate(reals[table_name], synth, BOX, families=FAMILIES, reference=False)
            metrics = {r["metric"]: r["value"] for r in rows}
            metrics.update(extra_metrics(reals[table_name], load_side(synth, BOX, "synth")[0]), fit_sample_s=fit_s)
            runs.append(dict(method=method, seed=seed, real=table_name, n_real=sizes[table_name],
                             fit_sample_s=fit_s, evaluate_s=time.perf_counter() - t2, metrics=metrics))
            print(f"{method} seed {seed}: fit + sample {fit_s:.1f} s, evaluate {runs[-1]['evaluate_s']:.1f} s; "
                  + ", ".join(f"{short} {fmt(metrics.get(m))}" for short, m in COLUMNS[:6]), flush=True)
    con.close()
    return dict(setting=dict(data=DATA, bbox=BOX, eps=eps, delta_neural=DELTA, seeds=seeds, limit=limit,
                             neural_limit=neural_limit, params=params or {}, families=FAMILIES,
                             code=code_version()),
                runs=runs, mean=means(runs))


def extra_metrics(real, synth) -> dict[str, float]:
    """The issue-32 columns evaluate has no row for: ``point_density_20_jsd`` (JSD of the points over a 20 x 20
    grid) and ``empty_cell_share`` (share of synthetic points in 200 x 200 cells that hold no real point)."""
    from duckmob.metrics.common import jsd
    from duckmob.metrics.fine import point_density

    real200, synth200 = point_density(real, 200), point_density(synth, 200)
    return dict(point_density_20_jsd=float(jsd(point_density(real, 20), point_density(synth, 20))),
                empty_cell_share=float(synth200[real200 == 0].sum() / max(synth200.sum(), 1.0)))


def oracle_sample(real, eps: float, seed: int, params: dict | None = None):
    """NOT private, a diagnostic: PrivTrace fitted at ``eps`` (seeded, outside the ledger), its fine placement
    applied to the REAL trajectories' state sequences instead of its random walks. Against the privtrace row it
    splits the error into the coarse model's (the walks) and the fine stage's (placement under noise)."""
    from duckmob.privacy.noise import NoiseSource
    from duckmob.synth.base import fit_unrecorded, trajectories_from_cells
    from duckmob.synth.cells import state_sequences
    from duckmob.synth.privtrace import PrivTrace

    model = fit_unrecorded(PrivTrace(BOX, **(params or {})), real, eps, 0.0, NoiseSource(seed))
    off, states, _ = state_sequences(model.grid, real.offsets, real.lat, real.lon)
    lengths, lat, lon = model.placement().points(off, states, np.random.default_rng(seed), model.config.max_points)
    return trajectories_from_cells(lengths, lat, lon)


def means(runs: list[dict]) -> dict:
    """Per method, each metric's mean over its seeds (None where a run has none)."""
    out = {}
    for method in dict.fromkeys(r["method"] for r in runs):
        mine = [r["metrics"] for r in runs if r["method"] == method]
        out[method] = {k: (float(np.mean([m[k] for m in mine])) if all(m.get(k) is not None for m in mine)
                           else None) for k in mine[0]}
        out[method]["n_real"] = next(r["n_real"] for r in runs if r["method"] == method)
    return out


def code_version() -> str:
    """The commit the code was run at, with '+dirty' when the working tree differs from it."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True).stdout.strip()
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def fmt(v) -> str:
    return "-" if v is None else f"{v:.4f}"


def table(result: dict, title: str) -> str:
    s = result["setting"]
    lines = [f"{title}: GeoLife in HRNet's box, eps {s['eps']}, mean of {len(s['seeds'])} seeded fits, code "
             f"{s['code']}",
             f"{'method':16s} {'n real':>6s} " + " ".join(f"{short:>9s}" for short, _ in COLUMNS)]
    for method, m in result["mean"].items():
        lines.append(f"{method:16s} {m['n_real']:6d} " + " ".join(f"{fmt(m.get(k)):>9s}" for _, k in COLUMNS))
    lines.append(f"{'target':16s} {'':6s} " + " ".join(f"{TARGETS.get(k, ''):>9s}" for _, k in COLUMNS))
    shares = ", ".join(f"{method} {fmt(m.get('fine_one_point_share_real'))}" for method, m in result["mean"].items())
    lines.append(f"real one-point share ({shares}); JSD in nats (ln 2 = 0.693 is the maximum)")
    return "\n".join(lines)


def compare(before: dict, after: dict) -> str:
    """after / before for every column, per method present in both."""
    lines = ["after / before (pts/traj: after and before values)",
             f"{'method':16s} {'':6s} " + " ".join(f"{short:>9s}" for short, _ in COLUMNS)]
    for method in after["mean"]:
        if method not in before["mean"]:
            continue
        a, b = after["mean"][method], before["mean"][method]
        cells = []
        for _, k in COLUMNS:
            if a.get(k) is None or b.get(k) is None:
                cells.append("-")
            elif k == "fine_points_per_traj_ratio":
                cells.append(f"{a[k]:.2f}/{b[k]:.2f}")
            else:
                cells.append(f"{a[k] / b[k]:.2f}" if b[k] else f"{a[k]:.4f}")
        lines.append(f"{method:16s} {'':6s} " + " ".join(f"{c:>9s}" for c in cells))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", default="privtrace,baseline",
                        help="comma-separated: privtrace, baseline, hrnet, hrnet-points, baseline-points, privtrace-oracle "
                             "(default privtrace,baseline)")
    parser.add_argument("--seeds", default="1,2,3", help="one seeded fit per seed; the table shows the mean")
    parser.add_argument("--eps", type=float, default=1.0)
    parser.add_argument("--limit", type=int, default=None, help="at most this many real trajectories")
    parser.add_argument("--neural-limit", type=int, default=1000,
                        help="at most this many for hrnet and baseline (DP-SGD: minutes per fit at 1,000 on 2 cores); "
                             "0 = no cap")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                        help="a method parameter for every fit (repeatable), e.g. --param fine_w=64")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--before", default=None, help="a saved JSON to print first and compare with")
    parser.add_argument("--show", default=None, help="print a saved JSON's table and exit")
    args = parser.parse_args()
    os.environ.setdefault("CI", "1")   # no progress bars in logs
    before = json.loads(open(args.before).read()) if args.before else None
    if args.show:
        print(table(json.loads(open(args.show).read()), args.show))
        return
    methods = [m.strip().lower() for m in args.methods.split(",") if m.strip()]
    known = {"privtrace", "baseline", "hrnet", "privtrace-oracle", "hrnet-points", "baseline-points",
             "privtrace-cells", "privtrace-points"}
    bad = sorted(set(methods) - known)
    if bad:
        parser.error(f"unknown methods {bad}: use {', '.join(sorted(known))}")
    params = {}
    for item in args.param:
        name, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--param {item!r}: write NAME=VALUE")
        params[name.strip()] = json.loads(value) if value.strip()[:1] in "-0123456789[{tn" else value
    result = run(methods, [int(s) for s in args.seeds.split(",")], args.eps, args.limit, args.neural_limit or None,
                 params)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    if before:
        print(table(before, "before"))
    print(table(result, "after" if before else "this run"))
    if before:
        print(compare(before, result))


if __name__ == "__main__":
    main()
