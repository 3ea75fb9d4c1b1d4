"""Fidelity against eps (issue 29): what a PrivTrace table looks like at eps 0.1, 0.3, 1, 3 and 10.

Answers the question docs/choosing_eps.md puts to a data engineer: at a given eps, is the synthetic table close
to noise or as close to the data as another real sample would be? For each data set, PrivTrace (the default
method, trajectory unit) is fitted through the public Python API (``duckmob.connect``, ``mob_set_budget``,
``duckmob.synthesize``) at every eps, once per seed (default 2 seeds: 1, 2; seeded fits: reproducible, NOT for
release), drawing ``n`` = the real table's number of trajectories (a public choice made here for every eps: the
default n, the model's noisy count, is refused at eps 0.1 on the sample as mostly noise). Each synthetic table is
compared with the real one by ``duckmob.evaluate(con, 'trips', 'synth', bbox=BOX, families=['privtrace'])``;
lower is better for every column:

    length    privtrace_length_jsd     JSD of trip length (metres travelled), 50 bins, nats (max ln 2 = 0.693)
    diameter  privtrace_diameter_jsd   JSD of trip diameter (widest distance between two points), idem
    density   privtrace_density_are    mean relative error of the number of trips passing 500 random circles
    pattern   privtrace_pattern_are    mean relative error of the 200 most frequent real movement patterns
                                       (2-5 cells of a 20 x 20 grid)

The table shows the mean over the seeds; the per-seed values are printed as the runs go. The last row of each
data set, "real vs real", is the same metrics between two halves of the real table (mob_evaluate's ``reference``:
the halves by a fixed hash of (user_id, traj_id), the one rule of duckmob demo and the report): how far apart two
real samples are, the
best a synthetic table can be expected to do. (Each half has half the trajectories, so that row is a little
pessimistic for the density and pattern errors.)

Data sets (``--data``, comma-separated):

    sample   FROM mob_geolife_sample(): the GeoLife sample shipped in the package (1,999 trajectories, 10 users)
    geolife  /work/shared/data/geolife_beijing.parquet (17,160 trajectories, 177 users); ``--limit N`` keeps a
             fixed public draw of N trajectories

Both keep the fixes inside HRNet's central-Beijing box [39.8477, 116.1956, 40.1133, 116.4880] (public,
declared) and the trajectories left with at least 2 distinct timestamps there (the input contract).

    python benchmarks/eps.py                                        # both data sets, eps 0.1,0.3,1,3,10, seeds 1,2
    python benchmarks/eps.py --data sample --eps 0.5,1,2 --seeds 1,2,3
    python benchmarks/eps.py --data geolife --limit 5000

NOT private: the evaluation reads the real tables exactly (it is for the data owner).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from fidelity import code_version   # noqa: E402 -- benchmarks/ is not a package

GEOLIFE = "/work/shared/data/geolife_beijing.parquet"
BOX = [39.8477, 116.1956, 40.1133, 116.4880]   # HRNet's box (duckmob.demo.HRNET_BBOX)
LIMIT_SEED = 2024                                # public: which trajectories --limit keeps (as fidelity.py)
COLUMNS = [("length", "privtrace_length_jsd"), ("diameter", "privtrace_diameter_jsd"),
           ("density", "privtrace_density_are"), ("pattern", "privtrace_pattern_are")]


def load(con, data: str, limit: int | None) -> tuple[int, int]:
    """Create table ``trips`` from data set ``data``: the fixes inside BOX of the trajectories with >= 2 distinct
    timestamps there, at most ``limit`` of them (a fixed public draw). Returns (trajectories, users)."""
    source = "mob_geolife_sample()" if data == "sample" else f"read_parquet('{GEOLIFE}')"
    lat0, lon0, lat1, lon1 = BOX
    con.execute(f"""CREATE OR REPLACE TEMP TABLE inside AS
        SELECT user_id, traj_id, ts, lat, lon FROM {source}
        WHERE lat BETWEEN {lat0} AND {lat1} AND lon BETWEEN {lon0} AND {lon1}""")
    keys = con.execute("SELECT user_id, traj_id FROM inside GROUP BY ALL HAVING count(DISTINCT ts) >= 2 "
                       "ORDER BY user_id, traj_id").fetchnumpy()
    pick = np.arange(len(keys["traj_id"]))
    if limit is not None and limit < len(pick):
        pick = np.sort(np.random.default_rng(LIMIT_SEED).choice(len(pick), limit, replace=False))
    con.register("keep_keys", {"user_id": np.asarray(keys["user_id"])[pick],
                               "traj_id": np.asarray(keys["traj_id"])[pick]})
    con.execute("CREATE OR REPLACE TABLE trips AS SELECT i.* FROM inside i SEMI JOIN keep_keys k "
                "USING (user_id, traj_id) ORDER BY user_id, traj_id, ts")
    con.unregister("keep_keys")
    con.execute("DROP TABLE inside")
    return len(pick), len(np.unique(np.asarray(keys["user_id"])[pick]))


def metrics(con, real: str, synth: str, column: str = "value") -> dict[str, float]:
    """The shown metrics of ``synth`` against ``real`` (table names or parenthesised queries on ``con``);
    ``column="reference"``: mob_evaluate's real-vs-real reference instead."""
    import duckmob

    rows = duckmob.evaluate(con, real, synth, bbox=BOX, families=["privtrace"], reference=column == "reference",
                            baseline=False).to_pylist()
    return {r["metric"]: r[column] for r in rows}


