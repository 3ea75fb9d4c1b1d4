"""Fidelity with and without roads on simulated San Francisco taxi trips (issue 39, items 5 and 6; NOT private).

Data: two disjoint tables of ``--trips`` trips simulated on the shipped downtown SF roads
(``benchmarks/roads_sim.py``: one public city, seed 0; "real A" drawn with seed 101, "real B" with seed 102).
Every output is released from real A at eps 1 (trajectory unit, each method's defaults, the issue's downtown box
as bbox) for each of ``--seeds`` and compared with real A; real B against real A is the real-vs-real reference.

Outputs: ``privtrace`` (the default), ``privtrace+roads`` (``roads := 'roads'``, the shipped SF roads: today every
synthetic point moved to its nearest road, post-processing), ``cleanslate`` and ``cleanslate+roads``.

Metrics, all on the points inside the downtown box (lon -122.45..-122.38, lat 37.76..37.80), each side's
trajectories in their own order (real: ts; synthetic: seq). JSD = scipy.spatial.distance.jensenshannon(p, q) ** 2
(natural log, at most ln 2 = .693), the same bins on both sides:

    pt dens    JSD of the points over a 200 x 200 grid of the box
    tr dens    JSD over a 100 x 100 grid, each trajectory counted once per cell it visits
    >30 m      share of the points more than 30 m from any road segment (duckmob.roads.snap distance)
    >250 m     share more than 250 m from any road (in this box: the Bay, the piers' ends, parks)
    pts/traj   mean points per trajectory (with at least one point in the box), relative to real A
    length     JSD of the trajectory lengths (metres along consecutive points; 60 bins of 250 m, + one over 15 km)
    trip       JSD of the (first cell, last cell) pairs on a 6 x 6 grid of the box (AdaTrace's trip distribution)
    detour     median road distance between consecutive points over the straight one (both snapped to the roads;
               5,000 steps longer than 20 m drawn with seed 0; duckmob.road_paths.network_distance up to 3 km)
    p90        its 90th percentile (a step with no road path within 3 km counts as infinite)
    s          wall seconds of the release (fit + sample) on this machine

    python benchmarks/roads.py                               # 5,000 trips, seeds 1,2; writes benchmarks/results/roads.*
    python benchmarks/roads.py --trips 20000 --seeds 1,2,3
    python benchmarks/roads.py --methods privtrace --trips 1000 --seeds 1 --out /tmp/roads   # a quick check
    python benchmarks/roads.py --trips 2000 --seeds 1 --gap-s 240,360 --out /tmp/sparse      # T-Drive-like sampling
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

BOX = [37.76, -122.45, 37.80, -122.38]          # min_lat, min_lon, max_lat, max_lon
EPS = 1.0
SEED_A, SEED_B = 101, 102
COLUMNS = [("pt dens", "pt_jsd", "{:.3f}"), ("tr dens", "tr_jsd", "{:.3f}"), (">30 m", "off30", "{:.1%}"),
           (">250 m", "off250", "{:.2%}"), ("pts/traj", "ppt_ratio", "{:.2f}"), ("length", "length_jsd", "{:.3f}"),
           ("trip", "trip_jsd", "{:.3f}"), ("detour", "detour_med", "{:.2f}"), ("p90", "detour_p90", "{:.2f}"),
           ("s", "seconds", "{:.1f}")]
DEFAULT_OUT = os.path.join(HERE, "results", "roads")


def js(p, q) -> float:
    from scipy.spatial.distance import jensenshannon

    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    return float(jensenshannon(p, q) ** 2)


class Side:
    """One table's points inside the box, in trajectory order: ``traj`` (dense ids 0..n-1), ``lat``, ``lon``."""

    def __init__(self, traj, order_key, lat, lon):
        traj, order_key = np.asarray(traj), np.asarray(order_key)
        lat, lon = np.asarray(lat, dtype=np.float64), np.asarray(lon, dtype=np.float64)
        inside = (lat >= BOX[0]) & (lat <= BOX[2]) & (lon >= BOX[1]) & (lon <= BOX[3])
        traj, order_key, lat, lon = traj[inside], order_key[inside], lat[inside], lon[inside]
        order = np.lexsort((order_key, traj))
        _, self.traj = np.unique(traj[order], return_inverse=True)
        self.lat, self.lon = lat[order], lon[order]
        self.n_traj = int(self.traj.max()) + 1 if len(self.traj) else 0

    @classmethod
    def of(cls, table, order_col: str):
        cols = {c: table.column(c).to_numpy() for c in ("traj_id", order_col, "lat", "lon")}
        key = cols[order_col]
        if np.issubdtype(key.dtype, np.datetime64):
            key = key.astype("datetime64[us]").astype(np.int64)
        return cls(cols["traj_id"], key, cols["lat"], cols["lon"])

    def cells(self, w: int) -> np.ndarray:
        r = np.clip(((self.lat - BOX[0]) / (BOX[2] - BOX[0]) * w).astype(np.int64), 0, w - 1)
        c = np.clip(((self.lon - BOX[1]) / (BOX[3] - BOX[1]) * w).astype(np.int64), 0, w - 1)
        return r * w + c

    def point_hist(self, w: int) -> np.ndarray:
        return np.bincount(self.cells(w), minlength=w * w)

    def traj_hist(self, w: int) -> np.ndarray:
        pairs = np.unique(self.traj * (w * w) + self.cells(w))
        return np.bincount(pairs % (w * w), minlength=w * w)

    def lengths_m(self) -> np.ndarray:
        from duckmob.grid import haversine_m

        same = self.traj[1:] == self.traj[:-1]
        step = haversine_m(self.lat[:-1], self.lon[:-1], self.lat[1:], self.lon[1:]) * same
        return np.bincount(self.traj[:-1], weights=step, minlength=self.n_traj)

    def trip_hist(self) -> np.ndarray:
        cells = self.cells(6)
        first = np.concatenate([[True], self.traj[1:] != self.traj[:-1]])
        last = np.concatenate([self.traj[1:] != self.traj[:-1], [True]])
        return np.bincount(cells[first] * 36 + cells[last], minlength=36 * 36)

    def points_per_traj(self) -> float:
        return len(self.traj) / max(self.n_traj, 1)


