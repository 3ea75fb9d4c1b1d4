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
    con.execute("CREATE TABLE trips AS SELECT 1 AS traj_id")   # a first budget names a table that exists
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
    with pytest.raises(BudgetError, match=r"has delta 0, and this release \(dp_sgd.*\) needs delta > 0: declare a "
                                          r"positive delta, e\.g\. FROM mob_set_budget\('t', eps := 10, delta := 1e-5\)"):
        ledger.check(con, "t", SGD)   # never "raise the budget ... delta := 0": no eps is enough at delta 0


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
    c.execute("CREATE TABLE trips AS SELECT 1 AS traj_id")
    c.sql("FROM mob_set_budget('trips', eps := 1, delta := 1e-6)").fetchall()
    rec(c, "trips", acc.laplace(0.25))
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


def _reseal(con, ledger_id, event):
    """Edit a row's event and recompute its seal, as someone who read ledger.py could."""
    row = ledger.release_row(con, ledger_id)
    row["event"] = event.to_json()
    con.execute("UPDATE duckmob_ledger SET event = ?, seal = ? WHERE id = ?",
                [row["event"], ledger._seal(row), ledger_id])


def test_verification_hashes_only_the_rows_added_since(con, monkeypatch):
    ledger.set_budget(con, "t", 5.0, 0.0)
    for _ in range(4):
        rec(con, "t", acc.laplace(0.1))
    verified = ledger.Verified()
    ledger.verify(con, verified)
    assert len(verified.rows) == 4 and verified.declared and verified.tables
    sealed = []
    real_seal = ledger._seal
    monkeypatch.setattr(ledger, "_seal", lambda row: sealed.append(row["id"]) or real_seal(row))
    ledger.verify(con, verified)
    assert sealed == []
    monkeypatch.undo()
    rec(con, "t", acc.laplace(0.1))
    monkeypatch.setattr(ledger, "_seal", lambda row: sealed.append(row["id"]) or real_seal(row))
    ledger.verify(con, verified)
    assert sealed == [5]
    assert ledger.prior(con, "t", verified=verified).events == (acc.laplace(0.1),) * 5


def test_a_resealed_edit_is_seen_by_the_process_that_verified_the_row(con):
    ledger.set_budget(con, "t", 5.0, 0.0)
    rec(con, "t", acc.laplace(1.0))
    rec(con, "t", acc.laplace(1.0))
    verified = ledger.Verified()
    ledger.verify(con, verified)
    _reseal(con, 2, acc.laplace(0.001))
    ledger.verify(con)   # a new process cannot tell (the threat model says so)
    with pytest.raises(ledger.LedgerTampered, match="ledger row 2 was edited"):
        ledger.verify(con, verified)
    with pytest.raises(ledger.LedgerTampered, match="ledger row 2 was edited"):
        ledger.prior(con, "t", verified=verified)


def test_a_deleted_tail_with_a_reset_sequence_is_seen_by_the_process_that_verified_it(con):
    ledger.set_budget(con, "t", 5.0, 0.0)
    for _ in range(3):
        rec(con, "t", acc.laplace(1.0))
    verified = ledger.Verified()
    ledger.verify(con, verified)
    con.execute("DELETE FROM duckmob_ledger WHERE id > 1")
    con.execute("DROP SEQUENCE duckmob_ledger_id")
    con.execute("CREATE SEQUENCE duckmob_ledger_id START 2")   # ids 1 .. 1 again, as if nothing was lost
    ledger.verify(con)
    with pytest.raises(ledger.LedgerTampered, match="rows were deleted from duckmob_ledger"):
        ledger.verify(con, verified)


def test_dropping_every_ledger_object_after_a_budget_was_seen_is_detected(con):
    verified = ledger.Verified()
    ledger.set_budget(con, "t", 5.0, 0.0, verified=verified)
    rec(con, "t", acc.laplace(1.0))
    for drop in ("TABLE duckmob_ledger", "TABLE duckmob_budget", "SEQUENCE duckmob_ledger_id",
                 "SEQUENCE duckmob_budget_seq"):
        con.execute(f"DROP {drop}")
    ledger.verify(con)   # a new process sees a new database
    with pytest.raises(ledger.LedgerTampered, match="were dropped after this process saw a privacy budget"):
        ledger.prior(con, "t", verified=verified)
    with pytest.raises(ledger.LedgerTampered, match="were dropped"):
        ledger.set_budget(con, "t", 9.0, 0.0, verified=verified)
    # a process that never saw a budget starts a new ledger
    fresh = ledger.Verified()
    ledger.set_budget(con, "t", 1.0, 0.0, verified=fresh)
    assert ledger.budget(con, "t") == (1.0, 0.0)


def test_a_dropped_budget_table_is_detected(con):
    ledger.set_budget(con, "t", 5.0, 0.0)
    rec(con, "t", acc.laplace(1.0))
    con.execute("DROP TABLE duckmob_budget")
    with pytest.raises(ledger.LedgerTampered, match="the table duckmob_budget was dropped"):
        ledger.check(con, "t", acc.laplace(0.1))


def test_ensure_tables_looks_at_the_catalog_until_the_tables_are_found(con, monkeypatch):
    verified = ledger.Verified()
    looks = []
    real_present = ledger._present
    monkeypatch.setattr(ledger, "_present", lambda c: looks.append(1) or real_present(c))
    ledger.ensure_tables(con, verified)
    assert len(looks) == 1
    ledger.verify(con, verified)
    ledger.ensure_tables(con, verified)
    ledger.ensure_tables(con, verified)
    assert len(looks) == 1


def test_an_edit_of_a_row_being_updated_is_refused_not_resealed(con):
    verified = ledger.Verified()
    ledger.set_budget(con, "t", 5.0, 0.0, verified=verified)
    p = ledger.prior(con, "t", verified=verified)
    ledger_id = ledger.reserve(con, p, acc.laplace(2.0), mechanism="test", privacy_unit="trajectory", params={},
                               seeded=False, verified=verified)
    _reseal(con, ledger_id, acc.laplace(0.001))   # lowered while the release runs
    with pytest.raises(ledger.LedgerTampered, match=f"ledger row {ledger_id} was edited"):
        ledger.update(con, ledger_id, status="spent", verified=verified)
    con.execute("UPDATE duckmob_ledger SET epsilon = 0.001")   # not resealed: any caller sees it
    with pytest.raises(ledger.LedgerTampered, match=f"ledger row {ledger_id} was edited"):
        ledger.update(con, ledger_id, status="spent")


def test_a_deleted_row_replaced_by_a_copy_of_another_is_detected(con):
    ledger.set_budget(con, "t", 5.0, 0.0)
    for eps in (1.0, 1.0, 0.5):
        rec(con, "t", acc.laplace(eps))
    verified = ledger.Verified()
    ledger.verify(con, verified)
    con.execute("DELETE FROM duckmob_ledger WHERE id = 2")
    con.execute("INSERT INTO duckmob_ledger FROM duckmob_ledger WHERE id = 3")   # ids 1, 3, 3: count and max hold
    for check in (ledger.Verified(), verified):
        with pytest.raises(ledger.LedgerTampered, match="rows were deleted|was edited"):
            ledger.verify(con, check)
