"""Foundation benchmarks: mob_cell vs the plain SQL floor() expression on 10M points, and stay points over all
3.5M fixes of GeoLife Beijing. Prints figures and ratios; run ``python benchmarks/foundation.py``."""

import time
from pathlib import Path

import duckmob
from timing import best_of
from duckmob import staypoints, trajectories

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
BOX = [39.4, 115.4, 41.1, 117.6]



def main():
    con = duckmob.connect()
    con.execute("SET threads = 1")
    con.execute("CREATE TABLE p AS SELECT 39.4 + random() * 1.7 AS lat, 115.4 + random() * 2.2 AS lon "
                "FROM range(10000000)")
    b = "[39.4, 115.4, 41.1, 117.6]"
    macro = best_of(lambda: con.execute(f"SELECT sum(mob_cell(lat, lon, {b}, 32)) FROM p").fetchall())
    plain = best_of(lambda: con.execute(
        "SELECT sum(least(floor((lat - 39.4) / 1.7 * 32), 31)::BIGINT * 32 "
        "+ least(floor((lon - 115.4) / 2.2 * 32), 31)::BIGINT) FROM p").fetchall())
    print(f"mob_cell on 10M points, 1 thread: {macro:.3f} s; plain floor() SQL: {plain:.3f} s; "
          f"ratio {macro / plain:.2f}x (goal <= 1.5x)")
    con.close()

    path = SHARED / "geolife_beijing.parquet"
    if not path.exists():
        print(f"{path} not found: skipping the stay-point benchmark")
        return
    import pyarrow.parquet as pq
    t0 = time.perf_counter()
    traj, _ = trajectories.from_points(pq.read_table(path), bbox=BOX, outside="drop")
    t1 = time.perf_counter()
    stays = staypoints.detect(traj)
    t2 = time.perf_counter()
    print(f"GeoLife Beijing: {traj.n_points:,} fixes, {traj.n_trajectories:,} trajectories; "
          f"load + validate {t1 - t0:.2f} s; stay points {t2 - t1:.2f} s (goal < 10 s), {len(stays['first']):,} stays")
    con = duckmob.connect()
    t3 = time.perf_counter()
    n = con.execute(f"SELECT count(*) FROM mob_staypoints('read_parquet(''{path}'')')").fetchone()[0]
    print(f"same through SQL (mob_staypoints over read_parquet): {time.perf_counter() - t3:.2f} s, {n:,} stays")
    con.close()


if __name__ == "__main__":
    main()
