"""PateGail: the EPR MDP, the isolated personal discriminators, the private aggregation and its accounting, and a
tiny end-to-end fit through SQL under both privacy units."""

from __future__ import annotations

import json
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting import pld

import duckmob
from duckmob.errors import DuckmobError
from duckmob.privacy import accounting, ledger
from duckmob.privacy.noise import NoiseSource
from duckmob.privacy.unit import PrivacyUnit
from duckmob.release.fitting import fit_request
from duckmob.synth.base import fit_unrecorded, pack
from duckmob.synth import pategail
from duckmob.synth.pategail import PateGail, PateGailConfig, PateGailModel, PateGailPlan, aggregate, mdp, render, student
from duckmob.synth.pategail.discriminators import Ensemble, sample_own
from duckmob.trajectories import Trajectories

BOX = [0.0, 0.0, 1.0, 1.0]
SLOT = mdp.DAY_US // 48
FAST = {"rounds": 3, "episodes": 32, "disc_steps": 2}


def _traj(points_per_traj: list[list[tuple[int, float, float]]], users=None) -> Trajectories:
    """Trajectories from lists of (ts in µs, lat, lon)."""
    lengths = [len(p) for p in points_per_traj]
    flat = [q for p in points_per_traj for q in p]
    n = len(lengths)
    return Trajectories(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), np.arange(n, dtype=np.int64),
                        np.asarray(users if users is not None else np.zeros(n), dtype=np.int64),
                        np.array([q[0] for q in flat], dtype=np.int64), np.array([q[1] for q in flat]),
                        np.array([q[2] for q in flat]))


