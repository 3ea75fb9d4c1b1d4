"""Ctrl-C from the first moment of a release, and a stopped fit charged what ran (duckmob.release.interrupts,
Release.stopped, duckmob.synth.dpsgd.charged_as_run).

Presses are simulated with ``release.interrupt_all()`` (what the SIGINT handler calls) from hooks that run at an
exact point of the release: between its entry (the UDF, the Python API) and its reservation, or before a given
DP-SGD step. Each test asserts what the ledger holds afterwards.
"""

from __future__ import annotations

import dataclasses

import duckdb
import pytest

import duckmob
from duckmob import release
from duckmob.cli import shell as cli_shell
from duckmob.errors import one_line
from duckmob.privacy import accounting
from duckmob.release import counting, fitting, interrupts
from duckmob.synth import dpsgd
from straight_trips import straight_trips

SQL_BOX = "[0.0, 0.0, 1.0, 1.0]"
BOX = [0.0, 0.0, 1.0, 1.0]
CANCELLED = "interrupted (Ctrl-C) before the data was read: the release was cancelled, nothing was spent"
# tiny fits: the hook presses before any of them trains, or after a few steps
PARAMS = {"privtrace": {"K": 2, "max_depth": 0},
          "hrnet": {"w": 4, "epochs": 3, "progress": False, "pretrain_iterations": 5, "n_hint": 200}}


def _trips(con, n=200, seed=0):
    straight_trips(con, n, seed)
    con.sql("FROM mob_set_budget('trips', eps := 10.0, delta := 1e-5)").fetchall()


def _rows(con) -> list[tuple[str, accounting.Event]]:
    return [(status, accounting.Event.from_json(event)) for status, event in
            con.execute("SELECT status, event FROM duckmob_ledger ORDER BY id").fetchall()]


def _pressing(fn):
    """``fn`` that presses Ctrl-C first (once per call)."""
    def pressed(*args, **kwargs):
        release.interrupt_all()
        return fn(*args, **kwargs)
    return pressed


def _sql_params(params: dict) -> str:
    return "{" + ", ".join(f"'{k}': {str(v).lower() if isinstance(v, bool) else v}" for k, v in params.items()) + "}"


# -- a press between entry and reservation -------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["privtrace", "hrnet"])
@pytest.mark.parametrize("path", ["sql", "python"])
def test_a_press_between_entry_and_reservation_cancels_with_nothing_spent(con, monkeypatch, method, path):
    """fit_request (the argument checks, where HRNet's first torch import happens) runs after the entry point
    took the press count and before protocol.run: a press there was lost before issue 38 and the fit spent."""
    _trips(con)
    monkeypatch.setattr(fitting, "fit_request", _pressing(fitting.fit_request))
    sql = (f"FROM synthesize('trips', eps := 1.0, method := '{method}', bbox := {SQL_BOX}, seed := 1, "
           f"params := {_sql_params(PARAMS[method])})")
    if path == "sql":
        with pytest.raises(duckdb.Error) as info:
            con.sql(sql).fetchall()
        message = one_line(info.value)
    else:
        with pytest.raises(release.Interrupted) as info:
            duckmob.synthesize(con, "trips", 1.0, method, bbox=BOX, seed=1, **PARAMS[method])
        message = str(info.value)
    assert CANCELLED in message
    assert _rows(con) == [] and con.execute("SELECT spent FROM mob_budget()").fetchall()[0][0] == 0.0
    # a release entered after the press is not affected by it
    monkeypatch.undo()
    if method == "privtrace":
        assert con.sql(sql.replace("seed := 1", "seed := 2, n := 50")).fetchall()
        assert [status for status, _ in _rows(con)] == ["spent"]


@pytest.mark.parametrize("path", ["sql", "python"])
def test_a_press_before_a_noisy_count_is_reserved_cancels_it(con, monkeypatch, path):
    _trips(con)
    monkeypatch.setattr(counting, "check_scale", _pressing(counting.check_scale))
    if path == "sql":
        with pytest.raises(duckdb.Error, match="before the data was read"):
            con.sql("FROM mob_noisy_count('trips', eps := 0.5, seed := 1)").fetchall()
    else:
        with pytest.raises(release.Interrupted, match="before the data was read"):
            duckmob.noisy_count(con, "trips", eps=0.5, seed=1)
    assert _rows(con) == []


