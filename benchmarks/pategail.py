"""PateGail on GeoLife (issue 19): its own metrics and next-location prediction against PrivTrace, at eps 1, 2, 4,
and how its quality grows with the number of devices.

Setting: benchmarks/fidelity.py's table (the fixes of /work/shared/data/geolife_beijing.parquet inside HRNet's box
[39.8477, 116.1956, 40.1133, 116.4880], trajectories with >= 2 distinct timestamps there; ``--limit N`` keeps a
fixed public draw of N). Each method is fitted through the public Python API (``duckmob.synthesize``) once per seed
(seeded fits: reproducible, not for release) and samples as many trajectories as the real table has. Rows:

    pategail/user   PateGail, privacy_unit 'user' (max_trajectories_per_user 500): each user is a device (~177)
    pategail/traj   PateGail, privacy_unit 'trajectory': each trajectory is a device (~16,700 on the full table;
                    in the devices table by default, add it to --methods for every eps)
    privtrace       PrivTrace, privacy_unit 'trajectory' (pure eps-DP)
    hrnet, cleanslate   when asked for with --methods (DP-SGD: slow on 2 cores; capped at --neural-limit)

Columns: mob_evaluate's pategail family (JSD in nats of radius of gyration, distinct 32 x 32 cells per trajectory,
distance between consecutive records, G-rank and I-rank profiles) and the downstream next-location task
(Acc@1 / Acc@5 of a second-order Markov predictor fitted on the synthetic table, tested on the real one; the
real-trained reference on the last line), and the fit + sample time in seconds. The device table repeats
pategail at one eps (--devices-eps, default 4) under the trajectory unit on growing draws (--device-limits) next
to the user unit: the aggregate's noise per reward is sd sigma sqrt(B) / n_devices, so quality should grow with
the number of devices.

    python benchmarks/pategail.py                                   # the full run (see results/pategail.txt)
    python benchmarks/pategail.py --limit 2000 --seeds 1 --eps 4 --methods pategail/user,privtrace
    python benchmarks/pategail.py --show out.json
    python benchmarks/pategail.py --control                         # issue 32: trained vs rounds := 1

``--control`` (issue 32, "PateGail learns"): on a fixed draw of 1,000 trajectories of the shipped sample
(``duckmob.demo.sample_path()``; trajectories with >= 2 distinct timestamps), trajectory unit, eps 4, seeds 1
and 2, the default fit and any ``--variants`` (JSON params), each against its own untrained control (the same
params with ``rounds := 1``: the uniform initial policy, the same start model and rendering), with the ratio
of its mean to the control's per metric (< 0.8: 20% better).

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

from fidelity import BOX, DELTA, code_version, fmt, load_real  # noqa: E402  (shared benchmark helpers)

METHODS = ("pategail/user", "pategail/traj", "privtrace", "hrnet", "cleanslate")
COLUMNS = [("radius", "pategail_radius_jsd"), ("dailyloc", "pategail_dailyloc_jsd"),
           ("distance", "pategail_distance_jsd"), ("g-rank", "pategail_grank_jsd"), ("i-rank", "pategail_irank_jsd"),
           ("acc@1", "next_location_acc1"), ("acc@5", "next_location_acc5")]
K_USER = 500   # max_trajectories_per_user for the user unit (PateGail's rounds do not scale with k)


def fit_kwargs(method: str) -> dict:
    """synthesize() arguments of a benchmark row."""
    if method == "pategail/user":
        return dict(method="pategail", privacy_unit="user", max_trajectories_per_user=K_USER, delta=DELTA)
    if method == "pategail/traj":
        return dict(method="pategail", delta=DELTA)
    if method == "privtrace":
        return dict(method="privtrace")
    return dict(method=method, delta=DELTA)


def measure(con, real, table: str, n_real: int, method: str, eps: float, seed: int) -> dict:
    """One seeded fit + sample, evaluated: metrics, seconds, and the fit's device count where it has one."""
    import duckmob
    from duckmob.metrics import evaluate, load_side
    from duckmob.metrics.downstream import downstream

    t0 = time.perf_counter()
    synth = duckmob.synthesize(con, table, eps=eps, bbox=BOX, n=n_real, seed=seed, outside="drop",
                               **fit_kwargs(method))
    seconds = time.perf_counter() - t0
    rows = evaluate(real, synth, BOX, families=["pategail"])
    side = load_side(synth, BOX, "synth")[0]
    rows += [m.as_dict() for m in downstream(real, side, "next_location")]
    metrics = {r["metric"]: r["value"] for r in rows}
    return dict(method=method, eps=eps, seed=seed, table=table, n_real=n_real, fit_sample_s=seconds,
                metrics=metrics)


