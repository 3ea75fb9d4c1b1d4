"""The SQL scripts of the repository's sql/ folder run as its README says: ``duckmob DB -f sql/X.sql`` in an empty
folder, each in a process of its own, exit 0 with nothing on stderr, and leave what they promise (pictures, the
release report, the tables of each stage, the ledger's rows and spend). A second run on the same database is refused
before any data is read, as each script's header says, and spends nothing.

The database is read back through the shell as well (``.mode json``): duckmob keeps a connection to a database file
until its process exits, so opening it in this process would lock the file against the second run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SQL = ROOT / "sql"
PNG = b"\x89PNG\r\n\x1a\n"
BEIJING = [39.8477, 116.1956, 40.1133, 116.4880]
SF = [37.76, -122.45, 37.80, -122.38]


def duckmob(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m duckmob ARGS`` in ``cwd``, with this checkout first on the path and progress lines off."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DUCKMOB_PROGRESS": "0"}
    return subprocess.run([sys.executable, "-m", "duckmob", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def run_script(tmp_path: Path, name: str) -> subprocess.CompletedProcess:
    """Run sql/NAME on ``tmp_path``/db.duckdb from ``tmp_path``; it must succeed and print no error."""
    done = duckmob(tmp_path, "db.duckdb", "-f", str(SQL / name))
    assert done.returncode == 0, done.stderr
    assert done.stderr == "" and "Error" not in done.stdout
    return done


def query(tmp_path: Path, sql: str) -> list[dict]:
    """The rows of one SELECT on ``tmp_path``/db.duckdb, through the shell."""
    done = duckmob(tmp_path, "db.duckdb", "-c", ".mode json", "-c", sql)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def statements(sql: str) -> list[str]:
    """The statements of SQL text, comments dropped and blanks collapsed (none of ours has '--' or ';' in a string)."""
    bare = re.sub(r"--[^\n]*", "", sql)
    return [" ".join(s.split()) for s in bare.split(";") if s.strip()]


def test_the_folder_holds_its_readme_and_scripts():
    scripts = sorted(p.name for p in SQL.glob("*.sql"))
    assert scripts == ["pipeline.sql", "roads.sql", "tour.sql"]
    readme = (SQL / "README.md").read_text()
    assert all(f"-f sql/{name}" in readme for name in scripts)
    assert "examples/dbt_project" in readme


def test_tour_is_the_readmes_tour_statement_for_statement():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"^```sql\n(.*?)^```", readme, re.S | re.M)
    tour, fit_once = blocks[0], blocks[1]
    assert "mob_geolife_sample()" in tour and "mob_fit(" in fit_once
    assert statements((SQL / "tour.sql").read_text()) == statements(tour) + statements(fit_once)


def test_tour(tmp_path):
    done = run_script(tmp_path, "tour.sql")
    assert (tmp_path / "density.png").read_bytes()[:8] == PNG
    assert "exact counts: NOT differentially private" in done.stdout        # mob_check says what it is
    budget = query(tmp_path, "SELECT eps, delta, spent, remaining, releases FROM mob_budget() WHERE source = 'trips'")
    assert len(budget) == 1 and budget[0]["eps"] == 2.0 and budget[0]["delta"] == 1e-5 and budget[0]["releases"] == 2
    # synthesize at eps 1 and mob_fit at 0.5, both Laplace only: spent is the smaller of PLD and the exact sum, 1.5
    assert budget[0]["spent"] == pytest.approx(1.5) and budget[0]["remaining"] == pytest.approx(0.5)
    ledger = query(tmp_path, "SELECT mechanism, params->>'model' AS model, seeded, status FROM mob_ledger() "
                             "ORDER BY id")
    assert ledger == [{"mechanism": "privtrace", "model": None, "seeded": False, "status": "spent"},
                      {"mechanism": "privtrace", "model": "beijing_v1", "seeded": False, "status": "spent"}]
    tables = query(tmp_path, "SELECT (SELECT count(DISTINCT traj_id) FROM synth_big) AS big, "
                             "(SELECT count(*) FROM trips) AS points, (SELECT count(*) FROM mob_models()) AS models")
    assert tables == [{"big": 10000, "points": 123317, "models": 1}]
    # run again: the synthesis at step 4 would pass the budget (1.5 + 1.0 > 2.0): refused, nothing read or spent
    again = duckmob(tmp_path, "db.duckdb", "-f", str(SQL / "tour.sql"))
    assert again.returncode == 1
    assert again.stderr.startswith("Error: ") and again.stderr.count("\n") == 1 and "mob_set_budget" in again.stderr
    assert query(tmp_path, "SELECT count(*) AS n FROM mob_ledger()") == [{"n": 2}]


def test_pipeline(tmp_path):
    run_script(tmp_path, "pipeline.sql")
    assert (tmp_path / "density.png").read_bytes()[:8] == PNG
    page = (tmp_path / "release_report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<title>Release report: synth</title>" in page
    assert "beijing_pipeline" in page and 'class="banner"' not in page      # the public page: no owner's banner
    # every stage left its table
    stages = query(tmp_path, "SELECT list(table_name ORDER BY table_name) AS t FROM duckdb_tables() "
                             "WHERE table_name IN ('trips', 'budget', 'fitted_model', 'synth', 'quality', 'density', "
                             "'report', 'spend')")
    assert stages == [{"t": ["budget", "density", "fitted_model", "quality", "report", "spend", "synth", "trips"]}]
    model = query(tmp_path, "SELECT name, method, source, eps, delta FROM fitted_model")
    assert model == [{"name": "beijing_pipeline", "method": "privtrace", "source": "trips", "eps": 1.0, "delta": 0.0}]
    synth = query(tmp_path, f"SELECT count(DISTINCT traj_id) AS n, bool_and(lat BETWEEN {BEIJING[0]} AND {BEIJING[2]} "
                            f"AND lon BETWEEN {BEIJING[1]} AND {BEIJING[3]}) AS inside FROM synth")
    assert synth == [{"n": 1000, "inside": True}]
    quality = query(tmp_path, "SELECT count(*) AS n, bool_and(exact_not_private) AS exact, "
                              "bool_and(value IS NOT NULL AND reference IS NOT NULL) AS filled FROM quality")
    assert quality == [{"n": 6, "exact": True, "filled": True}]
    # the publishable report: no comparison section, the real table never read
    sections = query(tmp_path, "SELECT list(section ORDER BY section) AS s FROM report")
    assert sections == [{"s": ["guarantee", "not-covered", "notices", "pictures", "release", "statistics"]}]
    # one release, pure eps-DP: at delta 0 the spend is the exact sum of its Laplace parts, 1.0 of 2.0
    spend = query(tmp_path, "SELECT source, budget, spent, remaining, mechanism, model, seeded, status FROM spend")
    assert spend == [{"source": "trips", "budget": 2.0, "spent": pytest.approx(1.0), "remaining": pytest.approx(1.0),
                      "mechanism": "privtrace", "model": "beijing_pipeline", "seeded": False, "status": "spent"}]
    # run again: the model name is in use, refused before the fit reads anything; nothing more spent
    again = duckmob(tmp_path, "db.duckdb", "-f", str(SQL / "pipeline.sql"))
    assert again.returncode == 1 and again.stderr.startswith("Error: ") and "beijing_pipeline" in again.stderr
    assert query(tmp_path, "SELECT count(*) AS n, sum(epsilon) AS eps FROM mob_ledger()") == [
        {"n": 1, "eps": pytest.approx(1.0)}]


def test_roads(tmp_path):
    run_script(tmp_path, "roads.sql")
    assert (tmp_path / "sf_density.png").read_bytes()[:8] == PNG
    roads = query(tmp_path, "SELECT count(*) AS n, count(DISTINCT highway) > 5 AS classes FROM roads")
    assert roads == [{"n": 28609, "classes": True}]
    # every point on the roads the release used: the segments with an endpoint in the bbox, kept whole (Roads.clip),
    # so the few points walked onto the outer end of a street crossing the edge lie within that network's extent
    inside = f"lat BETWEEN {SF[0]} AND {SF[2]} AND lon BETWEEN {SF[1]} AND {SF[3]}"
    synth = query(tmp_path, f"""
        WITH used AS (FROM roads WHERE {inside.replace('lat', 'lat1').replace('lon', 'lon1')}
                                    OR {inside.replace('lat', 'lat2').replace('lon', 'lon2')}),
             extent AS (SELECT least(min(lat1), min(lat2)) AS lat0, greatest(max(lat1), max(lat2)) AS lat1,
                               least(min(lon1), min(lon2)) AS lon0, greatest(max(lon1), max(lon2)) AS lon1 FROM used)
        SELECT count(DISTINCT traj_id) > 1000 AS many, avg(({inside})::INT) > 0.999 AS inside,
               bool_and(lat BETWEEN lat0 AND lat1 AND lon BETWEEN lon0 AND lon1) AS on_used_roads
        FROM sf_synth, extent""")
    assert synth == [{"many": True, "inside": True, "on_used_roads": True}]
    # the release named its roads and their digest (docs/sql.md quotes the same digest of the shipped roads)
    ledger = query(tmp_path, "SELECT source, mechanism, params->>'roads' AS roads, params->>'roads_digest' AS digest "
                             "FROM mob_ledger()")
    assert len(ledger) == 1 and ledger[0]["digest"].startswith("d671e6183503")
    assert {k: ledger[0][k] for k in ("source", "mechanism", "roads")} == {
        "source": "sf_trips", "mechanism": "privtrace", "roads": "roads"}
    budget = query(tmp_path, "SELECT spent, remaining FROM mob_budget() WHERE source = 'sf_trips'")
    assert budget == [{"spent": pytest.approx(1.0), "remaining": pytest.approx(0.0, abs=1e-9)}]