def _centre(cell: int, w: int = 4) -> tuple[float, float]:
    return ((cell // w) + 0.5) / w, ((cell % w) + 0.5) / w


# ------------------------------------------------------------------------------------------------------ the MDP

def test_episodes_take_the_last_fix_of_each_slot_and_carry_it_forward():
    day = 10 * mdp.DAY_US
    t0 = day + 3 * SLOT + 60_000_000          # slot 3 of the day, one minute in
    pts = [(t0, *_centre(5)), (t0 + 60_000_000, *_centre(6)),          # slot 3: first fix 5, last 6
           (t0 + SLOT, *_centre(6)),                                    # slot 4: 6
           (t0 + 3 * SLOT, *_centre(9))]                                # slot 5 empty, slot 6: 9
    ep = mdp.episodes(_traj([pts]), BOX, 4, 48, 48, np.array([7]))
    assert ep.steps.tolist() == [4] and ep.first_slot.tolist() == [3] and ep.device.tolist() == [7]
    assert ep.cells[0, :6].tolist() == [5, 6, 6, 6, 9, -1]
    # a public cap on the slots: later fixes are ignored
    capped = mdp.episodes(_traj([pts]), BOX, 4, 48, 2, np.array([7]))
    assert capped.steps.tolist() == [2] and capped.cells[0].tolist() == [5, 6, 6]


def test_actions_are_inferred_from_the_locations():
    cells = np.array([[0, 0, 1, 0, 2, 1, -1]])
    act = mdp.infer_actions(cells, np.array([5]))
    names = [mdp.ACTIONS[a] for a in act[0, :5]]
    assert names == ["stay", "explore", "home", "explore", "return"] and act[0, 5] == -1
    distinct, run = mdp.history(cells, np.array([5]))
    assert distinct[0, :5].tolist() == [1, 1, 2, 2, 3] and run[0, :5].tolist() == [1, 2, 1, 1, 1]


def test_env_follows_the_epr_rules_and_its_features_match_the_episodes():
    w = 8
    ranks = mdp.nearest_ranks(w, 10)
    assert ranks.shape == (64, 10) and (ranks != np.arange(64)[:, None]).all()
    rng = np.random.default_rng(0)
    n = 400
    env = mdp.Env(rng.integers(0, 64, n), rng.integers(0, 48, n), np.full(n, 6), w=w, n_slots=48, max_steps=6,
                  alpha=0.6, ranks=ranks, rng=rng)
    feats = []
    plan = [mdp.EXPLORE, mdp.EXPLORE, mdp.RETURN, mdp.HOME, mdp.STAY, mdp.EXPLORE]
    for a in plan:
        feats.append(env.features())
        before = env.cur.copy()
        visited = env.visits > 0
        env.step(np.full(n, a))
        if a == mdp.EXPLORE:       # a new cell among the 10 nearest
            assert not visited[np.arange(n), env.cur].any()
            assert (env.cur[:, None] == ranks[before]).any(axis=1).all()
        if a == mdp.RETURN:        # a visited cell, not home and not the current one (two exist after 2 explores)
            assert visited[np.arange(n), env.cur].all()
            assert (env.cur != env.home).all() and (env.cur != before).all()
        if a == mdp.HOME:
            assert (env.cur == env.home).all()
        if a == mdp.STAY:
            assert (env.cur == before).all()
    ep = env.episodes()
    x, rows, cols = mdp.episode_pairs(ep, w, 48, 6)
    online = np.stack(feats, axis=1)[rows, cols]
    np.testing.assert_allclose(x[:, :mdp.N_STATE_FEATURES], online, atol=1e-6)
    inferred = x[:, mdp.N_STATE_FEATURES:].argmax(axis=1).reshape(n, 6)
    assert (inferred[:, 3] == mdp.HOME).all() and (inferred[:, 4] == mdp.STAY).all()


# ------------------------------------------------------------------------------------- personal discriminators

def test_a_device_discriminator_depends_on_its_own_data_only():
    def train(real_other):
        gen = torch.Generator().manual_seed(5)
        ens = Ensemble(3, mdp.N_FEATURES, 8, 1e-2, gen, torch.device("cpu"))
        fake = torch.randn(16, mdp.N_FEATURES, generator=torch.Generator().manual_seed(1))
        for _ in range(5):
            ens.train_step(real, fake)
        return [p.detach().clone() for p in ens.params]

    real = torch.randn(3, 4, mdp.N_FEATURES, generator=torch.Generator().manual_seed(2))
    a = train(real)
    real[2] = real[2] * 10 + 3        # device 2's data changes
    b = train(real)
    for pa, pb in zip(a, b):
        assert torch.equal(pa[:2], pb[:2])     # devices 0 and 1: bit-identical
        assert not torch.equal(pa[2], pb[2])
    # own-pair sampling stays inside each device's range
    offsets = np.array([0, 1, 4, 9])
    idx = sample_own(offsets, 50, np.random.default_rng(0))
    assert ((idx >= offsets[:-1, None]) & (idx < offsets[1:, None])).all()


# -------------------------------------------------------------------------------------------- private aggregation

def test_outputs_are_clipped_and_one_device_moves_a_batch_by_at_most_sqrt_b():
    raw = torch.tensor([[-0.5, 0.3, 2.0, float("nan")], [1.0, 1.0, 1.0, 1.0], [0.2, 0.9, 0.0, 0.5]])
    clipped = aggregate.clip_outputs(raw)
    assert clipped.min() >= 0 and clipped.max() <= 1 and not torch.isnan(clipped).any()
    rng = np.random.default_rng(0)
    for b in (1, 7, 500):
        outputs = torch.from_numpy(rng.uniform(-1, 2, (20, b)))
        outputs[3] = 1e9          # an adversarial device: as far as anything can go
        s1, s2 = aggregate.device_sums(outputs, True)
        for u in (3, 11):
            without = torch.cat([outputs[:u], outputs[u + 1:]])
            t1, t2 = aggregate.device_sums(without, True)
            assert np.abs(s1 - t1).max() <= 1 + 1e-12 and np.abs(s2 - t2).max() <= 1 + 1e-12
            assert np.linalg.norm(s1 - t1) <= np.sqrt(b) + 1e-9 and np.linalg.norm(s2 - t2) <= np.sqrt(b) + 1e-9
            # as means over n devices: at most 1/n per query, sqrt(B)/n per batch
            assert np.linalg.norm(s1 / 20 - t1 / 20) <= np.sqrt(b) / 20 + 1e-12
        assert np.linalg.norm(s1 - aggregate.device_sums(outputs[[i for i in range(20) if i != 3]], False)[0]) \
            == pytest.approx(np.sqrt(b))    # the bound is tight


def test_round_noise_has_the_stated_scale():
    b, sigma, f = 400, 3.0, 0.2
    s1 = np.full(b, 7.0)
    s2 = np.full(b, 5.0)
    x1, x2 = aggregate.release_round(s1, s2, sigma, f, NoiseSource(3).generator())
    sigma1, sigma2 = aggregate.split_sigma(sigma, f)
    assert 1 / sigma1 ** 2 + 1 / sigma2 ** 2 == pytest.approx(1 / sigma ** 2)
    assert np.std(x1 - s1) == pytest.approx(sigma1 * np.sqrt(b), rel=0.1)
    assert np.std(x2 - s2) == pytest.approx(sigma2 * np.sqrt(b), rel=0.1)
    assert aggregate.release_round(s1, None, sigma, 0.0, NoiseSource(3).generator())[1] is None
    r = aggregate.rewards(np.array([10.0, 10.0]), np.array([10.0, 5.0]), 20, 0.5)
    assert r.tolist() == pytest.approx([0.5 - 0.5 * 0.5, 0.5 - 0.5 * np.sqrt(0.0)])


def test_the_whole_run_is_one_event_matching_an_independent_composition():
    synth = PateGail(BOX, rounds=40, variance_share=0.25)
    for k in (1, 5):
        unit = PrivacyUnit.user(k) if k > 1 else PrivacyUnit.trajectory()
        plan = synth.plan(1.0, 1e-5, unit)
        assert isinstance(plan, PateGailPlan) and plan.rounds == 40 and plan.needs_time and plan.sample_rate is None
        assert plan.eps_start == 0.2 * 1.0
        # PateGail's own count split: the device count alone (k = 1), else trajectories and devices, half each
        assert plan.count_eps == ((0.02,) if k == 1 else (0.01, 0.01))
        event = plan.event
        assert accounting.epsilon(event, 1e-5) == pytest.approx(1.0, abs=2e-3)
        # independently: every round as its mean part and its variance part, each a Gaussian mechanism
        s1, s2 = aggregate.split_sigma(plan.sigma_round, 0.25)
        parts = [dp_accounting.LaplaceDpEvent(1 / plan.eps_start)]
        parts += [dp_accounting.LaplaceDpEvent(1 / e) for e in plan.count_eps]
        parts += [dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(s1), 40),
                  dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(s2), 40)]
        acc = pld.PLDAccountant()
        acc.compose(dp_accounting.ComposedDpEvent(parts))
        assert acc.get_epsilon(1e-5) == pytest.approx(1.0, abs=5e-3)
    # delta 0 is refused by the release core, before anything is reserved, with the method's reason
    assert PateGail.needs_delta
    with pytest.raises(DuckmobError, match="pategail releases Gaussian rounds and needs 0 < delta"):
        fit_request(source="trips", eps=1.0, delta=0.0, method="pategail", bbox=BOX)
    with pytest.raises(DuckmobError, match="variance_share"):
        PateGail(BOX, variance_weight=1.0, variance_share=0.0)
    with pytest.raises(DuckmobError, match="unknown PateGail parameter"):
        PateGail(BOX, round=3)


