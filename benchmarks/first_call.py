"""A first release against plain SQL, end to end, each in a fresh process (issue 42, item 1).

    python benchmarks/first_call.py --source geolife_beijing.parquet --size 15.3e6 --pairs 3

Two commands, run alternately in fresh Python processes over the same view of a replicated GeoLife table (the one
benchmarks/scale.py builds: ``DIR/points_<n>.parquet``, made here if missing):

- ``sql``: ``import duckdb``, connect, ``CREATE VIEW trips``, and plain DuckDB SQL computing comparable statistics
  (benchmarks/scale.py's STATS_SQL: cells of a 64 x 64 grid, length-normalised cell counts, first-order
  transitions, no noise);
- ``synthesize``: ``import duckmob``, ``duckmob.connect()``, ``CREATE VIEW trips``, ``mob_set_budget`` and
  ``SELECT count(*) FROM synthesize('trips', eps := 1, n := 1000, bbox := ..., seed := 1)`` (PrivTrace: imports,
  planning, the statistics stage, the first block's route tables and the sampling all count).

Each time is the wall time from starting the process to its exit, as the parent sees it (interpreter start and
imports included; each tree's .pyc files are written once before, uncounted, as an installed package has them);
CPU is the child's user + system time. Each pair prints both times, the ratio and the load
average just before it; the end prints the medians and the median of the per-pair ratios. The machine is shared:
read the ratio of a pair, measured side by side, not a time alone. ``--compare DIR`` also runs the synthesize
command with another checkout's duckmob (DIR: its root, e.g. ``git worktree add DIR <commit>``) in each round,
right after this one's (before it in every other round): a before / after in the same run.

``--walks`` measures one stage instead, in the same fresh-process synthesize: the CPU seconds (thread time) of
duckmob.synth.cells.state_sequences, the line walks of PrivTrace's two passes and of the fine stage, per grid
(W base cells a side), in this tree and the ``--compare`` tree alternately.

``--stages`` likewise measures the read and clean stage and the passes after it inside the fresh-process
synthesize, in both trees alternately: CPU seconds (thread time, summed over threads) of routing the scan's record
batches to buckets (``source.table._split``; a tree without a function leaves its line out), cleaning
(``from_points``) and writing the cleaned buckets, the fine stage's statistics (its cells and step bins apart),
every line walk, the PLD accountant's import and the first block's route tables; the wall seconds of the read
stage (scan, routing, cleaning) and of PrivTrace's two passes; and the process's wall and CPU. ``--clean`` times
the cleaning alone: ``from_points(private=True)`` over the buckets that ``source.table.read_points`` makes of the
view (each tree its own), in one thread, three rounds, in a fresh process.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scale import BBOX, SOURCE_VARIABLE, STATS_SQL, generate  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SQL_CHILD = """
import duckdb
con = duckdb.connect()
con.execute("CREATE VIEW trips AS FROM '{points}'")
print(con.sql('''{query}''').fetchall()[0][0])
"""

SYNTH_CHILD = """
import duckmob
print(duckmob.__file__)
con = duckmob.connect()
con.execute("CREATE VIEW trips AS FROM '{points}'")
con.execute("FROM mob_set_budget('trips', eps := 100, delta := 1e-5)").fetchall()
print(con.sql("SELECT count(*) FROM synthesize('trips', eps := 1.0, n := 1000, bbox := {bbox}, seed := 1)")
      .fetchall()[0][0])
"""

WALKS_CHILD = """
import json, threading, time
import duckmob.synth.cells as cells
walk, spent, lock = cells.state_sequences, {{}}, threading.Lock()

def timed(grid, offsets, lat, lon):
    t = time.thread_time()
    out = walk(grid, offsets, lat, lon)
    with lock:
        key = f"W={{grid.W}}" + (f" (split, depth {{grid.depth}})" if grid.depth else "")
        spent[key] = spent.get(key, 0.0) + time.thread_time() - t
    return out

