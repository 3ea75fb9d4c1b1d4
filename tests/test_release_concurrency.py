"""The release core's lock and Ctrl-C: one lock per database file whatever path opened it, planning outside the
lock, and an interrupt at any moment before the data is read cancelling the release (duckmob.release).

Each test asserts what the ledger holds afterwards (rows, statuses, spend), not only that the code runs.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable

import duckdb
import pytest

import duckmob
from duckmob import release
from duckmob.errors import DuckmobError, one_line
from duckmob.privacy import accounting, composition, ledger
from duckmob.release import interrupts

WAIT = 30   # seconds a test waits for another thread before it reports a hang


def _trips(con, n=40):
    con.execute("CREATE TABLE trips AS SELECT range AS traj_id, range % 10 AS user_id FROM range(?)", [n])


def _statuses(con) -> list[tuple]:
    return con.execute("SELECT id, status FROM duckmob_ledger ORDER BY id").fetchall()


def _request(event_of, plan_of=lambda p: None) -> release.Request:
    """A test release whose price is ``(event_of(prior), plan_of(prior))``."""
    return release.Request(source="trips", mechanism="test", privacy_unit="trajectory", params={}, seeded=False,
                           price=lambda p: (event_of(p), plan_of(p)))


def _read(rel):
    return rel.read(lambda: "read")


def _in_thread(work) -> tuple[threading.Thread, dict]:
    """Start ``work()`` on a thread; the dict receives "result" or "error" and "done" (a perf_counter time)."""
    outcome: dict = {}

    def one():
        try:
            outcome["result"] = work()
        except BaseException as exc:   # noqa: BLE001 -- handed to the test
            outcome["error"] = exc
        outcome["done"] = time.perf_counter()

    thread = threading.Thread(target=one)
    thread.start()
    return thread, outcome


# A fit that re-plans after reading (as HRNet does with its noisy count): noise drawn for 0.1, 0.8 reserved
DRAWN = accounting.laplace(0.1)
RESERVED = accounting.compose([DRAWN, accounting.laplace(0.7)])


def _fit_settling(db, replan) -> tuple:
    """A release reserving RESERVED that reads, then settles with ``replan(prior)`` -> (event, "model")."""
    def compute(rel):
        _read(rel)
        return rel.settle(replan, drawn=DRAWN)

    return release.run(db, _request(lambda p: RESERVED), compute)


def _count(con, eps: float, what: str = "trajectories") -> None:
    cur = duckmob.register(con.cursor())
    try:
        cur.execute(f"FROM mob_noisy_count('trips', eps := {eps}, what := '{what}')").fetchall()
    finally:
        cur.close()


# -- Ctrl-C ----------------------------------------------------------------------------------------------------

def test_ctrl_c_while_planning_cancels_the_release_before_anything_is_reserved(con):
    _trips(con)
    con.sql("FROM mob_set_budget('trips', eps := 1.0, delta := 0)").fetchall()
    db = release.database(con)
    planning, pressed, read = threading.Event(), threading.Event(), []

    def slow_plan(p):
        planning.set()
        assert pressed.wait(WAIT)   # a long calibration, during which Ctrl-C comes
        return accounting.laplace(0.8)

    def press():
        assert planning.wait(WAIT)
        release.interrupt_all()   # from another thread: this one is busy planning
        pressed.set()

    presser = threading.Thread(target=press)
    presser.start()
    with pytest.raises(release.Interrupted, match="before the data was read: the release was cancelled"):
        release.run(db, _request(slow_plan), lambda rel: read.append(1) or _read(rel))
    presser.join()
    assert read == [] and _statuses(con) == [] and ledger.spent(con, "trips") == 0.0
    # a release started after the press is not affected by it
    assert release.run(db, _request(lambda p: accounting.laplace(0.8)), _read) == ("read", 1)
    assert _statuses(con) == [(1, "spent")]


def test_ctrl_c_during_a_noise_calibration_stops_it_there(con, monkeypatch):
    """A DP-SGD calibration (seconds of accountant evaluations while planning) checks for Ctrl-C between its
    evaluations: a press stops it where it is, the release is cancelled and nothing is reserved."""
    _trips(con)
    con.sql("FROM mob_set_budget('trips', eps := 100.0, delta := 1e-5)").fetchall()
    db = release.database(con)
    evaluations, finished = [], []
    epsilon = composition.epsilon

    def counted(*args, **kw):
        evaluations.append(1)
        if len(evaluations) == 3:
            release.interrupt_all()   # Ctrl-C while the calibration runs (from its own thread: the count is global)
        return epsilon(*args, **kw)

    def calibrating_plan(p):
        sigma = accounting.calibrate_noise_multiplier([], 0.01, 3000, 50.0, 1e-5, prior=p)
        finished.append(sigma)   # never reached: the calibration stops at the press
        return accounting.dp_sgd(sigma, 0.01, 3000)

    monkeypatch.setattr(composition, "epsilon", counted)
    with pytest.raises(release.Interrupted, match="before the data was read: the release was cancelled"):
        release.run(db, _request(calibrating_plan), _read)
    assert finished == [] and 3 <= len(evaluations) <= 4
    assert _statuses(con) == [] and ledger.spent(con, "trips") == 0.0


def test_ctrl_c_after_the_reservation_and_before_the_read_cancels_it(con):
    _trips(con)
    con.sql("FROM mob_set_budget('trips', eps := 1.0, delta := 0)").fetchall()
    db = release.database(con)

    def pressed_then_read(rel):
        db.active.discard(rel)   # not flagged by interrupt_all: the press count alone must stop it
        release.interrupt_all()
        return _read(rel)

    with pytest.raises(release.Interrupted, match="nothing was spent"):
        release.run(db, _request(lambda p: accounting.laplace(0.6)), pressed_then_read)
    assert _statuses(con) == [(1, "cancelled")] and ledger.spent(con, "trips") == 0.0


def test_ctrl_c_while_settling_cuts_the_reservation_to_the_noise_drawn(con):
    _trips(con)
    con.sql("FROM mob_set_budget('trips', eps := 1.0, delta := 0)").fetchall()
    db = release.database(con)

    def replan(p):
        release.interrupt_all()   # Ctrl-C during the calibration after the read
        return RESERVED, "model"

    with pytest.raises(release.Interrupted, match="stays spent"):
        _fit_settling(db, replan)
    assert _statuses(con) == [(1, "failed")]
    assert ledger.spent(con, "trips") == pytest.approx(0.1)


# -- planning outside the lock ------------------------------------------------------------------------------------

def _while_counting(con, release_with: Callable[[Callable[[], None]], object]) -> tuple[dict, float]:
    """Run ``release_with(calibrate)`` on a thread, where ``calibrate()`` (called inside a plan: a long noise
    calibration) lasts until a ``mob_noisy_count('trips', eps := 0.5)`` made meanwhile on this thread is done (5 s
    at most). Returns the release's outcome (see :func:`_in_thread`) and when the count was done."""
    calibrating, counted = threading.Event(), threading.Event()

    def calibrate():
        calibrating.set()
        counted.wait(5)

    thread, outcome = _in_thread(lambda: release_with(calibrate))
    assert calibrating.wait(WAIT)
    _count(con, 0.5)          # waits for the lock only while the ledger is read or written
    count_done = time.perf_counter()
    counted.set()
    thread.join(WAIT)
    return outcome, count_done


