"""The method guide's table (issue 32 item 4): every method at eps 1 and 2 on one GeoLife draw, every metric family.

Setting: the fixes of /work/shared/data/geolife_beijing.parquet inside HRNet's box [39.8477, 116.1956, 40.1133,
116.4880], trajectories with >= 2 distinct timestamps there, a fixed public draw of ``--limit`` of them (default
1,000; ``benchmarks/fidelity.py``'s ``load_real``, the same draw). Each method is fitted through the public API
with its defaults (trajectory unit): per (method, eps, seed) a copy of the real table (a new lineage: an empty
ledger, as a first release) with ``mob_set_budget`` of exactly that (eps, delta), ``FROM mob_fit(...)`` with
the seed (timed: "fit s") and ``duckmob.sample`` of as many trajectories as the real table has (timed: "sample
s"), compared with the real table by ``duckmob.evaluate`` (all six families, ``reference=False``; the real
halves' reference is computed once and printed as the "real halves" row). Delta 1e-5 for every method but
PrivTrace (pure eps-DP, delta 0). Seeded fits: reproducible, not for release. NOT private: the evaluation reads
the real table exactly.

Headline columns (lower is better unless marked ^; the JSON keeps every metric):

    fine       pt dens   fine_point_density_jsd       points over a 200 x 200 grid
               tr dens   fine_traj_density_jsd        (trajectory, cell) pairs over a 100 x 100 grid
               step      fine_step_jsd                metres between consecutive points
    privtrace  length    privtrace_length_jsd         metres along each trajectory
               dens ARE  privtrace_density_are        trajectories passing random circles
    adatrace   trip      adatrace_trip_jsd            (start, end) cells of a 6 x 6 grid
               F1 ^      adatrace_pattern_f1          top-100 frequent patterns of the 6 x 6 grid
    hrnet      dest      hrnet_destination_jsd        last cell given the start cell (32 x 32)
               dens t    hrnet_density_t_jsd          where trajectories are at 24 instants (- without time)
    lestyan    size      lestyan_trip_size_jsd        cells per trip (32 x 32)
               OD km     lestyan_od_emd_m / 1000      EMD between the origin-destination pairs
    pategail   radius    pategail_radius_jsd          radius of gyration
               DailyLoc  pategail_dailyloc_jsd        distinct cells per trajectory
    (timing)   fit s, sample s                         wall seconds of mob_fit and of duckmob.sample
               pts/traj                                mean points per synthetic trajectory (real: last line)

    python benchmarks/methods.py                                        # the guide's run: 5 methods, eps 1,2, 1 seed
    python benchmarks/methods.py --methods privtrace --eps 1 --limit 200 --out /tmp/m   # a quick check
    python benchmarks/methods.py --method-limit pategail=500            # a smaller draw for one method
    python benchmarks/methods.py --show benchmarks/results/methods.json  # print a saved run
    python benchmarks/methods.py --show benchmarks/results/methods.json --markdown   # as in docs/methods/README.md
    python benchmarks/methods.py --data taxi --eps 1 --out benchmarks/results/methods_taxi   # taxi-like trips

Timings are wall seconds on whatever machine runs it (the JSON records the load average before and after each
fit); on a shared machine compare rows of one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from fidelity import BOX, DATA, DELTA, LIMIT_SEED, code_version, fmt, load_real  # noqa: E402

METHODS = ["privtrace", "hrnet", "baseline", "pategail", "cleanslate"]
FAMILIES = ["fine", "privtrace", "adatrace", "hrnet", "lestyan", "pategail"]
COLUMNS = [("pt dens", "fine_point_density_jsd"), ("tr dens", "fine_traj_density_jsd"), ("step", "fine_step_jsd"),
           ("length", "privtrace_length_jsd"), ("dens ARE", "privtrace_density_are"),
           ("trip", "adatrace_trip_jsd"), ("F1 ^", "adatrace_pattern_f1"),
           ("dest", "hrnet_destination_jsd"), ("dens t", "hrnet_density_t_jsd"),
           ("size", "lestyan_trip_size_jsd"), ("OD km", "lestyan_od_emd_m"),
           ("radius", "pategail_radius_jsd"), ("DailyLoc", "pategail_dailyloc_jsd")]
DEFAULT_OUT = os.path.join(HERE, "results", "methods")


def table_stats(con, name: str) -> tuple[int, float]:
    """(trajectories, mean points per trajectory) of a point table."""
    n, rows = con.execute(f"SELECT count(DISTINCT traj_id), count(*) FROM {name}").fetchall()[0]
    return int(n), rows / max(n, 1)


def load_taxi(con, limits: dict[str, int | None]) -> dict[str, int]:
    """``--data taxi``: one table per cap of taxi-like trips (``benchmarks/cleanslate.py``'s ``taxi_like``: GeoLife
    in BOX, one fix a minute, cut into trips of 10 fixes, a fixed public draw), as ``load_real`` for GeoLife."""
    from cleanslate import taxi_like

    return {name: taxi_like(con, name, n=limit or 20_000) for name, limit in limits.items()}


def run(methods: list[str], eps_list: list[float], seeds: list[int], limit: int | None,
        method_limits: dict[str, int], data: str = "geolife") -> dict:
    import duckmob

    import dp_accounting  # noqa: F401  the accountant's import (3 s) would be timed in the first fit otherwise
    import scipy.sparse.csgraph  # noqa: F401

    con = duckmob.connect()
    limits = {m: min(method_limits.get(m, limit or 10**9), limit or 10**9) for m in methods}
    tables = {lim: f"trips_{lim}" for lim in sorted(set(limits.values()))}
    caps = {name: (None if lim >= 10**9 else lim) for lim, name in tables.items()}
    sizes = (load_taxi if data == "taxi" else load_real)(con, caps)
    reals = {}
    for name in tables.values():
        n, pts = table_stats(con, name)
        reference = duckmob.evaluate(con, name, name, bbox=BOX, families=FAMILIES).to_pylist()
        reals[name] = dict(n_real=n, points_per_traj=pts,
                           reference={r["metric"]: r["reference"] for r in reference})
        print(f"{name}: {n:,} real trajectories, {pts:.1f} points each", flush=True)
    runs = []
    for method in methods:
        table_name = tables[limits[method]]
        n_real = sizes[table_name]
        for eps in eps_list:
            for seed in seeds:
                model = f"{method}_e{str(eps).replace('.', '_')}_s{seed}"
                delta = 0.0 if method == "privtrace" else DELTA
                # each fit on its own copy (a new lineage, an empty ledger) with a budget of exactly its (eps,
                # delta): as a first release on a fresh table, so that no fit composes (or is timed composing) the
                # ledger of the fits before it
                source = f"{table_name}_{model}"
                con.execute(f"CREATE OR REPLACE TABLE {source} AS FROM {table_name}")
                con.execute(f"FROM mob_set_budget('{source}', eps := {eps}, delta := {delta})").fetchall()
                load0 = os.getloadavg()[0]
                t0 = time.perf_counter()
                con.execute(f"FROM mob_fit('{source}', '{model}', eps := {eps}, delta := {delta}, "
                            f"method := '{method}', bbox := {BOX}, seed := {seed})").fetchall()
                fit_s = time.perf_counter() - t0
                t1 = time.perf_counter()
                synth = duckmob.sample(con, model, n=n_real, seed=seed)
                sample_s = time.perf_counter() - t1
                load1 = os.getloadavg()[0]
                con.register("synth", synth)
                rows = duckmob.evaluate(con, table_name, "synth", bbox=BOX, families=FAMILIES,
                                        reference=False).to_pylist()
                n_synth, pts = table_stats(con, "synth")
                con.unregister("synth")
                con.execute(f"DROP TABLE {source}")
                metrics = {r["metric"]: r["value"] for r in rows}
                runs.append(dict(method=method, eps=eps, seed=seed, real=table_name, n_real=n_real,
                                 n_synth=n_synth, fit_s=fit_s, sample_s=sample_s, points_per_traj=pts,
                                 load_before=load0, load_after=load1, metrics=metrics))
                print(f"{method} eps {eps} seed {seed}: fit {fit_s:.1f} s, sample {sample_s:.1f} s "
                      f"(load {load0:.1f} -> {load1:.1f}), {pts:.1f} points/traj", flush=True)
    con.close()
    return dict(setting=dict(data=DATA if data == "geolife" else f"{DATA}, taxi-like trips", bbox=BOX, limit=limit,
                             limit_seed=LIMIT_SEED, method_limits=limits,
                             eps=eps_list, seeds=seeds, delta=DELTA, families=FAMILIES, code=code_version(),
                             cores=os.cpu_count()),
                reals=reals, runs=runs)


def cell(key: str, value) -> str:
    if value is None:
        return "-"
    if key == "lestyan_od_emd_m":
        return f"{value / 1000:.2f}"
    return fmt(value)


def short_cell(key: str, value) -> str:
    """As :func:`cell`, without the leading zero of a fraction (.4200)."""
    text = cell(key, value)
    return text[1:] if text.startswith("0.") else text


def mean_rows(result: dict) -> list[dict]:
    """One row per (method, eps): each metric's mean over the seeds (None where a seed has none)."""
    out = []
    for method in dict.fromkeys(r["method"] for r in result["runs"]):
        for eps in dict.fromkeys(r["eps"] for r in result["runs"]):
            mine = [r for r in result["runs"] if r["method"] == method and r["eps"] == eps]
            if not mine:
                continue

            def mean(values):
                return None if any(v is None for v in values) else sum(values) / len(values)
            row = dict(method=method, eps=eps, n_real=mine[0]["n_real"], seeds=len(mine),
                       metrics={k: mean([r["metrics"].get(k) for r in mine]) for _, k in COLUMNS})
            for k in ("fit_s", "sample_s", "points_per_traj"):
                row[k] = mean([r[k] for r in mine])
            out.append(row)
    return out


