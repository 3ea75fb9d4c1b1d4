"""The SQL surface of the foundation: macros, table functions and their error messages."""

import duckdb
import pytest

import duckmob
from duckmob.demo import load_sample
from duckmob.errors import one_line

BOX = "[39.0, 115.0, 41.0, 117.0]"


@pytest.fixture
def trips(con):
    con.execute("""CREATE TABLE trips AS SELECT * FROM (VALUES
        (1, 10, TIMESTAMP '2020-01-01 08:00', 40.0, 116.0),
        (1, 10, TIMESTAMP '2020-01-01 08:40', 40.0001, 116.0),
        (1, 10, TIMESTAMP '2020-01-01 08:50', 40.6, 116.6),
        (2, 11, TIMESTAMP '2020-01-01 09:00', 39.2, 115.2),
        (2, 11, TIMESTAMP '2020-01-01 09:10', 39.7, 115.2)) t(traj_id, user_id, ts, lat, lon)""")
    return con


def err(con, sql):
    with pytest.raises(duckdb.Error) as info:
        con.execute(sql).fetchall()
    return one_line(info.value)


def test_register_is_idempotent(con):
    duckmob.register(con)
    duckmob.register(con)
    assert con.execute(f"SELECT mob_cell(40.2, 116.9, {BOX}, 4)").fetchone()[0] == 2 * 4 + 3


def test_scalar_macros(con):
    row = con.execute(f"""SELECT mob_cell(41.0, 117.0, {BOX}, 4), mob_cell(38.0, 116.0, {BOX}, 4),
        mob_parent(15, 4, 1), mob_children(3, 1), mob_cell_center(5, {BOX}, 4),
        mob_cell_bounds(5, {BOX}, 4).max_lat, mob_time_slot(TIMESTAMP '2020-01-01 12:00', 4)""").fetchone()
    assert row[0] == 15 and row[1] is None and row[2] == 3
    assert row[3] == [10, 11, 14, 15]
    assert row[4] == {"lat": 39.75, "lon": 115.75} and row[5] == 40.0 and row[6] == 2


def test_mob_cell_matches_python_grid(con):
    from duckmob.grid import cell_of
    rows = con.execute(f"""SELECT lat, lon, mob_cell(lat, lon, {BOX}, 32) FROM
        (SELECT 39 + random() * 2 AS lat, 115 + random() * 2 AS lon FROM range(5000))""").fetchall()
    lat, lon, cell = zip(*rows)
    assert list(cell) == cell_of(lat, lon, [39, 115, 41, 117], 32).tolist()


def test_cell_sequences_and_staypoints(trips):
    seqs = trips.execute(f"FROM mob_cell_sequences('trips', bbox := {BOX}, w := 4) ORDER BY traj_id").fetchall()
    assert [(r[0], r[1], r[2]) for r in seqs] == [(1, 10, [10, 15]), (2, 11, [0, 4])]
    stays = trips.execute("FROM mob_staypoints('trips')").fetchall()
    assert len(stays) == 1 and stays[0][0] == 1 and stays[0][1] == 0
    # without stay points every fix counts
    raw = trips.execute(f"FROM mob_cell_sequences('trips', bbox := {BOX}, w := 4, stay_points := false) "
                        "ORDER BY traj_id").fetchall()
    assert raw[0][2] == [10, 15]


def test_column_mapping_and_queries(trips):
    trips.execute("CREATE VIEW renamed AS SELECT traj_id AS tid, ts AS t, lat AS y, lon AS x FROM trips")
    rows = trips.execute(f"FROM mob_cell_sequences('renamed', bbox := {BOX}, w := 4, traj_col := 'tid', "
                         "ts_col := 't', lat_col := 'y', lon_col := 'x') ORDER BY traj_id").fetchall()
    assert [r[2] for r in rows] == [[10, 15], [0, 4]] and rows[0][1] is None  # no user column: NULL user
    rows = trips.execute(f"FROM mob_cell_sequences('(SELECT * FROM trips WHERE traj_id = 2)', bbox := {BOX}, "
                         "w := 4)").fetchall()
    assert len(rows) == 1


def test_input_table_untouched(trips):
    before = trips.execute("SELECT * FROM trips ORDER BY ALL").fetchall()
    trips.execute("FROM mob_cell_sequences('trips', bbox := [39.5, 115.0, 41.0, 117.0], outside := 'drop')").fetchall()
    assert trips.execute("SELECT * FROM trips ORDER BY ALL").fetchall() == before


def test_error_messages(trips):
    assert "outside the bounding box" in err(trips, "FROM mob_cell_sequences('trips', bbox := [39.5, 115.0, 41.0, 117.0])")
    assert "is not [min_lat, min_lon, max_lat, max_lon]" in err(trips, "FROM mob_cell_sequences('trips', bbox := [41, 115, 39, 117])")
    assert "a bounding box is required" in err(trips, "FROM mob_cell_sequences('trips')")
    assert "not TIMESTAMP" in err(trips, "FROM mob_staypoints('trips', ts_col := 'lat')")
    assert "not an integer" in err(trips, "FROM mob_staypoints('(SELECT ''a'' || traj_id AS traj_id, ts, lat, lon FROM trips)')")
    assert "not a number" in err(trips, "FROM mob_staypoints('(SELECT traj_id, ts, lat::VARCHAR AS lat, lon FROM trips)')")
    assert 'the input has no column nope' in err(trips, "FROM mob_staypoints('trips', traj_col := 'nope')")
    assert "NULL or NaN lat" in err(trips, "FROM mob_staypoints('(SELECT traj_id, ts, CASE WHEN lat > 40.5 THEN ''nan''::DOUBLE ELSE lat END AS lat, lon FROM trips)')")
    assert "latitude outside" in err(trips, "FROM mob_staypoints('(SELECT traj_id, ts, lat + 60 AS lat, lon FROM trips)')")
    assert "empty" in err(trips, "FROM mob_staypoints('(SELECT * FROM trips WHERE false)')")
    assert "w = 2^d" in err(trips, "SELECT mob_parent(3, 6, 1)")
    assert "positive integer" in err(trips, f"SELECT mob_cell(40, 116, {BOX}, 0)")


def test_check_report_and_pois(con):
    load_sample(con)
    report = dict(con.execute("SELECT \"check\", count FROM mob_check('trips', bbox := [39.4, 115.4, 41.1, 117.6])").fetchall())
    assert report["points"] == 123317 and report["trajectories"] == 1999
    assert report["points outside bbox"] == 828
    con.execute("CREATE TABLE pois AS SELECT i AS poi_id, 39.1 + i * 0.3 AS lat, 115.1 + i * 0.3 AS lon FROM range(6) t(i)")
    cells = con.execute(f"SELECT count(DISTINCT cell), count(*) FROM mob_assign_pois('pois', bbox := {BOX}, w := 4)").fetchone()
    assert cells == (6, 6)


def test_sample_pipeline_counts(con):
    load_sample(con)
    n, mean_len = con.execute("SELECT count(*), avg(len(cells)) FROM mob_cell_sequences('trips', "
                              "bbox := [39.8477, 116.1956, 40.1133, 116.4880], outside := 'drop')").fetchone()
    assert n == 1945 and 2.0 < mean_len < 3.0