def test_a_release_planning_does_not_hold_up_another(con):
    _trips(con)
    con.sql("FROM mob_set_budget('trips', eps := 2.0, delta := 0)").fetchall()
    db = release.database(con)
    plans = []

    def plan(calibrate):
        return lambda p: plans.append(p) or calibrate() or accounting.laplace(0.8)

    planned, count_done = _while_counting(con, lambda calibrate: release.run(db, _request(plan(calibrate)), _read))
    assert planned.get("result") == ("read", 2), planned.get("error")
    assert count_done < planned["done"]
    assert len(plans) == 1    # 0.8 still fits after the count's 0.5: kept, not planned again
    assert _statuses(con) == [(1, "spent"), (2, "spent")] and ledger.spent(con, "trips") == pytest.approx(1.3)


def test_a_plan_that_no_longer_fits_is_made_again_against_the_ledger_as_it_is(con):
    _trips(con)
    con.sql("FROM mob_set_budget('trips', eps := 1.0, delta := 0)").fetchall()
    db = release.database(con)
    spent_before = []

    def plan_to_what_is_left(calibrate):   # a pure function of the prior, as a calibration is
        def plan(p):
            spent_before.append(p.spent())
            calibrate()
            return accounting.laplace(0.8) if p.fits(accounting.laplace(0.8)) else accounting.laplace(0.4)
        return plan

    planned, _ = _while_counting(
        con, lambda calibrate: release.run(db, _request(plan_to_what_is_left(calibrate)), _read))
    assert planned.get("result") == ("read", 2), planned.get("error")
    assert spent_before == [0.0, pytest.approx(0.5)]
    assert ledger.events(con, "trips") == [accounting.laplace(0.5), accounting.laplace(0.4)]


def test_the_release_computes_with_the_plan_its_reservation_paid_for(con):
    """Request.price -> (event, plan): the release carries the plan of the price it reserved (release.plan), the
    one made again when another release took room meanwhile, not the first one."""
    _trips(con)
    con.sql("FROM mob_set_budget('trips', eps := 1.0, delta := 0)").fetchall()
    db = release.database(con)

    def eps_left(p) -> float:
        return 0.8 if p.fits(accounting.laplace(0.8)) else 0.4

    def price_with(calibrate):
        return _request(lambda p: calibrate() or accounting.laplace(eps_left(p)), lambda p: {"eps": eps_left(p)})

    planned, _ = _while_counting(
        con, lambda calibrate: release.run(db, price_with(calibrate), lambda rel: rel.read(lambda: rel.plan)))
    assert planned.get("result") == ({"eps": 0.4}, 2), planned.get("error")
    assert ledger.events(con, "trips") == [accounting.laplace(0.5), accounting.laplace(0.4)]


