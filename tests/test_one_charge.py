"""One charge per request: a DuckDB relation runs its query again each time it is printed or fetched, so the same
request made again within a few minutes gets the same result back, charged once (release.registry.Recent)."""

import pytest

import duckmob
from duckmob import release

BBOX = [39.8477, 116.1956, 40.1133, 116.4880]


@pytest.fixture
def con():
    c = duckmob.connect()
    c.execute("CREATE TABLE trips AS FROM mob_geolife_sample() WHERE traj_id IN "
              "(SELECT DISTINCT traj_id FROM mob_geolife_sample() ORDER BY traj_id LIMIT 400)")
    c.execute("FROM mob_set_budget('trips', eps := 3.0, delta := 1e-5)").fetchall()
    yield c
    c.close()


def _releases(con):
    return con.sql("SELECT mechanism, status FROM mob_ledger()").fetchall()


def test_a_lazy_relation_printed_then_fetched_is_charged_once(con):
    rel = con.sql(f"FROM synthesize('trips', eps := 1.0, bbox := {BBOX}, n := 20)")
    shown = str(rel)                     # printing runs the query
    first, again = rel.fetchall(), rel.fetchall()
    assert _releases(con) == [("privtrace", "spent")]
    assert first == again and len({r[0] for r in first}) == 20
    assert str(first[0][0]) in shown
    count = con.sql("FROM mob_noisy_count('trips', eps := 0.5)")
    str(count)
    assert count.fetchall() == count.fetchall()
    assert _releases(con) == [("privtrace", "spent"), ("count(trajectories)", "spent")]


def test_the_python_api_answers_the_same_request_with_the_same_release(con):
    a = duckmob.synthesize(con, "trips", eps=1.0, bbox=BBOX, n=15)
    b = duckmob.synthesize(con, "trips", eps=1.0, bbox=BBOX, n=15)
    assert a.equals(b) and len(_releases(con)) == 1
    # another request (another eps, another n, a seed) is another release
    duckmob.synthesize(con, "trips", eps=0.5, bbox=BBOX, n=15)
    duckmob.synthesize(con, "trips", eps=0.5, bbox=BBOX, n=15, seed=3)
    assert len(_releases(con)) == 3


def test_past_the_window_the_same_request_is_a_new_release(con, monkeypatch):
    db = release.database(con)
    duckmob.noisy_count(con, "trips", eps=0.5)
    monkeypatch.setattr(db.recent, "WINDOW", 0.0)
    duckmob.noisy_count(con, "trips", eps=0.5)
    assert len(_releases(con)) == 2


def test_a_refused_request_is_not_remembered(con):
    with pytest.raises(duckmob.BudgetError):
        duckmob.noisy_count(con, "trips", eps=5.0)
    con.execute("FROM mob_set_budget('trips', eps := 10.0, delta := 1e-5)").fetchall()
    duckmob.noisy_count(con, "trips", eps=5.0)
    assert _releases(con) == [("count(trajectories)", "spent")]   # refused before anything was reserved


def test_a_request_over_changed_data_is_a_new_release(con):
    # the cache key holds a version of what the release reads: any write makes the same request a new release
    count = "FROM mob_noisy_count('trips', eps := 0.1)"
    first = con.sql(count).fetchall()
    assert con.sql(count).fetchall() == first and len(_releases(con)) == 1
    con.execute("INSERT INTO trips SELECT * FROM trips")                   # doubled
    doubled = con.sql(count).fetchall()
    assert doubled != first and len(_releases(con)) == 2
    con.execute("UPDATE trips SET lat = lat + 1e-9")   # a column a count does not read: the same release
    assert con.sql(count).fetchall() == doubled and len(_releases(con)) == 2
    con.execute("UPDATE trips SET user_id = user_id + 1000 WHERE traj_id = (SELECT min(traj_id) FROM trips)")
    con.sql(count).fetchall()
    assert len(_releases(con)) == 3
    con.execute("CREATE OR REPLACE TABLE trips AS FROM mob_geolife_sample() LIMIT 300")   # dropped, other data
    con.sql(count).fetchall()
    assert len(_releases(con)) == 4
    # another column mapping reads other values: a release of its own, with its own ledger row
    con.sql("FROM mob_noisy_count('trips', eps := 0.1, traj_col := 'user_id')").fetchall()
    assert len(_releases(con)) == 5


def test_another_connections_temporary_table_gets_its_own_release(con):
    con.execute("CREATE TEMP TABLE tt AS FROM trips")
    con.execute("FROM mob_set_budget('tt', eps := 3.0, delta := 1e-5)").fetchall()
    count = "FROM mob_noisy_count('tt', eps := 0.1)"
    mine = con.sql(count).fetchall()
    assert con.sql(count).fetchall() == mine and len(_releases(con)) == 1
    other = con.cursor()
    duckmob.register(other)
    other.execute("CREATE TEMP TABLE tt AS FROM trips LIMIT 100")
    theirs = other.sql(count).fetchall()
    assert theirs != mine and len(_releases(con)) == 2
    other.close()


def test_the_cache_switch_makes_every_request_a_new_release(con, monkeypatch):
    monkeypatch.setenv("DUCKMOB_RELEASE_CACHE", "off")
    count = "FROM mob_noisy_count('trips', eps := 0.1)"
    con.sql(count).fetchall()
    con.sql(count).fetchall()
    assert _releases(con) == [("count(trajectories)", "spent")] * 2
