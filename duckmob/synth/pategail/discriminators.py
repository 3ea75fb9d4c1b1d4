"""PateGail's personal discriminators (Wang et al., AAAI 2024, eq. 1) as one batched ensemble.

One small discriminator per device: ``D_u(s, a) = sigmoid(w2_u . relu(W1_u x + b1_u) + b2_u)`` on the
(state, action) features of ``mdp.pair_features``. The weights of all devices are stacked along a leading device
axis and evaluated with ``torch.einsum`` (grouped matrix products), never a Python loop over devices.

**Isolation.** Device u's discriminator is trained on u's own real state-action pairs (positives) against
generated pairs (negatives, public: produced by the policy, a function of earlier noised aggregates only). The
loss is the SUM over devices of each device's own eq. 1 loss, so the gradient of u's weights is the gradient of
u's loss alone; Adam works elementwise (its moments and step size of one weight depend on that weight's
gradients only); nothing else (no normalisation, no gradient clipping, no shared layer) couples devices. Hence a
device's data reaches nothing but its own discriminator, whose outputs leave only through the noised aggregate
(``aggregate.py``). The discriminators are never released.
"""

from __future__ import annotations

import math

import numpy as np
import torch

# Devices evaluated at once when answering reward queries (bounds memory: devices x queries x hidden floats).
QUERY_CHUNK = 1024


class Ensemble:
    """``n`` personal discriminators with stacked weights on ``device``; initialised from ``gen``."""

    def __init__(self, n: int, n_features: int, hidden: int, lr: float, gen: torch.Generator,
                 device: torch.device):
        self.n, self.device = n, device
        bound1, bound2 = 1 / math.sqrt(n_features), 1 / math.sqrt(hidden)

        def uniform(shape, bound):
            t = (torch.rand(shape, generator=gen) * 2 - 1) * bound
            return t.to(device).requires_grad_(True)

        self.w1 = uniform((n, n_features, hidden), bound1)
        self.b1 = uniform((n, hidden), bound1)
        self.w2 = uniform((n, hidden), bound2)
        self.b2 = uniform((n,), bound2)
        self.params = [self.w1, self.b1, self.w2, self.b2]
        self.opt = torch.optim.Adam(self.params, lr=lr)

    def logits_own(self, x: torch.Tensor) -> torch.Tensor:
        """Each device on its own inputs: ``x`` (n, m, F) -> (n, m)."""
        h = torch.relu(torch.einsum("nmf,nfh->nmh", x, self.w1) + self.b1[:, None, :])
        return torch.einsum("nmh,nh->nm", h, self.w2) + self.b2[:, None]

    def logits_shared(self, x: torch.Tensor, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        """Devices ``lo:hi`` on the same inputs: ``x`` (m, F) -> (hi - lo, m)."""
        w1, b1, w2, b2 = (p[lo:hi] for p in self.params)
        h = torch.relu(torch.einsum("mf,nfh->nmh", x, w1) + b1[:, None, :])
        return torch.einsum("nmh,nh->nm", h, w2) + b2[:, None]

    def train_step(self, real: torch.Tensor, fake: torch.Tensor) -> float:
        """One Adam step on eq. 1 for every device: ``real`` (n, m, F) each device's own pairs, ``fake`` (m', F)
        generated pairs shown to every device. Loss per device: mean BCE(D(real), 1) + mean BCE(D(fake), 0);
        summed over devices (see the module docstring). Returns the mean loss per device (not released)."""
        self.opt.zero_grad(set_to_none=True)
        pos = torch.nn.functional.softplus(-self.logits_own(real)).mean(dim=1)
        neg = torch.nn.functional.softplus(self.logits_shared(fake)).mean(dim=1)
        loss = (pos + neg).sum()
        loss.backward()
        self.opt.step()
        return float(loss.detach()) / max(self.n, 1)

    @torch.no_grad()
    def outputs(self, x: torch.Tensor) -> torch.Tensor:
        """Every device's D(s, a) on the queries ``x`` (B, F): (n, B) in [0, 1] (device-side, never released)."""
        parts = [torch.sigmoid(self.logits_shared(x, lo, lo + QUERY_CHUNK)) for lo in range(0, self.n, QUERY_CHUNK)]
        return torch.cat(parts, dim=0) if parts else torch.zeros((0, len(x)), device=x.device)


def sample_own(offsets: np.ndarray, m: int, rng: np.random.Generator) -> np.ndarray:
    """(n, m) indices of ``m`` pairs drawn with replacement from each device's own pairs ``offsets[u]:offsets[u+1]``
    (devices hold at least one pair)."""
    counts = np.diff(offsets)
    u = rng.random((len(counts), m))
    return offsets[:-1, None] + np.minimum((u * counts[:, None]).astype(np.int64), counts[:, None] - 1)
