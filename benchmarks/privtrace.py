"""PrivTrace benchmark: quality on GeoLife, speed and memory end to end from SQL, and how time grows.

    python benchmarks/privtrace.py                 # everything (about 10 minutes on 2 cores)
    python benchmarks/privtrace.py quality         # GeoLife at eps 0.5, 1, 2 (PrivTrace's metrics, lengths)
    python benchmarks/privtrace.py speed           # 20k trajectories / 576 states; 150k / 15M fixes
    python benchmarks/privtrace.py scaling         # time against trajectories and against states

Quality: ``geolife_beijing.parquet`` inside a declared box (HRNet's central-Beijing box by default, the data's
Beijing box with ``--box beijing``), points outside dropped; PrivTrace's four metrics from duckmob.evaluate
(length and diameter JSD, density and transition-pattern ARE) against the real table, plus the number of
states per generated sequence against the real sequences on the model's own grid (mean and JSD of the
histograms), averaged over ``--seeds`` fits. The reference implementation generates 2.6-3.9 cells on average
where GeoLife has 17.8 on its grid.

Speed: synthetic city-like trajectories (a bent path between two points drawn around 12 hubs, GPS jitter) are
written to Parquet once, loaded into DuckDB in a fresh process, and ``CREATE TABLE syn AS FROM synthesize(...)``
is timed end to end (SQL -> points -> fit -> sample -> SQL table); peak memory is the process's maximum resident
set (DuckDB's table included). Reference figures (ENGINEERING.md): 1219 s for 20k trajectories / 576 states,
growing with the square of the number of states.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

GEOLIFE = "/work/shared/data/geolife_beijing.parquet"
BOXES = {"hrnet": [39.8477, 116.1956, 40.1133, 116.4880], "beijing": [39.4, 115.4, 41.1, 117.6]}
CACHE = os.path.join(tempfile.gettempdir(), "duckmob_privtrace_bench")


# ------------------------------------------------------------------------------------------------- quality

def quality(box: str, eps_list, seeds: int, params: dict) -> None:
    import duckdb

    from duckmob.metrics import evaluate, load_side
    from duckmob.privacy.noise import NoiseSource
    from duckmob.synth.base import fit_unrecorded
    from duckmob.synth.cells import state_sequences
    from duckmob.synth.privtrace import PrivTrace
    from duckmob.trajectories import from_points

    bbox = BOXES[box]
    table = duckdb.sql(f"SELECT * FROM '{GEOLIFE}'").to_arrow_table()
    real, _ = from_points(table, bbox=bbox, outside="drop")
    real_side, _ = load_side(real, bbox, "real")
    print(f"\nQuality on GeoLife, box {box} {bbox}: {real.n_trajectories:,} trajectories, {real.n_points:,} fixes; "
          f"params {params or 'defaults'}; mean of {seeds} fits; synthetic n = real n")
    head = (f"{'eps':>5} {'len JSD':>8} {'diam JSD':>9} {'dens ARE':>9} {'patt ARE':>9} {'states':>7} "
            f"{'cells/seq synth':>16} {'real':>6} {'seq-len JSD':>12} {'fit s':>6} {'sample s':>9}")
    print(head)
    print("-" * len(head))
    quantiles = []
    for eps in eps_list:
        acc: dict[str, list] = {}
        for seed in range(seeds):
            t0 = time.perf_counter()
            model = fit_unrecorded(PrivTrace(bbox, **params), real, eps, 0.0, NoiseSource(1000 + seed))
            t1 = time.perf_counter()
            syn = model.sample(real.n_trajectories, NoiseSource(2000 + seed).generator())
            t2 = time.perf_counter()
            rows = {r["metric"]: r["value"] for r in evaluate(real_side, syn, bbox, families=["privtrace"])}
            off, _, _ = state_sequences(model.grid, real.offsets, real.lat, real.lon)
            real_len, syn_len = np.diff(off), syn.lengths
            cap = int(max(real_len.max(), syn_len.max())) + 1
            from duckmob.metrics.common import jsd
            row = {"len": rows["privtrace_length_jsd"], "diam": rows["privtrace_diameter_jsd"],
                   "dens": rows["privtrace_density_are"], "patt": rows["privtrace_pattern_are"],
                   "states": model.grid.m, "syn": syn_len.mean(), "real": real_len.mean(),
                   "seqjsd": jsd(np.bincount(real_len, minlength=cap), np.bincount(syn_len, minlength=cap)),
                   "fit": t1 - t0, "sample": t2 - t1}
            for k, v in row.items():
                acc.setdefault(k, []).append(v)
            if seed == 0:
                q = (10, 50, 90, 99)
                quantiles.append(f"{eps:>5}  synth {np.percentile(syn_len, q).astype(int).tolist()}  "
                                 f"real {np.percentile(real_len, q).astype(int).tolist()}")
        m = {k: float(np.mean(v)) for k, v in acc.items()}
        print(f"{eps:>5} {m['len']:>8.4f} {m['diam']:>9.4f} {m['dens']:>9.3f} {m['patt']:>9.3f} {m['states']:>7.0f} "
              f"{m['syn']:>16.2f} {m['real']:>6.2f} {m['seqjsd']:>12.4f} {m['fit']:>6.2f} {m['sample']:>9.2f}")
    print("cells per sequence, percentiles 10 / 50 / 90 / 99 (first fit):")
    for line in quantiles:
        print(line)


# ---------------------------------------------------------------------------------------------------- speed

def synthetic_parquet(n_traj: int, fixes: int, seed: int = 0) -> str:
    """City-like synthetic trajectories as a Parquet file (cached): user_id, traj_id, ts, lat, lon."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(CACHE, exist_ok=True)
    path = os.path.join(CACHE, f"trips_{n_traj}_{fixes}_{seed}.parquet")
    if os.path.exists(path):
        return path
    rng = np.random.default_rng(seed)
    a, b, c, d = BOXES["beijing"]
    hubs = np.stack([a + (c - a) * (0.3 + 0.4 * rng.random(12)), b + (d - b) * (0.3 + 0.4 * rng.random(12))], 1)
    spread = 0.03 + 0.05 * rng.random(12)

    def pts(n):
        h = rng.integers(0, 12, n)
        return hubs[h] + rng.normal(0, 1, (n, 2)) * spread[h, None]

    p0, p1, pm = pts(n_traj), pts(n_traj), pts(n_traj)
    lengths = np.maximum(2, rng.poisson(fixes, n_traj))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    owner = np.repeat(np.arange(n_traj), lengths)
    f = (np.arange(offsets[-1]) - offsets[owner]) / (lengths[owner] - 1)
    lat = (1 - f) ** 2 * p0[owner, 0] + 2 * f * (1 - f) * pm[owner, 0] + f ** 2 * p1[owner, 0]
    lon = (1 - f) ** 2 * p0[owner, 1] + 2 * f * (1 - f) * pm[owner, 1] + f ** 2 * p1[owner, 1]
    lat = np.clip(lat + rng.normal(0, 5e-4, len(lat)), a, c)
    lon = np.clip(lon + rng.normal(0, 5e-4, len(lon)), b, d)
    ts = (1_700_000_000_000_000 + (np.arange(offsets[-1]) - offsets[owner]) * 15_000_000).astype("datetime64[us]")
    pq.write_table(pa.table({"user_id": (np.arange(n_traj) % 500)[owner].astype(np.int32),
                             "traj_id": owner.astype(np.int32), "ts": ts, "lat": lat, "lon": lon}), path)
    return path


