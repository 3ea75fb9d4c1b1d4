"""mob_plot_density and mob_plot_distributions write readable PNGs and return their paths."""

from __future__ import annotations

import duckdb
import pytest

import duckmob

from evaluate_helpers import BBOX, city, table


@pytest.fixture
def con():
    c = duckmob.connect()
    c.register("r", table(city()))
    c.register("s", table(city(seed=4), with_time=False))
    c.execute("CREATE TEMP TABLE real AS FROM r; CREATE TEMP TABLE synth AS FROM s")
    yield c
    c.close()


def _is_png(path):
    with open(path, "rb") as f:
        return f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plots_write_pngs_and_return_their_paths(con, tmp_path):
    target = tmp_path / "density.png"
    (path,) = con.execute(f"FROM mob_plot_density('real', 'synth', path := '{target}', bbox := {BBOX}, w := 32)"
                      ).fetchone()
    assert path == str(target) and _is_png(path) and target.stat().st_size > 10_000
    target = tmp_path / "dist.png"
    (path,) = con.execute(f"FROM mob_plot_distributions('real', 'synth', path := '{target}', bbox := {BBOX})"
                      ).fetchone()
    assert path == str(target) and _is_png(path)


def test_plot_errors_are_clear(con, tmp_path):
    with pytest.raises(duckdb.Error, match="does not exist"):
        con.sql(f"FROM mob_plot_density('real', 'synth', path := '{tmp_path}/no/d.png', bbox := {BBOX})").fetchall()
    with pytest.raises(duckdb.Error, match="ending in .png"):
        con.sql(f"FROM mob_plot_density('real', 'synth', path := '{tmp_path}/d.jpg', bbox := {BBOX})").fetchall()
