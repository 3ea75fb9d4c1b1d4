"""mob_budget() / mob_ledger() (and duckmob.budgets / duckmob.releases, the dbt tests) verify the ledger before
showing it; the head file is named in every refusal about it, and deleting database and head file starts over."""

import os
import pathlib

import duckdb
import pytest

import duckmob
from duckmob.errors import one_line
from duckmob.privacy import ledger

TRIPS = ("CREATE TABLE trips AS SELECT (range % 10)::INTEGER AS user_id, (range // 4)::INTEGER AS traj_id, "
         "TIMESTAMP '2024-01-01' + INTERVAL (range % 4) MINUTE AS ts, 0.1 + (range % 7) / 10 AS lat, "
         "0.1 + (range % 5) / 10 AS lon FROM range(200)")
DBT_TESTS = pathlib.Path(__file__).parents[2] / "examples" / "dbt_project" / "tests"
READERS = {
    "mob_budget()": lambda c: c.sql("FROM mob_budget()").fetchall(),
    "mob_ledger()": lambda c: c.sql("FROM mob_ledger()").fetchall(),
    "duckmob.budgets": lambda c: duckmob.budgets(c).to_pylist(),
    "duckmob.releases": lambda c: duckmob.releases(c).to_pylist(),
    "dbt test budget_never_exceeded": lambda c: c.sql((DBT_TESTS / "budget_never_exceeded.sql").read_text()).fetchall(),
    "dbt test every_release_has_a_budget":
        lambda c: c.sql((DBT_TESTS / "every_release_has_a_budget.sql").read_text()).fetchall(),
}


def _spent(path: str) -> None:
    c = duckmob.connect(path)
    c.execute(TRIPS)
    c.sql("FROM mob_set_budget('trips', eps := 2.0, delta := 1e-5)").fetchall()
    c.sql("FROM mob_noisy_count('trips', eps := 0.5)").fetchall()
    c.sql("FROM mob_noisy_count('trips', eps := 0.4)").fetchall()
    c.close()


def _said(read, c) -> str:
    # SQL wraps the refusal in a duckdb.Error; Python (duckmob.budgets / releases, read by the release core as every
    # other Python release) raises LedgerTampered itself, as its docstring says
    with pytest.raises((duckdb.Error, ledger.LedgerTampered)) as info:
        read(c)
    return one_line(info.value) if isinstance(info.value, duckdb.Error) else f"LedgerTampered: {info.value}"


def test_an_intact_ledger_is_shown_as_recorded(tmp_path):
    path = str(tmp_path / "trips.duckdb")
    _spent(path)
    c = duckmob.connect(path)   # a new instance: verifies every row once
    [(source, eps, delta, spent, remaining, n, _at)] = c.sql("FROM mob_budget()").fetchall()
    assert (source, eps, delta, n) == ("trips", 2.0, 1e-5, 2)
    assert 0.899 < spent <= 0.9 and remaining == pytest.approx(2.0 - spent)   # PLD at delta 1e-5: just under the sum
    assert [r["epsilon"] for r in duckmob.releases(c).to_pylist()] == [0.5, 0.4]
    assert c.sql((DBT_TESTS / "budget_never_exceeded.sql").read_text()).fetchall() == []
    assert c.sql((DBT_TESTS / "every_release_has_a_budget.sql").read_text()).fetchall() == []
    c.close()


@pytest.mark.parametrize("reader", READERS, ids=list(READERS))
def test_a_reset_ledger_is_refused_not_shown_clean(tmp_path, reader):
    path = str(tmp_path / "trips.duckdb")
    _spent(path)
    with duckdb.connect(path) as plain:   # the reset of the attack: rows deleted, the sequence started again
        plain.execute("DELETE FROM duckmob_ledger; DROP SEQUENCE duckmob_ledger_id; "
                      "CREATE SEQUENCE duckmob_ledger_id START 1")
    c = duckmob.connect(path)
    said = _said(READERS[reader], c)
    assert said.startswith("LedgerTampered: the privacy ledger was rewritten outside duckmob: releases or budget "
                           "declarations were deleted"), said
    assert f"its head file {ledger.head_file(path)} records 2 and 1" in said
    c.close()


def test_an_edit_in_this_process_is_refused_by_mob_budget_and_mob_ledger(con):
    con.execute(TRIPS)
    con.sql("FROM mob_set_budget('trips', eps := 2.0, delta := 1e-5)").fetchall()
    con.sql("FROM mob_noisy_count('trips', eps := 0.5)").fetchall()
    assert con.sql("SELECT spent FROM mob_budget()").fetchall() == [(0.5,)]
    con.execute("""UPDATE duckmob_ledger SET event = '{"kind":"laplace","eps":0.001}'""")
    for read in ("FROM mob_budget()", "FROM mob_ledger()"):
        with pytest.raises(duckdb.Error, match="LedgerTampered: ledger row 1 was edited after it was recorded"):
            con.sql(read).fetchall()


def test_deleting_the_database_alone_names_the_head_file_and_deleting_both_starts_over(tmp_path):
    path = str(tmp_path / "trips.duckdb")
    head = ledger.head_file(path)
    _spent(path)
    os.remove(path)   # as the dbt example's README once said: delete the database to start over
    assert os.path.exists(head)
    c = duckmob.connect(path)
    c.execute(TRIPS)
    for read in (lambda c: c.sql("FROM mob_budget()").fetchall(),
                 lambda c: c.sql("FROM mob_set_budget('trips', eps := 2.0, delta := 1e-5)").fetchall(),
                 lambda c: c.sql("FROM mob_noisy_count('trips', eps := 0.5)").fetchall()):
        assert _said(read, c) == (
            f"LedgerTampered: this database holds no privacy ledger, but the ledger's head file {head} beside it "
            f"records 2 releases and 1 budget declaration: if the database file was deleted to start over, delete "
            f"{head} too (docs/threat_model.md, 'Starting over'); otherwise its ledger was dropped, so restore the "
            "database together with its head file from the same backup; releases are refused until then")
    assert os.path.exists(head)   # nothing is forgotten on duckmob's own
    c.close()
    for name in (path, path + ".wal", head):   # the documented way: both files
        if os.path.exists(name):
            os.remove(name)
    c = duckmob.connect(path)
    c.execute(TRIPS)
    c.sql("FROM mob_set_budget('trips', eps := 1.0, delta := 1e-5)").fetchall()
    c.sql("FROM mob_noisy_count('trips', eps := 0.25)").fetchall()
    [row] = duckmob.budgets(c).to_pylist()
    assert (row["source"], row["eps"], row["releases"]) == ("trips", 1.0, 1) and 0.249 < row["spent"] <= 0.25
    c.close()


def test_the_dbt_readme_starts_over_by_deleting_both_files():
    readme = (DBT_TESTS.parent / "README.md").read_text()
    assert "rm -f duckmob_example.duckdb duckmob_example.duckdb.wal duckmob_example.duckdb.duckmob-ledger" in readme