def run(methods: list[str], eps_list: list[float], seeds: list[int], limit: int | None, neural_limit: int,
        devices_eps: float, device_limits: list[int], device_seeds: list[int]) -> dict:
    import duckmob
    from duckmob.metrics import load_side, table_points

    con = duckmob.connect()
    tables = {"trips": limit, "trips_neural": min(v for v in (limit, neural_limit) if v is not None)}
    for lim in device_limits:
        if limit is None or lim < limit:
            tables[f"trips_{lim}"] = lim
    sizes = load_real(con, tables)
    users = {name: con.execute(f"SELECT count(DISTINCT user_id) FROM {name}").fetchall()[0][0] for name in sizes}
    reals = {}
    for name in sizes:
        con.execute(f"FROM mob_set_budget('{name}', eps := 1e6, delta := 0.5)").fetchall()
        reals[name] = load_side(table_points(con, name), BOX, "real")[0]
    print(", ".join(f"{name}: {n:,} trajectories" for name, n in sizes.items()), flush=True)
    runs = []

    def one(table, method, eps, seed, part):
        r = measure(con, reals[table], table, sizes[table], method, eps, seed)
        r["part"] = part
        runs.append(r)
        print(f"{part} {method} eps {eps} seed {seed} on {table}: {r['fit_sample_s']:.0f} s; "
              + ", ".join(f"{s} {fmt(r['metrics'].get(k))}" for s, k in COLUMNS), flush=True)

    for eps in eps_list:
        for method in methods:
            table = "trips_neural" if method in ("hrnet", "cleanslate") else "trips"
            for seed in seeds:
                one(table, method, eps, seed, "main")
    for table in [t for t in sizes if t.startswith("trips_") and t != "trips_neural"] + ["trips"]:
        for method in ("pategail/traj",) if table != "trips" else ("pategail/user", "pategail/traj"):
            done = [r for r in runs if r["part"] == "main" and r["method"] == method and r["table"] == table
                    and r["eps"] == devices_eps and r["seed"] in device_seeds]
            for r in done:
                runs.append({**r, "part": "devices"})
            for seed in sorted(set(device_seeds) - {r["seed"] for r in done}):
                one(table, method, devices_eps, seed, "devices")
    # the real-trained reference of next-location prediction (from any row on the full table)
    ref = next((r["metrics"] for r in runs if r["table"] == "trips"), {})
    con.close()
    return dict(setting=dict(bbox=BOX, eps=eps_list, seeds=seeds, limit=limit, neural_limit=neural_limit,
                             devices_eps=devices_eps, device_limits=device_limits, device_seeds=device_seeds,
                             code=code_version(),
                             sizes=sizes, users=users),
                runs=runs, reference={k: ref.get(k) for k in ("next_location_acc1_real_trained",
                                                              "next_location_acc5_real_trained")})


def _mean(rows: list[dict], key: str):
    vals = [r["metrics"].get(key) for r in rows]
    return None if not vals or any(v is None for v in vals) else float(np.mean(vals))


def table(result: dict) -> str:
    s = result["setting"]
    lines = [f"PateGail benchmark: GeoLife in HRNet's box {s['bbox']}, mean of {len(s['seeds'])} seeded fits, "
             f"code {s['code']}; real tables {s['sizes']}",
             "JSD in nats (lower is better); acc@1/acc@5 of next-location prediction trained on the synthetic table "
             "(higher is better); seconds = fit + sample on this machine", ""]
    head = f"{'method':14s} {'eps':>4s} {'n real':>6s} " + " ".join(f"{c:>8s}" for c, _ in COLUMNS) + \
        f" {'seconds':>8s}"
    lines.append(head)
    main = [r for r in result["runs"] if r["part"] == "main"]
    for eps in s["eps"]:
        for method in dict.fromkeys(r["method"] for r in main):
            rows = [r for r in main if r["method"] == method and r["eps"] == eps]
            if rows:
                lines.append(f"{method:14s} {eps:4g} {rows[0]['n_real']:6d} "
                             + " ".join(f"{fmt(_mean(rows, k)):>8s}" for _, k in COLUMNS)
                             + f" {np.mean([r['fit_sample_s'] for r in rows]):8.0f}")
    ref = result["reference"]
    lines.append(f"real-trained next-location reference: acc@1 {fmt(ref.get('next_location_acc1_real_trained'))}, "
                 f"acc@5 {fmt(ref.get('next_location_acc5_real_trained'))}")
    dev = [r for r in result["runs"] if r["part"] == "devices"]
    if dev:
        lines += ["", f"quality vs number of devices, pategail at eps {s['devices_eps']} (device = user, or "
                      f"trajectory), mean of seeds {s.get('device_seeds')}", f"{'method':14s} {'devices':>7s} " + " ".join(f"{c:>8s}" for c, _ in COLUMNS)]
        for (method, table_name) in dict.fromkeys((r["method"], r["table"]) for r in dev):
            rows = [r for r in dev if r["method"] == method and r["table"] == table_name]
            n_dev = s["users"][table_name] if method == "pategail/user" else rows[0]["n_real"]
            lines.append(f"{method:14s} {n_dev:>7,} "
                         + " ".join(f"{fmt(_mean(rows, k)):>8s}" for _, k in COLUMNS))
    return "\n".join(lines)


SAMPLE_DRAW_SEED = 0


