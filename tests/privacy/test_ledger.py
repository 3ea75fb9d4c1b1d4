"""Budgets and the ledger (duckmob.privacy.ledger) through duckmob.connect() and the SQL macros."""

import shutil
import subprocess
import sys

import duckdb
import pytest

import duckmob
from duckmob.errors import BudgetError, DuckmobError, one_line
from duckmob.privacy import accounting as acc
from duckmob.privacy import ledger

SGD = acc.dp_sgd(1.0, 0.00256, 4000)


def rec(con, source, event, seeded=False):
    ledger.record(con, source, event, mechanism="test", privacy_unit="trajectory", params={"k": 1}, seeded=seeded)


def test_no_budget_is_refused_with_what_to_run(con):
    assert con.sql("FROM mob_budget()").fetchall() == []
    assert con.sql("FROM mob_ledger()").fetchall() == []
    assert [c[0] for c in con.sql("FROM mob_ledger()").description][:3] == ["id", "recorded_at", "source"]
    with pytest.raises(BudgetError, match=r"no privacy budget declared for 'trips': run FROM "
                                          r"mob_set_budget\('trips', eps := \.\.\., delta := \.\.\.\)"):
        ledger.check(con, "trips", acc.laplace(0.1))


def test_set_budget_spend_and_refuse(con):
    rows = con.sql("FROM mob_set_budget('trips', eps := 2, delta := 1e-5)").fetchall()
    assert rows == [("trips", 2.0, 1e-5, 0.0, 2.0)]
    ledger.check(con, "trips", acc.laplace(0.5))
    assert con.execute("SELECT count(*) FROM duckmob_ledger").fetchall()[0][0] == 0  # check writes nothing
    rec(con, "trips", acc.laplace(0.5))
    rec(con, "trips", SGD, seeded=True)
    source, eps, delta, spent, remaining, releases, _ = con.execute("FROM mob_budget()").fetchall()[0]
    assert (source, eps, delta, releases) == ("trips", 2.0, 1e-5, 2)
    assert spent == pytest.approx(1.2844, abs=1e-3) == ledger.spent(con, "trips")
    assert remaining == pytest.approx(2.0 - spent)
    with pytest.raises(BudgetError, match=r"privacy budget of 'trips' exceeded: eps 1\.28\d* of 2 spent"):
        ledger.check(con, "trips", acc.laplace(1.0))
    ledger.check(con, "trips", acc.laplace(0.7))  # PLD composition: 1.2844 + 0.7 minus a little still fits
    led = con.sql("SELECT id, source, mechanism, privacy_unit, params, event, seeded, epsilon "
                  "FROM mob_ledger()").fetchall()
    assert [r[0] for r in led] == [1, 2]
    assert led[0][1:7] == ("trips", "test", "trajectory", '{"k": 1}', '{"kind":"laplace","eps":0.5}', False)
    assert led[1][6] is True
    assert led[1][7] == pytest.approx(acc.epsilon(SGD, 1e-5))
    assert acc.Event.from_json(led[1][5]) == SGD


def test_budgets_are_per_source(con):
    ledger.set_budget(con, "a", 1.0, 0.0)
    ledger.set_budget(con, "b", 1.0, 0.0)
    rec(con, "a", acc.laplace(1.0))
    ledger.check(con, "b", acc.laplace(1.0))
    with pytest.raises(BudgetError):
        ledger.check(con, "a", acc.laplace(0.01))
    assert [r[0] for r in con.sql("FROM mob_budget()").fetchall()] == ["a", "b"]


def test_lowering_below_spent_refused_raising_recorded(con):
    ledger.set_budget(con, "t", 1.0, 0.0)
    rec(con, "t", acc.laplace(0.6))
    with pytest.raises(Exception, match="already spent; a budget can only be raised"):
        con.sql("FROM mob_set_budget('t', eps := 0.5, delta := 0)").fetchall()
    con.sql("FROM mob_set_budget('t', eps := 0.8, delta := 0)").fetchall()  # lower, still above spent: fine
    con.sql("FROM mob_set_budget('t', eps := 3, delta := 0)").fetchall()
    history = con.sql("SELECT eps FROM duckmob_budget WHERE source = 't' ORDER BY declared_at, rowid").fetchall()
    assert history == [(1.0,), (0.8,), (3.0,)]
    assert con.execute("SELECT eps, remaining FROM mob_budget()").fetchall()[0] == pytest.approx((3.0, 2.4))


def test_pure_budget_refuses_gaussian_mechanisms(con):
    ledger.set_budget(con, "t", 10.0, 0.0)
    with pytest.raises(BudgetError, match="exceeded"):
        ledger.check(con, "t", SGD)


def test_sql_errors_say_what_to_do(con):
    with pytest.raises(duckdb.Error) as err:
        con.sql("FROM mob_set_budget('trips', eps := 4)").fetchall()
    assert one_line(err.value) == ("duckmob: mob_set_budget needs both eps and delta, e.g. FROM "
                                   "mob_set_budget('trips', eps := 4, delta := 1e-5)")
    with pytest.raises(duckdb.Error, match="eps must be a positive"):
        con.sql("FROM mob_set_budget('trips', eps := -1, delta := 1e-5)").fetchall()
    with pytest.raises(duckdb.Error, match="delta must be in"):
        con.sql("FROM mob_set_budget('trips', eps := 1, delta := 1)").fetchall()
    with pytest.raises(DuckmobError, match="source"):
        ledger.set_budget(con, "", 1, 0)


def test_ledger_persists_in_the_database_file(tmp_path):
    path = str(tmp_path / "db.duckdb")
    c = duckmob.connect(path)
    c.sql("FROM mob_set_budget('trips', eps := 1, delta := 1e-6)").fetchall()
    rec(c, "trips", acc.laplace(0.25))
    c.execute("CREATE TABLE trips AS SELECT 1 AS traj_id")
    c.execute("CHECKPOINT")
    c.close()
    again = duckmob.connect(path)
    assert again.execute("SELECT spent, releases FROM mob_budget()").fetchall()[0] == pytest.approx((0.25, 1),
                                                                                                    abs=1e-4)
    again.close()
    # duckmob keeps its own connection to the file until this process exits (the UDFs live on it), so a
    # read-only reopen is tried on a copy, in a fresh process
    shutil.copy(path, tmp_path / "copy.duckdb")
    path = str(tmp_path / "copy.duckdb")
    script = f"""
import duckmob, duckdb
from duckmob.privacy import accounting, ledger
c = duckmob.connect({path!r}, read_only=True)
print(c.execute("SELECT round(spent, 4), releases FROM mob_budget()").fetchall())
try:
    c.execute("FROM mob_noisy_count('trips', eps := 0.25)").fetchall()
except duckdb.Error as e:
    print(duckmob.errors.one_line(e))
empty = {str(tmp_path / "empty.duckdb")!r}
duckdb.connect(empty).close()
duckmob.connect(empty, read_only=True).close()
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr[-2000:]
    assert out.splitlines() == ["[(0.25, 1)]", "duckmob: the database is opened read-only: a release must be "
                                "recorded in its privacy ledger; open it writable", "ok"]