# -------------------------------------------------------------------------------------------------- end to end

@pytest.fixture
def trips():
    rng = np.random.default_rng(0)
    rows = []
    for t in range(90):
        a, b = rng.random(2) * 0.8 + 0.1, rng.random(2) * 0.8 + 0.1
        k = int(rng.integers(2, 8))
        start = 1.7e9 + 86400 * int(rng.integers(0, 5)) + int(rng.integers(0, 86400))
        for i, f in enumerate(np.linspace(0, 1, k)):
            p = a + f * (b - a)
            rows.append((t % 15, t, start + i * 900, float(p[0]), float(p[1])))
    con = duckmob.connect()
    con.execute("CREATE TABLE trips (user_id INTEGER, traj_id INTEGER, ts TIMESTAMP, lat DOUBLE, lon DOUBLE)")
    con.executemany("INSERT INTO trips VALUES (?, ?, to_timestamp(?)::TIMESTAMP, ?, ?)", rows)
    ledger.set_budget(con, "trips", 200.0, 1e-3)
    yield con, rows
    con.close()


def test_fit_and_sample_through_sql_under_both_units(trips):
    con, rows = trips
    params = "{'rounds': 3, 'episodes': 32, 'disc_steps': 2, 'count_share': 0.4}"
    for unit, extra, devices in [("trajectory", "", 90), ("user", ", max_trajectories_per_user := 10", 15)]:
        name = f"m_{unit}"
        con.execute(f"FROM mob_fit('trips', '{name}', eps := 8.0, bbox := {BOX}, method := 'pategail', seed := 1, "
                    f"privacy_unit := '{unit}'{extra}, params := {params})").fetchall()
        info = json.loads(con.execute(f"SELECT params FROM mob_models() WHERE name = '{name}'").fetchall()[0][0])
        assert abs(info["n_devices_noisy"] - devices) < 12          # users, or trajectories, are the devices
        assert info["epsilon_accounted"] == pytest.approx(8.0, abs=0.02)
        event = con.execute("SELECT event FROM mob_ledger() ORDER BY id DESC LIMIT 1").fetchall()[0][0]
        assert accounting.epsilon(accounting.Event.from_json(event), 1e-5) == pytest.approx(8.0, abs=0.02)
        out = con.sql(f"FROM mob_sample('{name}', n := 40, seed := 2)").to_arrow_table()
        assert len(np.unique(np.asarray(out["traj_id"]))) == 40 and out["ts"].null_count == 0
        again = con.sql(f"FROM mob_sample('{name}', n := 40, seed := 2)").to_arrow_table()
        assert again.equals(out)
    # no real value reaches the output: no synthetic point is a real fix, times come from the public base date
    lat, lon = np.asarray(out["lat"]), np.asarray(out["lon"])
    assert ((lat >= 0) & (lat <= 1) & (lon >= 0) & (lon <= 1)).all()
    real = {(r[3], r[4]) for r in rows}
    assert not real & set(zip(lat.tolist(), lon.tolist()))
    ts = np.asarray(out["ts"]).astype("datetime64[us]")
    assert (ts >= np.datetime64("2008-01-01")).all() and (ts < np.datetime64("2008-01-04")).all()
    counts = con.execute("SELECT count(*) FROM duckmob_ledger WHERE status = 'spent'").fetchall()[0][0]
    assert counts == 2      # one event per fit


