"""method := 'hrnet' / 'baseline' through synthesize, mob_fit and mob_sample (one ledger spend per fit)."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

import duckmob
from duckmob.errors import DuckmobError
from duckmob.privacy import accounting, ledger
from duckmob.synth import store
from duckmob.synth.hrnet import HRNet

BOX = "[39.8, 116.2, 40.2, 116.6]"
BOX_LIST = [39.8, 116.2, 40.2, 116.6]
TINY = "{'w': 4, 'epochs': 1, 'pretrain_iterations': 20, 'stay_points': false, 'max_len': 5, 'n_hint': 200}"


@pytest.fixture
def db():
    con = duckmob.connect()
    rng = np.random.default_rng(0)
    rows = []
    for t in range(150):
        a = np.array([39.85, 116.25]) + rng.random(2) * 0.3
        b = np.array([39.85, 116.25]) + rng.random(2) * 0.3
        for i, f in enumerate(np.linspace(0, 1, int(rng.integers(2, 5)))):
            p = a + f * (b - a)
            rows.append((t % 20, t, i * 3600, float(p[0]), float(p[1])))
    con.execute("CREATE TABLE trips (user_id INTEGER, traj_id INTEGER, ts TIMESTAMP, lat DOUBLE, lon DOUBLE)")
    con.executemany("INSERT INTO trips VALUES (?, ?, to_timestamp(1.2e9 + ?)::TIMESTAMP, ?, ?)", rows)
    yield con
    con.close()


def test_hrnet_fit_sample_and_synthesize_from_sql(db, monkeypatch):
    def spent_events():   # the events of the finished releases, in order
        return [accounting.Event.from_json(r[0]) for r in
                db.execute("SELECT event FROM duckmob_ledger WHERE status = 'spent' ORDER BY id").fetchall()]

    ledger.set_budget(db, "trips", 5.0, 1e-5)
    row = db.execute(f"FROM mob_fit('trips', 'h', eps := 2.0, delta := 1e-5, method := 'hrnet', bbox := {BOX}, "
                     f"seed := 1, params := {TINY})").fetchall()
    spent = spent_events()
    assert row[0][:2] == ("h", "hrnet") and len(spent) == 1
    assert accounting.epsilon(spent[0], 1e-5) <= 2.0 + 1e-9
    out = db.execute("FROM mob_sample('h', n := 40, seed := 2)").fetchall()
    assert len({r[0] for r in out}) == 40 and all(r[4] is not None for r in out)  # times are modelled
    again = db.execute("FROM mob_sample('h', n := 40, seed := 2)").fetchall()
    assert out == again
    syn = db.execute(f"FROM synthesize('trips', eps := 1.0, method := 'baseline', bbox := {BOX}, n := 30, "
                     f"seed := 3, params := {TINY})").fetchall()
    assert len({r[0] for r in syn}) == 30 and len(spent_events()) == 2


def test_ledger_records_the_run_not_the_plan(db):
    """The plan checked before reading data uses n_hint = 200; the run's sampling rate follows the noisy count of
    150 trajectories: the ledger row holds the run's own DP-SGD event, and the budget still holds composed with
    an earlier release."""
    ledger.set_budget(db, "trips", 2.0, 1e-5)
    ledger.record(db, "trips", accounting.laplace(1.0), mechanism="earlier", privacy_unit="trajectory", params={},
                  seeded=True)
    db.execute(f"FROM mob_fit('trips', 'h', eps := 0.99, method := 'hrnet', bbox := {BOX}, seed := 1, "
               f"params := {TINY})").fetchall()
    event = ledger.events(db, "trips")[-1]
    sgd = next(e for e in event.leaves() if e.kind == "dp_sgd")
    _, model = store.load(db, "h")
    assert sgd.param("sample_rate") == pytest.approx(model.info["sample_rate"])
    assert sgd.param("noise_multiplier") == pytest.approx(model.info["noise_multiplier"])
    plan = HRNet(BOX_LIST, w=4, epochs=1, pretrain_iterations=20, stay_points=False, max_len=5, n_hint=200)
    planned = next(e for e in plan.plan(0.99, 1e-5).event.leaves() if e.kind == "dp_sgd")
    assert sgd.param("sample_rate") != pytest.approx(planned.param("sample_rate"), rel=1e-3)
    assert ledger.spent(db, "trips") <= 2.0 + 1e-9


def test_refusal_after_the_noisy_count_records_the_count(db, monkeypatch):
    """A plan that fails only once the noisy count is known (here forced) is refused, no model is stored, and
    the ledger records the count's Laplace spend, since the refusal depends on it."""
    planned = HRNet.schedule

    def schedule(self, eps, delta, unit, n_trajectories, n_units, prior=None, default_size=None):
        if n_trajectories != self.config.n_hint:
            raise DuckmobError("forced: eps is too small for DP-SGD after the other releases")
        return planned(self, eps, delta, unit, n_trajectories, n_units, prior, default_size)

    monkeypatch.setattr(HRNet, "schedule", schedule)
    ledger.set_budget(db, "trips", 2.0, 1e-5)
    with pytest.raises(duckdb.Error, match="forced"):
        db.execute(f"FROM mob_fit('trips', 'h', eps := 1.0, method := 'hrnet', bbox := {BOX}, seed := 1, "
                   f"params := {TINY})").fetchall()
    (row,) = db.execute("SELECT event, status FROM mob_ledger()").fetchall()
    assert accounting.Event.from_json(row[0]) == accounting.compose([accounting.laplace(0.01)])
    assert row[1] == "failed"
    assert db.execute("SELECT count(*) FROM mob_models()").fetchall() == [(0,)]