LENGTH_EDGES = np.concatenate([np.arange(0, 15_001, 250.0), [np.inf]])


def detours(side: Side, roads, m: int = 5000) -> np.ndarray:
    """Road over straight distance of up to ``m`` consecutive steps (the module docstring's detour)."""
    from duckmob.grid import haversine_m
    from duckmob.road_paths import network_distance
    from duckmob.roads import snap

    same = np.flatnonzero(side.traj[1:] == side.traj[:-1])
    lat, lon = side.lat, side.lon
    straight = haversine_m(lat[same], lon[same], lat[same + 1], lon[same + 1])
    same = same[straight > 20]
    if not len(same):
        return np.full(1, np.nan)
    pick = np.sort(np.random.default_rng(0).choice(same, min(m, len(same)), replace=False))
    sa, ta, *_ = snap(roads, lat[pick], lon[pick])
    sb, tb, *_ = snap(roads, lat[pick + 1], lon[pick + 1])
    road = network_distance(roads, sa, ta, sb, tb, 3_000.0)
    return road / haversine_m(lat[pick], lon[pick], lat[pick + 1], lon[pick + 1])


def scores(real: Side, synth: Side, roads) -> dict:
    from duckmob.roads import snap

    dist = snap(roads, synth.lat, synth.lon)[4] if len(synth.lat) else np.zeros(0)
    detour = detours(synth, roads)
    return dict(pt_jsd=js(real.point_hist(200), synth.point_hist(200)),
                tr_jsd=js(real.traj_hist(100), synth.traj_hist(100)),
                off30=float((dist > 30).mean()) if len(dist) else float("nan"),
                off250=float((dist > 250).mean()) if len(dist) else float("nan"),
                ppt_ratio=synth.points_per_traj() / real.points_per_traj(),
                length_jsd=js(np.histogram(real.lengths_m(), LENGTH_EDGES)[0],
                              np.histogram(synth.lengths_m(), LENGTH_EDGES)[0]),
                trip_jsd=js(real.trip_hist(), synth.trip_hist()),
                detour_med=float(np.quantile(detour, 0.5, method="nearest")),
                detour_p90=float(np.quantile(detour, 0.9, method="nearest")),   # inf: no road path within 3 km
                n_traj=synth.n_traj, n_points=len(synth.lat))