def test_a_press_after_a_shell_statement_began_and_before_the_udf_was_called_cancels(con, monkeypatch):
    """interrupts.statement(): DuckDB calls the UDF on a thread of its own, after planning and gathering; a press
    in that time (here: right before DuckDB is handed the statement) stops the release it then makes."""
    import io

    _trips(con)
    out, err = io.StringIO(), io.StringIO()
    shell = cli_shell.Shell(con, out=out, err=err)
    monkeypatch.setattr(cli_shell.Shell, "_statement", _pressing(cli_shell.Shell._statement))
    assert not shell.run_sql(f"FROM synthesize('trips', eps := 1.0, bbox := {SQL_BOX}, params := {{'K': 2}});")
    assert shell.interrupted and err.getvalue().endswith(cli_shell.INTERRUPTED + "\n")
    assert _rows(con) == []
    assert interrupts._STATEMENT is None   # the statement's scope closed with it


def test_entered_keeps_the_outermost_count_and_releases_outside_see_the_count_now():
    assert interrupts._ENTERED.get() is None
    before = interrupts.presses()
    with interrupts.entered():
        release.interrupt_all()
        with interrupts.entered():
            assert interrupts.since() == before
    assert interrupts.since() == interrupts.presses() == before + 1


# -- a press during training -----------------------------------------------------------------------------------------

def _press_before_step(monkeypatch, step: int, run: int = 0):
    """Press Ctrl-C as DP-SGD run number ``run`` (in this process) is about to begin step ``step`` (1-based):
    the steps before it ran."""
    loop, runs = dpsgd._loop, []

    def pressing_loop(*args, context, **kwargs):
        check_interrupt = context.check_interrupt
        calls, this = [], len(runs)
        runs.append(this)

        def check():
            calls.append(1)
            if this == run and len(calls) == step:
                release.interrupt_all()
            check_interrupt()
        return loop(*args, context=dataclasses.replace(context, check_interrupt=check), **kwargs)

    monkeypatch.setattr(dpsgd, "_loop", pressing_loop)


def test_a_press_during_hrnet_dp_sgd_records_the_steps_that_ran(con, monkeypatch):
    _trips(con)
    _press_before_step(monkeypatch, 6)
    params = {**PARAMS["hrnet"], "epochs": 4}
    with pytest.raises(duckdb.Error, match=r"interrupted \(Ctrl-C\): the release stopped"):
        con.sql(f"FROM mob_fit('trips', 'h', eps := 2.0, method := 'hrnet', bbox := {SQL_BOX}, seed := 3, "
                f"params := {_sql_params(params)})").fetchall()
    ((status, event),) = _rows(con)
    (dp,) = [leaf for leaf in event.leaves() if leaf.kind == "dp_sgd"]
    assert status == "failed" and dp.param("steps") == 5
    # the Laplace parts (counts, lengths, fine stage, DPTRAN) stay; 5 steps of a run planned to spend eps 2
    assert [leaf.kind for leaf in event.leaves()].count("laplace") >= 3
    spent = con.execute("SELECT spent FROM mob_budget()").fetchall()[0][0]
    assert spent == pytest.approx(accounting.epsilon(event, 1e-5), rel=1e-3)
    assert spent < 1.5
    assert con.execute("SELECT count(*) FROM duckmob_models").fetchall()[0][0] == 0


def test_a_press_in_hrnet_pre_training_charges_no_dp_sgd_step(con, monkeypatch):
    _trips(con)
    pretrain = duckmob.synth.hrnet.pretrain

    def pressing_pretrain(*args, check_interrupt, **kwargs):
        release.interrupt_all()
        return pretrain(*args, check_interrupt=check_interrupt, **kwargs)

    monkeypatch.setattr(duckmob.synth.hrnet, "pretrain", pressing_pretrain)
    with pytest.raises(release.Interrupted, match="stopped"):
        duckmob.synthesize(con, "trips", 2.0, "hrnet", bbox=BOX, seed=3, **PARAMS["hrnet"])
    ((status, event),) = _rows(con)
    assert status == "failed" and event.leaves() and all(leaf.kind == "laplace" for leaf in event.leaves())


