"""A release's input, resolved once (duckmob.release.inputs): each release of duckmob.release.tables is written once
against it, whether it reads a relation out of core or the rows a SQL macro gathered."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

from duckmob import release
from duckmob.errors import DuckmobError
from duckmob.privacy import ledger
from duckmob.release import tables
from duckmob.release.counting import CountArgs
from duckmob.release.inputs import Gathered, Relation
from duckmob.source.schema import Mapping
from straight_trips import straight_trips


@pytest.fixture
def trips(con):
    straight_trips(con, 60, 0)
    con.execute("FROM mob_set_budget('trips', eps := 10, delta := 0)").fetchall()
    return con


def _closed(cur) -> bool:
    try:
        cur.execute("SELECT 1")
    except duckdb.ConnectionException:
        return True
    return False


def test_an_owned_cursor_is_closed_after_the_release_and_on_a_refusal(trips):
    db = release.database(trips)
    cur = trips.cursor()
    count = tables.noisy_count(db, Relation(db, cur, "trips", Mapping.of(), shape="ids", owned=True),
                               CountArgs(eps=1.0, seed=3))
    assert abs(count - 60) < 30 and count != round(count)
    assert _closed(cur)

    refused = trips.cursor()   # refused before anything is reserved: no such relation
    with pytest.raises(DuckmobError):
        Relation(db, refused, "no_such_table", Mapping.of(), shape="ids", owned=True)
    assert _closed(refused)

    invalid = trips.cursor()   # refused by the release, after the input was resolved: a noise scale too large
    inp = Relation(db, invalid, "trips", Mapping.of(), shape="ids", owned=True)
    with pytest.raises(DuckmobError, match="eps is too small"):
        tables.noisy_count(db, inp, CountArgs(eps=1e-9))
    assert _closed(invalid)
    assert ledger.spent(trips, "trips") == pytest.approx(1.0)   # the one count only


def test_a_callers_connection_is_left_open(trips):
    db = release.database(trips)
    tables.noisy_count(db, Relation(db, trips, "trips", Mapping.of(), shape="ids"), CountArgs(eps=1.0, seed=3))
    assert trips.execute("SELECT count(*) FROM trips").fetchone()[0] > 60


def test_gathered_rows_release_as_the_sql_macro_releases_them(trips):
    """A Gathered input made by hand is the release mob_noisy_count makes of a temporary table's rows (same budget
    key, same noise under a seed); a relation that is no temporary table is refused when the input is resolved,
    before anything is read or reserved."""
    trips.execute("CREATE TEMP TABLE mine AS SELECT DISTINCT traj_id, user_id FROM trips")
    trips.execute("FROM mob_set_budget('mine', eps := 10, delta := 0)").fetchall()
    db = release.database(trips)
    read = []

    def pairs():
        read.append(1)
        return np.arange(60, dtype=np.int64), np.arange(60, dtype=np.int64) % 20

    with pytest.raises(DuckmobError, match="CTE"):
        Gathered("(SELECT 1)", ["mine"], ["BIGINT", "BIGINT"], Mapping.of(), pairs, shape="ids")
    assert read == []
    by_sql = trips.sql("FROM mob_noisy_count('mine', eps := 1.0, seed := 3, privacy_unit := 'user', "
                       "max_trajectories_per_user := 2)").fetchall()[0][0]
    inp = Gathered("mine", ["mine"], ["BIGINT", "BIGINT"], Mapping.of(), pairs, shape="ids")
    by_hand = tables.noisy_count(db, inp, CountArgs(eps=1.0, seed=3, privacy_unit="user",
                                                    max_trajectories_per_user=2))
    assert by_hand == by_sql and abs(by_hand - 40) < 20   # 20 users, at most 2 trajectories each
    assert read and ledger.spent(trips, inp.source) >= 1.0   # charged to the temporary table's own budget