cells.state_sequences = timed   # before duckmob.synth's modules import it
""" + SYNTH_CHILD + "print(json.dumps(spent))\n"


STAGES_CHILD = """
import json, os, threading, time
spent, lock = {{}}, threading.Lock()

def wrap(owner, attr, key, clock):
    f = getattr(owner, attr, None)
    if f is None:   # a tree without it
        return
    def timed(*a, **k):
        t = clock()
        try:
            return f(*a, **k)
        finally:
            with lock:
                spent[key] = spent.get(key, 0.0) + clock() - t
    setattr(owner, attr, timed)

import duckmob.synth.cells as cells
wrap(cells, "state_sequences", "line walks (all grids)", time.thread_time)   # before duckmob.synth imports it
import duckmob.privacy.composition as composition
import duckmob.release.protocol as protocol
import duckmob.source.batches as batches
import duckmob.source.table as table
import duckmob.synth.placement as placement
import duckmob.synth.placement.releases as releases
import duckmob.synth.placement.routes as routes
cpu = time.thread_time
for owner, attr, key, clock in [
        (table, "_split", "route: split batches", cpu), (batches, "from_points", "clean: from_points", cpu),
        (batches, "_save", "clean: write buckets", cpu), (placement, "statistics", "fine statistics", cpu),
        (releases, "fine_cells", "fine: cells", cpu), (releases, "step_bins", "fine: step bins", cpu),
        (composition, "_import_pld", "PLD import", cpu), (routes.Placement, "_route_tables", "route tables", cpu),
        (protocol.Release, "read", "wall: read stage", time.perf_counter),
        (batches.Batches, "reduce", "wall: PrivTrace passes", time.perf_counter)]:
    wrap(owner, attr, key, clock)
t0 = time.perf_counter()
""" + SYNTH_CHILD + """times = os.times()
spent["process wall"], spent["process CPU"] = time.perf_counter() - t0, times.user + times.system
print(json.dumps(spent))
"""


CLEAN_CHILD = """
import json, os, shutil, tempfile, time
import duckdb
import pandas   # a release has it imported (pyarrow imports it at its first pa.array) before it cleans
import duckmob
import duckmob.source.table as table
from duckmob.trajectories import from_points
print(duckmob.__file__)
con = duckdb.connect()
folder = tempfile.mkdtemp()
select = "SELECT traj_id, user_id, ts, lat, lon, NULL::BIGINT AS seq FROM '{points}'"
buckets = list(table.read_points(con, select, folder=folder, bbox={bbox}, time_required=True))
spent = {{}}
for r in range(3):
    t = time.thread_time()
    for b in buckets:
        from_points(b, bbox={bbox}, outside="drop", time_required=True, private=True)
    spent[f"round {{r + 1}}"] = time.thread_time() - t
shutil.rmtree(folder)
print(json.dumps(spent))
"""


def run(code: str, root: str = ROOT) -> tuple[float, float, str]:
    """Wall seconds from start to exit of ``python -c code`` (duckmob from ``root``), its CPU seconds (user +
    system) and its last line."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    # run in ``root``: ``python -c`` puts the current folder first on sys.path, before PYTHONPATH, so a child
    # started elsewhere (e.g. in another checkout's root) would import that folder's duckmob
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(root), cwd=root)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"a child failed: {done.stderr.strip().splitlines()[-1]}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    imported = os.path.join(os.path.abspath(root), "duckmob", "__init__.py")
    if "import duckmob" in code and imported not in done.stdout.splitlines():
        raise SystemExit(f"a child imported duckmob from elsewhere than {root}")
    return wall, cpu, done.stdout.strip().splitlines()[-1]


def child_env(root: str) -> dict:
    """The environment of a child: duckmob from ``root``, and bytecode cached as a user's Python caches it
    (PYTHONDONTWRITEBYTECODE, set on some machines, would make every child compile duckmob's modules again)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": root}


def compile_tree(root: str) -> None:
    """Write the .pyc files of ``root``'s duckmob once, uncounted, as an installed package has them."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(root, "duckmob")], check=True,
                   capture_output=True, env=child_env(root))


