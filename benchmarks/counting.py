"""Transition counting speed (duckmob.privacy.counting): first and second order on the cell sequences of all of
GeoLife Beijing (bbox [39.8477, 116.1956, 40.1133, 116.4880], w = 32, consecutive duplicates collapsed, through
mob_cell_sequences) and on 10M synthetic cells (random walks on the 32 x 32 grid). Prints seconds and rates;
run ``python benchmarks/counting.py``."""

import time
from pathlib import Path

import numpy as np

import duckmob
from duckmob.privacy import counting
from duckmob.privacy.noise import NoiseSource

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
BBOX = "[39.8477, 116.1956, 40.1133, 116.4880]"


def timed(label, fn, n_cells):
    t0 = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t0
    print(f"  {label:<58} {dt:7.2f} s  ({n_cells / dt / 1e6:6.1f} M cells/s)")
    return out


def cell_sequences(con, w):
    path = SHARED / "geolife_beijing.parquet"
    t0 = time.perf_counter()
    rows = con.sql(f"SELECT cells FROM mob_cell_sequences('read_parquet(''{path}'')', bbox := {BBOX}, "
                       f"w := {w}, stay_points := false, outside := 'drop')").to_arrow_table()
    lists = rows.column("cells").combine_chunks()
    offsets = np.asarray(lists.offsets, dtype=np.int64)
    cells = np.asarray(lists.values, dtype=np.int64)
    print(f"GeoLife Beijing, w = {w}: {len(offsets) - 1:,} trajectories, {len(cells):,} cells (duplicates "
          f"collapsed); mob_cell_sequences {time.perf_counter() - t0:.2f} s")
    return offsets, cells


def run(offsets, cells, w, second_dense=False):
    n_states, m = w * w, len(cells)
    noise = NoiseSource(1)
    timed("exact first order (transition_counts)", lambda: counting.transition_counts(offsets, cells, n_states, 1), m)
    timed(f"noisy first order, full support ({(n_states + 2) ** 2:,} entries)",
          lambda: counting.noisy_transition_counts(offsets, cells, n_states, 1, 0.5, noise), m)
    sup = len(counting.support_entries(n_states, 2, "neighbours", w=w))
    timed(f"noisy second order, neighbour support ({sup:,} entries)",
          lambda: counting.noisy_transition_counts_sparse(offsets, cells, n_states, 2, 0.5, noise, w=w), m)
    if second_dense:
        timed(f"noisy second order, full support, float32 ({(n_states + 2) ** 3:,} entries)",
              lambda: counting.noisy_transition_counts(offsets, cells, n_states, 2, 0.5, noise, dtype=np.float32), m)
    if w & (w - 1) == 0:
        timed("noisy HRNet DPTRAN, level 2 (16 x w^2)",
              lambda: counting.noisy_region_transition_counts(offsets, cells, w, 2, 0.5, noise), m)


def random_walks(n_cells, w, rng):
    lengths = rng.integers(10, 91, n_cells // 50)
    lengths = lengths[: np.searchsorted(np.cumsum(lengths), n_cells)]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    starts = np.repeat(rng.integers(0, w, (len(lengths), 2)), lengths, axis=0)
    steps = rng.integers(-1, 2, (offsets[-1], 2))
    steps[offsets[:-1]] = 0
    pos = np.cumsum(steps, axis=0)
    pos -= np.repeat(pos[offsets[:-1]], lengths, axis=0)
    rc = np.clip(starts + pos, 0, w - 1)
    return offsets, rc[:, 0] * w + rc[:, 1]


def main():
    con = duckmob.connect()
    if (SHARED / "geolife_beijing.parquet").exists():
        offsets, cells = cell_sequences(con, 32)
        run(offsets, cells, 32)
        path = SHARED / "geolife_beijing.parquet"
        con.execute(f"CREATE TABLE seqs AS FROM mob_cell_sequences('read_parquet(''{path}'')', "
                    f"bbox := {BBOX}, w := 32, stay_points := false, outside := 'drop')")
        con.execute("FROM mob_set_budget('seqs', eps := 100, delta := 1e-6)").fetchall()
        t0 = time.perf_counter()
        n = con.execute("SELECT count(*) FROM mob_transitions('seqs', eps := 0.5, n_states := 1024)").fetchall()[0][0]
        print(f"  {'SQL mob_transitions, first order (incl. ledger)':<58} {time.perf_counter() - t0:7.2f} s  "
              f"({n:,} non-zero rows)")
        offsets24, cells24 = cell_sequences(con, 24)
        run(offsets24, cells24, 24, second_dense=True)
    else:
        print("geolife_beijing.parquet not found: skipping GeoLife")
    con.close()
    rng = np.random.default_rng(0)
    offsets, cells = random_walks(10_000_000, 32, rng)
    print(f"Synthetic: {len(offsets) - 1:,} random walks, {len(cells):,} cells on the 32 x 32 grid")
    run(offsets, cells, 32)


if __name__ == "__main__":
    main()