def table(result: dict) -> str:
    s = result["setting"]
    head = (f"{'method':11s} {'eps':>3s} {'n real':>6s} " + " ".join(f"{short:>8s}" for short, _ in COLUMNS)
            + f" {'fit s':>7s} {'sample s':>8s} {'pts/traj':>8s}")
    what = "taxi-like trips (one fix a minute, 10 fixes a trip) of GeoLife" if "taxi" in s["data"] else "GeoLife"
    lines = [f"{what} in HRNet's box, fixed draw (seed {s['limit_seed']}), each method's defaults, trajectory unit, "
             f"mean of {len(s['seeds'])} seeded fit(s), code {s['code']}", head]
    for row in mean_rows(result):
        lines.append(f"{row['method']:11s} {row['eps']:3g} {row['n_real']:6d} "
                     + " ".join(f"{cell(k, row['metrics'][k]):>8s}" for _, k in COLUMNS)
                     + f" {row['fit_s']:7.1f} {row['sample_s']:8.1f} {row['points_per_traj']:8.1f}")
    for name, real in result["reals"].items():
        lines.append(f"{'real halves':11s} {'':3s} {real['n_real']:6d} "
                     + " ".join(f"{cell(k, real['reference'].get(k)):>8s}" for _, k in COLUMNS)
                     + f" {'':7s} {'':8s} {real['points_per_traj']:8.1f}")
    lines.append("JSD in nats (ln 2 = 0.693 at most); ^ higher is better; OD km: Lestyan's OD EMD in km; 'real "
                 "halves': the same metric between two halves of the real table (pts/traj: the real table's mean)")
    loads = [r["load_before"] for r in result["runs"]] + [r["load_after"] for r in result["runs"]]
    if loads:
        lines.append(f"wall seconds on {s['cores']} cores; 1-minute load average during the fits "
                     f"{min(loads):.1f}-{max(loads):.1f}")
    return "\n".join(lines)


