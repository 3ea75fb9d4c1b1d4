"""mob_evaluate from SQL and duckmob.evaluate from Python give the same rows."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

import duckmob
from duckmob.metrics import evaluate as evaluate_points

from metrics_helpers import BBOX, W, city, table


@pytest.fixture
def con():
    c = duckmob.connect()
    c.register("real_view", table(city()))
    c.execute("CREATE TEMP TABLE real AS FROM real_view")
    c.register("synth_view", table(city(seed=3), with_time=False))
    c.execute("CREATE TEMP TABLE synth AS FROM synth_view")
    yield c
    c.close()


def test_mob_evaluate_matches_python(con):
    rows = con.sql(f"FROM mob_evaluate('real', 'synth', bbox := {BBOX}, w := {W}, seed := 3)").to_arrow_table()
    assert rows.column_names == ["exact_not_private", "metric", "value", "reference", "baseline", "lower_is_better",
                                 "source", "description"]
    assert rows.column("exact_not_private").to_pylist() == [True] * rows.num_rows
    expected = evaluate_points(table(city()), table(city(seed=3), with_time=False), BBOX, w=W, seed=3)
    got = rows.to_pylist()
    assert [r["metric"] for r in got] == [r["metric"] for r in expected]
    for a, b in zip(got, expected):
        for col in ("value", "reference", "baseline"):
            assert a[col] == pytest.approx(b[col]) if b[col] is not None else a[col] is None
    by = {r["metric"]: r for r in got}
    assert by["hrnet_density_t_jsd"]["value"] is None
    assert "no timestamps" in by["hrnet_density_t_jsd"]["description"]


def test_identical_tables_from_sql(con):
    rows = con.sql(f"FROM mob_evaluate('real', 'real', bbox := {BBOX}, families := ['hrnet', 'privtrace']) "
                   "WHERE metric NOT LIKE '%_trajectories'").fetchall()
    assert len(rows) == 13
    assert all(exact and value == 0.0 for exact, _, value, *_ in rows)


def test_python_api_returns_a_table(con):
    first = duckmob.evaluate(con, "real", "synth", bbox=BBOX, families=["pategail"])
    second = duckmob.evaluate(con, "real", "synth", bbox=BBOX, families=["pategail"])
    assert isinstance(first, pa.Table) and first.equals(second)
    assert first.num_rows == 2 + 5


def test_errors_reach_sql_as_one_line(con):
    with pytest.raises(duckdb.Error, match="bounding box is required"):
        con.sql("FROM mob_evaluate('real', 'synth')").fetchall()
    with pytest.raises(duckdb.Error, match="unknown metric families"):
        con.sql(f"FROM mob_evaluate('real', 'synth', bbox := {BBOX}, families := ['x'])").fetchall()
    con.execute("CREATE TEMP TABLE nothing AS SELECT * FROM synth WHERE false")
    with pytest.raises(duckdb.Error, match="synth table"):
        con.sql(f"FROM mob_evaluate('real', 'nothing', bbox := {BBOX})").fetchall()