def test_a_plan_that_no_longer_fits_and_cannot_be_made_smaller_is_refused(con):
    _trips(con)
    con.sql("FROM mob_set_budget('trips', eps := 1.0, delta := 0)").fetchall()
    db = release.database(con)
    planned, _ = _while_counting(
        con, lambda calibrate: release.run(db, _request(lambda p: calibrate() or accounting.laplace(0.8)), _read))
    assert "budget of 'trips' exceeded" in str(planned.get("error"))
    assert _statuses(con) == [(1, "spent")] and ledger.spent(con, "trips") == pytest.approx(0.5)


def test_settling_does_not_hold_up_another_release(con):
    _trips(con)
    con.sql("FROM mob_set_budget('trips', eps := 2.0, delta := 0)").fetchall()
    db = release.database(con)
    settled = accounting.compose([DRAWN, accounting.laplace(0.6)])
    fitted, count_done = _while_counting(
        con, lambda calibrate: _fit_settling(db, lambda p: calibrate() or (settled, "model")))
    assert fitted.get("result") == ("model", 1), fitted.get("error")
    assert count_done < fitted["done"]
    assert ledger.spent(con, "trips") == pytest.approx(1.2)


# -- one lock per database file ------------------------------------------------------------------------------

def test_every_path_to_one_file_shares_one_lock_and_one_budget(tmp_path, monkeypatch):
    path = tmp_path / "trips.duckdb"
    first = duckmob.connect(str(path))
    _trips(first)
    (tmp_path / "link.duckdb").symlink_to(path)
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    paths = [str(tmp_path / "link.duckdb"), os.path.join("..", "trips.duckdb"),
             str(tmp_path / "sub" / ".." / "trips.duckdb")]
    cons = [first] + [duckmob.connect(p) for p in paths]
    try:
        dbs = [release.database(c) for c in cons]
        assert all(db.lock is dbs[0].lock for db in dbs)
        cons[1].sql("FROM mob_set_budget('trips', eps := 1.0, delta := 0)").fetchall()
        start = threading.Barrier(2)

        def count(c, what):
            def work():
                start.wait(WAIT)
                _count(c, 0.8, what)
            return work

        # through the symlink and the relative path; two different requests (the same one twice is one release)
        runs = [_in_thread(count(c, w)) for c, w in ((cons[1], "trajectories"), (cons[2], "users"))]
        for thread, _ in runs:
            thread.join(WAIT)
        outcomes = [o.get("error") for _, o in runs]
        assert sum(e is None for e in outcomes) == 1
        (refused,) = [e for e in outcomes if e is not None]
        assert "budget of 'trips' exceeded" in one_line(refused)
        for c in cons:
            assert ledger.spent(c, "trips") == pytest.approx(0.8)
            assert [s for _, s in _statuses(c)] == ["spent"]
    finally:
        for c in cons:
            c.close()


def test_a_hard_link_to_an_open_database_is_refused(tmp_path):
    path = tmp_path / "trips.duckdb"
    first = duckmob.connect(str(path))
    _trips(first)
    first.sql("FROM mob_set_budget('trips', eps := 1.0, delta := 0)").fetchall()
    first.execute("FROM mob_noisy_count('trips', eps := 0.8)").fetchall()
    first.execute("CHECKPOINT")
    os.link(path, tmp_path / "hard.duckdb")
    # DuckDB opens a second, independent instance of the file through the hard link: its writes (a second 0.8)
    # would not be seen by the first, and one checkpoint would overwrite the other's ledger rows
    second = duckdb.connect(str(tmp_path / "hard.duckdb"))
    with pytest.raises(DuckmobError, match="this process already has open as") as info:
        duckmob.register(second)
    second.close()
    assert str(path) in str(info.value)
    assert ledger.spent(first, "trips") == pytest.approx(0.8)
    first.close()
    # once the first path is closed, the hard link is just another name for the file
    again = duckmob.connect(str(tmp_path / "hard.duckdb"))
    try:
        assert release.database(again).path == str(tmp_path / "hard.duckdb")
        assert ledger.spent(again, "trips") == pytest.approx(0.8)
    finally:
        again.close()


def test_in_memory_databases_keep_one_lock_each():
    a, b = duckmob.connect(), duckmob.connect()
    try:
        assert release.database(a).lock is not release.database(b).lock
    finally:
        a.close()
        b.close()


def test_the_press_count_only_grows():
    before = interrupts.presses()
    release.interrupt_all()
    assert interrupts.presses() == before + 1
