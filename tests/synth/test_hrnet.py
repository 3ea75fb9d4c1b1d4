"""HRNet: encoding, per-sample clipping, accounting, pre-training counts, end-to-end fit + sample."""

from __future__ import annotations

import io

import dp_accounting
import numpy as np
import pytest

from duckmob.privacy.ledger import Prior
import torch

from duckmob.errors import BudgetError, DuckmobError
from duckmob.grid import cell_of, parent
from duckmob.synth.base import fit_unrecorded
from duckmob.synth.hrnet import Baseline, FittedModel, HRNet, HRNetConfig
from duckmob.privacy import accounting
from duckmob.privacy.calibration import calibrate_noise_multiplier
from duckmob.privacy.noise import NoiseSource
from duckmob.privacy.unit import PrivacyUnit
from duckmob.release.fitting import fit_request
from duckmob.synth.hrnet.encoding import HierarchicalEncoding, morton, unmorton
from duckmob.synth.hrnet.generate import slot_times
from duckmob.synth.hrnet.model import BaselineModel, HRNetModel, ancestor_targets
from duckmob.synth.hrnet.pretrain import dptran, pretraining_epsilon, transition_targets
from duckmob.trajectories import CellSequences, Trajectories

BOX = [39.8, 116.2, 40.2, 116.6]


def toy_trajectories(n=300, seed=0) -> Trajectories:
    """Commuters between a few home/work places, 2-5 points, hourly fixes (no stay-point step needed)."""
    rng = np.random.default_rng(seed)
    places = np.array([[39.85, 116.25], [39.95, 116.35], [40.05, 116.45], [40.15, 116.55], [39.9, 116.5]])
    lengths = rng.integers(2, 6, n)
    m = lengths.sum()
    which = rng.integers(0, len(places), m)
    lat = places[which, 0] + rng.normal(0, 0.005, m)
    lon = places[which, 1] + rng.normal(0, 0.005, m)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    start = np.repeat(1_200_000_000_000_000 + rng.integers(0, 10, n) * 3_600_000_000, lengths)
    step = np.arange(m) - np.repeat(offsets[:-1], lengths)
    ts = start + step * 3_600_000_000
    return Trajectories(offsets.astype(np.int64), np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int64) % 7,
                        ts.astype(np.int64), lat, lon)


TINY = dict(w=8, epochs=2, pretrain_iterations=50, stay_points=False, max_len=6, progress=False, device="cpu")


def test_morton_matches_grid_parents():
    w = 16
    cells = np.arange(w * w)
    z = morton(cells, w)
    assert sorted(z) == list(range(w * w))
    assert (unmorton(z, w) == cells).all()
    for level in range(5):
        assert (morton(parent(cells, w, level), 1 << level) == z >> (2 * (4 - level))).all()


def test_encoding_children_are_contiguous_deconvolution():
    enc = HierarchicalEncoding(dim=4, depth=2)
    m = enc()
    assert [tuple(t.shape) for t in m] == [(1, 4), (4, 4), (16, 4)]
    # the 4 children of Z-order vector z at level 2 are rows 4z..4z+3, a linear image of the parent
    lin = enc.deconvs[1].linear
    expect = lin(m[1]).reshape(4, 4, 4).reshape(16, 4)
    assert torch.allclose(m[2], expect)


def test_parameter_count_grows_logarithmically():
    """Table 2: each quadtree depth adds a constant (4 dim^2 + 4 dim); the baseline grows with w^2."""
    def count(model):
        return sum(p.numel() for p in model.parameters())

    hr = [count(HRNetModel(d, loc_dim=32, key_dim=32)) for d in (3, 4, 5, 6)]
    base = [count(BaselineModel(d, loc_dim=32)) for d in (3, 4, 5, 6)]
    assert np.diff(hr).tolist() == [4 * 32 * 32 + 4 * 32] * 3
    assert hr[-1] < 60_000
    assert base[-1] > 4 * base[1] and base[-1] - base[-2] > 100 * (hr[-1] - hr[-2]) / 10