def test_an_error_in_clean_slate_tpg_keeps_ti_whole_and_the_tpg_steps_that_ran(con, monkeypatch):
    """Any failure, not only Ctrl-C, is charged what ran: TI (DP-SGD part 0) whole, TPG (part 1) to its steps."""
    _trips(con)
    loop, runs = dpsgd._loop, []

    def failing_loop(*args, context, **kwargs):
        check_interrupt = context.check_interrupt
        this, calls = len(runs), []
        runs.append(this)

        def check():
            calls.append(1)
            if this == 1 and len(calls) == 3:
                raise MemoryError("out of memory in step 3")
            check_interrupt()
        return loop(*args, context=dataclasses.replace(context, check_interrupt=check), **kwargs)

    monkeypatch.setattr(dpsgd, "_loop", failing_loop)
    reserved, stopped = [], release.Release.stopped

    def recorded_stopped(self, drawn):
        reserved.append(self.event)
        return stopped(self, drawn)

    monkeypatch.setattr(release.Release, "stopped", recorded_stopped)
    tiny = dict(w=4, n_time=4, ti_epochs=1, tpg_epochs=1, ti_hidden=8, ti_latent=2, tpg_embed=4, tpg_hidden=8,
                n_hint=200, batch_size=8, ti_coarse=2)
    with pytest.raises(MemoryError):
        duckmob.synthesize(con, "trips", 1.0, "cleanslate", bbox=BOX, seed=4, **tiny)
    ((status, event),) = _rows(con)
    (whole,) = reserved
    ti, tpg = [leaf for leaf in event.leaves() if leaf.kind == "dp_sgd"]
    planned_ti, planned_tpg = [leaf for leaf in whole.leaves() if leaf.kind == "dp_sgd"]
    assert status == "failed" and runs == [0, 1]
    assert ti == planned_ti and planned_tpg.param("steps") > 2
    assert tpg == accounting.dp_sgd(planned_tpg.param("noise_multiplier"), planned_tpg.param("sample_rate"), 2)
    assert [leaf for leaf in event.leaves() if leaf.kind != "dp_sgd"] == \
        [leaf for leaf in whole.leaves() if leaf.kind != "dp_sgd"]


def test_a_press_during_pategail_rounds_charges_the_rounds_that_began(con, monkeypatch):
    _trips(con)
    from duckmob.synth import pategail

    release_round, rounds = pategail.aggregate.release_round, []

    def pressing_round(*args, **kwargs):
        rounds.append(1)
        if len(rounds) == 2:
            release.interrupt_all()   # round 2's noise is drawn; round 3 is stopped at its check
        return release_round(*args, **kwargs)

    monkeypatch.setattr(pategail.aggregate, "release_round", pressing_round)
    with pytest.raises(release.Interrupted):
        duckmob.synthesize(con, "trips", 1.0, "pategail", bbox=BOX, seed=5, w=4, rounds=6, episodes=4)
    ((status, event),) = _rows(con)
    planned = duckmob.synth.get("pategail")(BOX, w=4, rounds=6, episodes=4).plan(1.0, 1e-5)
    (gaussian,) = [leaf for leaf in event.leaves() if leaf.kind == "gaussian"]
    assert status == "failed" and len(rounds) == 2
    assert gaussian == accounting.gaussian_rounds(planned.sigma_round, 2)


def test_a_cut_outside_the_reservation_is_ignored():
    """Release.stopped never records more than a sub-event of the reservation, nor anything else."""
    reserved = accounting.compose([accounting.laplace(0.1), accounting.dp_sgd(2.0, 0.1, 100)])
    assert release.protocol.within(accounting.compose([accounting.laplace(0.1), accounting.dp_sgd(2.0, 0.1, 7)]),
                                   reserved)
    for outside in ([accounting.dp_sgd(2.0, 0.1, 101)], [accounting.dp_sgd(1.9, 0.1, 7)],
                    [accounting.laplace(0.2)], [accounting.laplace(0.1), accounting.laplace(0.1)]):
        assert not release.protocol.within(accounting.compose(outside), reserved)
    assert dpsgd.ran_event(reserved, 0, None) == reserved
    assert dpsgd.ran_event(reserved, 0, 0) == accounting.compose([accounting.laplace(0.1)])
