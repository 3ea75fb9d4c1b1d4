"""Private pre-training (HRNet §4): a noisy coarse-to-fine transition matrix DPTRAN and a KL fit to it.

* DPTRAN (eq. 3, 4), released by the privacy core: ``TRAN[r, l] = sum_v 1[v moves from a cell inside region r
  (level ``level``, 4**level regions) to cell l] / W_v`` (W_v = number of transitions of v). Privacy map: a
  trajectory has at most W_v distinct (region, cell) transitions, each weighted 1/W_v, so adding or removing one
  trajectory changes the matrix by at most 1 in L1 (a user with at most k trajectories: k); Laplace noise of
  scale k/eps_pre on every one of the 4**level x w*w entries (a data-independent support) makes the release
  eps_pre-DP. Everything after it (normcut, normalisation, the pre-training itself) is post-processing.
* Pre-training (§4.2): a temporary module maps a Dirichlet(1) mixture of region encodings
  ``x = sum_r r_r hiencode_level(r)`` to a query-like state; the loss is ``KL(sum_r r_r DPTRAN[r] || model)``
  (eq. 6), summed over resolutions when the model is multi-task (the target aggregated to each resolution).
  It trains the location encoding, f_query and f_key; the GRU is not pre-trained (DPTRAN has no prefixes).
* Budget split (eq. 9 in the form of App. A.1 and the reference code): ``eps_pre = c 4**level w^2 ln(w^2) / |D|``
  with c = 0.018, from public parameters and a noisy count |D| (eq. 9's body writes log(w); App. A.1 and the
  reference use log(w^2), which we follow). Capped at ``max_share`` of the budget left.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from duckmob.privacy.counting import noisy_region_transition_counts
from duckmob.privacy.normcut import normcut
from duckmob.privacy.unit import PrivacyUnit
from duckmob.synth.hrnet.encoding import morton
from duckmob.synth.hrnet.model import HRNetModel
from duckmob.progress import steps as progress_steps
from duckmob.synth.dpsgd import ForeachAdam
from duckmob.synth.hrnet.train import torch_generator
from duckmob.trajectories import CellSequences

PRETRAIN_LEVEL = 2  # HRNet §4.2.3: first-order transitions from the 4 x 4 regions


def pretraining_epsilon(eps_left: float, n_noisy: float, w: int, level: int = PRETRAIN_LEVEL, c: float = 0.018,
                        max_share: float = 0.5, sensitivity: float = 1.0) -> float:
    """HRNet eq. 9 / App. A.1: ``min(c 4**level w^2 ln(w^2) sensitivity / |D|, max_share * eps_left)``.

    ``n_noisy`` is a DP count (never the exact one). ``sensitivity`` (k for users with k trajectories) keeps the
    signal-to-noise ratio of App. A.1 constant. The paper's cap is the whole budget; ours leaves at least
    ``1 - max_share`` of it to DP-SGD.
    """
    n = max(float(n_noisy), 1.0)
    return float(min(c * 4 ** level * w * w * math.log(w * w) * sensitivity / n, max_share * eps_left))


def dptran(seqs: CellSequences, w: int, eps: float, noise, level: int = PRETRAIN_LEVEL, k: int = 1) -> np.ndarray:
    """The eps-DP release DPTRAN_level (eq. 4) from the privacy core
    (:func:`duckmob.privacy.counting.noisy_region_transition_counts`): TRAN + Laplace(k / eps) on every one of the
    4**level x w*w entries; one trajectory moves TRAN by <= 1 in L1, a user with at most k trajectories by <= k.
    Accounted as ``accounting.laplace(eps)``. Returns the raw noisy matrix (4**level, w*w), grid ids."""
    if k == 1:
        return noisy_region_transition_counts(seqs.offsets, seqs.cells, w, level, eps, noise)
    return noisy_region_transition_counts(seqs.offsets, seqs.cells, w, level, eps, noise, user_id=seqs.user_id,
                                          unit=PrivacyUnit.user(k))


def transition_targets(noisy: np.ndarray) -> np.ndarray:
    """Post-processing of DPTRAN into row-stochastic targets: PrivTrace's normcut per row (keep the largest
    entries up to the noisy row total), then normalise; a row left empty becomes the mean of the others
    (uniform if all are empty)."""
    kept = np.clip(normcut(noisy, axis=1), 0, None)
    sums = kept.sum(1, keepdims=True)
    prob = np.divide(kept, sums, out=np.zeros_like(kept), where=sums > 0)
    empty = sums[:, 0] <= 0
    if empty.all():
        return np.full_like(noisy, 1.0 / noisy.shape[1])
    prob[empty] = prob[~empty].mean(0)
    return prob


def pretrain(model: HRNetModel, noisy: np.ndarray, *, iterations: int, batch: int, lr: float,
             rng: np.random.Generator, device: torch.device, level: int = PRETRAIN_LEVEL,
             progress: bool | None = None, check_interrupt: Callable[[], None] | None = None) -> None:
    """Fit ``model``'s encoding, f_query and f_key to the raw DPTRAN ``noisy`` (4**level, w*w; grid ids) with the
    Dirichlet(1)-mixing KL loss (HRNet eq. 6), at every resolution of the model's loss. The target at resolution
    r is :func:`transition_targets` of the noisy counts summed over each resolution-r cell (summing before
    normcut keeps the coarse targets unbiased; their noise is relatively smaller). Post-processing of a DP
    release: no budget. In place.

    ``check_interrupt``: called with no arguments before every iteration (a cheap flag check); whatever it raises
    propagates unchanged, leaving the model partly pre-trained."""
    depth = model.depth
    w = 1 << depth
    n_regions = 4 ** level
    # grid ids -> Z-order on both axes
    tz = np.empty_like(noisy)
    tz[np.ix_(morton(np.arange(n_regions), 1 << level), morton(np.arange(w * w), w))] = noisy
    levels = [r for r in model.levels if r >= 1]
    targets = {r: torch.as_tensor(transition_targets(tz.reshape(n_regions, 4 ** r, -1).sum(-1)),
                                  dtype=torch.float32, device=device) for r in levels}
    hidden = model.f_query.in_features
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(rng.integers(2 ** 62)))
        temp = nn.Sequential(nn.Linear(model.encoding.dim, hidden), nn.Tanh()).to(device)
    model.to(device).train()
    params = (list(model.encoding.parameters()) + list(model.f_query.parameters())
              + list(model.f_key_t.parameters()) + list(temp.parameters()))
    opt = ForeachAdam(params, lr=lr)   # torch's Adam, the same weights bit for bit, in a few calls a step
    gen = torch_generator(rng, torch.device("cpu"))
    bar = progress_steps("hrnet pre-training", iterations, progress)
    try:
        for _ in range(iterations):
            if check_interrupt is not None:
                check_interrupt()
            # Dirichlet(1) = normalised Exp(1) draws
            mix = -torch.log(torch.rand(batch, n_regions, generator=gen).clamp_min(1e-12))
            mix = (mix / mix.sum(1, keepdim=True)).to(device)
            m = model.encoding()
            x = mix @ m[level]
            q = model.f_key_t(model.f_query(temp(x)))
            loss = 0.0
            for r in levels:
                logp = F.log_softmax(q @ m[r].T, dim=1)
                loss = loss + F.kl_div(logp, mix @ targets[r], reduction="batchmean")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            bar.update(1)
    finally:
        bar.close()