def child(path: str, params: dict, eps: float) -> dict:
    """Run in a fresh process: load the Parquet into DuckDB, then time fit and sample from SQL.

    ``mob_fit`` + ``mob_sample`` is what ``synthesize`` does in one call (the same driver); timing them apart
    shows where the time goes and gives the model's state count from mob_fit's summary row.
    """
    import duckmob
    from duckmob.privacy import ledger

    con = duckmob.connect()
    t0 = time.perf_counter()
    con.execute(f"CREATE TABLE trips AS FROM '{path}'")
    t_load = time.perf_counter() - t0
    n_fixes, n_traj = con.execute("SELECT count(*), count(DISTINCT traj_id) FROM trips").fetchone()
    ledger.set_budget(con, "trips", 100.0, 1e-6)
    t0 = time.perf_counter()
    row = con.execute(f"FROM mob_fit('trips', 'bench', eps := {eps}, bbox := {BOXES['beijing']}, "
                      f"params := '{json.dumps(params)}')").fetchone()
    t_fit = time.perf_counter() - t0
    con.execute(f"CREATE TABLE syn AS FROM mob_sample('bench', n := {n_traj})")
    t_sample = time.perf_counter() - t0 - t_fit
    n_out = con.execute("SELECT count(DISTINCT traj_id) FROM syn").fetchone()[0]
    con.close()
    return {"trajectories": n_traj, "fixes": n_fixes, "load_s": t_load, "fit_s": t_fit, "sample_s": t_sample,
            "synthesize_s": t_fit + t_sample, "synthetic": n_out, "states": int(json.loads(row[5])["states"]),
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run_child(n_traj: int, fixes: int, params: dict, eps: float = 1.0) -> dict:
    path = synthetic_parquet(n_traj, fixes)
    out = subprocess.run([sys.executable, __file__, "child", path, json.dumps(params), str(eps)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def speed() -> None:
    print("\nSpeed and memory, end to end from SQL (mob_fit + CREATE TABLE syn AS FROM mob_sample, i.e. synthesize), "
          "eps 1, fresh process per case; peak = max RSS incl. DuckDB's copy of the table")
    head = (f"{'case':<32} {'trajectories':>12} {'fixes':>11} {'states':>7} {'fit s':>6} {'sample s':>9} "
            f"{'total s':>8} {'goal s':>7} {'peak MB':>8} {'goal MB':>8}")
    print(head)
    print("-" * len(head))
    ref = float("nan")
    cases = [("20k, 24x24 = 576 states", 20_000, 100, {"K": 24, "max_depth": 0}, 10, None),
             ("150k / 15M fixes, default grid", 150_000, 100, {}, 60, 4096)]
    for name, n, fixes, params, goal_s, goal_mb in cases:
        r = run_child(n, fixes, params)
        print(f"{name:<32} {r['trajectories']:>12,} {r['fixes']:>11,} {r['states']:>7} {r['fit_s']:>6.2f} "
              f"{r['sample_s']:>9.2f} {r['synthesize_s']:>8.2f} {goal_s:>7} {r['peak_mb']:>8.0f} {goal_mb or '':>8}")
        if n == 20_000:
            ref = r["synthesize_s"]
    print(f"reference implementation: 1219 s for 20k trajectories / 576 states (ENGINEERING.md): "
          f"{1219 / ref:.0f}x slower than this")


def scaling() -> None:
    from duckmob.privacy.noise import NoiseSource
    from duckmob.synth.base import fit_unrecorded
    from duckmob.synth.privtrace import PrivTrace
    from duckmob.trajectories import from_points
    import pyarrow.parquet as pq

    def timed(n, fixes, params, repeats=2):
        table = pq.read_table(synthetic_parquet(n, fixes))
        traj, _ = from_points(table, bbox=BOXES["beijing"])
        fits, samples = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            model = fit_unrecorded(PrivTrace(BOXES["beijing"], **params), traj, 1.0, 0.0, NoiseSource(0))
            t1 = time.perf_counter()
            model.sample(n, NoiseSource(1).generator())
            fits.append(t1 - t0)
            samples.append(time.perf_counter() - t1)
        return model.grid.m, min(fits), min(samples)

    print("\nHow time grows (Python fit + sample, points already in memory; eps 1; best of 2 runs)")
    print("with trajectories (100 fixes each, K = 24, no split: 576 states)")
    print(f"{'trajectories':>12} {'fit s':>7} {'sample s':>9} {'per 10k traj s':>15}")
    for n in (5_000, 10_000, 20_000, 40_000, 80_000, 150_000):
        m, tf, ts = timed(n, 100, {"K": 24, "max_depth": 0})
        print(f"{n:>12,} {tf:>7.2f} {ts:>9.2f} {(tf + ts) / n * 1e4:>15.3f}")
    print("with states (20k trajectories of 100 fixes; K x K, no split)")
    print(f"{'K':>4} {'states':>7} {'fit s':>7} {'sample s':>9} {'per 1k states s':>16}")
    for K in (8, 12, 17, 24, 34, 48, 68):
        m, tf, ts = timed(20_000, 100, {"K": K, "max_depth": 0})
        print(f"{K:>4} {m:>7} {tf:>7.2f} {ts:>9.2f} {(tf + ts) / m * 1e3:>16.3f}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        print(json.dumps(child(sys.argv[2], json.loads(sys.argv[3]), float(sys.argv[4]))))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("parts", nargs="*", default=["quality", "speed", "scaling"])
    ap.add_argument("--box", choices=sorted(BOXES), default="hrnet")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--eps", type=float, nargs="*", default=[0.5, 1.0, 2.0])
    ap.add_argument("--params", default="{}", help="PrivTrace parameters as JSON")
    args = ap.parse_args()
    if "quality" in args.parts:
        quality(args.box, args.eps, args.seeds, json.loads(args.params))
    if "speed" in args.parts:
        speed()
    if "scaling" in args.parts:
        scaling()


if __name__ == "__main__":
    main()
