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


def _label_boxes(fig):
    """The drawn x tick labels of both panels, as (left, right) pixel spans in figure order."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    spans = []
    for ax in fig.axes[:2]:
        for label in ax.get_xticklabels():
            if label.get_visible() and label.get_text():
                box = label.get_window_extent(renderer)
                spans.append((box.x0, box.x1))
    return sorted(spans)


@pytest.mark.parametrize("box, least", [([37.70, -122.52, 37.83, -122.35], 3),        # all SF: overlapped by 45 px
                                        ([37.70, -122.52, 37.81, -122.36], 3),        # by 1 px
                                        ([37.76, -122.45, 37.80, -122.38], 5),        # downtown: edges on round degrees
                                        ([37.77, -122.43, 37.79, -122.40], 3),
                                        ([39.8477, 116.1956, 40.1133, 116.4880], 4)])  # Beijing (the sample)
def test_longitude_labels_never_overlap(box, least):
    """Issue 40: on the SF box the left panel's last longitude label ran into the right panel's first, and
    matplotlib's default ticks crowded narrow panels (45 px of overlap on the whole city's box)."""
    import numpy as np

    from duckmob.metrics import load_side
    from duckmob.metrics.plots import density_figure, longitude_ticks

    rng = np.random.default_rng(0)
    lat = rng.uniform(box[0], box[2], 400)
    lon = rng.uniform(box[1], box[3], 400)
    side = load_side(pa_points(lat, lon), box, "real")[0]
    fig = density_figure(side, side, 32)
    spans = _label_boxes(fig)
    assert len(spans) >= 2 * least
    gaps = [b[0] - a[1] for a, b in zip(spans, spans[1:])]
    assert min(gaps) > 5, gaps                     # pixels between neighbouring labels, across the panels too
    ticks, labels = longitude_ticks(box[1], box[3], 6.9)
    assert all(box[1] < t < box[3] for t in ticks)
    if box[1] == -122.45:        # a 6.9 inch panel: every 0.01 degree but the two edges
        assert ticks == pytest.approx([-122.44, -122.43, -122.42, -122.41, -122.40, -122.39])
        assert labels[0] == "\u2212122.44"


def pa_points(lat, lon):
    import numpy as np
    import pyarrow as pa

    n = len(lat)
    return pa.table({"traj_id": np.arange(n) // 4, "ts": pa.array(np.datetime64("2024-05-01T08:00")
                                                                  + np.arange(n) * np.timedelta64(30, "s")),
                     "lat": lat, "lon": lon})