OUTPUTS = {"privtrace": ("privtrace", None), "privtrace+roads": ("privtrace", "roads"),
           "cleanslate": ("cleanslate", None), "cleanslate+roads": ("cleanslate", "roads")}
# variants with a public parameter (--variants): the fine grid's cell size, the walk's road costs (with roads)
VARIANTS = {"privtrace+roads/fine_m=50": ("privtrace", "roads", {"fine_m": 50.0}),
            "privtrace+roads/road_weight=0.5": ("privtrace", "roads", {"road_weight": 0.5}),
            "privtrace+roads/fine_m=25": ("privtrace", "roads", {"fine_m": 25.0})}


def replicated(table, copies: int, trips: int):
    """``copies`` copies of a table of ``trips`` trips, each with traj_id and user_id moved past the previous
    copy's: a larger table of the same population (for sizes the simulation is too slow to draw)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if copies == 1:
        return table
    parts = []
    for c in range(copies):
        shift = pa.scalar(c * 10 * trips, pa.int64())
        parts.append(table.set_column(table.column_names.index("traj_id"), "traj_id",
                                      pc.add(table.column("traj_id"), shift))
                     .set_column(table.column_names.index("user_id"), "user_id",
                                 pc.add(table.column("user_id"), shift)))
    return pa.concat_tables(parts)


def release_db(real_a):
    """A fresh duckmob connection holding ``real_a`` (an Arrow table) as table real_a, with a budget large enough for
    every release of a run, and the shipped SF roads as table roads."""
    import duckmob

    con = duckmob.connect()
    con.register("a_arrow", real_a)
    con.execute("CREATE TABLE real_a AS FROM a_arrow")
    con.unregister("a_arrow")
    con.execute("CREATE TABLE roads AS FROM mob_sf_roads()")
    con.execute("FROM mob_set_budget('real_a', eps := 1000, delta := 0.001)").fetchall()
    return con


def save(text: str, result: dict, out: str) -> None:
    """Print a run's table and write it to ``OUT.txt``, its figures to ``OUT.json``."""
    print(text)
    with open(out + ".txt", "w") as f:
        f.write(text + "\n")
    with open(out + ".json", "w") as f:
        json.dump(result, f, indent=1)


def run(trips: int, seeds: list[int], outputs: list[str], picture: str | None, gap_s=(30.0, 60.0),
        copies: int = 1) -> dict:
    import duckmob
    from roads_sim import City

    t0 = time.perf_counter()
    city = City(seed=0)
    base = trips // copies
    real_a = replicated(city.trips(base, SEED_A, gap_s=gap_s), copies, base)
    real_b = replicated(city.trips(base, SEED_B, id_offset=10 * trips, gap_s=gap_s), copies, base)
    sim_s = time.perf_counter() - t0
    print(f"simulated 2 x {trips:,} trips in {sim_s:.1f} s: {real_a.num_rows:,} and {real_b.num_rows:,} fixes",
          flush=True)
    con = release_db(real_a)
    roads = city.roads
    a = Side.of(real_a, "ts")
    b = Side.of(real_b, "ts")
    ref = scores(a, b, roads)
    ref_a = scores(a, a, roads)            # real A's own distances to the roads (its JSDs are 0)
    ref.update(seconds=float("nan"))
    print(f"real B vs real A: {fmt_row(ref)}", flush=True)
    # untimed warm-up: the first release of a process pays the imports and the accountant's start-up
    duckmob.synthesize(con, "real_a", EPS, "privtrace", bbox=BOX, seed=10**6, n=10)
    runs, pictures = [], {}
    for name in outputs:
        method, road_table, params = (*OUTPUTS[name], {}) if name in OUTPUTS else VARIANTS[name]
        for seed in seeds:
            kw = ({} if road_table is None else {"roads": road_table}) | params
            t1 = time.perf_counter()
            out = duckmob.synthesize(con, "real_a", EPS, method, bbox=BOX, seed=seed, n=a.n_traj, **kw)
            seconds = time.perf_counter() - t1
            side = Side.of(out, "seq")
            row = scores(a, side, roads)
            row.update(output=name, seed=seed, seconds=seconds)
            runs.append(row)
            if seed == seeds[0]:
                pictures[name] = side
            print(f"{name} seed {seed}: {fmt_row(row)}", flush=True)
    con.close()
    if picture:
        draw(picture, a, b, pictures)
    return dict(setting=dict(trips=trips, seeds=seeds, eps=EPS, bbox=BOX, seed_a=SEED_A, seed_b=SEED_B, gap_s=gap_s,
                             copies=copies,
                             fixes_a=real_a.num_rows, fixes_b=real_b.num_rows, sim_s=sim_s,
                             real_points_per_traj=a.points_per_traj(), cores=os.cpu_count(),
                             real_off30=ref_a["off30"], real_off250=ref_a["off250"], code=code_version()),
                reference=ref, runs=runs)


