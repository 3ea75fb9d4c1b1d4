"""PrivTrace's trip distribution in bounded memory (issue 42, item 4): peak memory and wall time of
``duckmob.synth.privtrace.trips.trip_distribution`` on an input of the 1 B-fix release's size, before and after.

    git worktree add -f /tmp/exp/before 727eaae~1 --detach        # the dense |I| x |J| float64 code
    python benchmarks/trips_memory.py --before /tmp/exp/before --after .

The input. The 1 B run's RSS timeline put its peak (about 3 GB above the statistics stage) in this function, but
its |I| and |J| (states with positive noisy start and end counts) were not recorded. So: the state adjacency of the
60,451-state PrivTrace model of docs/scale.md (GeoLife Beijing, ``params := {'K': 64, 'kappa_c': 0.05}``, eps 1),
taken from a fit of ``--source`` once and kept in ``--dir``, and released counts of that shape: ``--ends`` states
with a positive start count and as many with a positive end count, drawn at random (seed 1), gamma-distributed
values; the noisy trajectory count makes the mean trip length ``--target`` transitions, so the gravity decay is
fitted by bisection (the default path). With 4,000 ends the dense code holds a 4,000 x 60,451 float64 BFS table
(1.9 GB) and |I| x |J| tables of 128 MB each.

Each tree runs in a fresh subprocess (``PYTHONPATH`` = the tree): wall time of the call, its tracemalloc peak
(numpy's buffers included) and its peak RSS above the process's RSS before the call (VmHWM reset through
/proc/self/clear_refs). The two trees' start distributions are compared (largest relative difference).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SOURCE = os.path.join(os.path.dirname(ROOT), "shared", "data", "geolife_beijing.parquet")
BBOX = [39.8477, 116.1956, 40.1133, 116.4880]


def capture_graph(source: str, path: str) -> None:
    """Fit the 60,451-state model on ``source`` and save the state adjacency its trip distribution gets."""
    import duckdb
    import numpy as np

    import duckmob
    import duckmob.synth.privtrace as privtrace

    dense = privtrace.trip_distribution

    def keep(b, q, n_trips, offsets, dst, **kw):
        np.savez(path, offsets=offsets, dst=dst)
        return dense(b, q, n_trips, offsets, dst, **kw)

    privtrace.trip_distribution = keep
    con = duckdb.connect()
    duckmob.register(con)
    con.execute(f"CREATE VIEW trips AS FROM '{source}'")
    con.execute("FROM mob_set_budget('trips', eps := 10, delta := 1e-5)")
    con.execute(f"FROM mob_fit('trips', 'm', eps := 1.0, bbox := {BBOX}, seed := 1, "
                "params := {'K': 64, 'kappa_c': 0.05})").fetchall()


def released(graph: str, ends: int, target: float):
    """Start and end counts with ``ends`` positive states each, and a trajectory count for mean length ``target``."""
    import numpy as np

    g = np.load(graph)
    m = len(g["offsets"]) - 1
    rng = np.random.default_rng(1)
    b, q = np.zeros(m), np.zeros(m)
    b[rng.choice(m, ends, replace=False)] = rng.gamma(0.7, 50.0, ends) + 1e-3
    q[rng.choice(m, ends, replace=False)] = rng.gamma(0.7, 50.0, ends) + 1e-3
    q *= b.sum() / q.sum()
    return b, q, target * b.sum(), g["offsets"], g["dst"]


def _rss_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(graph: str, ends: int, target: float, out: str) -> None:
    """Run the call once in this process (the tree on sys.path) and write its figures to ``out`` (JSON)."""
    import tracemalloc

    import numpy as np

    from duckmob.synth.privtrace import trips
    from duckmob.synth.privtrace.trips import trip_distribution

    args = released(graph, ends, target)
    with open("/proc/self/clear_refs", "w") as f:     # VmHWM starts again from the current RSS
        f.write("5")
    before = _rss_mb("VmRSS")
    tracemalloc.start()
    t0, c0 = time.perf_counter(), time.process_time()
    p, info = trip_distribution(*args)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    traced = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    np.save(out + ".npy", p)
    with open(out, "w") as f:
        json.dump({"wall": wall, "cpu": cpu, "traced_mb": traced, "rss_mb": _rss_mb("VmHWM") - before,
                   "code": trips.__file__, "states": len(p), "I": int((args[0] > 0).sum()),
                   "J": int((args[1] > 0).sum()),
                   "info": {k: float(v) for k, v in info.items()}}, f)


def run_tree(tree: str, graph: str, ends: int, target: float, out: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    subprocess.run([sys.executable, os.path.abspath(__file__), "--child", graph, str(ends), str(target), out],
                   check=True, env=env, cwd=os.path.abspath(tree))
    with open(out) as f:
        return json.load(f)


def load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", help="a checkout of the code before (the dense tables)")
    ap.add_argument("--after", default=ROOT, help="a checkout of the code after (default: this one)")
    ap.add_argument("--ends", type=int, default=4000, help="states with a positive start (and end) count")
    ap.add_argument("--target", type=float, default=30.0, help="mean trip length the trajectory count implies")
    ap.add_argument("--source", default=SOURCE, help="GeoLife Beijing parquet, for the model's graph")
    ap.add_argument("--dir", default="/tmp/duckmob_trips_memory", help="where the graph and results are kept")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child[0], int(a.child[1]), float(a.child[2]), a.child[3])
        return
    os.makedirs(a.dir, exist_ok=True)
    graph = os.path.join(a.dir, "graph_60k.npz")
    if not os.path.exists(graph):
        capture_graph(a.source, graph)
    print(f"# python benchmarks/trips_memory.py --ends {a.ends} --target {a.target}"
          + (f" --before {a.before}" if a.before else "") + f"   load at start {load()}")
    trees = [("before", a.before)] * bool(a.before) + [("after", a.after)]
    rows = {}
    for name, tree in trees:
        rows[name] = run_tree(tree, graph, a.ends, a.target, os.path.join(a.dir, f"{name}.json"))
    r = rows["after"]
    print(f"# states {r['states']:,}, |I| {r['I']:,}, |J| {r['J']:,} ({r['I'] * r['J']:,} table entries); "
          f"decay {r['info']['decay']:.4g}, detour {r['info']['detour']:.4g}")
    print(f"{'tree':8} {'wall s':>8} {'CPU s':>8} {'tracemalloc peak MB':>20} {'peak RSS above start MB':>24}")
    for name, r in rows.items():
        print(f"{name:8} {r['wall']:8.1f} {r['cpu']:8.1f} {r['traced_mb']:20.1f} {r['rss_mb']:24.1f}   {r['code']}")
    if "before" in rows:
        import numpy as np

        b, f = rows["before"], rows["after"]
        pb, pa = (np.load(os.path.join(a.dir, f"{n}.json.npy")) for n in ("before", "after"))
        print(f"# before / after: wall {b['wall'] / f['wall']:.1f}x, tracemalloc peak "
              f"{b['traced_mb'] / f['traced_mb']:.0f}x, peak RSS {b['rss_mb'] / max(f['rss_mb'], 0.1):.0f}x; "
              f"start distributions' largest relative difference {np.abs(pa - pb).max() / pb.max():.1e}")
    print(f"# load at end {load()}")


if __name__ == "__main__":
    main()
