"""``FROM mob_beijing_roads()``: the central Beijing roads shipped inside the package (OpenStreetMap 2013, ODbL,
duckmob/data/ROADS_README.md) cover the demo's box and lie where the shipped GeoLife sample's fixes are."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from duckmob import api
from duckmob import roads as R
from duckmob.demo import HRNET_BBOX
from duckmob.grid import BBox
from duckmob.samples import sample_path

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def con():
    c = api.connect()
    yield c
    c.close()


@pytest.fixture(scope="module")
def beijing(con):
    return R.Roads.of(con.sql("FROM mob_beijing_roads()").to_arrow_table())


def test_is_the_shipped_table(con, beijing):
    table = con.sql("FROM mob_beijing_roads()").to_arrow_table()
    assert table.column_names == ["lat1", "lon1", "lat2", "lon2", "highway"]
    assert table.num_rows == len(beijing) == 62_325                       # no zero-length segment among them
    assert round(float(beijing.length_m.sum()) / 1000) == 5_448
    assert set(beijing.highway) <= set(R.DRIVABLE) and "service" in set(beijing.highway)
    assert "roads_beijing_central.parquet" in con.execute("SELECT _mob_beijing_roads_path()").fetchone()[0]


def test_every_segment_touches_the_demo_box_and_the_roads_reach_its_edges(beijing):
    box = BBox.of(HRNET_BBOX)
    assert (box.contains(beijing.lat1, beijing.lon1) | box.contains(beijing.lat2, beijing.lon2)).all()
    lat = np.concatenate([beijing.lat1, beijing.lat2])
    lon = np.concatenate([beijing.lon1, beijing.lon2])
    assert lat.min() < box.min_lat and lon.min() < box.min_lon and lon.max() > box.max_lon
    assert 40.095 < lat.max() < 40.097                                    # the 2013 extract's northern edge


def test_the_shipped_sample_lies_on_them(con, beijing):
    # public points on public roads: a check of the extract's georeferencing (ROADS_README.md), not a fit
    lat, lon = con.execute("SELECT lat, lon FROM read_parquet(?) WHERE lat BETWEEN 39.85 AND 40.05 AND lon BETWEEN "
                           "116.2 AND 116.5 ORDER BY user_id, traj_id, ts", [sample_path()]).fetchnumpy().values()
    pick = np.random.default_rng(0).choice(len(lat), 5_000, replace=False)
    d = R.snap(beijing, lat[pick], lon[pick])[4]
    assert 5.0 < np.median(d) < 11.0 and np.percentile(d, 25) < 5.0
    shifted = R.Roads.from_arrays(beijing.lat1, beijing.lon1 + 0.001, beijing.lat2, beijing.lon2 + 0.001)
    assert np.median(R.snap(shifted, lat[pick], lon[pick])[4]) > 2 * np.median(d)   # 85 m off is seen


def test_the_build_script_reads_ways_and_their_planar_coordinates():
    spec = importlib.util.spec_from_file_location("build", ROOT / "benchmarks" / "roads_geolife_network.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    osm_data = "2\n3\t1\n0.0 0.0\n85.276 0.0\n85.276 119.4\n2\t0\n0.0 11.94\n8.5276 11.94\n"
    highway = "3\tprimary\t1\tChang'an Jie\t80\n2\tfootway\t0\t\t60\n"
    lat1, lon1, lat2, lon2, hw = build.segments(osm_data, highway)
    assert hw.tolist() == ["primary", "primary", "footway"]               # no segment joins two ways
    np.testing.assert_allclose(np.c_[lat1, lon1, lat2, lon2],
                               [[39.0, 116.0, 39.0, 117.0], [39.0, 117.0, 40.0, 117.0], [39.1, 116.0, 39.1, 116.1]])