def code_version() -> str:
    """The commit, with '+dirty' when duckmob/ has uncommitted changes (several people share the working tree)."""
    import subprocess

    root = os.path.dirname(HERE)
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "duckmob"], cwd=root, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def copies_note(setting: dict) -> str:
    copies = setting.get("copies", 1)
    return "" if copies == 1 else f", {copies} copies of {setting['trips'] // copies:,} simulated trips"


def fmt_row(row: dict) -> str:
    return " ".join(f"{short} {fmt.format(row[key])}" for short, key, fmt in COLUMNS)


def mean_rows(result: dict) -> list[dict]:
    out = []
    for name in dict.fromkeys(r["output"] for r in result["runs"]):
        mine = [r for r in result["runs"] if r["output"] == name]
        out.append(dict(output=name, seeds=len(mine), **{k: float(np.mean([r[k] for r in mine]))
                                                        for _, k, _ in COLUMNS}))
    return out


def table(result: dict) -> str:
    s = result["setting"]
    lines = [f"Simulated SF taxi trips (benchmarks/roads_sim.py), {s['trips']:,} trips per table "
             f"({s['fixes_a']:,} fixes in real A, {s['real_points_per_traj']:.1f} per trip in the box, a fix every "
             f"{s.get('gap_s', (30, 60))[0]:g}-{s.get('gap_s', (30, 60))[1]:g} s{copies_note(s)}), eps "
             f"{s['eps']:g}, trajectory unit, mean of {len(s['seeds'])} seed(s) {s['seeds']}; downtown box "
             f"{s['bbox']}; code {s['code']}",
             f"{'output':17s}" + "".join(f"{short:>9s}" for short, _, _ in COLUMNS)]
    rows = mean_rows(result)
    for row in rows:
        lines.append(f"{row['output']:17s}" + "".join(f"{fmt.format(row[k]):>9s}" for _, k, fmt in COLUMNS))
    ref = result["reference"]
    lines.append(f"{'real B vs A':17s}" + "".join(
        f"{('-' if k == 'seconds' else fmt.format(ref[k])):>9s}" for _, k, fmt in COLUMNS))
    lines.append(f"(real A itself: {s['real_off30']:.2%} of its points > 30 m from a road, {s['real_off250']:.2%} "
                 f"> 250 m: the simulated GPS noise, 4 m with a 15 m tail on 10% of the fixes)")
    by = {r["output"]: r for r in rows}
    ratio_lines = []
    for name in ("privtrace", "cleanslate"):
        if name in by and f"{name}+roads" in by:
            w, wo = by[f"{name}+roads"], by[name]
            ratio_lines.append(
                f"{name}: with roads / without: pt dens {w['pt_jsd'] / wo['pt_jsd']:.2f}, tr dens "
                f"{w['tr_jsd'] / wo['tr_jsd']:.2f}, length {w['length_jsd'] / max(wo['length_jsd'], 1e-12):.2f}, "
                f"trip {w['trip_jsd'] / max(wo['trip_jsd'], 1e-12):.2f}, time {w['seconds'] / wo['seconds']:.2f}; "
                f"gap to real-vs-real closed: pt dens "
                f"{(wo['pt_jsd'] - w['pt_jsd']) / (wo['pt_jsd'] - ref['pt_jsd']):.0%}, tr dens "
                f"{(wo['tr_jsd'] - w['tr_jsd']) / (wo['tr_jsd'] - ref['tr_jsd']):.0%}")
    for name in by:
        ratio_lines.append(f"{name}: / real vs real: pt dens {by[name]['pt_jsd'] / ref['pt_jsd']:.1f}x, tr dens "
                           f"{by[name]['tr_jsd'] / ref['tr_jsd']:.1f}x")
    lines += ratio_lines
    lines.append("issue 39 item 5 targets (on real taxi trips): pt dens <= .18, tr dens <= .12, pts/traj within 15% "
                 "(0.85-1.15), length and trip no worse than without roads")
    lines.append("JSD = jensenshannon(p, q) ** 2, natural log; wall seconds on "
                 f"{s['cores']} shared cores (simulation {s['sim_s']:.0f} s)")
    return "\n".join(lines)


