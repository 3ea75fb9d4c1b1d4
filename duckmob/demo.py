"""``duckmob demo``: the whole pipeline on the GeoLife sample shipped inside the package."""

from __future__ import annotations

import time
from importlib import resources

import duckdb

import duckmob

# Beijing's box as declared in the data's README: a public parameter, not computed from the data.
BEIJING_BBOX = [39.4, 115.4, 41.1, 117.6]
# HRNet's 32 x 32 box over central Beijing (ENGINEERING.md); also declared, not computed.
HRNET_BBOX = [39.8477, 116.1956, 40.1133, 116.4880]


def sample_path() -> str:
    """Path of the shipped GeoLife sample (10 users, 1,999 trajectories, 123,317 fixes)."""
    return str(resources.files("duckmob").joinpath("data/geolife_sample.parquet"))


def load_sample(con: duckdb.DuckDBPyConnection, name: str = "trips") -> None:
    """Create table ``name`` from the shipped sample."""
    con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT * FROM read_parquet(?)", [sample_path()])


def run(out=print) -> None:
    """Run the demo and print a short summary."""
    t0 = time.perf_counter()
    con = duckmob.connect()
    try:
        load_sample(con)
        bbox = f"[{', '.join(map(str, HRNET_BBOX))}]"
        n_traj, n_pts, n_users = con.execute(
            "SELECT count(DISTINCT traj_id), count(*), count(DISTINCT user_id) FROM trips").fetchone()
        out(f"duckmob {duckmob.__version__} demo on the shipped GeoLife sample")
        out(f"  input        {n_traj:,} trajectories, {n_pts:,} GPS fixes, {n_users} users")
        checks = dict(con.execute(f"SELECT \"check\", count FROM mob_check('trips', bbox := {bbox})").fetchall())
        out(f"  cleaning     {checks['points outside bbox']:,} fixes outside HRNet's box {HRNET_BBOX} dropped, "
            f"{checks['trajectories with fewer than 2 points']} trajectories under 2 fixes dropped")
        n_stay, n_stay_traj = con.execute(
            "SELECT count(*), count(DISTINCT traj_id) FROM mob_staypoints('trips', radius_m := 200, "
            "min_minutes := 30)").fetchone()
        out(f"  stay points  {n_stay:,} stays (200 m / 30 min) in {n_stay_traj:,} trajectories")
        con.execute(f"CREATE TABLE seqs AS FROM mob_cell_sequences('trips', bbox := {bbox}, w := 32, "
                    "outside := 'drop')")
        n_seq, mean_len, n_cells = con.execute(
            "SELECT count(*), avg(len(cells)), (SELECT count(DISTINCT c) FROM (SELECT unnest(cells) c FROM seqs)) "
            "FROM seqs").fetchone()
        out(f"  cells        {n_seq:,} stay-point cell sequences on a 32x32 grid, {mean_len:.2f} cells on average, "
            f"{n_cells} distinct cells visited")
        for line in _synthesis(con, bbox):
            out(line)
        out(f"  done in {time.perf_counter() - t0:.1f} s")
    finally:
        con.close()


def _synthesis(con, bbox):
    """Declare a budget, synthesise the sample with PrivTrace at eps 1, and measure it against the real table."""
    eps = 1.0
    con.execute("FROM mob_set_budget('trips', eps := 2.0, delta := 1e-5)").fetchall()
    t0 = time.perf_counter()
    con.execute(f"CREATE TABLE synth AS FROM synthesize('trips', eps := {eps}, method := 'privtrace', "
                f"bbox := {bbox}, outside := 'drop', seed := 7)")
    took = time.perf_counter() - t0
    n_syn, n_pts = con.execute("SELECT count(DISTINCT traj_id), count(*) FROM synth").fetchone()
    spent, remaining = con.execute("SELECT spent, remaining FROM mob_budget() WHERE source = 'trips'").fetchone()
    yield (f"  synthesis    PrivTrace at eps {eps}: {n_syn:,} synthetic trajectories, {n_pts:,} points in {took:.1f} s "
           f"(seeded demo run: not for release)")
    yield f"  budget       'trips': {spent:.3f} of 2.0 spent (PLD composition at delta 1e-5), {remaining:.3f} left"
    wanted = {"privtrace_length_jsd": "length JSD", "privtrace_diameter_jsd": "diameter JSD",
              "privtrace_density_are": "density ARE", "privtrace_pattern_are": "pattern ARE",
              "hrnet_destination_jsd": "destination JSD"}
    rows = dict(con.execute(f"SELECT metric, value FROM mob_evaluate('trips', 'synth', bbox := {bbox}, "
                            "families := ['privtrace', 'hrnet'])").fetchall())
    parts = [f"{label} {rows[key]:.3f}" for key, label in wanted.items() if rows.get(key) is not None]
    yield "  quality      " + ", ".join(parts) + " (lower is better; mob_evaluate lists them all)"
