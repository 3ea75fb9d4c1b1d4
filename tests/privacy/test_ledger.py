"""Budgets and the ledger (duckmob.privacy.ledger) through duckmob.connect() and the SQL macros."""

import json
import os
import shutil
import subprocess
import sys

import duckdb
import pytest

import duckmob
from duckmob.errors import BudgetError, DuckmobError, one_line
from duckmob.privacy import accounting as acc
from duckmob.privacy import ledger
from duckmob.privacy.ledger import headfile, schema, seals

SGD = acc.dp_sgd(1.0, 0.00256, 4000)


def rec(con, source, event, seeded=False):
    ledger.record(con, source, event, mechanism="test", privacy_unit="trajectory", params={"k": 1}, seeded=seeded)


def test_no_budget_is_refused_with_what_to_run(con):
    assert con.sql("FROM mob_budget()").fetchall() == []
    assert con.sql("FROM mob_ledger()").fetchall() == []
    assert [c[0] for c in con.sql("FROM mob_ledger()").description][:3] == ["id", "recorded_at", "source"]
    with pytest.raises(BudgetError, match=r"no privacy budget declared for 'trips': run FROM "
                                          r"mob_set_budget\('trips', eps := \.\.\., delta := \.\.\.\)"):
        ledger.check_source(con, "trips", acc.laplace(0.1))


def test_set_budget_spend_and_refuse(con):
    con.execute("CREATE TABLE trips AS SELECT 1 AS traj_id")   # a first budget names a table that exists
    rows = con.sql("FROM mob_set_budget('trips', eps := 2, delta := 1e-5)").fetchall()
    assert rows == [("trips", 2.0, 1e-5, 0.0, 2.0)]
    ledger.check_source(con, "trips", acc.laplace(0.5))
    assert con.execute("SELECT count(*) FROM duckmob_ledger").fetchall()[0][0] == 0  # check writes nothing
    rec(con, "trips", acc.laplace(0.5))
    rec(con, "trips", SGD, seeded=True)
    source, eps, delta, spent, remaining, releases, _ = con.execute("FROM mob_budget()").fetchall()[0]
    assert (source, eps, delta, releases) == ("trips", 2.0, 1e-5, 2)
    assert spent == pytest.approx(1.2844, abs=1e-3) == ledger.spent(con, "trips")
    assert remaining == pytest.approx(2.0 - spent)
    with pytest.raises(BudgetError, match=r"privacy budget of 'trips' exceeded: eps 1\.28\d* of 2 is spent"):
        ledger.check_source(con, "trips", acc.laplace(1.0))
    ledger.check_source(con, "trips", acc.laplace(0.7))  # PLD composition: 1.2844 + 0.7 minus a little still fits
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
    ledger.check_source(con, "b", acc.laplace(1.0))
    with pytest.raises(BudgetError):
        ledger.check_source(con, "a", acc.laplace(0.01))
    assert [r[0] for r in con.sql("FROM mob_budget()").fetchall()] == ["a", "b"]


def test_lowering_below_spent_refused_raising_recorded(con):
    ledger.set_budget(con, "t", 1.0, 0.0)
    rec(con, "t", acc.laplace(0.6))
    with pytest.raises(Exception, match="already spent, and a budget cannot go below what is spent: declare at least"):
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
        ledger.check_source(con, "t", SGD)   # never "raise the budget ... delta := 0": no eps is enough at delta 0


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
    # read-only reopen is tried on a copy (with its head file), in a fresh process
    shutil.copy(path, tmp_path / "copy.duckdb")
    shutil.copy(ledger.head_file(path), ledger.head_file(str(tmp_path / "copy.duckdb")))
    head = open(ledger.head_file(path)).read()
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
    # read, not written: the head file is untouched and none is made for a read-only database
    assert open(ledger.head_file(path)).read() == head
    assert not os.path.exists(ledger.head_file(str(tmp_path / "empty.duckdb")))


def _reseal(con, ledger_id, event):
    """Edit a row's event and recompute its seal, as someone who read duckmob.privacy.ledger could."""
    row = ledger.release_row(con, ledger_id)
    row["event"] = event.to_json()
    con.execute("UPDATE duckmob_ledger SET event = ?, seal = ? WHERE id = ?",
                [row["event"], seals.seal(row), ledger_id])


