"""The synthesizer contract (duckmob/synth/base.py): checked over every registered method, and pinned with a fake
method (fake_method.py) on the paths users run (duckmob.synthesize, mob_fit, mob_sample)."""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path

import numpy as np
import pytest

import duckmob
from duckmob import synth
from duckmob.errors import DuckmobError
from duckmob.grid import BBox
from duckmob.privacy import accounting
from duckmob.privacy.unit import PrivacyUnit
from duckmob.synth import base
from duckmob.synth.config import Config

import fake_method

BBOX = [39.8, 116.2, 40.1, 116.6]
MODELS = Path(__file__).parent.parent / "data" / "models_v1"
# a recorded format-1 model of each method (tests/seeded_outputs.py)
STORED = {"privtrace": "privtrace", "hrnet": "hrnet", "baseline": "baseline", "pategail": "pategail",
          "cleanslate": "cleanslate"}


# -- every registered method ------------------------------------------------------------------------------------

@pytest.mark.parametrize("method", sorted(synth.METHODS))
def test_every_method_declares_the_contract(method):
    cls = synth.get(method)
    assert issubclass(cls, base.Synthesizer) and cls.method == method
    assert issubclass(cls.config_class, Config)
    assert cls.config_class.method in synth.METHODS     # spelled as the registry key (HRNet's config: 'hrnet')
    assert issubclass(cls.model_class, base.Model) and cls.model_class.format_version >= 2
    assert not inspect.isabstract(cls) and not inspect.isabstract(cls.model_class)
    assert list(inspect.signature(cls.model_class.sample).parameters) == ["self", "n", "rng"]
    for gone in ("privacy_event", "streams", "cfg"):
        assert not hasattr(cls, gone), f"{method} still has {gone}"
    s = cls(BBOX)
    assert isinstance(s.config, cls.config_class) and not hasattr(s, "cfg")
    if cls.needs_delta:
        assert cls.default_delta > 0 and cls.mechanism


@pytest.mark.parametrize("method", ["hrnet", "baseline", "cleanslate", "pategail"])
def test_a_device_torch_cannot_name_is_refused_with_the_parameters(method):
    """The torch methods check ``device`` where every parameter is checked (Config.parse), in one line."""
    cls = synth.get(method)
    label = cls.config_class.label()
    with pytest.raises(DuckmobError, match=f"^{label} parameter device must be a torch device such as 'cpu' or "
                                           "'cuda', got 'gpu0'$"):
        cls(BBOX, device="gpu0")
    assert cls(BBOX, device="cpu").config.device == "cpu"


@pytest.mark.parametrize("method", sorted(synth.METHODS))
@pytest.mark.parametrize("unit", [PrivacyUnit.trajectory(), PrivacyUnit.user(3)])
def test_every_plan_is_public_and_within_its_budget(method, unit):
    cls = synth.get(method)
    eps, delta = 2.0, cls.default_delta
    plan = cls(BBOX).plan(eps, delta, unit)
    assert isinstance(plan, base.Plan)
    assert (plan.eps, plan.delta, plan.unit) == (eps, delta, unit)
    assert plan.bbox == BBox.of(BBOX) and plan.needs_time == cls.needs_time
    assert accounting.epsilon(plan.event, delta) <= eps * (1 + 1e-6)
    assert plan.sample_rate is None or 0 < plan.sample_rate <= 1
    # planned from public parameters only: the same plan again
    assert cls(BBOX).plan(eps, delta, unit).event == plan.event