def test_the_model_holds_no_real_value_and_round_trips(trips):
    con, rows = trips
    from duckmob.trajectories import from_points

    points = con.sql("SELECT * FROM trips ORDER BY traj_id, ts").to_arrow_table()
    data, _ = from_points(points, bbox=BOX, outside="drop", private=True)
    model = fit_unrecorded(PateGail(BOX, **FAST), data, 2.0, 1e-5, NoiseSource(4))
    blob = model.to_bytes()
    for r in rows[:200]:      # no real coordinate or timestamp, as float64 bytes, inside the stored model
        assert np.float64(r[3]).tobytes() not in blob and np.float64(r[4]).tobytes() not in blob
    again = PateGailModel.from_bytes(blob)
    a = model.sample(30, np.random.default_rng(1))
    b = again.sample(30, np.random.default_rng(1))
    assert np.array_equal(a.lat, b.lat) and np.array_equal(a.ts, b.ts) and a.n_trajectories == 30
    assert (a.lengths >= 2).all()
    # an empty table is fitted from noise alone
    empty = fit_unrecorded(PateGail(BOX, **FAST), Trajectories.empty(), 1.0, 1e-5, NoiseSource(5))
    assert empty.sample(5, np.random.default_rng(0)).n_trajectories == 5


def test_a_model_stored_in_format_1_is_upgraded_and_a_newer_format_refused():
    blob = (Path(__file__).parents[1] / "data" / "models_v1" / "pategail.bin").read_bytes()
    model = PateGailModel.from_bytes(blob)           # headerless: format 1
    assert isinstance(model.config, PateGailConfig) and model.config.rounds == 2 and model.config.episodes == 32
    assert "contribution_bound" not in model.info and model.info["max_trajectories_per_user"] == 1
    again = PateGailModel.from_bytes(model.to_bytes())    # format 2, with its header
    a, b = model.sample(10, np.random.default_rng(3)), again.sample(10, np.random.default_rng(3))
    assert np.array_equal(a.lat, b.lat) and np.array_equal(a.ts, b.ts)
    assert again.describe() == model.describe()
    with pytest.raises(DuckmobError, match="format 3"):
        PateGailModel.from_bytes(pack("pategail", 3, model.payload()))