def test_verification_hashes_only_the_rows_added_since(con, monkeypatch):
    ledger.set_budget(con, "t", 5.0, 0.0)
    for _ in range(4):
        rec(con, "t", acc.laplace(0.1))
    verified = ledger.Verified()
    ledger.verify(con, verified)
    assert len(verified.rows) == 4 and verified.declared and verified.tables
    sealed = []
    real_seal = seals.seal
    monkeypatch.setattr(seals, "seal", lambda row: sealed.append(row["id"]) or real_seal(row))
    ledger.verify(con, verified)
    assert sealed == []
    monkeypatch.undo()
    rec(con, "t", acc.laplace(0.1))
    monkeypatch.setattr(seals, "seal", lambda row: sealed.append(row["id"]) or real_seal(row))
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
    ledger.verify(con)   # a new Verified cannot tell: in memory there is no head file (no other process opens it)
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
        ledger.check_source(con, "t", acc.laplace(0.1))


def test_ensure_tables_looks_at_the_catalog_until_the_tables_are_found(con, monkeypatch):
    verified = ledger.Verified()
    looks = []
    real_present = schema.present
    monkeypatch.setattr(schema, "present", lambda c: looks.append(1) or real_present(c))
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


# -- a ledger rewritten by another process (issue 28, item 4) ------------------------------------------------------

TRIPS = ("CREATE TABLE trips AS SELECT (range % 10)::INTEGER AS user_id, (range // 4)::INTEGER AS traj_id, "
         "TIMESTAMP '2024-01-01' + INTERVAL (range % 4) MINUTE AS ts, 0.1 + (range % 7) / 10 AS lat, "
         "0.1 + (range % 5) / 10 AS lon FROM range(200)")


def _python(script: str) -> list[str]:
    """Run ``script`` in a brand-new Python process; its printed lines."""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return done.stdout.splitlines()


def _spent_ledger(tmp_path) -> str:
    """A database file written by one duckmob process: trips, a budget of eps 2 lowered to 1.5 after two
    releases (eps 0.5 and 0.4: the same request twice would be one release, charged once)."""
    path = str(tmp_path / "trips.duckdb")
    _python(f"""
import duckmob
c = duckmob.connect({path!r})
c.execute({TRIPS!r})
c.sql("FROM mob_set_budget('trips', eps := 2.0, delta := 1e-5)").fetchall()
c.sql("FROM mob_noisy_count('trips', eps := 0.5)").fetchall()
c.sql("FROM mob_noisy_count('trips', eps := 0.4)").fetchall()
c.sql("FROM mob_set_budget('trips', eps := 1.5, delta := 1e-5)").fetchall()
c.close()
""")
    return path


# What a user with SQL access (and duckmob.privacy.ledger at hand) could run on the database in another process.
ATTACKS = {
    "delete rows, recreate the sequence": """
c.execute("DELETE FROM duckmob_ledger; DROP SEQUENCE duckmob_ledger_id; CREATE SEQUENCE duckmob_ledger_id START 1")
""",
    "drop and recreate all four objects": """
c.execute("DROP TABLE duckmob_ledger; DROP TABLE duckmob_budget; DROP SEQUENCE duckmob_ledger_id; "
          "DROP SEQUENCE duckmob_budget_seq")
ledger.ensure_tables(c)
c.execute("INSERT INTO duckmob_budget VALUES (nextval('duckmob_budget_seq'), 'trips', 2.0, 1e-5, now())")
""",
    "drop all four objects": """
c.execute("DROP TABLE duckmob_ledger; DROP TABLE duckmob_budget; DROP SEQUENCE duckmob_ledger_id; "
          "DROP SEQUENCE duckmob_budget_seq")
""",
    "delete a budget declaration": """
c.execute("DELETE FROM duckmob_budget WHERE seq = 2")   # the lowering to 1.5: back to eps 2
""",
    "edit a budget declaration": """
c.execute("UPDATE duckmob_budget SET eps = 100 WHERE seq = 2")
""",
    "edit a row and recompute its seal": """
row = ledger.release_row(c, 1)
row["event"] = accounting.laplace(0.001).to_json()
c.execute("UPDATE duckmob_ledger SET event = ?, seal = ? WHERE id = 1", [row["event"], seals.seal(row)])
""",
    "insert a budget declaration": """
c.execute("INSERT INTO duckmob_budget VALUES (nextval('duckmob_budget_seq'), 'trips', 100.0, 1e-5, now())")
""",
}