def draw(path: str, a: Side, b: Side, sides: dict) -> None:
    """Point density at about 15 m (420 x 300 bins over the box), log colour, each panel its own share."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    panels = [("real A (simulated)", a), ("real B (simulated)", b)] + [(k, v) for k, v in sides.items()]
    ncol = 3
    nrow = (len(panels) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(6.2 * ncol, 3.9 * nrow), squeeze=False)
    bins = (420, 300)
    for ax, (title, side) in zip(axes.ravel(), panels):
        h, _, _ = np.histogram2d(side.lon, side.lat, bins=bins, range=[[BOX[1], BOX[3]], [BOX[0], BOX[2]]])
        share = h.T / max(h.sum(), 1)
        ax.imshow(np.where(share > 0, share, np.nan), origin="lower", extent=[BOX[1], BOX[3], BOX[0], BOX[2]],
                  norm=LogNorm(vmin=1e-6, vmax=3e-3), cmap="magma", aspect=1 / np.cos(np.radians(37.78)),
                  interpolation="nearest")
        ax.set_facecolor("black")
        ax.set_title(f"{title}: {len(side.lat):,} points", fontsize=10)
        ax.tick_params(labelsize=7)
    for ax in axes.ravel()[len(panels):]:
        ax.axis("off")
    fig.suptitle("Point density in the downtown SF box (about 15 m bins, share of each table's points, log), eps 1, "
                 "first seed", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trips", type=int, default=5000)
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--methods", default="privtrace,cleanslate", help="privtrace and/or cleanslate")
    parser.add_argument("--no-roads", action="store_true", help="skip the +roads outputs")
    parser.add_argument("--variants", default="", help=f"comma-separated, of: {', '.join(VARIANTS)}")
    parser.add_argument("--gap-s", default="30,60", help="seconds between fixes, low,high (T-Drive-like: 240,360)")
    parser.add_argument("--copies", type=int, default=1,
                        help="simulate trips / copies trips and replicate them (larger tables, faster)")
    parser.add_argument("--out", default=DEFAULT_OUT, help="writes OUT.txt, OUT.json and OUT_density.png")
    args = parser.parse_args()
    gap_s = tuple(float(g) for g in args.gap_s.split(","))
    seeds = [int(s) for s in args.seeds.split(",")]
    outputs = []
    for m in args.methods.split(","):
        outputs += [m] if args.no_roads else [m, f"{m}+roads"]
    outputs += [v for v in args.variants.split(",") if v]
    result = run(args.trips, seeds, outputs, args.out + "_density.png", gap_s, args.copies)
    save(table(result), result, args.out)


if __name__ == "__main__":
    main()