def markdown(result: dict) -> str:
    """The table as Markdown (docs/methods/README.md): the best method of each column at each eps in bold."""
    higher = {"adatrace_pattern_f1"}
    rows = mean_rows(result)
    best = {}
    for eps in dict.fromkeys(r["eps"] for r in rows):
        for _, k in COLUMNS:
            values = [r["metrics"][k] for r in rows if r["eps"] == eps and r["metrics"][k] is not None]
            if values:
                best[eps, k] = max(values) if k in higher else min(values)
    head = ["method", "eps", *(short for short, _ in COLUMNS), "fit s", "sample s", "pts/traj"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [f"`{r['method']}`", f"{r['eps']:g}"]
        for _, k in COLUMNS:
            text = short_cell(k, r["metrics"][k])
            cells.append(f"**{text}**" if r["metrics"][k] is not None and r["metrics"][k] == best.get((r["eps"], k))
                         else text)
        cells += [f"{r['fit_s']:.1f}", f"{r['sample_s']:.1f}", f"{r['points_per_traj']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    for real in result["reals"].values():
        cells = (["real halves", ""] + [short_cell(k, real["reference"].get(k)) for _, k in COLUMNS]
                 + ["", "", f"{real['points_per_traj']:.1f}"])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated (default {','.join(METHODS)})")
    parser.add_argument("--eps", default="1,2", help="comma-separated epsilons (default 1,2)")
    parser.add_argument("--seeds", default="1", help="one seeded fit per seed; rows show the mean (default 1)")
    parser.add_argument("--limit", type=int, default=1000, help="real trajectories in the draw (0: all)")
    parser.add_argument("--data", default="geolife", choices=("geolife", "taxi"),
                        help="geolife: the GeoLife trajectories; taxi: taxi-like trips cut from them (one fix a "
                             "minute, 10 fixes a trip; benchmarks/cleanslate.py's taxi_like)")
    parser.add_argument("--method-limit", action="append", default=[], metavar="METHOD=N",
                        help="a smaller draw for one method (repeatable); the 'n real' column shows it")
    parser.add_argument("--out", default=DEFAULT_OUT, help="write OUT.json and OUT.txt (default "
                                                           "benchmarks/results/methods)")
    parser.add_argument("--show", default=None, help="print a saved JSON's table and exit")
    parser.add_argument("--markdown", action="store_true", help="with --show: the table as Markdown")
    args = parser.parse_args()
    os.environ.setdefault("CI", "1")   # no progress bars in logs
    os.environ.setdefault("DUCKMOB_PROGRESS", "0")
    if args.show:
        saved = json.loads(open(args.show).read())
        print(markdown(saved) if args.markdown else table(saved))
        return
    methods = [m.strip().lower() for m in args.methods.split(",") if m.strip()]
    bad = sorted(set(methods) - set(METHODS))
    if bad:
        parser.error(f"unknown methods {bad}: use {', '.join(METHODS)}")
    method_limits = {}
    for item in args.method_limit:
        name, sep, value = item.partition("=")
        if not sep or name.strip().lower() not in METHODS:
            parser.error(f"--method-limit {item!r}: write METHOD=N")
        method_limits[name.strip().lower()] = int(value)
    result = run(methods, [float(e) for e in args.eps.split(",")], [int(s) for s in args.seeds.split(",")],
                 args.limit or None, method_limits, args.data)
    text = table(result)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out + ".json", "w") as f:
            json.dump(result, f, indent=1)
        with open(args.out + ".txt", "w") as f:
            f.write(f"$ python benchmarks/methods.py {' '.join(sys.argv[1:])}\n{text}\n")


if __name__ == "__main__":
    main()
