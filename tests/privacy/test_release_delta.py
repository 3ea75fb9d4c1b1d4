"""A release never spends more than the eps asked at the budget's delta without saying so before the reservation
(issue 38, point 11), and a count too noisy to size an output points at mob_check for the bbox."""

import duckdb
import pytest

import duckmob
from duckmob.errors import BudgetError, DuckmobError
from duckmob.privacy import accounting as acc
from duckmob.privacy import ledger
from duckmob.release.fitting import default_size

TRIPS = ("CREATE TABLE trips AS SELECT (range % 10)::INTEGER AS user_id, (range // 6)::INTEGER AS traj_id, "
         "TIMESTAMP '2024-01-01' + INTERVAL (range % 6) MINUTE AS ts, 0.1 + (range % 7) / 10 AS lat, "
         "0.1 + (range % 5) / 10 AS lon FROM range(600)")
FAST = ("{'w': 4, 'n_time': 4, 'ti_epochs': 1, 'tpg_epochs': 1, 'ti_hidden': 8, 'ti_latent': 2, 'tpg_embed': 4, "
        "'tpg_hidden': 8, 'n_hint': 200, 'batch_size': 8, 'ti_coarse': 2, 'progress': false, 'device': 'cpu'}")
SGD = acc.dp_sgd(1.0, 0.00256, 4000)   # eps about 1 at delta 1e-5


def test_an_event_costing_more_at_the_budget_delta_than_asked_is_refused_saying_what_to_pass():
    asked = acc.epsilon(SGD, 1e-5)
    at_budget = acc.epsilon(SGD, 1e-7)
    assert at_budget > asked * 1.05
    p = ledger.Prior("trips", 10.0, 1e-7, ())
    with pytest.raises(BudgetError) as err:
        p.check_asked(SGD, asked, 1e-5)
    assert str(err.value) == (f"this release asks eps {asked:g} at delta 1e-05, but the budget of 'trips' is kept at "
                              f"delta 1e-07, where it would cost eps {at_budget:.4g}, more than asked: pass "
                              "delta := 1e-07 to plan it at the budget's delta")
    p.check_asked(SGD, at_budget, 1e-5)          # asked for what it costs there: fine
    ledger.Prior("trips", 10.0, 1e-5, ()).check_asked(SGD, asked, 1e-5)    # the budget's own delta
    ledger.Prior("trips", 10.0, 1e-3, ()).check_asked(SGD, asked, 1e-5)    # a larger one costs less
    p.check_asked(acc.laplace(0.5), 0.5, 1e-5)                             # pure: eps 0.5 at every delta


def test_a_clean_slate_release_at_its_default_delta_is_refused_before_the_reservation(con):
    con.execute(TRIPS)
    con.sql("FROM mob_set_budget('trips', eps := 5.0, delta := 1e-7)").fetchall()
    query = ("FROM synthesize('trips', eps := 1.0, method := 'cleanslate', bbox := [0.0, 0.0, 1.0, 1.0], n := 5, "
             f"seed := 1, params := {FAST}DELTA)")
    with pytest.raises(duckdb.Error,
                       match=r"this release asks eps 1 at delta 1e-05, but the budget of 'trips' is kept at delta "
                             r"1e-07, where it would cost eps 1\.\d+, more than asked: pass delta := 1e-07"):
        con.sql(query.replace("DELTA", "")).fetchall()
    assert con.sql("SELECT count(*) FROM duckmob_ledger").fetchall() == [(0,)]   # nothing reserved
    rows = con.sql(query.replace("DELTA", ", delta := 1e-7")).fetchall()
    assert len({r[0] for r in rows}) == 5
    [(epsilon, delta, status)] = con.sql("SELECT epsilon, delta, status FROM duckmob_ledger").fetchall()
    assert (delta, status) == (1e-7, "spent") and epsilon <= 1.0 + 1e-9


def test_a_count_too_noisy_to_size_the_output_suggests_checking_the_bbox_with_mob_check():
    class Counted:
        default_n = 3
        size_count = {"value": 3, "eps": 0.016, "k": 1, "scale": 1 / 0.016}

    with pytest.raises(DuckmobError) as err:
        default_size(Counted())
    message = str(err.value)
    assert "few of its trajectories lie inside the bbox" in message
    assert "FROM mob_check('<table>', bbox := [...])" in message and "\n" not in message