def _release(path: str) -> tuple[str, int]:
    """In a brand-new duckmob process: release a noisy count of trips; (what happened, ledger rows added)."""
    out = _python(f"""
import duckdb, duckmob
c = duckmob.connect({path!r})
c.execute("SET enable_progress_bar = false")   # a release past 2 s (a loaded machine) would draw it on stdout
before = c.execute("SELECT count(*) FROM duckmob_ledger").fetchone()[0]
try:
    c.execute("FROM mob_noisy_count('trips', eps := 0.1)").fetchall()
    print("released")
except duckdb.Error as e:
    print(duckmob.errors.one_line(e))
print(c.execute("SELECT count(*) FROM duckmob_ledger").fetchone()[0] - before)
""")
    return out[0], int(out[1])


@pytest.mark.parametrize("attack", ATTACKS, ids=list(ATTACKS))
def test_a_ledger_rewritten_in_another_process_is_refused_by_a_new_process(tmp_path, attack):
    path = _spent_ledger(tmp_path)
    _python(f"""
import duckdb
from duckmob.privacy import accounting, ledger
from duckmob.privacy.ledger import seals
c = duckdb.connect({path!r})   # plain DuckDB, in another process
{ATTACKS[attack]}
c.close()
""")
    for _ in range(2):   # and again in the next process: the refusal stands
        said, added = _release(path)
        assert said.startswith("LedgerTampered: ") and said.endswith("releases are refused until then"), said
        assert added == 0   # nothing new is spent, not even a cancelled reservation


def test_an_untouched_ledger_reopened_in_a_new_process_releases_normally(tmp_path):
    path = _spent_ledger(tmp_path)
    assert _release(path) == ("released", 1)
    assert _release(path) == ("released", 1)
    with duckdb.connect(path, read_only=True) as c:
        assert c.execute("SELECT count(*), count(*) FILTER (WHERE status = 'spent') FROM duckmob_ledger"
                         ).fetchone() == (4, 4)
        assert c.execute("SELECT comment FROM duckdb_tables() WHERE table_name = 'duckmob_ledger'"
                         ).fetchone()[0] == headfile.MARK
    head = json.load(open(ledger.head_file(path)))
    assert (head["head"]["releases"], head["head"]["budgets"], "pending" in head) == (4, 2, False)


def test_a_lost_head_file_is_refused_and_a_copy_needs_its_head_file(tmp_path):
    path = _spent_ledger(tmp_path)
    copy = str(tmp_path / "copy.duckdb")
    shutil.copy(path, copy)
    said, added = _release(copy)   # copied without its head file
    assert said.startswith(f"LedgerTampered: the ledger's head file {ledger.head_file(copy)} is missing") and added == 0
    shutil.copy(ledger.head_file(path), ledger.head_file(copy))
    assert _release(copy) == ("released", 1)
    os.remove(ledger.head_file(path))   # deleted
    said, added = _release(path)
    assert said.startswith(f"LedgerTampered: the ledger's head file {ledger.head_file(path)} is missing") and added == 0


def test_an_older_ledger_without_head_file_gets_one_at_its_next_release(tmp_path):
    path = _spent_ledger(tmp_path)
    os.remove(ledger.head_file(path))   # as an older duckmob left it: no head file, no mark
    with duckdb.connect(path) as c:
        c.execute("COMMENT ON TABLE duckmob_ledger IS NULL")
    assert _release(path) == ("released", 1)
    assert json.load(open(ledger.head_file(path)))["head"]["releases"] == 3
    with duckdb.connect(path) as c:   # from now on it is checked like any other
        c.execute("DELETE FROM duckmob_ledger WHERE id = 3; DROP SEQUENCE duckmob_ledger_id; "
                  "CREATE SEQUENCE duckmob_ledger_id START 3")
    said, added = _release(path)
    assert said.startswith("LedgerTampered: the privacy ledger was rewritten outside duckmob") and added == 0


