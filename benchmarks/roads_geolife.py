"""Fidelity with and without roads on real trajectories: GeoLife Beijing on OpenStreetMap roads you pass (issue 39,
item 5; NOT private: it reads the real tables exactly).

Data: ``../shared/data/geolife_beijing.parquet`` (every GeoLife 1.3 trajectory of Beijing, fixes at least 15 s
apart; research use, cite the GeoLife papers). Its users are split into two disjoint halves by user id: "real A"
(even ids) is released from, "real B" (odd ids) is the real-vs-real reference. Walks, bikes, buses, cars, taxis and
the subway are all in it: real trips that are not all on drivable roads.

Roads: ``--roads PATH``, required: duckmob ships no Beijing network. PATH is an OpenStreetMap extract of central
Beijing (``.osm``, ``.osm.gz``, ``.osm.bz2``, or ``.osm.pbf`` with ``duckmob[roads]``), read with
``duckmob.road_osm.read_osm`` (``mob_roads_from_osm``'s reader) cut to the box, or a Parquet roads table of the shape
docs/roads.md describes (``lat1, lon1, lat2, lon2``, optional ``highway``). It must be public: never derived from
these traces. The numbers in benchmarks/results/roads_geolife*.txt were measured on a 2013 extract of central
Beijing that is not shipped (docs/methods, "Real trajectories: GeoLife Beijing with OSM roads").

Every output is released from real A at eps 1 (trajectory unit, each method's defaults, the demo's box, HRNet's
lat 39.8477..40.1133, lon 116.1956..116.4880, as bbox; ``n`` = real A's trajectories in the box) for each seed and
compared with real A. The metrics and their columns are benchmarks/roads.py's (its ``Side`` and ``scores``, here
over this box: point density on 200 x 200 cells of about 125 x 150 m, trajectory density on 100 x 100, distance to
the roads, points per trajectory, length, trip and detour).

    python benchmarks/roads_geolife.py --roads beijing.osm.pbf                   # privtrace +- roads, seeds 1,2
    python benchmarks/roads_geolife.py --roads beijing.osm.pbf --methods privtrace,cleanslate --seeds 1
    python benchmarks/roads_geolife.py --roads roads.parquet --users 40 --seeds 1 --out /tmp/g   # 40 users
    python benchmarks/roads_geolife.py --roads beijing.osm.pbf --box 39.95,116.28,40.02,116.36 \
        --out benchmarks/results/roads_geolife_haidian
    GEOLIFE_BEIJING=/path/geolife_beijing.parquet python benchmarks/roads_geolife.py --roads ...   # another checkout

``--params JSON`` (repeatable) adds, for each method, one more output with roads released with ``params=JSON``,
labelled by its values (``privtrace+roads/road_release=flows``), beside the default ``privtrace+roads``: variants
of the roads release side by side in one table.

    python benchmarks/roads_geolife.py --roads roads.parquet --params '{"road_release": "flows"}' --out /tmp/flows

``--picture`` also writes OUT_density.png, which draws the roads: ship it only where their licence allows.
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

import roads as bench  # noqa: E402  benchmarks/roads.py: Side, scores, the columns

from duckmob.demo import HRNET_BBOX  # noqa: E402

BOX = list(HRNET_BBOX)
bench.BOX = BOX            # benchmarks/roads.py bins over its module's BOX: here, the demo's Beijing box
DATA = os.environ.get("GEOLIFE_BEIJING", os.path.join(os.path.dirname(HERE), "..", "shared", "data",
                                                     "geolife_beijing.parquet"))
DEFAULT_OUT = os.path.join(HERE, "results", "roads_geolife")
OUTPUTS = bench.OUTPUTS


def load(con, users: int | None):
    """real A (even user ids) and real B (odd) as tables of con; ``users``: only the first that many of each."""
    limit = "" if users is None else f"AND user_id // 2 < {users}"
    for name, parity in (("real_a", 0), ("real_b", 1)):
        con.execute(f"CREATE TABLE {name} AS SELECT user_id, traj_id, ts, lat, lon FROM read_parquet(?) "
                    f"WHERE user_id % 2 = {parity} {limit}", [os.path.abspath(DATA)])
    return (con.sql("FROM real_a").to_arrow_table(), con.sql("FROM real_b").to_arrow_table())


def load_roads(con, path: str) -> None:
    """Table ``roads`` of con from ``path``: a Parquet roads table, or an OpenStreetMap extract's drivable ways with
    an endpoint in the box."""
    from duckmob.road_osm import read_osm

    if path.lower().endswith(".parquet"):
        con.execute("CREATE TABLE roads AS SELECT * FROM read_parquet(?)", [os.path.abspath(path)])
        return
    con.register("osm_roads", read_osm(path, bbox=BOX))
    con.execute("CREATE TABLE roads AS FROM osm_roads")
    con.unregister("osm_roads")


def variant(method: str, params: dict) -> str:
    """The output name of ``method`` with roads released with ``params``: ``privtrace+roads/road_release=flows``."""
    return f"{method}+roads/" + ",".join(f"{k}={v}" for k, v in params.items())


def run(seeds: list[int], outputs: dict, picture: str | None, users: int | None, roads_path: str) -> dict:
    import duckmob
    from duckmob.roads import Roads

    con = duckmob.connect()
    real_a, real_b = load(con, users)
    load_roads(con, roads_path)
    con.execute("FROM mob_set_budget('real_a', eps := 1000, delta := 0.001)").fetchall()
    roads = Roads.of(con.sql("FROM roads").to_arrow_table(), name="roads").clip(BOX)
    a, b = bench.Side.of(real_a, "ts"), bench.Side.of(real_b, "ts")
    ref = bench.scores(a, b, roads)
    ref_a = bench.scores(a, a, roads)      # real A's own distances to the roads (its JSDs are 0)
    ref.update(seconds=float("nan"))
    n_users = [len(np.unique(t.column("user_id").to_numpy())) for t in (real_a, real_b)]
    print(f"real A: {n_users[0]} users, {a.n_traj:,} trajectories, {len(a.lat):,} fixes in the box; real B: "
          f"{n_users[1]} users, {b.n_traj:,}, {len(b.lat):,}", flush=True)
    print(f"real B vs real A: {bench.fmt_row(ref)}", flush=True)
    duckmob.synthesize(con, "real_a", bench.EPS, "privtrace", bbox=BOX, seed=10**6, n=10)   # untimed warm-up
    runs, pictures = [], {}
    for name, (method, road_table, params) in outputs.items():
        for seed in seeds:
            kw = {} if road_table is None else {"roads": road_table}
            if params:
                kw["params"] = params
            t1 = time.perf_counter()
            out = duckmob.synthesize(con, "real_a", bench.EPS, method, bbox=BOX, seed=seed, n=a.n_traj, **kw)
            seconds = time.perf_counter() - t1
            side = bench.Side.of(out, "seq")
            row = bench.scores(a, side, roads)
            row.update(output=name, seed=seed, seconds=seconds)
            runs.append(row)
            if seed == seeds[0]:
                pictures[name] = side
            print(f"{name} seed {seed}: {bench.fmt_row(row)}", flush=True)
    con.close()
    if picture:
        draw(picture, roads, a, b, pictures)
    setting = dict(seeds=seeds, eps=bench.EPS, bbox=BOX, users=n_users, traj_a=a.n_traj, traj_b=b.n_traj,
                   fixes_a=len(a.lat), fixes_b=len(b.lat), real_points_per_traj=a.points_per_traj(),
                   real_off30=ref_a["off30"], real_off250=ref_a["off250"], roads=len(roads),
                   roads_source=os.path.basename(roads_path), params={k: v[2] for k, v in outputs.items() if v[2]},
                   cores=os.cpu_count(), load=os.getloadavg()[0], code=bench.code_version())
    return dict(setting=setting, reference=ref, runs=runs)


def table(result: dict) -> str:
    s = result["setting"]
    rows = bench.mean_rows(result)
    width = max([17] + [len(r["output"]) + 1 for r in rows])
    lines = [f"Real GeoLife Beijing trajectories (../shared/data/geolife_beijing.parquet), users split by id: real A "
             f"{s['users'][0]} users, {s['traj_a']:,} trajectories, {s['fixes_a']:,} fixes in the box "
             f"({s['real_points_per_traj']:.1f} per trajectory); real B {s['users'][1]} users, {s['traj_b']:,}, "
             f"{s['fixes_b']:,}. eps {s['eps']:g}, trajectory unit, mean of {len(s['seeds'])} seed(s) {s['seeds']}; "
             f"box {s['bbox']}; roads: {s.get('roads_source', '?')} ({s['roads']:,} segments touch the box); "
             f"code {s['code']}",
             f"{'output':{width}s}" + "".join(f"{short:>9s}" for short, _, _ in bench.COLUMNS)]
    for row in rows:
        lines.append(f"{row['output']:{width}s}" + "".join(f"{fmt.format(row[k]):>9s}" for _, k, fmt in bench.COLUMNS))
    ref = result["reference"]
    lines.append(f"{'real B vs A':{width}s}" + "".join(
        f"{('-' if k == 'seconds' else fmt.format(ref[k])):>9s}" for _, k, fmt in bench.COLUMNS))
    lines.append(f"(real A itself: {s['real_off30']:.1%} of its points > 30 m from a drivable road, "
                 f"{s['real_off250']:.1%} > 250 m: walks on campuses and in parks, the subway, GPS error)")
    by = {r["output"]: r for r in rows}
    pairs = [(f"{m}+roads", m) for m in ("privtrace", "cleanslate")] + [(v, v.split("/")[0]) for v in by if "/" in v]
    for with_, without in pairs:
        if with_ in by and without in by:
            w, wo = by[with_], by[without]
            lines.append(f"{with_} / {without}: pt dens {w['pt_jsd'] / wo['pt_jsd']:.2f}, tr dens "
                         f"{w['tr_jsd'] / wo['tr_jsd']:.2f}, pts/traj {w['ppt_ratio']:.2f} vs {wo['ppt_ratio']:.2f}, "
                         f"length {w['length_jsd'] / max(wo['length_jsd'], 1e-12):.2f}, trip "
                         f"{w['trip_jsd'] / max(wo['trip_jsd'], 1e-12):.2f}, time {w['seconds'] / wo['seconds']:.2f}")
    for name in by:
        lines.append(f"{name}: / real vs real: pt dens {by[name]['pt_jsd'] / ref['pt_jsd']:.1f}x, tr dens "
                     f"{by[name]['tr_jsd'] / ref['tr_jsd']:.1f}x")
    lines.append("JSD = jensenshannon(p, q) ** 2, natural log; wall seconds on "
                 f"{s['cores']} shared cores, load {s['load']:.1f} at the end")
    return "\n".join(lines)


def draw(path: str, roads, a, b, sides: dict) -> None:
    """Point density on 400 bins across the box (about 60 m over the demo's), log colour, each panel its own share,
    the roads in faint grey under each; a second row zooms on the densest part (Haidian: Tsinghua, Peking
    University, MSRA)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection
    from matplotlib.colors import LogNorm

    panels = [("real A", a), ("real B", b)] + list(sides.items())
    zoom = [39.95, 116.28, 40.02, 116.36]
    fig, axes = plt.subplots(2, len(panels), figsize=(4.6 * len(panels), 10.5), squeeze=False)
    segs = np.stack([np.c_[roads.lon1, roads.lat1], np.c_[roads.lon2, roads.lat2]], axis=1)
    aspect = 1 / np.cos(np.radians(39.98))
    for row, (box, bins) in enumerate(((BOX, (400, 500)), (zoom, (400, 470)))):
        for ax, (title, side) in zip(axes[row], panels):
            h, _, _ = np.histogram2d(side.lon, side.lat, bins=bins, range=[[box[1], box[3]], [box[0], box[2]]])
            share = h.T / max(h.sum(), 1)
            ax.set_facecolor("black")
            ax.add_collection(LineCollection(segs, colors="#555555", linewidths=0.25, zorder=0))
            ax.imshow(np.where(share > 0, share, np.nan), origin="lower", extent=[box[1], box[3], box[0], box[2]],
                      norm=LogNorm(vmin=3e-7, vmax=3e-3), cmap="magma", aspect=aspect, interpolation="nearest",
                      zorder=1)
            ax.set_xlim(box[1], box[3])
            ax.set_ylim(box[0], box[2])
            ax.set_title(f"{title}: {len(side.lat):,} points" + (" (zoom)" if row else ""), fontsize=10)
            ax.tick_params(labelsize=7)
    fig.suptitle(f"GeoLife Beijing: point density (share of each table's points, log; 400 bins across), top: the "
                 f"box {BOX}, bottom: Haidian {zoom}; grey: the OpenStreetMap roads; eps 1, first seed", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    shrink(path)


def shrink(path: str) -> None:
    """Rewrite the PNG with a 256-colour palette (about a third of the bytes; the picture reads the same)."""
    from PIL import Image

    Image.open(path).convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--methods", default="privtrace", help="privtrace and/or cleanslate")
    parser.add_argument("--users", type=int, default=None, help="only the first USERS users of each half")
    parser.add_argument("--box", default=None, help="min_lat,min_lon,max_lat,max_lon: bbox and metrics box "
                        "(default: the demo's); e.g. Haidian's 39.95,116.28,40.02,116.36")
    parser.add_argument("--roads", default=None, help="an OpenStreetMap extract (.osm, .osm.gz, .osm.bz2, "
                        ".osm.pbf) or a Parquet roads table (docs/roads.md) covering the box")
    parser.add_argument("--out", default=DEFAULT_OUT, help="writes OUT.txt and OUT.json")
    parser.add_argument("--params", action="append", default=[], metavar="JSON", help="also each method with "
                        "roads released with params=JSON, e.g. '{\"road_release\": \"flows\"}' (repeatable)")
    parser.add_argument("--picture", action="store_true", help="also OUT_density.png (it draws the roads)")
    args = parser.parse_args()
    if not args.roads:
        sys.exit("roads_geolife.py: no road network given: pass --roads PATH, an OpenStreetMap extract of central "
                 "Beijing (.osm, .osm.gz, .osm.bz2, .osm.pbf) or a Parquet roads table (docs/roads.md); "
                 "duckmob ships no Beijing roads")
    if not os.path.isfile(args.roads):
        sys.exit(f"roads_geolife.py: --roads {args.roads}: no such file; pass an OpenStreetMap extract or a "
                 "Parquet roads table")
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.box:
        BOX[:] = [float(v) for v in args.box.split(",")]     # bench.BOX is this same list
    try:
        variants = [json.loads(p) for p in args.params]
    except ValueError as e:
        sys.exit(f"roads_geolife.py: --params is not a JSON object ({e}); pass e.g. '{{\"road_release\": \"flows\"}}'")
    if not all(isinstance(v, dict) and v for v in variants):
        sys.exit("roads_geolife.py: --params takes a non-empty JSON object, e.g. '{\"road_release\": \"flows\"}'")
    outputs = {}
    for m in args.methods.split(","):
        outputs.update({m: (m, None, None), f"{m}+roads": (m, "roads", None)})
        outputs.update({variant(m, v): (m, "roads", v) for v in variants})
    picture = args.out + "_density.png" if args.picture else None
    result = run(seeds, outputs, picture, args.users, args.roads)
    bench.save(table(result), result, args.out)


if __name__ == "__main__":
    main()
