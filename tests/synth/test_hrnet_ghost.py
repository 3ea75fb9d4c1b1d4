"""HRNet's DP-SGD by ghost clipping (issue 42 item 5): each trajectory's clipped gradient is the one its own
per-example gradient gives, so the sensitivity argument of opacus's clipping holds unchanged; the paths that cannot
be ghost-clipped keep vmap; pre-training's Adam is torch's bit for bit."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

from duckmob.synth import dpsgd
from duckmob.synth.hrnet.model import BaselineModel, HRNetModel
from duckmob.synth.hrnet.train import ghost_clipped, per_sample_gradients

pretrain_module = importlib.import_module("duckmob.synth.hrnet.pretrain")   # the package's name is the function


def _batch(depth, b, t, seed):
    g = torch.Generator().manual_seed(seed)
    cells = torch.randint(0, 4 ** depth, (b, t), generator=g)
    times = torch.randint(0, 5, (b, t), generator=g)
    lengths = torch.randint(1, t, (b,), generator=g)
    lengths[0] = t - 1    # one row as long as the batch allows (its end token at the last position)
    return cells, times, lengths


MODELS = [
    pytest.param(lambda: HRNetModel(3, loc_dim=8, time_dim=4, hidden=8, key_dim=8, multitask_loss="conditional",
                                    input_levels="all", deconv_activation=True), id="hrnet-all"),
    pytest.param(lambda: HRNetModel(3, loc_dim=8, time_dim=4, hidden=8, key_dim=8, multitask_loss="conditional",
                                    input_levels="finest", finest_weight=2.0), id="hrnet-finest"),
    pytest.param(lambda: BaselineModel(3, loc_dim=8, time_dim=4, hidden=8), id="baseline"),
]


@pytest.mark.parametrize("build", MODELS)
@pytest.mark.parametrize("clip", [0.05, 50.0])
def test_the_ghost_clipped_sum_is_the_sum_of_clipped_per_example_gradients(build, clip):
    """Row by row: the norms ghost clipping computes are the norms of each trajectory's own gradient (vmap, itself
    tested against one backward pass per example), so the clipped sum is the same: tight clipping (every row
    clipped) and loose (none)."""
    torch.manual_seed(3)
    model = build()
    cells, times, lengths = _batch(3, 9, 6, seed=4)
    grads = per_sample_gradients(model, cells, times, lengths)
    names = [n for n, _ in model.named_parameters()]
    per = torch.cat([grads[n].reshape(len(lengths), -1) for n in names], 1)
    norms = per.norm(dim=1)
    assert (norms > 0.05).all() and (norms < 50.0).all()
    expect = (per * (clip / (norms + 1e-6)).clamp(max=1.0)[:, None]).sum(0)
    taps = dpsgd._Taps(model)
    try:
        out = dpsgd._clipped_sum(model(cells, times, lengths), taps, clip)
    finally:
        taps.close()
    assert set(out) == set(model.parameters())          # every trained parameter is seen by the taps
    got = torch.cat([out[p].reshape(-1) for _, p in model.named_parameters()])
    assert torch.allclose(got, expect, atol=1e-6 * max(1.0, float(expect.abs().max())), rtol=1e-4)


def test_ghost_clipping_is_used_where_it_is_exact():
    hrnet = HRNetModel(2, loc_dim=4, time_dim=2, hidden=4, key_dim=4, multitask_loss="conditional")
    full = HRNetModel(2, loc_dim=4, time_dim=2, hidden=4, key_dim=4, multitask_loss="full")
    baseline = BaselineModel(2, loc_dim=4, time_dim=2, hidden=4)
    assert ghost_clipped(hrnet, False) and ghost_clipped(baseline, False)
    assert not ghost_clipped(full, False)            # the shared encoding tree: vmap
    assert not ghost_clipped(hrnet, True)            # a user's trajectories summed before clipping: vmap


def _pretrained(monkeypatch=None):
    if monkeypatch is not None:
        monkeypatch.setattr(pretrain_module, "ForeachAdam", lambda params, lr: torch.optim.Adam(params, lr=lr))
    torch.manual_seed(0)
    model = HRNetModel(3, loc_dim=8, time_dim=4, hidden=8, key_dim=8, deconv_activation=True)
    noisy = np.random.default_rng(0).random((16, 64)) * 3
    pretrain_module.pretrain(model, noisy, iterations=25, batch=10, lr=1e-2, rng=np.random.default_rng(1),
                             device=torch.device("cpu"), progress=False)
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_pretraining_with_foreach_adam_equals_torch_adam_bit_for_bit(monkeypatch):
    ours = _pretrained()
    theirs = _pretrained(monkeypatch)
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name
    torch.manual_seed(0)
    untrained = HRNetModel(3, loc_dim=8, time_dim=4, hidden=8, key_dim=8, deconv_activation=True).state_dict()
    assert not torch.equal(ours["f_query.weight"], untrained["f_query.weight"])
