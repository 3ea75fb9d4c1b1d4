"""A first release scans its table once (issue 42, item 1): the content version that the repeated-request cache
keeps is computed by the fit's own scan over the rows it keeps (source.table.read_points with on_version), equal
to the version a later request computes on its own (source.table.content_version through the same point filter);
a first request computes none of its own."""

import tempfile

import duckdb
import pytest

import duckmob
from duckmob.release import inputs, tables
from duckmob.source import table as stream
from duckmob.source.schema import select_sql

BBOX = [39.8477, 116.1956, 40.1133, 116.4880]


@pytest.fixture(scope="module")
def points():
    c = duckdb.connect()
    c.execute("CREATE TABLE t AS FROM 'duckmob/data/geolife_sample.parquet' WHERE traj_id IN "
              "(SELECT DISTINCT traj_id FROM 'duckmob/data/geolife_sample.parquet' ORDER BY traj_id LIMIT 300)")
    # rows the point filter drops: no traj_id, no lat, outside the bbox
    c.execute("INSERT INTO t (traj_id, user_id, ts, lat, lon) VALUES (NULL, 1, TIMESTAMP '2008-01-01', 40, 116.3), "
              "(7, 1, TIMESTAMP '2008-01-01', NULL, 116.3), (7, 1, TIMESTAMP '2008-01-02', 10.0, 10.0)")
    yield c
    c.close()


def _select(con):
    names = {c: c for c in ("traj_id", "user_id", "ts", "lat", "lon")} | {"seq": None}
    return select_sql("t", names)


@pytest.mark.parametrize("bucket_points", [1 << 30, 3000])
def test_the_scan_gives_the_content_version_and_the_same_buckets(points, bucket_points):
    query = _select(points)
    got = []
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        plain = list(stream.read_points(points, query, bucket_points=bucket_points, folder=a, bbox=BBOX))
        versioned = list(stream.read_points(points, query, bucket_points=bucket_points, folder=b, bbox=BBOX,
                                            on_version=got.append))
    assert len(plain) == len(versioned) == stream.n_buckets(points.sql("SELECT count(*) FROM t").fetchall()[0][0],
                                                            bucket_points)
    for x, y in zip(plain, versioned):
        assert x.schema == y.schema and x.equals(y)       # the same points, in the same order
    where = stream.point_filter(BBOX, False)
    kept = points.sql(f"SELECT count(*) FROM ({query}) WHERE {where}").fetchall()[0][0]
    assert got == [stream.content_version(points, query, where)] and got[0][0] == kept
    assert sum(t.num_rows for t in plain) == kept <= points.sql("SELECT count(*) FROM t").fetchall()[0][0] - 3
    assert stream.content_version(points, query) != got[0]   # all rows: another version


@pytest.fixture
def con():
    c = duckmob.connect()
    c.execute("CREATE TABLE trips AS FROM mob_geolife_sample() WHERE traj_id IN "
              "(SELECT DISTINCT traj_id FROM mob_geolife_sample() ORDER BY traj_id LIMIT 300)")
    c.execute("FROM mob_set_budget('trips', eps := 10.0, delta := 1e-5)").fetchall()
    yield c
    c.close()


def test_a_first_synthesize_scans_no_version_and_a_repeat_is_one_release(con, monkeypatch):
    calls = []
    version = stream.content_version
    for module in (inputs, tables):   # a relation's version, whole or through the release's point filter
        monkeypatch.setattr(module, "content_version", lambda *a: calls.append(1) or version(*a))
    query = f"FROM synthesize('trips', eps := 1.0, bbox := {BBOX}, n := 20, seed := 4)"
    first = con.sql(query).fetchall()
    assert calls == [] and len(con.sql("FROM mob_ledger()").fetchall()) == 1
    assert con.sql(query).fetchall() == first                      # the kept release: charged once
    assert calls == [1] and len(con.sql("FROM mob_ledger()").fetchall()) == 1
    con.execute("UPDATE trips SET lat = lat + 1e-6 WHERE traj_id = (SELECT min(traj_id) FROM trips)")
    changed = con.sql(query).fetchall()                             # other rows: a new release
    assert len(con.sql("FROM mob_ledger()").fetchall()) == 2
    assert con.sql(query).fetchall() == changed and len(con.sql("FROM mob_ledger()").fetchall()) == 2
    # a row the release's point filter drops (outside the bbox) changes nothing it reads: the same release
    con.execute("INSERT INTO trips (traj_id, user_id, ts, lat, lon) VALUES (1, 1, TIMESTAMP '2008-01-01', 10, 10)")
    assert con.sql(query).fetchall() == changed and len(con.sql("FROM mob_ledger()").fetchall()) == 2
