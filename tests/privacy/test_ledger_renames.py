"""ALTER TABLE ... RENAME keeps a table's budget (issue 38, low point): DuckDB's table_oid is handed out again at
every open, so the link is the budget mark duckmob appends to the table's comment, which survives a rename and a
reopen; a fresh budget under the new name is refused naming the key that holds it."""

import duckdb
import pytest

import duckmob
from duckmob.errors import one_line

TRIPS = ("CREATE TABLE trips AS SELECT (range % 10)::INTEGER AS user_id, (range // 4)::INTEGER AS traj_id, "
         "TIMESTAMP '2024-01-01' + INTERVAL (range % 4) MINUTE AS ts, 0.1 + (range % 7) / 10 AS lat, "
         "0.1 + (range % 5) / 10 AS lon FROM range(200)")
REFUSED = ("duckmob: 't2' is the table 'trips' renamed (its comment carries duckmob's budget mark [duckmob budget: "
           "trips]): its rows already draw on the budget of 'trips', which releases from 't2' are charged to; raise "
           "that one: FROM mob_set_budget('trips', eps := ..., delta := ...)")


def _said(c, query: str) -> str:
    with pytest.raises(duckdb.Error) as err:
        c.sql(query).fetchall()
    return one_line(err.value)


def _comment(c, table: str) -> str:
    return c.sql(f"SELECT comment FROM duckdb_tables() WHERE table_name = '{table}'").fetchall()[0][0]


@pytest.mark.parametrize("reopen", [False, True], ids=["same session", "closed and reopened"])
def test_a_renamed_table_keeps_its_budget(tmp_path, reopen):
    path = str(tmp_path / "trips.duckdb")
    c = duckmob.connect(path)
    c.execute(TRIPS)
    c.sql("FROM mob_set_budget('trips', eps := 1.0, delta := 1e-5)").fetchall()
    c.sql("FROM mob_noisy_count('trips', eps := 0.6)").fetchall()
    c.execute("ALTER TABLE trips RENAME TO t2")
    if reopen:
        c.close()
        c = duckmob.connect(path)
    assert _said(c, "FROM mob_set_budget('t2', eps := 1.0, delta := 1e-5)") == REFUSED
    # the same rows under the new name draw on the old budget: 0.6 of 1.0 spent, 0.6 more does not fit
    assert _said(c, "FROM mob_noisy_count('t2', eps := 0.6)").startswith(
        "duckmob: privacy budget of 'trips' exceeded: eps 0.6 of 1 is spent (0.4 left)")
    c.sql("FROM mob_noisy_count('t2', eps := 0.3)").fetchall()
    c.sql("FROM mob_set_budget('trips', eps := 2.0, delta := 1e-5)").fetchall()   # the call the messages name works
    c.sql("FROM mob_noisy_count('t2', eps := 0.6)").fetchall()
    assert c.sql("SELECT source, epsilon, status FROM mob_ledger()").fetchall() == [
        ("trips", 0.6, "spent"), ("trips", 0.3, "spent"), ("trips", 0.6, "spent")]
    assert [(r["source"], r["releases"]) for r in duckmob.budgets(c).to_pylist()] == [("trips", 3)]
    c.close()


def test_the_mark_keeps_the_owners_comment_and_is_written_once(con):
    con.execute(TRIPS)
    con.execute("COMMENT ON TABLE trips IS 'GPS fixes, the owner''s note'")
    con.sql("FROM mob_set_budget('trips', eps := 1.0, delta := 1e-5)").fetchall()
    con.sql("FROM mob_set_budget('trips', eps := 2.0, delta := 1e-5)").fetchall()
    assert _comment(con, "trips") == "GPS fixes, the owner's note [duckmob budget: trips]"
    con.execute("CREATE TABLE other AS FROM trips")   # a copy: no comment, no mark, its own budget
    con.sql("FROM mob_set_budget('other', eps := 1.0, delta := 1e-5)").fetchall()
    assert _comment(con, "other") == "[duckmob budget: other]"


def test_a_renamed_table_that_has_its_own_budget_is_charged_to_both(con):
    """A budget declared under the new name before duckmob marked tables: the rows have drawn on both, so a
    release must fit both."""
    con.execute(TRIPS)
    con.sql("FROM mob_set_budget('trips', eps := 1.0, delta := 1e-5)").fetchall()
    con.execute("ALTER TABLE trips RENAME TO t2")
    con.execute("COMMENT ON TABLE t2 IS NULL")   # unmarked: as if renamed before duckmob wrote marks
    con.sql("FROM mob_set_budget('t2', eps := 5.0, delta := 1e-5)").fetchall()
    con.execute("COMMENT ON TABLE t2 IS '[duckmob budget: trips]'")
    con.sql("FROM mob_noisy_count('t2', eps := 0.5)").fetchall()
    assert con.sql("SELECT source FROM mob_ledger()").fetchall() == [("t2, trips",)]
    assert _said(con, "FROM mob_noisy_count('t2', eps := 0.6)").startswith(
        "duckmob: privacy budget of 'trips' exceeded: eps 0.5 of 1 is spent")
