"""The hint for a time column that is not a TIMESTAMP works: the expression it suggests, written into a view, is
accepted by the exact tools (mob_points, mob_check) and by a release, and reads UTC time whatever the session's
TimeZone (issue 38, point 12)."""

import datetime
import re

import duckdb
import pytest

import duckmob
from duckmob.errors import DuckmobError, one_line
from duckmob.source.schema import Mapping, check_points

EPOCH = 1_700_000_000   # 2023-11-14 22:13:20 UTC
COLUMNS = {
    "BIGINT": f"{EPOCH}::BIGINT + range * 60",
    "DOUBLE": f"{EPOCH}::DOUBLE + range * 60",
    "TIMESTAMP WITH TIME ZONE": f"to_timestamp({EPOCH} + range * 60)",   # what the old hint produced
}


def _hint(said: str) -> str:
    found = re.search(r", not TIMESTAMP: .*?, e\.g\. (.*), or name another column with ts_col := \.\.\.$", said)
    assert found, said
    return found.group(1)


@pytest.mark.parametrize("kind", COLUMNS)
def test_the_suggested_conversion_is_accepted_and_reads_utc_time(con, kind):
    con.execute("SET TimeZone = 'Asia/Shanghai'")   # a plain cast of a TIMESTAMPTZ would read local hours
    con.execute(f"CREATE TABLE raw AS SELECT (range // 5)::INTEGER AS traj_id, (range % 3)::INTEGER AS user_id, "
                f"{COLUMNS[kind]} AS ts, 0.1 + (range % 7) / 10 AS lat, 0.1 + (range % 5) / 10 AS lon FROM range(200)")
    assert con.sql("SELECT typeof(ts) FROM raw LIMIT 1").fetchall() == [(kind,)]
    con.sql("FROM mob_set_budget('raw', eps := 5.0, delta := 1e-5)").fetchall()
    release = ("FROM synthesize('{t}', eps := 0.5, bbox := [0.0, 0.0, 1.0, 1.0], n := 3, seed := 1, "
               "params := {{'K': 2, 'max_depth': 0}})")
    hints = set()
    for query in ("FROM mob_check('raw', bbox := [0.0, 0.0, 1.0, 1.0])", release.format(t="raw")):
        with pytest.raises(duckdb.Error) as err:
            con.sql(query).fetchall()
        hints.add(_hint(one_line(err.value)))
    [hint] = hints   # the exact tools and the releases suggest the same
    assert hint.endswith("AT TIME ZONE 'UTC'")
    con.execute(f"CREATE VIEW trips AS SELECT * REPLACE ({hint} AS ts) FROM raw")
    assert con.sql("SELECT min(ts) FROM mob_points('trips')").fetchall() == [(datetime.datetime(2023, 11, 14, 22, 13, 20),)]
    assert con.sql("SELECT count FROM mob_check('trips', bbox := [0.0, 0.0, 1.0, 1.0]) "
                   "WHERE \"check\" = 'NULL ts'").fetchall() == [(0,)]
    assert len(con.sql(release.format(t="trips")).fetchall()) > 0
    assert con.sql("SELECT source, status FROM duckmob_ledger").fetchall() == [("raw", "spent")]


def test_the_python_check_gives_the_same_hints():
    for t, hint in (("BIGINT", "to_timestamp(t) AT TIME ZONE 'UTC'"), ("DECIMAL(12,3)", "to_timestamp(t) AT TIME "
                    "ZONE 'UTC'"), ("TIMESTAMP WITH TIME ZONE", "t AT TIME ZONE 'UTC'"), ("VARCHAR", "t::TIMESTAMP")):
        with pytest.raises(DuckmobError, match=re.escape(f"e.g. {hint}, or name another column with ts_col")):
            check_points({"traj_id": "BIGINT", "ts": t, "lat": "DOUBLE", "lon": "DOUBLE"}, Mapping(ts_col="t"))