def control(variants: list[dict], seeds: list[int], n: int = 1000, eps: float = 4.0) -> str:
    """Trained vs untrained (``rounds := 1``) PateGail on ``n`` shipped-sample trajectories: the table."""
    import duckmob
    from duckmob import demo
    from duckmob.metrics import evaluate, load_side, table_points

    con = duckmob.connect()
    con.execute(f"CREATE TABLE allt AS FROM read_parquet('{demo.sample_path()}')")
    keys = con.execute("SELECT user_id, traj_id FROM allt GROUP BY ALL HAVING count(DISTINCT ts) >= 2 "
                       "ORDER BY ALL").fetchnumpy()
    pick = np.sort(np.random.default_rng(SAMPLE_DRAW_SEED).choice(len(keys["traj_id"]), n, replace=False))
    con.register("kk", {"user_id": keys["user_id"][pick], "traj_id": keys["traj_id"][pick]})
    con.execute("CREATE TABLE trips AS SELECT a.* FROM allt a SEMI JOIN kk USING (user_id, traj_id) "
                "ORDER BY user_id, traj_id, ts")
    con.execute("FROM mob_set_budget('trips', eps := 1e6, delta := 1e-3)").fetchall()
    real = load_side(table_points(con, "trips"), BOX, "real")[0]
    keys5 = [k for _, k in COLUMNS[:5]]
    means = {}
    runs = [{}] + variants
    for params in [p for v in runs for p in ({**v, "rounds": 1}, v)]:
        if json.dumps(params) in means:
            continue
        vals = []
        for seed in seeds:
            synth = duckmob.synthesize(con, "trips", eps=eps, bbox=BOX, n=n, seed=seed, outside="drop",
                                       method="pategail", delta=DELTA, params=params)
            m = {r["metric"]: r["value"] for r in evaluate(real, synth, BOX, families=["pategail"])}
            vals.append([m[k] for k in keys5])
            print(json.dumps(params), seed, " ".join(f"{v:.4f}" for v in vals[-1]), flush=True)
        means[json.dumps(params)] = np.mean(vals, axis=0)
    lines = [f"PateGail trained vs untrained control, {n} shipped-sample trajectories, trajectory unit, eps {eps}, "
             f"mean of seeds {seeds}, code {code_version()}; JSD in nats (lower is better), (ratio to the control: "
             "the same params with rounds := 1)",
             f"{'params':44s} " + " ".join(f"{c:>15s}" for c, _ in COLUMNS[:5])]
    for v in runs:
        for name in (json.dumps({**v, "rounds": 1}), json.dumps(v)):
            base = means[json.dumps({**v, "rounds": 1})]
            lines.append(f"{name:44s} " + " ".join(f"{x:.4f} ({x / b:4.2f})" if b > 0 else f"{x:.4f}"
                                                   for x, b in zip(means[name], base)))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", default="pategail/user,privtrace",
                        help=f"comma-separated, from {', '.join(METHODS)}")
    parser.add_argument("--eps", default="1,2,4", help="comma-separated epsilons")
    parser.add_argument("--seeds", default="1,2,3", help="one seeded fit per seed; tables show the mean")
    parser.add_argument("--limit", type=int, default=None, help="at most this many real trajectories")
    parser.add_argument("--neural-limit", type=int, default=1000, help="cap for hrnet and cleanslate (DP-SGD)")
    parser.add_argument("--devices-eps", type=float, default=4.0, help="eps of the devices table")
    parser.add_argument("--device-limits", default="1000,4000",
                        help="draws for the devices table (trajectory unit), besides the whole table; '' for none")
    parser.add_argument("--device-seeds", default="1", help="seeds of the devices table (each fit on the whole table "
                        "under the trajectory unit takes minutes)")
    parser.add_argument("--out", default=None, help="write the runs as JSON here")
    parser.add_argument("--show", default=None, help="print a saved JSON's tables and exit")
    parser.add_argument("--control", action="store_true", help="issue 32's trained vs rounds := 1 table and exit")
    parser.add_argument("--variants", default='[{"student": true}, {"gravity": 1}, {"gravity": 1, "step_m": 200}]',
                        help="--control: JSON list of params to add")
    args = parser.parse_args()
    os.environ.setdefault("CI", "1")
    if args.control:
        print(control(json.loads(args.variants), [int(s) for s in args.seeds.split(",")][:2]))
        return
    if args.show:
        print(table(json.loads(open(args.show).read())))
        return
    methods = [m.strip().lower() for m in args.methods.split(",") if m.strip()]
    bad = sorted(set(methods) - set(METHODS))
    if bad:
        parser.error(f"unknown methods {bad}: use some of {', '.join(METHODS)}")
    result = run(methods, [float(e) for e in args.eps.split(",")], [int(s) for s in args.seeds.split(",")],
                 args.limit, args.neural_limit, args.devices_eps,
                 [int(v) for v in args.device_limits.split(",") if v.strip()],
                 [int(v) for v in args.device_seeds.split(",") if v.strip()])
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(table(result))


if __name__ == "__main__":
    main()