@pytest.mark.parametrize("crash", ["before the commit", "after the commit"])
def test_a_crash_between_the_database_and_its_head_file_is_not_taken_for_tampering(tmp_path, crash):
    path = _spent_ledger(tmp_path)
    # the process dies right after the head file records the write as pending (before the statement runs), or
    # right before it records it as done (the statement committed)
    _python(f"""
import os, duckmob
from duckmob.privacy.ledger import headfile
real = headfile.write_head
def dying(path, head, pending=None):
    if pending is None and {crash == "after the commit"}:
        os._exit(0)
    real(path, head, pending)
    if pending is not None and {crash == "before the commit"}:
        os._exit(0)
headfile.write_head = dying
c = duckmob.connect({path!r})
c.execute("FROM mob_noisy_count('trips', eps := 0.1)").fetchall()
""")
    with duckdb.connect(path, read_only=True) as c:
        rows = c.execute("SELECT count(*) FROM duckmob_ledger").fetchone()[0]
    assert rows == (2 if crash == "before the commit" else 3)
    assert _release(path) == ("released", 1)


def test_incremental_checks_relink_only_from_the_row_written(con):
    ledger.set_budget(con, "t", 5.0, 0.0)
    verified = ledger.Verified()
    ledger.verify(con, verified)
    for _ in range(3):
        p = ledger.prior(con, "t", verified=verified)
        ledger.reserve(con, p, acc.laplace(0.1), mechanism="test", privacy_unit="trajectory", params={},
                       seeded=False, verified=verified)
    ledger.update(con, 2, status="spent", verified=verified)
    fresh = ledger.Verified()
    ledger.verify(con, fresh)   # hashes every row: the chain the incremental one kept is the same
    assert fresh.head() == verified.head() and fresh.links == verified.links
    assert fresh.head().releases == 3 and fresh.head().budgets == 1


# -- delta is bounded (issue 28, item 7) -----------------------------------------------------------------------

@pytest.mark.parametrize("delta", [0.5, 2e-3])
def test_a_delta_above_one_in_a_thousand_is_refused_for_budgets_and_releases(con, delta):
    con.execute(TRIPS)
    con.sql("FROM mob_set_budget('trips', eps := 1.0, delta := 0)").fetchall()
    for sql in (f"FROM mob_set_budget('trips', eps := 2.0, delta := {delta})",
                f"FROM synthesize('trips', eps := 0.5, delta := {delta}, bbox := [0.0, 0.0, 1.0, 1.0], n := 3)"):
        with pytest.raises(duckdb.Error) as err:
            con.sql(sql).fetchall()
        assert one_line(err.value) == (f"duckmob: delta must be in [0, 0.001], got {delta!r}: delta is the chance "
                                       "that the privacy guarantee fails outright, so it must be far below 1 / the "
                                       "number of people in the table (typically 1e-5 or less; 0 for a pure-eps "
                                       "method)")
    assert ledger.budget(con, "trips") == (1.0, 0.0)
    assert con.execute("SELECT count(*) FROM duckmob_ledger").fetchone()[0] == 0


@pytest.mark.parametrize("delta", [1e-3, 1e-5])
def test_a_delta_up_to_one_in_a_thousand_is_accepted(con, delta):
    con.execute(TRIPS)
    con.sql(f"FROM mob_set_budget('trips', eps := 2.0, delta := {delta})").fetchall()
    assert ledger.budget(con, "trips") == (2.0, delta)
    rows = con.sql(f"FROM synthesize('trips', eps := 0.5, delta := {delta}, bbox := [0.0, 0.0, 1.0, 1.0], n := 3, "
                   "params := {'K': 2, 'max_depth': 0})").fetchall()
    assert rows and con.execute("SELECT status FROM duckmob_ledger").fetchall() == [("spent",)]


