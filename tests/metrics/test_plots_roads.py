"""mob_plot_density(..., roads := 'table'): the public road segments drawn under both panels."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

import duckmob

from metrics_helpers import BBOX, city, real_and_synth, table

# Three straight streets of the 32 x 32 test grid (0.01 degree cells) and one segment wholly outside the bbox.
SEGMENTS = [(40.05, 116.01, 40.05, 116.31),    # an east-west street
            (40.01, 116.15, 40.31, 116.15),    # a north-south street
            (40.10, 116.10, 40.20, 116.20),    # a diagonal
            (41.00, 117.00, 41.10, 117.10)]    # outside: not drawn


@pytest.fixture
def con():
    c = duckmob.connect()
    real_and_synth(c)
    values = ", ".join(f"({a}, {b}, {c_}, {d}, 'primary')" for a, b, c_, d in SEGMENTS)
    c.execute(f"CREATE TEMP TABLE streets AS FROM (VALUES {values}) t(lat1, lon1, lat2, lon2, highway)")
    yield c
    c.close()


def _pixels(path):
    import matplotlib.image

    return matplotlib.image.imread(path)


def _plot(con, path, roads=None):
    extra = "" if roads is None else f", roads := '{roads}'"
    (got,) = con.execute(f"FROM mob_plot_density('real', 'synth', path := '{path}', bbox := {BBOX}, w := 32{extra})"
                         ).fetchone()
    return got


def test_roads_are_drawn_and_change_the_png(con, tmp_path):
    plain = _plot(con, tmp_path / "plain.png")
    again = _plot(con, tmp_path / "again.png", roads=None)
    streets = _plot(con, tmp_path / "streets.png", roads="streets")
    assert streets == str(tmp_path / "streets.png")
    with open(streets, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    a, b, c = _pixels(plain), _pixels(again), _pixels(streets)
    assert np.array_equal(a, b)          # without roads: the picture as before, pixel for pixel
    assert a.shape == c.shape            # the same layout, panels the same size ...
    assert (np.abs(a - c).max(axis=-1) > 0.05).mean() > 0.01   # ... but other pixels: the streets and the cells


def test_the_figure_holds_one_line_per_segment_in_the_box_under_the_cells():
    from matplotlib.collections import LineCollection

    from duckmob.metrics import load_side
    from duckmob.metrics.plots import ROAD_COLOUR, density_figure
    from duckmob.roads import Roads

    side = load_side(table(city()), BBOX, "real")[0]
    roads = Roads.from_arrays(*np.array(SEGMENTS).T)
    plain = density_figure(side, side, w=32)
    fig = density_figure(side, side, w=32, roads=roads)
    assert not any(isinstance(c, LineCollection) for ax in plain.axes[:2] for c in ax.collections)
    for ax in fig.axes[:2]:
        (lines,) = [c for c in ax.collections if isinstance(c, LineCollection)]
        segs = lines.get_segments()
        assert len(segs) == 3            # the segment outside the bbox is left out
        # drawn as (lon, lat), endpoints exactly the table's
        assert np.allclose(segs[0], [[116.01, 40.05], [116.31, 40.05]])
        assert lines.get_zorder() < ax.images[0].get_zorder()   # under the cells
        assert np.allclose(lines.get_colors()[0][:3], [int(ROAD_COLOUR[i:i + 2], 16) / 255 for i in (1, 3, 5)])
        # the panel still spans exactly the bbox
        assert ax.get_xlim() == (BBOX[1], BBOX[3]) and ax.get_ylim() == (BBOX[0], BBOX[2])


def test_the_shipped_sf_roads_named_by_a_table_function(tmp_path):
    # Any FROM item names the roads: here mob_sf_roads(), under trips drawn along those same roads (seeded).
    import pyarrow as pa

    from duckmob.roads import Roads, sample_along

    con = duckmob.connect()
    roads = Roads.of(con.sql("FROM mob_sf_roads()").to_arrow_table())
    rng = np.random.default_rng(5)
    _, _, lat, lon = sample_along(roads, 600, rng)
    ts = pa.array(np.datetime64("2024-05-01T08:00") + (np.arange(600) % 6) * np.timedelta64(30, "s"))
    con.register("pts", pa.table({"traj_id": np.arange(600) // 6, "ts": ts, "lat": lat, "lon": lon}))
    con.execute("CREATE TEMP TABLE real AS FROM pts; CREATE TEMP TABLE synth AS FROM pts")
    box = [37.76, -122.45, 37.80, -122.38]
    paths = []
    for name, extra in (("plain", ""), ("sf", ", roads := 'mob_sf_roads()'")):
        (got,) = con.execute(f"FROM mob_plot_density('real', 'synth', path := '{tmp_path / name}.png', "
                             f"bbox := {box}, w := 64{extra})").fetchone()
        paths.append(got)
    plain, sf = _pixels(paths[0]), _pixels(paths[1])
    assert plain.shape == sf.shape and (np.abs(plain - sf).max(axis=-1) > 0.05).mean() > 0.05
    con.close()


def test_bad_roads_are_refused_in_one_line(con, tmp_path):
    con.execute("CREATE TEMP TABLE no_roads AS SELECT * FROM streets WHERE false")
    with pytest.raises(duckdb.Error, match=r"roads := 'no_roads' has no segment; give a roads table"):
        _plot(con, tmp_path / "d.png", roads="no_roads")
    con.execute("CREATE TEMP TABLE nan_roads AS SELECT lat1, lon1, 'x' AS lat2, lon2 FROM streets")
    with pytest.raises(duckdb.Error, match=r"column lat2 is NULL in row 0"):
        _plot(con, tmp_path / "d.png", roads="nan_roads")
    con.execute("CREATE TEMP TABLE points_only AS SELECT lat1 AS lat, lon1 AS lon FROM streets")
    with pytest.raises(duckdb.Error, match=r"lat1"):
        _plot(con, tmp_path / "d.png", roads="points_only")
