import pytest

import duckmob


@pytest.fixture
def con():
    c = duckmob.connect()
    yield c
    c.close()


GEOLIFE_BBOX = [39.8477, 116.1956, 40.1133, 116.4880]


@pytest.fixture(scope="module")
def fitted_sample():
    """A connection with the shipped GeoLife sample as ``trips`` (budget eps 100) and a PrivTrace model ``m``
    fitted on it at eps 1, seed 1 (one per test module)."""
    c = duckmob.connect()
    c.execute("CREATE TABLE trips AS FROM mob_geolife_sample()")
    c.execute("FROM mob_set_budget('trips', eps := 100, delta := 1e-5)").fetchall()
    c.execute(f"FROM mob_fit('trips', 'm', eps := 1.0, bbox := {GEOLIFE_BBOX}, seed := 1)").fetchall()
    yield c
    c.close()


SF_DOWNTOWN_BBOX = [37.76, -122.45, 37.80, -122.38]


@pytest.fixture(scope="session")
def sf_downtown():
    """The shipped San Francisco roads cut to the downtown box (public; read once per test session)."""
    from duckmob.roads import Roads

    c = duckmob.connect()
    roads = Roads.of(c.sql("FROM mob_sf_roads()").to_arrow_table()).cut(SF_DOWNTOWN_BBOX)
    c.close()
    return roads