def load() -> str:
    """The 1-minute load average (the machine is shared: every figure carries it)."""
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", default=os.environ.get(SOURCE_VARIABLE),
                   help=f"the Parquet file of GeoLife Beijing fixes (default: ${SOURCE_VARIABLE})")
    p.add_argument("--dir", default="/tmp/duckmob-scale", help="folder of the generated Parquet file")
    p.add_argument("--size", default="15.3e6", help="fixes in the table")
    p.add_argument("--pairs", type=int, default=3, help="sql / synthesize pairs, alternating")
    p.add_argument("--out", help="also write the lines to this file")
    p.add_argument("--compare", help="root of another checkout: its synthesize runs too, after this one's")
    p.add_argument("--walks", action="store_true", help="measure the line walks' CPU seconds instead (see above)")
    p.add_argument("--stages", action="store_true", help="measure the read and clean stage and the passes instead")
    p.add_argument("--clean", action="store_true", help="measure the cleaning of the scan's buckets instead")
    a = p.parse_args(argv)
    size = int(float(a.size))
    points = os.path.abspath(os.path.join(a.dir, f"points_{size}.parquet"))
    if not os.path.exists(points):
        if not a.source or not os.path.isfile(a.source):
            p.error(f"no table {points} and no source to make it from: pass --source PATH (GeoLife Beijing fixes) "
                    f"or set {SOURCE_VARIABLE}")
        os.makedirs(a.dir, exist_ok=True)
        generate(a.dir, size, a.source, cells_too=False)
    a_, b_, c_, d_ = BBOX
    sql = SQL_CHILD.format(points=points, query=STATS_SQL.format(a=a_, b=b_, c=c_, d=d_, w=64))
    synth = SYNTH_CHILD.format(points=points, bbox=BBOX)
    for root in [ROOT] + ([os.path.abspath(a.compare)] if a.compare else []):
        compile_tree(root)
    run(sql)   # warm the file cache once, uncounted
    if a.walks:
        return walks(WALKS_CHILD.format(points=points, bbox=BBOX), a)
    if a.stages:
        return stages(STAGES_CHILD.format(points=points, bbox=BBOX), a)
    if a.clean:
        return stages(CLEAN_CHILD.format(points=points, bbox=BBOX), a, "--clean", "CPU s of from_points(private=True) "
                      "over the scan's buckets in one thread, 3 rounds, in a fresh process")
    compare = f" --compare {a.compare}" if a.compare else ""
    lines = [f"# python benchmarks/first_call.py --size {a.size} --pairs {a.pairs}{compare}: {size:,} fixes, "
             f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M')}",
             f"{'pair':>4} {'load':>5} {'sql wall/CPU s':>15} {'synthesize wall/CPU s':>22} {'ratio wall/CPU':>15}"]
    print(lines[0], flush=True)
    print(lines[1], flush=True)
    sqls, synths, ratios, others = [], [], [], []
    for i in range(a.pairs):
        before = load()
        s_wall, s_cpu, _ = run(sql)
        if a.compare and i % 2:   # every other round the other tree first: neither gains from going second
            other = run(synth, os.path.abspath(a.compare))
        p_wall, p_cpu, rows = run(synth)
        if a.compare and not i % 2:
            other = run(synth, os.path.abspath(a.compare))
        sqls.append(s_wall)
        synths.append(p_wall)
        ratios.append(p_wall / s_wall)
        lines.append(f"{i + 1:>4} {before:>5} {s_wall:>7.2f} / {s_cpu:<5.2f} {p_wall:>13.2f} / {p_cpu:<6.2f} "
                     f"{p_wall / s_wall:>7.1f}x / {p_cpu / s_cpu:.1f}x   ({rows} rows)")
        print(lines[-1], flush=True)
        if a.compare:
            o_wall, o_cpu, o_rows = other
            others.append(o_wall / s_wall)
            lines.append(f"{'':>4} {'':>5} {'':>15} {o_wall:>13.2f} / {o_cpu:<6.2f} {o_wall / s_wall:>7.1f}x / "
                         f"{o_cpu / s_cpu:.1f}x   ({o_rows} rows; --compare {a.compare})")
            print(lines[-1], flush=True)
    if others:
        lines.append(f"median ratio of pairs with --compare {a.compare}: {statistics.median(others):.1f}x")
        print(lines[-1])
    lines.append(f"median: sql {statistics.median(sqls):.2f} s, synthesize {statistics.median(synths):.2f} s, "
                 f"ratio of pairs {statistics.median(ratios):.1f}x (load after: {load()})")
    print(lines[-1])
    if a.out:
        with open(a.out, "a") as f:
            f.write("\n".join(lines) + "\n")


