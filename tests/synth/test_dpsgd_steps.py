"""dpsgd.train_ghost's own noisy Adam step (issue 42 item 5) against opacus's optimiser: the same noise draws, the
same clipped sums and the same Adam, so the same weights bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from duckmob.synth import dpsgd
from duckmob.synth.cleanslate.transitions import Transitions, by_width


def _torch_adam(params, lr):
    return torch.optim.Adam(params, lr=lr)


def _opacus_optimizer(params, schedule, generator):
    """What train_ghost used before: opacus's fast-gradient-clipping optimiser around torch's Adam."""
    return dpsgd._dp_optimizer(dpsgd._GhostOptimizer, dpsgd._DistributedGhostOptimizer, params, schedule,
                               generator, None)


def _data(b=40, w=6, g_max=7, seed=2):
    gen = torch.Generator().manual_seed(seed)
    current = torch.randint(0, w * w, (b, g_max), generator=gen)
    label = torch.randint(0, 9, (b, g_max), generator=gen)
    dest = torch.randint(0, w * w, (b,), generator=gen)
    slot = torch.randint(0, 3, (b,), generator=gen)
    count = torch.randint(0, g_max + 1, (b,), generator=gen)
    return current, dest, slot, label, count


def _train(sigma, ema, steps=12, users=None):
    current, dest, slot, label, count = _data()

    def losses(module, rows):
        idx = torch.as_tensor(rows)
        width = max(1, int(count[idx].max()))
        return module(current[idx, :width], dest[idx], slot[idx], label[idx, :width], count[idx])

    torch.manual_seed(0)
    model = Transitions(6, 1, 3, 4, 8)
    schedule = dpsgd.Schedule(sample_rate=0.3, steps=steps, noise_multiplier=sigma, max_grad_norm=0.05,
                              expected_batch_size=12.4, lr=0.02, lr_final=0.1, ema=ema)
    kw = dict(unit_of_row=users, max_trajectories_per_user=2) if users is not None else {}
    dpsgd.train_ghost(model, losses, len(count), schedule,
                      dpsgd.RunContext(np.random.default_rng(7), torch.device("cpu"), progress=False),
                      split_rows=by_width(count.numpy(), widths=(2, 4)), **kw)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("sigma, ema, users", [(1.3, 0.0, None), (0.0, 0.0, None), (0.8, 0.9, None),
                                               (1.1, 0.0, np.arange(40) // 2)])
def test_the_noisy_adam_step_equals_opacus_bit_for_bit(monkeypatch, sigma, ema, users):
    ours = _train(sigma, ema, users=users)
    monkeypatch.setattr(dpsgd, "_NoisyAdam", _opacus_optimizer)
    monkeypatch.setattr(dpsgd, "ForeachAdam", _torch_adam)
    theirs = _train(sigma, ema, users=users)
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name
    moved = _train(sigma, ema, steps=0)
    assert any(not torch.equal(ours[n], moved[n]) for n in ours if n != "log_mask")   # training changed weights


def _train_materialised(steps=8):
    """dpsgd.train (per-example gradients from vmap, opacus's DPOptimizer clipping them) on a small TPG."""
    current, dest, slot, label, count = _data()
    torch.manual_seed(0)
    model = Transitions(6, 1, 3, 4, 8)
    from duckmob.synth.cleanslate.transitions import loss_of_one

    def row_gradients(rows):
        idx = torch.as_tensor(rows)
        return dpsgd.per_example_gradients(model, loss_of_one, current[idx], dest[idx], slot[idx], label[idx],
                                           count[idx])

    schedule = dpsgd.Schedule(sample_rate=0.3, steps=steps, noise_multiplier=1.2, max_grad_norm=0.05,
                              expected_batch_size=12.4, lr=0.02, lr_final=0.1)
    dpsgd.train(model, row_gradients, len(count), schedule,
                dpsgd.RunContext(np.random.default_rng(7), torch.device("cpu"), progress=False))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_the_materialised_path_with_foreach_adam_equals_torch_adam_bit_for_bit(monkeypatch):
    ours = _train_materialised()
    monkeypatch.setattr(dpsgd, "ForeachAdam", _torch_adam)
    theirs = _train_materialised()
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name
    assert not torch.equal(ours["out.weight"], _train_materialised(steps=0)["out.weight"])


def test_the_noise_has_the_planned_scale_and_the_batch_divides():
    """With zero gradients (lr tiny), the gradient handed to Adam is noise of sd sigma * C divided by the rounded
    expected batch: measured over many coordinates."""
    model = torch.nn.Linear(400, 50)
    schedule = dpsgd.Schedule(sample_rate=1.0, steps=1, noise_multiplier=2.0, max_grad_norm=0.5,
                              expected_batch_size=9.6, lr=1e-3)
    opt = dpsgd._NoisyAdam(list(model.parameters()), schedule, torch.Generator().manual_seed(1))
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    seen = []
    handle = register_optimizer_step_pre_hook(
        lambda o, a, k: seen.append(torch.cat([p.grad.flatten() for p in model.parameters()])))
    try:
        opt.step()
    finally:
        handle.remove()
    sd = float(seen[0].std()) * 10            # divided by round(9.6) = 10
    assert abs(sd - 1.0) < 0.02 and abs(float(seen[0].mean())) < 0.01


def test_rows_without_a_gram_are_left_out_and_the_training_is_the_same():
    """by_width leaves out the rows of no gram (zero loss, zero gradient) and parts the rest by width; training with
    it takes the same steps as with the whole batch in one part (up to the sums' rounding)."""
    current, dest, slot, label, count = _data()
    c = count.numpy()
    split = by_width(c, widths=(2, 4), min_rows=1)
    rows = np.arange(len(c))
    parts = split(rows)
    assert (c == 0).sum() >= 3 and sorted(np.concatenate(parts)) == list(np.flatnonzero(c > 0))
    assert len(parts) == 3 and (c[parts[0]] <= 2).all() and (c[parts[1]] > 2).all() and (c[parts[1]] <= 4).all()
    assert (c[parts[2]] > 4).all()
    # parts of fewer than min_rows rows join the next wider part; a small last part stays alone
    merged = by_width(c, widths=(1, 2, 4), min_rows=len(parts[0]) + 2)(rows)
    assert [len(p) for p in merged] == [len(parts[0]) + len(parts[1]), len(parts[2])]
    assert sorted(np.concatenate(merged)) == list(np.flatnonzero(c > 0))

    def losses(module, rows):
        idx = torch.as_tensor(rows)
        width = max(1, int(count[idx].max()))
        return module(current[idx, :width], dest[idx], slot[idx], label[idx, :width], count[idx])

    weights = []
    for split_rows in (None, split):
        torch.manual_seed(0)
        model = Transitions(6, 1, 3, 4, 8)
        schedule = dpsgd.Schedule(sample_rate=0.5, steps=6, noise_multiplier=0.7, max_grad_norm=0.05,
                                  expected_batch_size=20, lr=1e-2)
        dpsgd.train_ghost(model, losses, len(c), schedule,
                          dpsgd.RunContext(np.random.default_rng(5), torch.device("cpu"), progress=False),
                          split_rows=split_rows)
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.allclose(weights[0], weights[1], atol=1e-6)


class _Stack(torch.nn.Module):
    """One-position linear layers with and without bias (ghost norms of all of them at once), a frozen-weight layer
    (the per-layer path) and an embedding looked up twice a row."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(7, 5)
        self.a = torch.nn.Linear(5, 6)
        self.b = torch.nn.Linear(6, 3, bias=False)
        self.c = torch.nn.Linear(3, 4)
        self.c.weight.requires_grad_(False)
        self.d = torch.nn.Linear(4, 2)

    def forward(self, ids, x):
        h = torch.tanh(self.a(self.embed(ids).sum(1) + x))
        return (self.d(torch.relu(self.c(self.b(h)))) ** 2).sum(-1)


def test_one_position_layers_clip_every_row_to_its_exact_norm():
    """The clipped sum of _clipped_sum (the one-position layers' norms all at once) equals the sum of every row's
    exact gradient (vmap) clipped to C, with rows above and below C."""
    b, clip = 10, 1.5
    gen = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 7, (b, 2), generator=gen)
    x = torch.randn(b, 5, generator=gen) * torch.linspace(0.0, 3.0, b)[:, None]
    torch.manual_seed(1)
    model = _Stack()
    exact = dpsgd.per_example_gradients(model, lambda call, *row: call(*(v[None] for v in row))[0], ids, x)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    per_row = torch.cat([exact[n].reshape(b, -1) for n, _ in named], 1)
    norms = per_row.norm(dim=1)
    assert (norms > clip).any() and (norms < clip).any()
    expect = (per_row * (clip / (norms + 1e-6)).clamp(max=1.0)[:, None]).sum(0)
    taps = dpsgd._Taps(model)
    try:
        out = dpsgd._clipped_sum(model(ids, x), taps, clip)
    finally:
        taps.close()
    got = torch.cat([out[p].flatten() for _, p in named])
    assert torch.allclose(got, expect, rtol=1e-4, atol=1e-6)