def _batch(model_cls, depth=3, b=6, t=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = 4 ** depth
    cells = torch.randint(0, n, (b, t), generator=g)
    times = torch.randint(0, 5, (b, t), generator=g)
    lengths = torch.randint(1, t, (b,), generator=g)
    return cells, times, lengths


@pytest.mark.parametrize("model_cls,loss,inputs", [(HRNetModel, "full", "finest"),
                                                    (HRNetModel, "conditional", "all"), (BaselineModel, None, None)])
def test_per_sample_gradients_are_exact_and_clipped(model_cls, loss, inputs):
    """The per-sample gradients used by DP-SGD (torch.func over the example axis, the encoding tree computed
    once per batch) equal each example's own autograd gradient, and after opacus's clipping every example's
    gradient norm is <= C."""
    from opacus.optimizers import DPOptimizer

    from duckmob.synth.hrnet.train import per_sample_gradients

    torch.manual_seed(0)
    extra = {"key_dim": 8, "multitask_loss": loss, "input_levels": inputs} if model_cls is HRNetModel else {}
    model = model_cls(3, loc_dim=8, time_dim=4, hidden=8, **extra)
    cells, times, lengths = _batch(model_cls)
    b = len(lengths)
    own = []
    for i in range(b):
        model.zero_grad()
        model(cells[i:i + 1], times[i:i + 1], lengths[i:i + 1]).sum().backward()
        own.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    own = torch.stack(own)
    clip = 0.05
    opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), noise_multiplier=0.0, max_grad_norm=clip,
                      expected_batch_size=b)
    grads = per_sample_gradients(model, cells, times, lengths)
    for name, p in model.named_parameters():
        p.grad_sample = grads[name]
    per = torch.cat([p.grad_sample.reshape(b, -1) for p in model.parameters()], dim=1)
    assert torch.allclose(per, own, atol=1e-5, rtol=1e-4)
    norms = own.norm(dim=1)
    assert (norms > clip).all()  # clipping is active for every example
    opt.step()
    summed = torch.cat([p.summed_grad.flatten() for p in model.parameters()])
    expect = (own * (clip / (norms + 1e-6)).clamp(max=1.0)[:, None]).sum(0)
    assert torch.allclose(summed, expect, atol=1e-6)
    clipped_norms = (own * (clip / (norms + 1e-6))[:, None]).norm(dim=1)
    assert (clipped_norms <= clip + 1e-6).all()


def test_accountant_matches_dp_accounting_directly():
    q, steps, delta = 0.01, 1000, 1e-5
    fixed = [accounting.laplace(0.02), accounting.laplace(0.2)]
    sigma = calibrate_noise_multiplier(fixed, q, steps, 2.0, delta)
    acc = dp_accounting.pld.PLDAccountant()
    acc.compose(dp_accounting.ComposedDpEvent([
        dp_accounting.LaplaceDpEvent(1 / 0.02), dp_accounting.LaplaceDpEvent(1 / 0.2),
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)]))
    independent = acc.get_epsilon(delta)
    ours = accounting.epsilon(accounting.compose(fixed + [accounting.dp_sgd(sigma, q, steps)]), delta)
    assert independent == pytest.approx(ours, rel=1e-3)
    assert 1.97 < ours <= 2.0  # calibrated tightly, never above the target
    assert independent < 0.02 + 0.2 + ours  # PLD composition beats adding the parts (which would exceed 2)


def test_calibration_keeps_the_ledger_budget_with_earlier_releases():
    """Calibrated alone to eps 0.6, the run composed with an earlier Laplace 1.0 overshoots a budget of 1.5;
    with the ledger's prior events the noise multiplier grows until the composition fits."""
    q, steps, delta = 0.01, 300, 1e-5
    fixed = [accounting.laplace(0.006)]
    earlier = [accounting.laplace(1.0)]

    def total(sigma):
        return accounting.epsilon(accounting.compose(earlier + fixed + [accounting.dp_sgd(sigma, q, steps)]), delta)

    alone = calibrate_noise_multiplier(fixed, q, steps, 0.6, delta)
    assert total(alone) > 1.5
    sigma = calibrate_noise_multiplier(fixed, q, steps, 0.6, delta, prior=Prior("t", 1.5, delta, tuple(earlier)))
    assert sigma > alone
    assert 1.49 < total(sigma) <= 1.5 + 1e-9
    with pytest.raises(BudgetError, match="cannot hold this run"):
        calibrate_noise_multiplier(fixed, q, steps, 0.6, delta, prior=Prior("t", 1.5, delta, tuple(earlier * 2)))