def test_a_stored_model_keeps_no_machine_setting():
    """The payload's config leaves out the machine's settings (device, threads); a model stored with them (older
    duckmob) loads with the defaults, so it samples wherever it is loaded, the same rows."""
    import io

    from duckmob.synth.base import unpack

    blob = (Path(__file__).parents[1] / "data" / "models_v1" / "pategail.bin").read_bytes()
    model = PateGailModel.from_bytes(blob)
    stored = torch.load(io.BytesIO(unpack(model.to_bytes())[2]), weights_only=True)
    assert not {"device", "threads"} & set(stored["config"]) and stored["config"]["rounds"] == 2
    assert not {"device", "threads"} & set(model.describe())
    buf = io.BytesIO()
    torch.save({**stored, "config": {**stored["config"], "device": "cuda:7", "threads": 4}}, buf)
    loaded = PateGailModel.from_bytes(pack("pategail", 2, buf.getvalue()))
    assert (loaded.config.device, loaded.config.threads) == (None, 1) and loaded.config == model.config
    a, b = loaded.sample(6, np.random.default_rng(2)), model.sample(6, np.random.default_rng(2))
    assert np.array_equal(a.lat, b.lat) and np.array_equal(a.ts, b.ts)


# ------------------------------------------------------------------------------------------- the PATE student

def test_the_student_is_post_processing_the_plan_spends_the_same():
    """The student reads released sums and generated pairs only: with or without it the plan, its event and the
    per-round noise multiplier are identical, and every round is still one accounted Gaussian release."""
    for unit in (PrivacyUnit.trajectory(), PrivacyUnit.user(5)):
        a = PateGail(BOX, rounds=12).plan(2.0, 1e-5, unit)
        b = PateGail(BOX, rounds=12, student=False).plan(2.0, 1e-5, unit)
        assert a.event.to_json() == b.event.to_json() and a.sigma_round == b.sigma_round and a.rounds == 12
        assert accounting.epsilon(a.event, 1e-5) == pytest.approx(2.0, abs=5e-3)
    # a fit with the student spends exactly its plan's event, and its model samples
    rng = np.random.default_rng(1)
    data = _traj([[(mdp.DAY_US + i * SLOT, *rng.random(2) * 0.9 + 0.05) for i in range(4)] for _ in range(30)])
    synth = PateGail(BOX, student=True, **FAST)
    model = fit_unrecorded(synth, data, 2.0, 1e-5, NoiseSource(7))
    assert model.event_json == synth.plan(2.0, 1e-5).event.to_json()
    assert model.sample(5, np.random.default_rng(0)).n_trajectories == 5


def test_the_student_regresses_the_noised_votes_and_averages_their_noise_out():
    """Labels at the released noise scale (sd sigma_1 sqrt(B) / n per mean) are mostly noise one by one; the
    student's prediction over thousands of them is close to the noiseless mean."""
    rng = np.random.default_rng(0)
    gen = torch.Generator().manual_seed(0)
    b, n, sigma = 1000, 1000, 10.0
    sd = aggregate.split_sigma(sigma, 0.0)[0] * np.sqrt(b) / n         # noise sd of one released mean, 0.32
    trainer = student.StudentTrainer(mdp.N_FEATURES, 16, 1, 1e-2, 60, 1024, gen)
    truth = lambda x: 0.3 + 0.4 * (x[:, -1] > 0.5)                     # votes depend on the action
    for _ in range(20):
        x = rng.random((b, mdp.N_FEATURES)).astype(np.float32)
        x[:, -4:] = np.eye(4, dtype=np.float32)[rng.integers(0, 4, b)]
        s1 = truth(x) * n
        x1, _ = aggregate.release_round(s1, None, sigma, 0.0, rng)
        assert np.std(x1 / n - truth(x)) == pytest.approx(sd, rel=0.1)
        trainer.add(x, aggregate.moments(x1, None, n))
        trainer.fit()
    pred = aggregate.moment_rewards(trainer.predict(x), 0.0)
    assert np.abs(pred - truth(x)).mean() < sd / 4
    # eq. 3 from the predicted moments: mean - beta sd, the variance clipped to [0, 1/4]
    m = np.array([[0.5, 0.5], [0.5, 0.1], [0.2, 0.04]])
    assert aggregate.moment_rewards(m, 0.5).tolist() == pytest.approx([0.5 - 0.25, 0.5, 0.2])


