"""A database with one release on the shipped GeoLife sample, shared by the report tests: ``trips`` (budget eps
2, delta 1e-5), ``synth`` (synthesize, eps 1, seed 7: ledger id 1), model ``m`` (mob_fit, eps 0.5, seed 7: ledger
id 2) and ``drawn`` (mob_sample of it, 600 trajectories, seed 3)."""

from __future__ import annotations

import re

import duckmob

BBOX = [39.8477, 116.1956, 40.1133, 116.4880]
BOX_SQL = "[39.8477, 116.1956, 40.1133, 116.4880]"
SECTIONS = ["release", "guarantee", "not-covered", "statistics", "notices", "pictures"]


def released(path: str) -> str:
    """Write the database at ``path`` (a .duckdb file) and return it."""
    con = duckmob.connect(path)
    con.execute("CREATE TABLE trips AS FROM mob_geolife_sample()")
    con.sql("FROM mob_set_budget('trips', eps := 2.0, delta := 1e-5)").fetchall()
    con.execute(f"CREATE TABLE synth AS FROM synthesize('trips', eps := 1.0, bbox := {BOX_SQL}, seed := 7)")
    con.sql(f"FROM mob_fit('trips', 'm', eps := 0.5, bbox := {BOX_SQL}, seed := 7)").fetchall()
    con.execute("CREATE TABLE drawn AS FROM mob_sample('m', n := 600, seed := 3)")
    con.close()
    return path


def without_time(html: str) -> str:
    """The page without the moment it was written (its footer)."""
    return re.sub(r"<footer>.*?</footer>", "", html)
