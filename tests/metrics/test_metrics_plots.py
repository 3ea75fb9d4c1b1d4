"""mob_plot_density and mob_plot_distributions write readable PNGs and return their paths."""

from __future__ import annotations

import duckdb
import pytest

import duckmob

from metrics_helpers import BBOX, city, real_and_synth, table


@pytest.fixture
def con():
    c = duckmob.connect()
    real_and_synth(c)
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


def test_density_compares_shares_not_counts():
    # The synthetic table is the real one repeated 25 times (50 trajectories vs 2): raw counts would make it 25
    # times brighter; on shares the two panels are the same image.
    import numpy as np

    from duckmob.metrics import load_side
    from duckmob.metrics.plots import density_figure

    paths = [[(10, 10), (10, 11), (11, 11), (12, 13)], [(20, 5), (20, 6), (21, 6)]]
    real = load_side(table(paths), BBOX, "real")[0]
    repeated = load_side(table(paths * 25), BBOX, "synth")[0]
    assert repeated.n == 25 * real.n
    fig = density_figure(real, repeated, w=32)
    left, right = (ax.images[0] for ax in fig.axes[:2])
    assert np.array_equal(left.get_array().mask, right.get_array().mask)
    assert np.array_equal(left.to_rgba(left.get_array()), right.to_rgba(right.get_array()))
    assert left.get_array().sum() == pytest.approx(1.0)   # each panel is a distribution over cells
    # Against itself the real panel gives exactly the same pixels: the repeated table is indistinguishable.
    alone = density_figure(real, real, w=32).axes[0].images[0]
    assert np.array_equal(alone.to_rgba(alone.get_array()), left.to_rgba(left.get_array()))


def test_density_panels_keep_the_bbox_shape_in_metres(tmp_path):
    # The test box is square in degrees, about 0.77 as wide as tall in metres at 40 N: so is each panel.
    from duckmob.metrics import load_side
    from duckmob.metrics.common import bbox_sides_m
    from duckmob.metrics.plots import density_figure

    side = load_side(table(city()), BBOX, "real")[0]
    fig = density_figure(side, side, w=32)
    fig.canvas.draw()
    ns_m, ew_m = bbox_sides_m(BBOX)
    for ax in fig.axes[:2]:
        box = ax.get_window_extent()
        assert box.width / box.height == pytest.approx(ew_m / ns_m, rel=0.02)