def run(data: str, eps_list: list[float], seeds: list[int], limit: int | None) -> dict:
    """Every (eps, seed) fit on one data set and the real-vs-real reference."""
    import duckmob

    con = duckmob.connect()
    t0 = time.perf_counter()
    n_real, n_users = load(con, data, limit)
    # PrivTrace is pure eps-DP: at delta 0 the fits add up exactly, so this budget is spent to the last digit.
    total = math.fsum(eps_list) * len(seeds)
    con.execute(f"FROM mob_set_budget('trips', eps := {total!r}, delta := 0)").fetchall()
    print(f"{data}: {n_real:,} trajectories of {n_users} users inside {BOX} ({time.perf_counter() - t0:.0f} s)",
          flush=True)
    t1 = time.perf_counter()
    reference = metrics(con, "trips", "trips", column="reference")
    print(f"{data} real vs real: {line(reference)} ({time.perf_counter() - t1:.0f} s)", flush=True)
    runs = []
    for eps in eps_list:
        for seed in seeds:
            t1 = time.perf_counter()
            synth = duckmob.synthesize(con, "trips", eps=eps, bbox=BOX, n=n_real, seed=seed)
            fit_s = time.perf_counter() - t1
            con.register("synth", synth)
            got = metrics(con, "trips", "synth")
            con.unregister("synth")
            runs.append(dict(eps=eps, seed=seed, fit_s=fit_s, metrics=got))
            print(f"{data} eps {eps:g} seed {seed}: {line(got)} (fit + sample {fit_s:.1f} s, with evaluation "
                  f"{time.perf_counter() - t1:.0f} s)", flush=True)
    spent = con.execute("SELECT spent FROM mob_budget() WHERE source = 'trips'").fetchall()[0][0]
    con.close()
    return dict(data=data, n_real=n_real, n_users=n_users, runs=runs, reference=reference, spent=spent,
                seconds=time.perf_counter() - t0)


def line(m: dict) -> str:
    return ", ".join(f"{short} {m[key]:.4f}" for short, key in COLUMNS)


def table(result: dict, seeds: list[int]) -> str:
    """Mean over the seeds per eps, then the real-vs-real row."""
    name = {"sample": "shipped sample, FROM mob_geolife_sample()", "geolife": "GeoLife, geolife_beijing.parquet"}
    lines = [f"{name[result['data']]}: {result['n_real']:,} trajectories of {result['n_users']} users in HRNet's box; "
             f"PrivTrace, trajectory unit, n = {result['n_real']:,}; mean (lowest-highest) of {len(seeds)} seeded "
             f"fits (seeds {','.join(map(str, seeds))})",
             f"{'eps':>12s} {'odds x':>7s} " + " ".join(f"{short:>21s}" for short, _ in COLUMNS) + f" {'fit s':>6s}"]
    for eps in dict.fromkeys(r["eps"] for r in result["runs"]):
        mine = [r for r in result["runs"] if r["eps"] == eps]
        cells = []
        for _, key in COLUMNS:
            values = [r["metrics"][key] for r in mine]
            cells.append(f"{np.mean(values):.4f} ({min(values):.3f}-{max(values):.3f})")
        lines.append(f"{eps:12g} {odds(eps):>7s} " + " ".join(f"{c:>21s}" for c in cells)
                     + f" {np.mean([r['fit_s'] for r in mine]):6.1f}")
    lines.append(f"{'real vs real':>12s} {'':>7s} "
                 + " ".join(f"{result['reference'][key]:21.4f}" for _, key in COLUMNS))
    lines.append(f"budget spent {result['spent']:g} (delta 0: the fits' eps add up); {result['seconds']:.0f} s in all")
    return "\n".join(lines)


def odds(eps: float) -> str:
    """e^eps, the most an observer's odds about one trajectory may move, to 3 significant digits or so."""
    x = math.exp(eps)
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="sample,geolife", help="comma-separated: sample, geolife (default both)")
    parser.add_argument("--eps", default="0.1,0.3,1,3,10", help="comma-separated eps of the fits")
    parser.add_argument("--seeds", default="1,2", help="one seeded fit per seed and eps; the table shows the mean")
    parser.add_argument("--limit", type=int, default=None,
                        help="geolife: at most this many trajectories (a fixed public draw); default all")
    args = parser.parse_args()
    os.environ.setdefault("CI", "1")   # no progress bars in logs
    datasets = [d.strip().lower() for d in args.data.split(",") if d.strip()]
    bad = sorted(set(datasets) - {"sample", "geolife"})
    if bad:
        parser.error(f"unknown data sets {bad}: use sample, geolife")
    eps_list = [float(e) for e in args.eps.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    t0 = time.perf_counter()
    code = code_version()   # before the runs: the code they import
    results = [run(d, eps_list, seeds, args.limit if d == "geolife" else None) for d in datasets]
    print(f"\nFidelity against eps, code {code}; lower is better in every column; odds x = e^eps")
    for result in results:
        print()
        print(table(result, seeds))
    print(f"\n{time.perf_counter() - t0:.0f} s in all")


if __name__ == "__main__":
    main()
