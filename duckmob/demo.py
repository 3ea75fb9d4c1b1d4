"""``duckmob demo``: the whole pipeline on the GeoLife sample shipped inside the package.

It loads the sample, cleans it, finds stay points, synthesises it with PrivTrace under a declared budget, and
measures the synthetic table beside a reference: the same metrics between two halves of the real sample, so each
number has a scale. It leaves a database (``trips``, ``seqs``, ``synth`` and the ledger), the density picture and,
beside it, the release report (the public page, :mod:`duckmob.report`) behind, and ends with three commands to run
on them.
"""

from __future__ import annotations

import os
import shlex
import time

import duckdb

from duckmob import api
from duckmob.errors import DuckmobError
from duckmob.samples import sample_path

# Beijing's box as declared in the data's README: a public parameter, not computed from the data.
BEIJING_BBOX = [39.4, 115.4, 41.1, 117.6]
# HRNet's 32 x 32 box over central Beijing (ENGINEERING.md); also declared, not computed.
HRNET_BBOX = [39.8477, 116.1956, 40.1133, 116.4880]

DEFAULT_SAVE = "duckmob_demo.duckdb"
DEFAULT_PNG = "duckmob_demo_density.png"
# The release report (the public page), written beside the picture.
REPORT = "duckmob_demo_report.html"
# The comment the demo puts on its trips table: a database carrying it was written by the demo and may be
# replaced by the next run; any other existing file is left alone.
MARK = "GeoLife sample loaded by duckmob demo"
# The metrics shown (all of them: FROM mob_evaluate(...)), by mob_evaluate's name.
SHOWN = {"privtrace_length_jsd": "length JSD", "privtrace_diameter_jsd": "diameter JSD",
         "privtrace_density_are": "density ARE", "privtrace_pattern_are": "pattern ARE",
         "hrnet_destination_jsd": "destination JSD", "hrnet_travel_distance_jsd": "travel distance JSD"}


def load_sample(con: duckdb.DuckDBPyConnection, name: str = "trips") -> None:
    """Create table ``name`` from the shipped sample."""
    con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT * FROM read_parquet(?)", [sample_path()])


def run(out=print, save: str = DEFAULT_SAVE, png: str = DEFAULT_PNG) -> None:
    """Run the demo, print a short summary, and leave the database ``save`` and the picture ``png`` behind.

    ``save`` is replaced if an earlier demo wrote it; any other existing file there is refused."""
    t0 = time.perf_counter()
    _clear(save)
    con = api.connect(save)
    try:
        con.execute("SET enable_progress_bar = false")  # the demo prints its own lines
        load_sample(con)
        con.execute(f"COMMENT ON TABLE trips IS '{MARK}'")
        bbox = f"[{', '.join(map(str, HRNET_BBOX))}]"
        n_traj, n_pts, n_users = con.execute(
            "SELECT count(DISTINCT traj_id), count(*), count(DISTINCT user_id) FROM trips").fetchone()
        out(f"duckmob {api.__version__} demo on the shipped GeoLife sample")
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
        for line in _quality(con, bbox):
            out(line)
        picture = con.execute(f"SELECT path FROM mob_plot_density('trips', 'synth', path := ?, bbox := {bbox})",
                              [png]).fetchone()[0]
        out(f"  picture      {_shown(png, picture)}: where real and synthetic trajectories go, side by side")
        report = os.path.join(os.path.dirname(png), REPORT)
        page = con.execute("SELECT DISTINCT path FROM mob_report('synth', path := ?)", [report]).fetchone()[0]
        out(f"  report       {_shown(report, page)}: the release report, the page to publish with the table "
            "(docs/report.md)")
        out(f"  saved        {_shown(save, os.path.abspath(save))}: tables trips, seqs, synth and the privacy "
            f"ledger (duckmob {shlex.quote(save)} opens it)")
        out(f"  done in {time.perf_counter() - t0:.1f} s")
    finally:
        con.close()
    for line in next_commands(save, bbox):
        out(line)


def _synthesis(con, bbox):
    """Declare a budget and synthesise the sample with PrivTrace at eps 1."""
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


def _quality(con, bbox):
    """The shown metrics of synth against trips, beside mob_evaluate's own anchors: ``reference`` (one half of the
    real sample against the other, split by its fixed hash of (user_id, traj_id): the one rule everywhere) and
    ``baseline`` (a naive table of straight trips between uniform places)."""
    query = (f"SELECT metric, value, reference, baseline FROM mob_evaluate(?, ?, bbox := {bbox}, "
             f"families := ['privtrace', 'hrnet']) WHERE metric IN ({', '.join(repr(k) for k in SHOWN)})")
    rows = {metric: (value, reference, baseline) for metric, value, reference, baseline in
            con.execute(query, ["trips", "synth"]).fetchall()}
    yield f"  quality      {'lower is better':<22}{'synthetic':>10}{'real vs real':>14}{'naive':>10}"
    for key, label in SHOWN.items():
        value, reference, baseline = rows.get(key, (None, None, None))
        yield f"               {label:<22}{_number(value):>10}{_number(reference):>14}{_number(baseline):>10}"
    yield "               real vs real: the same metrics between two halves of the real sample; naive: straight"
    yield "               trips between uniform places. Near the first is as close as other real data; near the"
    yield "               second, no better than naive"


def next_commands(save: str, bbox: str) -> list[str]:
    """The three commands the demo ends with, on the database it saved."""
    db = shlex.quote(save)
    return ["next, try:",
            f"  duckmob {db} -c \"FROM mob_evaluate('trips', 'synth', bbox := {bbox})\"      # every metric",
            f"  duckmob {db} -c \"FROM mob_budget(); FROM mob_ledger()\"      # what was spent, on what",
            f"  duckmob {db} -c \"CREATE TABLE synth2 AS FROM synthesize('trips', eps := 0.5, bbox := {bbox}); "
            "FROM mob_budget()\"      # a second release, from what is left"]


def _number(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def _shown(given: str, absolute: str) -> str:
    """A path as the user gave it, with its folder when it was relative."""
    return given if os.path.isabs(given) else f"{given} (in {os.path.dirname(absolute)})"


def _clear(save: str) -> None:
    """Remove an earlier demo's database at ``save``; refuse to touch any other file there."""
    if not os.path.exists(save):
        return
    try:
        with duckdb.connect(save, read_only=True) as con:
            mark = con.execute("SELECT comment FROM duckdb_tables() WHERE table_name = 'trips' "
                               "AND schema_name = 'main'").fetchall()
    except duckdb.Error:
        mark = []
    if mark != [(MARK,)]:
        raise DuckmobError(f"{save} exists and was not written by duckmob demo: name a new file with "
                           f"duckmob demo --save FILE.duckdb")
    from duckmob.privacy.ledger import head_file

    for path in (save, save + ".wal", head_file(save)):   # the ledger's head file goes with its database
        if os.path.exists(path):
            os.remove(path)
