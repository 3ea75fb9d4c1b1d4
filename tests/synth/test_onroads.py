"""roads := 'table': every synthetic point on the public road network, the network recorded with the release, and a
network built from the sensitive table refused (issue 39, first part: placement; the release on the roads comes
next)."""

import json

import duckdb
import numpy as np
import pytest

import duckmob
from duckmob.roads import Roads, snap

BBOX = "[37.76, -122.45, 37.80, -122.38]"


@pytest.fixture(scope="module")
def con():
    c = duckmob.connect()
    # trips that wander over the box, water included: placement must still put every point on a road
    c.execute("""CREATE TABLE trips AS SELECT range // 20 AS traj_id, range // 400 AS user_id,
        TIMESTAMP '2024-01-01' + INTERVAL (range * 30) SECOND AS ts, 37.78 + 0.02 * sin(range / 7.0) AS lat,
        -122.415 + 0.035 * cos(range / 11.0) AS lon FROM range(8000)""")
    c.execute("CREATE TABLE roads AS FROM mob_sf_roads()")
    c.execute("FROM mob_set_budget('trips', eps := 20, delta := 1e-5)").fetchall()
    yield c
    c.close()


def _distances(con, rows) -> np.ndarray:
    roads = Roads.of(con.sql("FROM roads").to_arrow_table())
    return snap(roads, rows.column("lat").to_numpy(), rows.column("lon").to_numpy())[4]


def test_every_synthetic_point_lies_on_a_road_and_the_roads_are_recorded(con):
    rows = con.sql(f"FROM synthesize('trips', eps := 1, bbox := {BBOX}, roads := 'roads', seed := 3)").to_arrow_table()
    assert rows.num_rows > 1000 and _distances(con, rows).max() < 1e-3   # metres
    plain = con.sql(f"FROM synthesize('trips', eps := 1, bbox := {BBOX}, seed := 3)").to_arrow_table()
    assert np.median(_distances(con, plain)) > 1.0                         # without roads: off the roads
    params = [json.loads(p) for (p,) in con.sql("SELECT params FROM mob_ledger()").fetchall()]
    digest = Roads.of(con.sql("FROM roads").to_arrow_table()).clip(json.loads(BBOX)).digest
    assert params[0]["roads"] == "roads" and params[0]["roads_digest"] == digest and "roads" not in params[1]


def test_a_stored_model_samples_on_its_roads_and_refuses_changed_roads(con):
    con.sql(f"FROM mob_fit('trips', 'on_roads', eps := 1, bbox := {BBOX}, roads := 'roads')").fetchall()
    rows = con.sql("FROM mob_sample('on_roads', n := 50, seed := 1)").to_arrow_table()
    assert _distances(con, rows).max() < 1e-3
    con.execute("CREATE TABLE roads_copy AS FROM roads")
    con.execute("DELETE FROM roads WHERE rowid % 3 = 0")
    with pytest.raises(duckdb.Error, match="the roads table 'roads' changed since model 'on_roads' was fitted"):
        con.sql("FROM mob_sample('on_roads', n := 50)").fetchall()
    con.execute("CREATE OR REPLACE TABLE roads AS FROM roads_copy")
    assert con.sql("SELECT count(*) FROM mob_sample('on_roads', n := 5, seed := 1)").fetchall()[0][0] > 0


def test_roads_built_from_the_sensitive_table_are_refused_before_anything_is_spent(con):
    spent = con.sql("SELECT count(*) FROM mob_ledger()").fetchall()
    con.execute("CREATE VIEW traced AS SELECT lat AS lat1, lon AS lon1, lat + 1e-4 AS lat2, lon AS lon2 FROM trips")
    for roads in ("trips", "traced"):
        with pytest.raises(duckdb.Error, match="a road network built from the sensitive data is not public"):
            con.sql(f"FROM synthesize('trips', eps := 1, bbox := {BBOX}, roads := '{roads}')").fetchall()
    assert con.sql("SELECT count(*) FROM mob_ledger()").fetchall() == spent


def test_privtrace_releases_its_fine_density_on_the_road_cells_only(con):
    # the support is public (the cells the roads pass); Laplace on each of its cells, none elsewhere
    from duckmob.roads import cells_on
    from duckmob.synth import store

    con.sql(f"FROM mob_fit('trips', 'fine_on_roads', eps := 2, bbox := {BBOX}, roads := 'roads')").fetchall()
    _, model = store.load(con, "fine_on_roads")
    w = model.fine.w
    on = np.zeros(w * w, dtype=bool)
    on[cells_on(Roads.of(con.sql("FROM roads").to_arrow_table()), json.loads(BBOX), w)] = True
    density = np.asarray(model.fine.density).reshape(-1)
    assert (density[~on] == 0).all() and (density[on] > 0).any() and (~on).sum() > 0


def test_the_road_support_drops_mass_off_it_and_keeps_the_sensitivity():
    from duckmob.privacy.noise import NoiseSource
    from duckmob.synth.placement import release_statistics
    from duckmob.synth.placement.releases import statistics
    from duckmob.trajectories import from_points
    import pyarrow as pa

    bbox = [0.0, 0.0, 0.004, 0.004]                       # about 440 m a side, a 4 x 4 fine grid
    pts = pa.table({"traj_id": [1, 1, 1, 2, 2], "ts": pa.array([0, 1, 2, 0, 1], pa.timestamp("s")),
                    "lat": [0.0005, 0.0005, 0.0035, 0.0035, 0.0035], "lon": [0.0005, 0.0015, 0.0015, 0.0005, 0.0035]})
    data = from_points(pts, bbox=bbox)[0]
    scales = {"density": 1.0}
    support = np.array([0, 1, 5], dtype=np.int64)       # cells (0,0), (0,1), (1,1)
    full = statistics(data, bbox, 4, scales, support=None)["fine_density"]
    part = statistics(data, bbox, 4, scales, support=support)["fine_density"]
    assert len(part) == 3 and (part == full[support]).all() and part.sum() < full.sum()
    seen = []

    class Recording(NoiseSource):
        def laplace(self, scale, size):
            seen.append(size)
            return super().laplace(scale, size)

    stats = release_statistics({"fine_density": part}, 4, scales, Recording(1), support=support)
    off = np.setdiff1d(np.arange(16), support)
    assert seen == [3] and (np.asarray(stats.density).reshape(-1)[off] == 0).all()


def test_a_temporary_table_released_with_roads_is_placed_on_them(con):
    # the gathered path (a TEMP table's rows reach the release as lists): the same roads rule
    con.execute("CREATE TEMP TABLE tmp_trips AS FROM trips")
    con.execute("FROM mob_set_budget('tmp_trips', eps := 5, delta := 1e-5)").fetchall()
    rows = con.sql(f"FROM synthesize('tmp_trips', eps := 1, bbox := {BBOX}, roads := 'roads', n := 30, seed := 2)"
                   ).to_arrow_table()
    assert rows.num_rows > 0 and _distances(con, rows).max() < 1e-3
    with pytest.raises(duckdb.Error, match="a road network built from the sensitive data is not public"):
        con.sql(f"FROM synthesize('tmp_trips', eps := 1, bbox := {BBOX}, roads := 'trips', n := 5)").fetchall()