# ---------------------------------------------------------------------------- gravity exploration and rendering

def test_gravity_exploration_weighs_the_rank_by_the_released_start_share():
    """attraction(): the start share to the power gravity, floored at a tenth of uniform (None at gravity 0); an
    exploring agent picks the k-th nearest cell with probability k^-alpha attraction / sum, measured."""
    p = np.array([0.0, 0.1, 0.6, 0.3])
    assert pategail.attraction(p, 0.0) is None
    np.testing.assert_allclose(pategail.attraction(p, 1.0), [0.025, 0.1, 0.6, 0.3])
    np.testing.assert_allclose(pategail.attraction(p, 0.5), np.sqrt([0.025, 0.1, 0.6, 0.3]))
    w, n = 4, 20_000
    ranks = mdp.nearest_ranks(w, 15)
    attract = np.ones(16)
    attract[15] = 50.0                       # the far corner: rank 15 of cell 0
    env = mdp.Env(np.zeros(n, np.int64), np.zeros(n, np.int64), np.ones(n, np.int64), w=w, n_slots=48,
                  max_steps=1, alpha=0.6, ranks=ranks, rng=np.random.default_rng(3), attraction=attract)
    env.step(np.full(n, mdp.EXPLORE))
    weight = np.arange(1, 16) ** -0.6 * attract[ranks[0]]
    expect = weight / weight.sum()
    got = np.bincount(env.cur, minlength=16)[ranks[0]] / n
    assert np.abs(got - expect).max() < 4 * np.sqrt(expect.max() / n)
    assert got[-1] > 0.5                     # without gravity the corner would get 3%


def test_line_rendering_draws_each_move_as_fixes_at_most_step_m_apart():
    ep = mdp.Episodes(np.array([[0, 15, 15, 0, -1], [5, 5, 6, 6, 10]]), np.array([3, 4]), np.array([10, 47]),
                      np.array([-1, -1]))
    box = [39.8, 116.2, 40.1, 116.5]
    slot = mdp.DAY_US // 48
    plain = render.render(ep, box, 4, 48, 0, np.random.default_rng(1))
    assert plain.lengths.tolist() == [4, 5]
    assert plain.ts[:4].tolist() == [10 * slot, 11 * slot, 12 * slot, 13 * slot]
    lines = render.render(ep, box, 4, 48, 0, np.random.default_rng(1), step_m=500.0, slot_points=1000)
    # the slot-end points are the plain rendering's points, in order, at the same times
    keep = np.isin(lines.ts, plain.ts)
    assert np.array_equal(lines.lat[keep][[0, 1, 3, 4]], plain.lat[[0, 1, 3, 4]])
    from duckmob.grid import haversine_m
    own = np.repeat(np.arange(2), lines.lengths)
    d = haversine_m(lines.lat[:-1], lines.lon[:-1], lines.lat[1:], lines.lon[1:])[own[1:] == own[:-1]]
    # equal steps in degrees: equal in metres to well under 1% over a few kilometres
    assert d.max() <= 500.0 * 1.005 and (d > 0).sum() > 2 * (plain.n_points - 2)
    assert (np.diff(lines.ts)[own[1:] == own[:-1]] >= 0).all()      # times spread over each slot, in order
    # a stay is one fix; the public cap bounds the fixes per slot, and max_points bounds every trajectory
    capped = render.render(ep, box, 4, 48, 0, np.random.default_rng(1), step_m=1.0, slot_points=3)
    assert capped.lengths.tolist() == [1 + 3 + 1 + 3, 1 + 1 + 3 + 1 + 3]
    config = PateGailConfig.parse({"step_m": 1.0, "slot_points": 3, "max_steps": 4})
    assert pategail.max_points(config) == 13 and pategail.max_points(PateGailConfig.parse({})) == 49
    assert PateGail(BOX, step_m=1.0, slot_points=3).plan(1.0, 1e-5).max_points == 48 * 3 + 1
