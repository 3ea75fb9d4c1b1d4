"""Benchmark: the whole metric set, 20k real against 20k synthetic trajectories (target: under 30 s on 2 cores).

Real: GeoLife Beijing (shared/data/geolife_beijing.parquet); trajectories with more than 200 fixes are cut in
two so that 20,000 can be drawn (seeded). Synthetic: a perturbed, resampled copy (every second fix kept,
Gaussian jitter of about 150 m, start times shifted by up to an hour), and the same copy without timestamps.
Prints seconds per family, in Python and through SQL (mob_evaluate), for both bounding boxes of the brief.

    python benchmarks/evaluate.py [path/to/geolife_beijing.parquet]
"""

from __future__ import annotations

import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import duckmob
from duckmob.metrics import evaluate, load_side
from duckmob.metrics.audit import audit
from duckmob.metrics.downstream import downstream
from duckmob.trajectories import NO_TIME, Trajectories, from_points, to_arrow

DATA = sys.argv[1] if len(sys.argv) > 1 else "/work/shared/data/geolife_beijing.parquet"
BEIJING = [39.4, 115.4, 41.1, 117.6]
HRNET = [39.8477, 116.1956, 40.1133, 116.4880]
N = 20_000
TARGET_S = 30.0


def split_long(traj: Trajectories, longest: int = 200) -> Trajectories:
    """Cut every trajectory with more than ``longest`` points into two halves (new traj_ids)."""
    lengths = traj.lengths
    cut = lengths > longest
    half = lengths // 2
    first = np.where(cut, half, lengths)
    second = np.where(cut, lengths - half, 0)
    pieces = np.stack([first, second], axis=1).ravel()
    owner = np.repeat(np.arange(traj.n_trajectories), 2)
    keep = pieces > 0
    pieces, owner = pieces[keep], owner[keep]
    offsets = np.concatenate([[0], np.cumsum(pieces)]).astype(np.int64)
    ids = np.arange(len(pieces), dtype=np.int64)
    return Trajectories(offsets, ids, traj.user_id[owner], traj.ts, traj.lat, traj.lon)


def perturbed_copy(real: Trajectories, rng: np.random.Generator, with_time: bool) -> Trajectories:
    """Every second fix (first and last kept), ~150 m jitter, starts shifted by up to an hour."""
    keep = np.zeros(real.n_points, dtype=bool)
    keep[::2] = True
    keep[real.offsets[:-1]] = True
    keep[real.offsets[1:] - 1] = True
    t = real.take_points(keep)
    jitter = 150 / 111_000
    lat = t.lat + rng.normal(0, jitter, t.n_points)
    lon = t.lon + rng.normal(0, jitter / np.cos(np.radians(40)), t.n_points)
    shift = np.repeat(rng.integers(0, 3_600_000_000, t.n_trajectories), t.lengths)
    ts = t.ts + shift if with_time else np.full(t.n_points, NO_TIME, dtype=np.int64)
    return Trajectories(t.offsets, t.traj_id, np.full(t.n_trajectories, -1), ts, lat, lon)


def run(name: str, real: pa.Table, synth: pa.Table, bbox) -> float:
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    rows = evaluate(real, synth, bbox, timings=times)
    total = time.perf_counter() - t0
    parts = "  ".join(f"{k} {v:5.2f}" for k, v in times.items())
    n = {r["metric"]: int(r["value"]) for r in rows if r["metric"].endswith("_trajectories")}
    print(f"{name:34s} total {total:6.2f} s  ({total / TARGET_S:.2f} of the {TARGET_S:.0f} s target)  {parts}")
    print(f"{'':34s} compared {n['real_trajectories']:,} real / {n['synth_trajectories']:,} synthetic "
          f"trajectories, {len(rows) - 2} metrics")
    return total


def main() -> None:
    rng = np.random.default_rng(7)
    table = pq.read_table(DATA)
    whole, _ = from_points(table, bbox=BEIJING, outside="drop")
    pool = split_long(whole)
    real_traj = pool.take(np.sort(rng.choice(pool.n_trajectories, N, replace=False)))
    real = to_arrow(real_traj)
    synth = to_arrow(perturbed_copy(real_traj, rng, with_time=True))
    timeless = to_arrow(perturbed_copy(real_traj, rng, with_time=False))
    print(f"real: {real_traj.n_trajectories:,} trajectories, {real_traj.n_points:,} fixes; "
          f"synthetic: {synth.num_rows:,} fixes")

    totals = [run("Beijing bbox, synthetic with time", real, synth, BEIJING),
              run("Beijing bbox, synthetic timeless", real, timeless, BEIJING),
              run("HRNet bbox (outside dropped)", real, synth, HRNET)]

    # Downstream tasks and the audit are separate table functions (not part of the 30 s metric set).
    real_side, _ = load_side(real, BEIJING, "real")
    synth_side, _ = load_side(synth, BEIJING, "synth")
    for task in ("next_location", "commute"):
        t0 = time.perf_counter()
        rows = downstream(real_side, synth_side, task)
        print(f"{'mob_downstream ' + task:34s} total {time.perf_counter() - t0:6.2f} s  " +
              "  ".join(f"{r.metric} {r.value:.3f}" for r in rows))
    half = N // 2
    members = load_side(real_traj.take(np.arange(half)), BEIJING, "members")[0]
    others = load_side(real_traj.take(np.arange(half, N)), BEIJING, "non_members")[0]
    copies = load_side(perturbed_copy(real_traj.take(np.arange(half)), rng, True), BEIJING, "synth")[0]
    t0 = time.perf_counter()
    rows = audit(members, others, copies)
    print(f"{'mob_audit (10k/10k vs 10k copies)':34s} total {time.perf_counter() - t0:6.2f} s  " +
          "  ".join(f"{r.metric} {r.value:.3f}" for r in rows))

    con = duckmob.connect()
    con.register("real_arrow", real)
    con.register("synth_arrow", synth)
    con.execute("CREATE TEMP TABLE real AS FROM real_arrow; CREATE TEMP TABLE synth AS FROM synth_arrow")
    t0 = time.perf_counter()
    got = con.execute(f"FROM mob_evaluate('real', 'synth', bbox := {BEIJING})").fetchall()
    sql_s = time.perf_counter() - t0
    con.close()
    print(f"{'SQL mob_evaluate, Beijing bbox':34s} total {sql_s:6.2f} s  ({len(got) - 2} metrics; "
          f"{sql_s / totals[0]:.2f}x the Python call)")
    print(f"worst total {max(totals + [sql_s]):.2f} s against the {TARGET_S:.0f} s target: "
          f"{'PASS' if max(totals + [sql_s]) < TARGET_S else 'FAIL'}")


if __name__ == "__main__":
    main()