def test_a_head_file_beside_a_database_whose_ledger_is_gone_is_refused(tmp_path):
    path = str(tmp_path / "trips.duckdb")
    c = duckmob.connect(path)
    c.execute(TRIPS)
    c.sql("FROM mob_set_budget('trips', eps := 2.0, delta := 1e-5)").fetchall()
    c.execute("DROP TABLE duckmob_ledger; DROP TABLE duckmob_budget; DROP SEQUENCE duckmob_ledger_id; "
              "DROP SEQUENCE duckmob_budget_seq")
    with pytest.raises(ledger.LedgerTampered, match=r"holds no privacy ledger, but the ledger's head file .*trips\."
                                                    r"duckdb\.duckmob-ledger beside it records 0 releases and 1 "
                                                    r"budget declaration: if the database file was deleted"):
        ledger.verify(c)   # what knows nothing of this ledger but its head file: a new process
    c.close()


def test_a_laplace_spend_whose_sum_fits_is_admitted_without_the_pld(monkeypatch):
    """The sum of Laplace epsilons bounds the PLD's epsilon at every delta: when it fits, the slow PLD is not built;
    when it does not, the PLD decides (tighter), and a refusal stays a refusal."""
    from duckmob.privacy import accounting

    laplace = [accounting.laplace(e) for e in (0.1, 0.3, 0.2)]
    prior = ledger.Prior("trips", 1.0, 1e-5, tuple(laplace[:2]))
    calls = []
    real = accounting.epsilon
    monkeypatch.setattr(accounting, "epsilon", lambda ev, d: calls.append(ev) or real(ev, d))
    prior.check(laplace[2])                                   # 0.6 <= 1.0: no PLD
    assert calls == []
    tight = ledger.Prior("trips", 0.59, 1e-5, tuple(laplace[:2]))
    assert tight.fits(laplace[2]) == (real(accounting.compose(laplace), 1e-5) <= 0.59)   # the PLD's answer
    assert len(calls) == 1
    with pytest.raises(BudgetError, match="exceeded"):
        ledger.Prior("trips", 0.4, 1e-5, tuple(laplace[:2])).check(laplace[2])
    sgd = ledger.Prior("trips", 5.0, 1e-5, ())
    calls.clear()
    assert sgd.fits(accounting.dp_sgd(1.0, 0.01, 100)) and len(calls) == 1     # not pure Laplace: the PLD


def test_a_reservation_writes_a_quick_bound_and_the_release_end_the_pld_value(con):
    """Before the PLD's imports are loaded, a reservation of Laplace events writes a valid upper bound (no half
    second of imports before the data is read) and starts those imports on a thread; the finished row holds the
    PLD's value."""
    script = (
        "import sys, time\n"
        "from duckmob.privacy import accounting as a\n"
        "ev = a.compose([a.laplace(0.3), a.laplace(0.2), a.laplace(0.5)])\n"
        "assert not a.pld_loaded()\n"
        "q = a.quick_epsilon(ev, 1e-5)\n"
        "assert q == min(1.0, a.advanced_composition([0.3, 0.2, 0.5], 1e-5)), q\n"
        "assert a.quick_epsilon(a.laplace(0.5), 1e-5) is None and a.quick_epsilon(ev, 0.0) is None\n"
        "t = time.monotonic()\n"
        "while not a.pld_loaded() and time.monotonic() - t < 120: time.sleep(0.05)\n"
        "assert a.pld_loaded() and a.quick_epsilon(ev, 1e-5) is None\n"
        "assert a.epsilon(ev, 1e-5) <= q\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
    con.execute("CREATE TABLE trips_q AS FROM mob_geolife_sample()")
    con.execute("FROM mob_set_budget('trips_q', eps := 10, delta := 1e-5)").fetchall()
    con.execute("FROM mob_fit('trips_q', 'mq', eps := 1.0, bbox := [39.8477, 116.1956, 40.1133, 116.4880], "
                "seed := 1)").fetchall()
    eps, event, status = con.execute("SELECT epsilon, event, status FROM duckmob_ledger WHERE source = 'trips_q'"
                                     ).fetchall()[0]
    assert status == "spent" and eps == acc.epsilon(acc.Event.from_json(event), 1e-5) < 1.0