def test_dptran_is_the_privacy_core_release_with_scale_k_over_eps():
    """DPTRAN comes from the privacy core; its noise scale is k / eps (trajectory: k = 1)."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 6, 400)
    cells = rng.integers(0, 64, lengths.sum())
    off = np.concatenate([[0], np.cumsum(lengths)])
    seqs = CellSequences(off, np.arange(400), np.arange(400) // 2, cells, np.zeros(len(cells), dtype=np.int64))
    from duckmob.privacy.counting import region_transition_counts

    exact = region_transition_counts(off, cells, 8, 2)
    assert exact.shape == (16, 64) and exact.sum() <= 400
    spread = [np.std(dptran(seqs, 8, 0.5, NoiseSource(s), k=k) - exact) for k, s in ((1, 1), (2, 2))]
    assert spread[0] == pytest.approx(np.sqrt(2) * 2, rel=0.1)     # Laplace(1/0.5): sd sqrt(2) * 2
    assert spread[1] == pytest.approx(np.sqrt(2) * 4, rel=0.1)     # k = 2 (users of 2 trajectories)


def test_transition_targets_rows_are_distributions():
    rng = np.random.default_rng(1)
    noisy = rng.laplace(0, 5, (16, 64))
    noisy[3, 7] += 200
    p = transition_targets(noisy)
    assert np.allclose(p.sum(1), 1) and (p >= 0).all()
    assert p[3].argmax() == 7


def test_budget_split_eq9():
    # reference code: 0.018 n ln(n) / (N / 16) with n = 1024 cells
    assert pretraining_epsilon(10.0, 10_000, 32) == pytest.approx(0.018 * 1024 * np.log(1024) * 16 / 10_000)
    assert pretraining_epsilon(0.2, 10_000, 32) == pytest.approx(0.1)  # capped at half the budget left


def test_slot_times_sorted_and_in_slots():
    rng = np.random.default_rng(0)
    lengths = np.array([3, 2, 1])
    slots = np.array([1, 1, 0, 4, 2, 3])
    ts = slot_times(lengths, slots, 5, 0, rng)
    day = 86_400_000_000
    assert (ts[1] >= ts[0]) and ts[2] >= day  # slot 0 after slot 1 is the next day
    assert ts[4] >= day and ts[3] < day
    assert ((ts % day) // (day // 5) == slots).all()


def test_tiny_fit_and_sample_end_to_end():
    data = toy_trajectories()
    synth = HRNet(BOX, **TINY)
    model = fit_unrecorded(synth, data, 2.0, 1e-5, NoiseSource(7))
    info = model.info
    assert info["epsilon_accounted"] <= 2.0 + 1e-9 and info["eps_pretrain"] > 0
    assert info["steps"] == int(np.ceil(2 / info["sample_rate"]))
    out = model.sample(500, np.random.default_rng(3))
    assert out.n_trajectories == 500
    assert (out.lengths >= 1).all() and (out.lengths <= TINY["max_len"]).all()
    cells = cell_of(out.lat, out.lon, BOX, 8)
    assert (cells >= 0).all()
    same = cells[1:] == cells[:-1]
    same[np.cumsum(out.lengths)[:-1] - 1] = False   # pairs across trajectories do not count
    # no consecutive duplicate cells, but a one-cell trajectory's two points (its first and last fix)
    assert not (same & ~np.repeat(out.lengths == 2, out.lengths)[1:]).any() and out.lengths.min() >= 2
    assert out.has_time and (np.diff(out.ts)[np.diff(np.repeat(np.arange(500), out.lengths)) == 0] >= 0).all()
    # deterministic under fixed seeds, and survives serialisation
    again = FittedModel.from_bytes(model.to_bytes()).sample(500, np.random.default_rng(3))
    assert np.array_equal(again.lat, out.lat) and np.array_equal(again.ts, out.ts)
    model2 = fit_unrecorded(synth, data, 2.0, 1e-5, NoiseSource(7))
    assert all(torch.equal(model.state[k], model2.state[k]) for k in model.state)


def test_baseline_fit_and_event():
    data = toy_trajectories(200)
    synth = Baseline(BOX, **TINY)
    planned = synth.plan(1.0, 1e-5).event
    assert accounting.epsilon(planned, 1e-5) <= 1.0 + 1e-9
    model = fit_unrecorded(synth, data, 1.0, 1e-5, NoiseSource(3))
    assert model.info["eps_pretrain"] == 0
    out = model.sample(100, np.random.default_rng(0))
    assert out.n_trajectories == 100


def test_bad_parameters_are_refused():
    with pytest.raises(DuckmobError, match=r"hrnet trains with DP-SGD and needs 0 < delta"):
        fit_request(source="t", eps=1.0, delta=0.0, method="hrnet", bbox=BOX, params=TINY)
    with pytest.raises(DuckmobError, match="unknown"):
        HRNet(BOX, epoch=3)
    with pytest.raises(DuckmobError, match="w = 2"):
        HRNet(BOX, w=12)
    with pytest.raises(DuckmobError, match="temperature must be a number > 0"):
        HRNet(BOX, temperature=0)
    with pytest.raises(DuckmobError, match="batch_factor must be a number > 0"):
        HRNet(BOX, batch_factor=-1)
    with pytest.raises(DuckmobError, match=r"ema must be a number in \[0, 1\)"):
        HRNet(BOX, ema=1.0)


def test_batch_is_a_public_rule_of_the_noisy_count():
    """Expected batch batch_factor * sqrt(N~) (the paper's factor is 1: the baseline's default; HRNet's is 2), or
    batch_size when given; the steps follow from epochs and the rate q = batch / N~."""
    plan = HRNet(BOX, n_hint=10_000).plan(2.0, 1e-5)
    assert plan.expected_batch == pytest.approx(200) and plan.sample_rate == pytest.approx(0.02)
    assert plan.steps == 1500 and plan.default_size == 10_000          # ceil(30 epochs / 0.02)
    paper = Baseline(BOX, n_hint=10_000).plan(2.0, 1e-5)
    assert paper.sample_rate == pytest.approx(0.01) and paper.steps == 3000
    assert paper.noise_multiplier < plan.noise_multiplier               # more steps at a lower rate: less noise
    assert HRNet(BOX, batch_size=250, n_hint=10_000).plan(2.0, 1e-5).expected_batch == pytest.approx(250)
    assert HRNet(BOX, n_hint=4).plan(2.0, 1e-5).sample_rate == 1.0      # a tiny table: every example, every step
    # the fit's own schedule: the same rule of the noisy count (users under the user unit)
    again = HRNet(BOX).schedule(2.0, 1e-5, PrivacyUnit.user(2), 10_000, 5_000)
    assert again.sample_rate == pytest.approx(2 * np.sqrt(5_000) / 5_000) and again.unit == PrivacyUnit.user(2)


def test_sampling_temperature_sharpens_the_softmax():
    from duckmob.synth.hrnet.generate import _pick

    logits = torch.tensor([[0.0, 1.0]]).expand(200_000, -1)
    for t, expect in ((1.0, np.e / (1 + np.e)), (0.5, np.e ** 2 / (1 + np.e ** 2)), (2.0, np.e ** 0.5 / (1 + np.e ** 0.5))):
        share = _pick(logits, torch.Generator().manual_seed(3), t).float().mean().item()
        assert share == pytest.approx(expect, abs=0.005)


def test_scattered_pois_output_lies_on_pois():
    """HRNet §3.2.2: public POIs assigned to distinct quadtree leaves; every synthetic point is a POI."""
    places = np.array([[39.85, 116.25], [39.95, 116.35], [40.05, 116.45], [40.15, 116.55], [39.9, 116.5],
                       [40.0, 116.3]])
    synth = HRNet(BOX, **{**TINY, "pois": places.tolist()})
    assert synth.config.w == 4 and synth.config.output == "cells"  # 6 POIs fit on the 16 leaves of depth 2
    model = fit_unrecorded(synth, toy_trajectories(150), 2.0, 1e-5, NoiseSource(1))
    out = model.sample(200, np.random.default_rng(0))
    on_poi = (np.abs(out.lat[:, None] - places[None, :, 0]) < 1e-12) & \
             (np.abs(out.lon[:, None] - places[None, :, 1]) < 1e-12)
    assert on_poi.any(1).all()


def test_user_level_fit_samples_users_and_accounts():
    """privacy_unit 'user' (the plan's unit, max_trajectories_per_user = k): counts and DPTRAN scaled by k, users
    Poisson-sampled, per-trajectory gradients summed per user before clipping."""
    synth = HRNet(BOX, **TINY)
    data = toy_trajectories(300)
    data = data.take(np.arange(data.n_trajectories) < 7 * 3)    # 7 users, 3 trajectories each
    model = fit_unrecorded(synth, data, 4.0, 1e-5, NoiseSource(2), PrivacyUnit.user(3))
    info = model.info
    assert info["max_trajectories_per_user"] == 3
    assert info["epsilon_accounted"] <= 4.0 + 1e-9
    assert info["sample_rate"] == pytest.approx(min(1.0, max(info["units_noisy"], 1) ** -0.5))
    with pytest.raises(DuckmobError, match="contribution bound"):
        fit_unrecorded(synth, toy_trajectories(100), 4.0, 1e-5, NoiseSource(2), PrivacyUnit.user(3))
    assert model.sample(50, np.random.default_rng(0)).n_trajectories == 50


def test_ema_returns_the_moving_average_of_the_iterates():
    """ema = a: the model ends with avg_k = a avg_{k-1} + (1 - a) theta_k (avg_0 = the initial weights), computed
    here from the iterates of the same run without averaging (same seed, same noise)."""
    from duckmob.synth.hrnet import train as tr

    cells, times, lengths = _batch(BaselineModel, depth=2, b=6, t=4)
    data = tr.TrainingData(cells.numpy(), times.numpy(), lengths.numpy(), np.arange(6))

    def run(steps, ema):
        torch.manual_seed(0)
        model = BaselineModel(2, loc_dim=4, time_dim=2, hidden=4)
        schedule = tr.Schedule(sample_rate=0.5, steps=steps, noise_multiplier=1.0, max_grad_norm=1.0,
                               expected_batch_size=3, lr=0.1, ema=ema)
        tr.dp_sgd_train(model, data, schedule, tr.RunContext(np.random.default_rng(3), torch.device("cpu"),
                                                             progress=False))
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    theta = [run(k, 0.0) for k in range(3)]  # theta_0 (no step), theta_1, theta_2
    a = 0.7
    avg = theta[0]
    for k in (1, 2):
        avg = a * avg + (1 - a) * theta[k]
    assert not torch.allclose(theta[2], theta[0])
    assert torch.allclose(run(2, a), avg, atol=1e-6)


def test_per_user_gradient_aggregation_is_clipped_per_user(monkeypatch):
    """One DP-SGD step without noise: the update equals the sum over users of their clipped summed gradients."""
    from duckmob.synth.hrnet import train as tr

    torch.manual_seed(0)
    model = BaselineModel(2, loc_dim=4, time_dim=2, hidden=4)
    cells, times, lengths = _batch(BaselineModel, depth=2, b=6, t=4)
    data = tr.TrainingData(cells.numpy(), times.numpy(), lengths.numpy(), np.array([0, 0, 1, 1, 1, 2]))
    before = [p.detach().clone() for p in model.parameters()]
    grads = []
    for users in ([0, 1], [2, 3, 4], [5]):
        model.zero_grad()
        model(cells[users], times[users], lengths[users]).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    clip = 0.01
    expect = sum(g * min(1.0, clip / (g.norm().item() + 1e-6)) for g in grads)
    schedule = tr.Schedule(sample_rate=1.0, steps=1, noise_multiplier=0.0, max_grad_norm=clip,
                           expected_batch_size=3, lr=1.0)
    tr.dp_sgd_train(model, data, schedule, tr.RunContext(np.random.default_rng(0), torch.device("cpu"), progress=False),
                    by_user=True)
    # Adam's first step moves each coordinate by lr * sign(g) (up to eps): compare the signs of the update
    moved = torch.cat([(b - p.detach()).flatten() for b, p in zip(before, model.parameters())])
    big = expect.abs() > 1e-6
    assert torch.equal(torch.sign(moved[big]), torch.sign(expect[big]))


def test_poisson_rate_used_is_the_rate_accounted(monkeypatch):
    """opacus accounts 1/len(loader) when it builds the loader; here the sampler is built with the exact rate q
    that goes into the dp_sgd event, and batches are Poisson(q N)-sized."""
    from duckmob.synth import dpsgd as tr   # the DP-SGD loop HRNet's training runs

    seen = {}
    real = tr.UniformWithReplacementSampler

    class Recording(real):
        def __init__(self, **kw):
            super().__init__(**kw)
            seen.update(kw)
            self.sizes = seen.setdefault("sizes", [])

        def __iter__(self):
            for batch in super().__iter__():
                self.sizes.append(len(batch))
                yield batch

    monkeypatch.setattr(tr, "UniformWithReplacementSampler", Recording)
    data = toy_trajectories(400)
    model = fit_unrecorded(HRNet(BOX, **{**TINY, "epochs": 3}), data, 2.0, 1e-5, NoiseSource(4))
    sgd = [e for e in model.event.leaves() if e.kind == "dp_sgd"][0]
    assert seen["sample_rate"] == sgd.param("sample_rate") == model.info["sample_rate"]
    assert seen["steps"] == sgd.param("steps") and seen["num_samples"] == 400
    sizes = np.array(seen["sizes"])
    assert len(sizes) == sgd.param("steps")
    assert sizes.mean() == pytest.approx(400 * seen["sample_rate"], rel=0.15)


def test_coarse_to_fine_decoding_matches_the_product_of_level_conditionals():
    """decode='coarse_to_fine': Pr(leaf) = Pr_1(a_1) * prod_r Pr_r(a_r | children of a_{r-1}) (end from level 1)."""
    from duckmob.synth.hrnet.generate import coarse_to_fine

    torch.manual_seed(0)
    model = HRNetModel(2, loc_dim=4, time_dim=2, hidden=4, key_dim=4).eval()
    with torch.no_grad():
        h = torch.randn(1, 4).expand(40_000, -1)
        levels = model.encoding()[1:]
        prev = torch.full((40_000,), -1)
        counts = [torch.full((4,), 4), torch.ones(16, dtype=torch.long)]
        got = coarse_to_fine(model, h, levels, prev, False, counts, torch.Generator().manual_seed(1))
        q = model.f_query(h[:1])
        qk = model.f_key_t(q)
        p1 = torch.softmax(torch.cat([qk @ levels[0].T, model.end_key(q)], 1), 1)[0]
        s2 = (qk @ levels[1].T)[0].reshape(4, 4)
        p2 = torch.softmax(s2, 1)
        expect = torch.cat([(p1[:4, None] * p2).reshape(-1), p1[4:]])
    freq = torch.bincount(got, minlength=17).double() / len(got)
    assert torch.allclose(freq, expect.double(), atol=0.01)


def test_coarse_to_fine_sampling_end_to_end_with_pois():
    places = np.array([[39.85, 116.25], [39.95, 116.35], [40.05, 116.45], [40.15, 116.55], [39.9, 116.5]])
    synth = HRNet(BOX, **{**TINY, "pois": places.tolist(), "decode": "coarse_to_fine"})
    out = fit_unrecorded(synth, toy_trajectories(150), 2.0, 1e-5, NoiseSource(1)).sample(300, np.random.default_rng(0))
    on_poi = (np.abs(out.lat[:, None] - places[None, :, 0]) < 1e-12) & \
             (np.abs(out.lon[:, None] - places[None, :, 1]) < 1e-12)
    assert on_poi.any(1).all() and (out.lengths >= 1).all()
    idx = on_poi.argmax(1)
    same = idx[1:] == idx[:-1]
    same[np.cumsum(out.lengths)[:-1] - 1] = False
    assert not same.any()


def test_finest_weight_scales_only_the_finest_resolution_term():
    """loss(finest_weight = 3) - loss(1) = 2 x the finest resolution's summed cross entropy (end token included)."""
    torch.manual_seed(0)
    one = HRNetModel(depth=2, n_time=3, loc_dim=8, time_dim=4, hidden=8, key_dim=8)
    three = HRNetModel(depth=2, n_time=3, loc_dim=8, time_dim=4, hidden=8, key_dim=8, finest_weight=3.0)
    three.load_state_dict(one.state_dict())
    cells = torch.tensor([[3, 7, 12, 0], [5, 0, 0, 0]])
    times = torch.tensor([[0, 1, 2, 0], [1, 0, 0, 0]])
    lengths = torch.tensor([3, 1])
    h, m = one.run(cells, times)
    logits = one.scores(one.f_query(h), m[2])
    target = torch.where(torch.arange(4)[None, :] == lengths[:, None], torch.tensor(16), cells)
    ce = torch.nn.functional.cross_entropy(logits, target, reduction="none")
    finest = (ce * (torch.arange(4)[None, :] <= lengths[:, None])).sum(1)
    with torch.no_grad():
        diff = three(cells, times, lengths) - one(cells, times, lengths)
    assert torch.allclose(diff, 2 * finest.detach(), atol=1e-5)
    with pytest.raises(DuckmobError, match="finest_weight must be a number > 0"):
        HRNet(BOX, finest_weight=0)


def _kids(model, m, targets):
    """The 4 children's vectors (B, T, 4, dim) at each resolution 2..d of the true cell's parent, read from the
    whole tree ``m`` (what ``HRNetModel.paths`` computes along the paths)."""
    leaf = targets.clamp(min=0)
    return [m[r][4 * ancestor_targets(leaf, model.depth, r - 1)[..., None] + torch.arange(4)]
            for r in range(2, model.depth + 1)]


def test_the_loss_along_paths_is_the_loss_of_the_whole_tree():
    """HRNetModel.paths gives the rows of the whole encoding (nodes and siblings), so the conditional loss (which
    reads them along paths) equals the loss computed from every row of the tree, as do its per-example
    gradients; gru_states is opacus's DPGRU, same outputs."""
    from opacus.layers import DPGRU

    from duckmob.synth.hrnet.model import gru_states

    torch.manual_seed(0)
    model = HRNetModel(3, n_time=3, loc_dim=4, time_dim=2, hidden=5, key_dim=4, multitask_loss="conditional",
                       deconv_activation=True, input_levels="all")
    leaves = torch.randint(0, 64, (6, 3))
    m = model.encoding()
    siblings, nodes = model.paths(leaves)
    for r in range(1, 4):
        assert torch.allclose(nodes[r - 1], m[r][ancestor_targets(leaves, 3, r)], atol=1e-6)
        parent = ancestor_targets(leaves, 3, r - 1)
        assert torch.allclose(siblings[r - 1], m[r][4 * parent[..., None] + torch.arange(4)], atol=1e-6)
    cells = torch.randint(0, 64, (6, 4))
    times = torch.randint(0, 3, (6, 4))
    lengths = torch.tensor([1, 2, 3, 3, 2, 1])
    with torch.no_grad():
        h, m = model.run(cells, times)
        query = model.f_query(h)
        targets = torch.where(torch.arange(4)[None, :] == lengths[:, None], -1, cells)
        loc_valid = (torch.arange(4)[None, :] <= lengths[:, None]).float()
        time_valid = (torch.arange(4)[None, :] < lengths[:, None]).float()
        whole = model.time_loss(h, times, time_valid) + (
            model.conditional_ce(query, m[1], _kids(model, m, targets), targets) * loc_valid).sum(1)
        assert torch.allclose(model(cells, times, lengths), whole, atol=1e-5)
    gru = DPGRU(3, 5, batch_first=True)
    x = torch.randn(4, 6, 3)
    assert torch.allclose(gru_states(gru, x), gru(x)[0], atol=1e-6)


def test_conditional_loss_is_the_likelihood_of_the_coarse_to_fine_decoder():
    """multitask_loss='conditional': exp(-loss term) of every possible next location (16 leaves + end) is the
    coarse-to-fine decoder's probability Pr_1(a_1) Pr_2(a_2 | children of a_1), and these sum to 1; the
    forward loss is that term summed over the steps plus the time loss."""
    torch.manual_seed(0)
    model = HRNetModel(2, n_time=3, loc_dim=4, time_dim=2, hidden=4, key_dim=4, multitask_loss="conditional")
    cells = torch.tensor([[5, 0]]).expand(17, -1).clone()
    cells[:, 1] = torch.arange(17).clamp(max=15)
    lengths = torch.where(torch.arange(17) == 16, 1, 2)       # row 16: the end token after cell 5
    times = torch.zeros(17, 2, dtype=torch.long)
    with torch.no_grad():
        h, m = model.run(cells, times)
        query = model.f_query(h)
        targets = torch.where(torch.arange(2)[None, :] == lengths[:, None], -1, cells)
        nll = model.conditional_ce(query, m[1], _kids(model, m, targets), targets)[:, 1]   # the next after cell 5
        q, levels = query[0, 1:2], m[1:]
        qk = model.f_key_t(q)
        p1 = torch.softmax(torch.cat([qk @ levels[0].T, model.end_key(q)], 1), 1)[0]
        p2 = torch.softmax((qk @ levels[1].T)[0].reshape(4, 4), 1)
        expect = torch.cat([(p1[:4, None] * p2).reshape(-1), p1[4:]])
        assert torch.allclose(torch.exp(-nll), expect, atol=1e-6)
        assert torch.exp(-nll).sum() == pytest.approx(1.0, abs=1e-5)
        loc_valid = (torch.arange(2)[None, :] <= lengths[:, None]).float()
        time_valid = (torch.arange(2)[None, :] < lengths[:, None]).float()
        total = model.time_loss(h, times, time_valid) + (
            model.conditional_ce(query, m[1], _kids(model, m, targets), targets) * loc_valid).sum(1)
        assert torch.allclose(model(cells, times, lengths), total)
    full = HRNetModel(2, n_time=3, loc_dim=4, time_dim=2, hidden=4, key_dim=4, multitask_loss="full")
    full.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert not torch.allclose(full(cells, times, lengths), model(cells, times, lengths))


def test_cosine_learning_rate_goes_from_lr_to_lr_final_times_lr():
    from duckmob.synth.hrnet.train import cosine_lr

    rates = [cosine_lr(3e-3, 0.1, k, 101) for k in range(101)]
    assert rates[0] == pytest.approx(3e-3)
    assert rates[50] == pytest.approx(3e-3 * 0.55)
    assert rates[-1] == pytest.approx(3e-4)
    assert all(a > b for a, b in zip(rates, rates[1:]))
    assert {cosine_lr(3e-3, 1.0, k, 101) for k in range(101)} == {3e-3}
    with pytest.raises(DuckmobError, match=r"lr_final must be a number in \(0, 1\]"):
        HRNet(BOX, lr_final=0)


def test_input_levels_all_feeds_the_sum_of_a_cells_encodings_at_every_resolution():
    """input_levels='all': the GRU input of leaf l is sum_{r=1..d} hiencode_r(up_r(l)), the same table at
    training (run) and generation (input_vectors); 'finest' is the paper's hiencode_d(l). No extra parameters."""
    torch.manual_seed(0)
    model = HRNetModel(3, n_time=3, loc_dim=4, time_dim=2, hidden=4, key_dim=4, input_levels="all")
    paper = HRNetModel(3, n_time=3, loc_dim=4, time_dim=2, hidden=4, key_dim=4)
    paper.load_state_dict(model.state_dict())   # same parameters: the option adds none
    with torch.no_grad():
        m = model.encoding()
        leaves = torch.arange(64)
        expect = sum(m[r][ancestor_targets(leaves, 3, r)] for r in (1, 2, 3))
        assert torch.allclose(model.input_vectors(), expect)
        assert torch.allclose(paper.input_vectors(), m[3])
        assert not torch.allclose(expect, m[3])
        assert torch.equal(model.leaf_vectors(), m[3])   # the keys stay the finest encoding
        cells = torch.tensor([[9, 40, 63]])
        times = torch.zeros(1, 3, dtype=torch.long)
        h, _ = model.run(cells, times)
        x = model.encode_inputs(torch.cat([model.start.weight[None], expect[cells[:, :2]]], 1), times)
        assert torch.allclose(h, model.gru(x)[0])
    with pytest.raises(ValueError, match="input_levels must be one of"):
        HRNetModel(3, input_levels="coarsest")


def test_multitask_loss_and_decode_are_checked():
    with pytest.raises(DuckmobError, match="input_levels must be one of"):
        HRNet(BOX, input_levels="sum")
    with pytest.raises(DuckmobError, match="multitask_loss must be one of"):
        HRNet(BOX, multitask_loss="joint")
    with pytest.raises(DuckmobError, match=r"^HRNet parameter pois must be a list of \[lat, lon\] pairs$"):
        HRNetConfig.parse({"pois": [[1.0, 2.0, 3.0]]})
    with pytest.raises(DuckmobError, match="decode must be one of"):
        HRNet(BOX, decode="greedy")
    with pytest.raises(DuckmobError, match="does not train: use decode 'coarse_to_fine'"):
        HRNet(BOX, decode="finest")
    HRNet(BOX, decode="finest", multitask_loss="full")
    HRNet(BOX, decode="finest", multitask=False)   # the no-multi-task ablation has only the finest head


def format_1_blob(model: FittedModel, without=()) -> bytes:
    """What duckmob stored before models carried a version (format 1: no header, ``method`` and ``pois`` beside
    the config), the config without the fields ``without`` (added after such a model was stored)."""
    config = {k: v for k, v in model.stored_config().items() if k != "pois" and k not in without}
    info = {("contribution_bound" if k == "max_trajectories_per_user" else k): v for k, v in model.info.items()}
    buf = io.BytesIO()
    torch.save(dict(method=model.kind, bbox=model.bbox, config=config, pois=model.config.pois, state=model.state,
                    event_json=model.event_json, info=info,
                    extra={k: torch.as_tensor(v) for k, v in model.extra.items()}), buf)
    return buf.getvalue()


def test_models_saved_before_multitask_loss_load_with_the_papers_loss_and_input():
    model = fit_unrecorded(HRNet(BOX, **{**TINY, "multitask_loss": "full"}), toy_trajectories(120), 2.0, 1e-5,
                           NoiseSource(3))
    again = FittedModel.from_bytes(format_1_blob(model, without=("multitask_loss", "input_levels")))
    assert again.network().conditional is False
    assert again.network().input_levels == "finest"
    assert again.info["max_trajectories_per_user"] == 1                # format 1's contribution_bound, renamed
    assert HRNet(BOX, **TINY).build().conditional is True


def test_format_1_models_sample_with_what_their_sampling_used():
    """A format-1 model stored without the later sampling fields samples as format 1's code did (decode
    'finest', output 'cells', one route draw), not with today's defaults; a baseline model says so itself."""
    model = fit_unrecorded(Baseline(BOX, **TINY), toy_trajectories(120), 2.0, 1e-5, NoiseSource(3))
    later = ("multitask_loss", "input_levels", "decode", "output", "route_draws", "temperature", "anchors",
             "max_points", "step_m")
    again = FittedModel.from_bytes(format_1_blob(model, without=later))   # no method given: the payload's
    assert again.kind == "baseline" and again.stored_method() == "baseline"
    assert (again.config.decode, again.config.output, again.config.route_draws) == ("finest", "cells", 1)
    assert again.sample(20, np.random.default_rng(0)).n_trajectories == 20
    stored = FittedModel.from_bytes(again.to_bytes())
    assert stored.config == again.config and stored.kind == "baseline"