def walks(code: str, a) -> None:
    """Rounds of the walks child in this tree and the --compare tree (alternating which goes first): each run's
    state_sequences CPU seconds per grid, and the medians of their totals."""
    import json
    trees = [ROOT] + ([os.path.abspath(a.compare)] if a.compare else [])
    lines = [f"# python benchmarks/first_call.py --size {a.size} --pairs {a.pairs} --walks"
             + (f" --compare {a.compare}" if a.compare else "") + f": {os.cpu_count()} cores, "
             f"{time.strftime('%Y-%m-%d %H:%M')}; state_sequences CPU s per grid in one fresh-process synthesize"]
    print(lines[0], flush=True)
    totals: dict = {root: [] for root in trees}
    for i in range(a.pairs):
        for root in (trees if i % 2 == 0 else trees[::-1]):
            before = load()
            wall, cpu, last = run(code, root)
            spent = json.loads(last)
            totals[root].append(sum(spent.values()))
            grids = ", ".join(f"{k} {v:.2f}" for k, v in sorted(spent.items()))
            lines.append(f"{i + 1:>4} load {before:>5}  {'this' if root == ROOT else 'compare'}: walks "
                         f"{totals[root][-1]:.2f} ({grids}); synthesize {wall:.2f} s wall / {cpu:.2f} CPU s")
            print(lines[-1], flush=True)
    lines.append("median walks CPU s: " + ", ".join(f"{'this' if r == ROOT else a.compare} "
                                                    f"{statistics.median(v):.2f}" for r, v in totals.items())
                 + f" (load after: {load()})")
    print(lines[-1])
    if a.out:
        with open(a.out, "a") as f:
            f.write("\n".join(lines) + "\n")


def stages(code: str, a, flag: str = "--stages",
           what: str = "thread CPU s per stage (wall s where named) in one fresh-process synthesize") -> None:
    """Rounds of the stages (or clean) child in this tree and the --compare tree (alternating which goes first):
    each run's seconds per stage, then each stage's median per tree."""
    import json
    trees = [ROOT] + ([os.path.abspath(a.compare)] if a.compare else [])
    lines = [f"# python benchmarks/first_call.py --size {a.size} --pairs {a.pairs} {flag}"
             + (f" --compare {a.compare}" if a.compare else "") + f": {os.cpu_count()} cores, "
             f"{time.strftime('%Y-%m-%d %H:%M')}; {what}"]
    print(lines[0], flush=True)
    seen: dict = {root: [] for root in trees}
    for i in range(a.pairs):
        for root in (trees if i % 2 == 0 else trees[::-1]):
            before = load()
            spent = json.loads(run(code, root)[2])
            seen[root].append(spent)
            lines.append(f"{i + 1:>4} load {before:>5}  {'this' if root == ROOT else 'compare'}: "
                         + ", ".join(f"{k} {v:.2f}" for k, v in spent.items()))
            print(lines[-1], flush=True)
    keys = list(dict.fromkeys(k for runs in seen.values() for run_ in runs for k in run_))
    for key in keys:
        lines.append(f"median {key}: " + ", ".join(
            f"{'this' if r == ROOT else 'compare'} {statistics.median([x[key] for x in v if key in x]):.2f}"
            for r, v in seen.items() if any(key in x for x in v)))
    lines.append(f"(load after: {load()})")
    print("\n".join(lines[-len(keys) - 1:]))
    if a.out:
        with open(a.out, "a") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