@pytest.mark.parametrize("method", sorted(STORED))
def test_every_model_stores_its_method_and_format(method):
    blob = (MODELS / f"{STORED[method]}.bin").read_bytes()
    assert base.unpack(blob)[:2] == (None, 1)                    # today's recorded models: no header, format 1
    model = synth.model_class(method).from_bytes(blob, method)
    again = model.to_bytes()
    assert base.unpack(again)[:2] == (method, model.format_version)
    reloaded = synth.model_class(method).from_bytes(again)
    # the machine's settings (device, threads, progress, workers) are neither stored nor described
    assert not set(Config.MACHINE) & set(model.describe()) and not set(Config.MACHINE) & set(reloaded.describe())
    a, b = model.sample(7, np.random.default_rng(3)), reloaded.sample(7, np.random.default_rng(3))
    for name in ("offsets", "ts", "lat", "lon"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    newer = base.pack(method, model.format_version + 1, model.payload())
    with pytest.raises(DuckmobError, match="stored by a newer duckmob"):
        synth.model_class(method).from_bytes(newer)
    other = "pategail" if method != "pategail" else "privtrace"
    with pytest.raises(DuckmobError, match=f"fitted by method '{other}'"):
        synth.model_class(method).from_bytes(base.pack(other, 2, model.payload()))


# -- the fake method on the release paths ------------------------------------------------------------------------

@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setitem(synth.METHODS, "fake", "fake_method:Fake")
    monkeypatch.setitem(synth.METHODS, "needsdelta", "fake_method:NeedsDelta")
    fake_method.CALLS.clear()
    return fake_method.CALLS


@pytest.fixture
def trips():
    con = duckmob.connect()
    # user 1 has 5 trajectories, users 2 and 3 one each; traj_id 7 is used by two users (two trajectories)
    rows = [(t, u, f"2008-01-01 00:0{s}:00", 39.9 + 0.001 * s, 116.4) for t, u in [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (7, 2), (7, 3)]
            for s in range(3)]
    con.execute("CREATE TABLE trips (traj_id BIGINT, user_id BIGINT, ts TIMESTAMP, lat DOUBLE, lon DOUBLE)")
    con.executemany("INSERT INTO trips VALUES (?, ?, ?, ?, ?)", rows)
    con.execute("FROM mob_set_budget('trips', eps := 10, delta := 1e-5)").fetchall()
    yield con
    con.close()


def _ledger(con):
    return con.sql("SELECT mechanism, epsilon, delta, privacy_unit, params, event, status FROM mob_ledger() "
                   "ORDER BY id").fetchall()


def test_the_core_reserves_the_plan_it_hands_to_fit(fake, trips):
    out = duckmob.synthesize(trips, "trips", 1.5, method="fake", bbox=BBOX, seed=4, n=3)
    assert out.num_rows == 6
    [call] = fake
    plan = call["plan"]
    assert isinstance(plan, fake_method.FakePlan) and plan.eps == 1.5 and plan.unit == PrivacyUnit.trajectory()
    assert call["source"] == "Cleaned" or call["source"].endswith("Batches")   # the source's batches, not a table
    assert call["trajectories"] == 7 and call["noise_seeded"]
    [(mechanism, eps, delta, unit, params, event, status)] = _ledger(trips)
    assert (mechanism, eps, unit, status) == ("fake", 1.5, "trajectory", "spent")
    assert accounting.Event.from_json(event) == plan.event
    assert json.loads(params)["max_trajectories_per_user"] == 1


def test_the_source_is_bounded_to_the_unit_before_fit(fake, trips):
    duckmob.synthesize(trips, "trips", 1.0, method="fake", bbox=BBOX, seed=4, n=2, privacy_unit="user",
                       max_trajectories_per_user=2)
    [call] = fake
    assert call["plan"].unit == PrivacyUnit.user(2)
    assert sorted(call["per_user"]) == [1, 1, 2] and call["trajectories"] == 4
    [(_, _, _, unit, params, _, _)] = _ledger(trips)
    assert unit == "user" and json.loads(params)["max_trajectories_per_user"] == 2


def test_seeded_noise_comes_from_the_release(fake, trips):
    for n in (2, 3):   # (the same request twice would be served from the first: duckmob.release.registry.Recent)
        duckmob.synthesize(trips, "trips", 1.0, method="fake", bbox=BBOX, seed=9, n=n, params='{"count_share": 0.5}')
    duckmob.synthesize(trips, "trips", 1.0, method="fake", bbox=BBOX, seed=10, n=2, params='{"count_share": 0.5}')
    a, b, c = (call["noisy"] for call in fake)
    assert a == b != c


def test_a_settled_plan_replaces_the_reservation(fake, trips):
    duckmob.synthesize(trips, "trips", 2.0, method="fake", bbox=BBOX, seed=1, n=2, params='{"replan": true}')
    [(_, _, _, _, _, event, status)] = _ledger(trips)
    assert status == "spent" and accounting.Event.from_json(event) == accounting.laplace(1.0)


def test_needs_delta_is_refused_before_anything_is_read(fake, trips):
    with pytest.raises(DuckmobError, match=r"needsdelta adds Gaussian noise and needs 0 < delta"):
        duckmob.synthesize(trips, "trips", 1.0, method="needsdelta", bbox=BBOX, delta=0, n=2)
    assert fake == [] and _ledger(trips) == []


def test_a_stored_fake_model_carries_its_method_and_format(fake, trips):
    trips.execute("FROM mob_fit('trips', 'm', eps := 1.0, method := 'fake', bbox := ?, seed := 2)", [BBOX]).fetchall()
    blob = trips.execute("SELECT model FROM duckmob_models WHERE name = 'm'").fetchall()[0][0]
    assert base.unpack(blob)[:2] == ("fake", 2)
    rows = trips.sql("FROM mob_sample('m', n := 3, seed := 5)").fetchall()
    assert len(rows) == 6 and trips.sql("FROM mob_sample('m', n := 3, seed := 5)").fetchall() == rows
    assert math.isclose(fake_method.FakeModel.from_bytes(blob).n_noisy, fake[0]["noisy"])
