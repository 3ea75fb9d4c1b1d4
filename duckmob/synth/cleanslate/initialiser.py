"""The trajectory initialiser (TI): a variational autoencoder over (source cell, destination cell, time slot)
(Lestyan et al. §7.3.1, §8.3.1; the loss of Doersch 2016).

Cells here are the cells the VAE works on: the fine w x w cells, or the public coarse cells of :mod:`.prior`
(then ``n_cells`` is the number of coarse cells). Encoder: the one-hot input (2 n_cells + T values) -> dense
``hidden`` (ReLU) -> dense ``hidden`` (linear) -> mean and log-variance of a Gaussian latent of size ``latent``.
Decoder: latent -> dense ``hidden`` (ReLU) -> three parallel softmax heads over sources, destinations and slots,
each with a fixed (untrained) bias: the log of the released DP prior of :mod:`.prior` when there is one
(:meth:`Initialiser.set_prior`), else 0. The first dense layer applied to a one-hot input is the sum of three rows
of its weight matrix, so it is stored as one embedding table whose last row, looked up by every example, is the
layer's bias (the same function and the same gradients, without a 2 n_cells-wide input; and only
``nn.Embedding`` and ``nn.Linear`` layers, each used once per forward pass, as ghost clipping needs).

Training example = one trajectory (one row); its loss is its own reconstruction cross-entropy plus the KL term,
with the reparameterisation noise given as an input (``eps``), so per-example gradients are a pure function of
the example (see :func:`duckmob.synth.dpsgd.per_example_gradients`).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn.functional import nll_loss


class Initialiser(nn.Module):
    """TI: ``forward(source, dest, slot, eps)`` -> per-example loss (negative ELBO, nats)."""

    def __init__(self, n_cells: int, n_time: int, hidden: int, latent: int, w: int | None = None):
        super().__init__()
        self.n_cells, self.n_time, self.latent, self.w = n_cells, n_time, latent, w
        # the first dense layer over the one-hot input; its last row is the bias
        self.inputs = nn.Embedding(2 * n_cells + n_time + 1, hidden)
        with torch.no_grad():
            self.inputs.weight[-1].zero_()
        self.enc2 = nn.Linear(hidden, hidden)
        self.mean = nn.Linear(hidden, latent)
        self.log_var = nn.Linear(hidden, latent)
        self.dec = nn.Linear(latent, hidden)
        # w given: each cell head is factorised, logit(row, col) = a[row] + b[col] (2w outputs instead of w^2)
        out = n_cells if w is None else 2 * w
        self.source_head = nn.Linear(hidden, out)
        self.dest_head = nn.Linear(hidden, out)
        self.slot_head = nn.Linear(hidden, n_time)
        # fixed (not trained) logit offsets: the log of the released DP prior, zero without one
        self.register_buffer("bias_source", torch.zeros(n_cells))
        self.register_buffer("bias_dest", torch.zeros(n_cells))
        self.register_buffer("bias_slot", torch.zeros(n_time))

    def set_prior(self, source: np.ndarray, dest: np.ndarray, slot: np.ndarray) -> None:
        """Use the log-probabilities ``source``, ``dest`` (n_cells,) and ``slot`` (n_time,) of a released prior as
        the heads' fixed biases, and start the heads' own weights and biases at 0: the untrained decoder is the
        prior (independent source, destination and slot), and DP-SGD learns the residual, their correlation."""
        with torch.no_grad():
            for buf, value in ((self.bias_source, source), (self.bias_dest, dest), (self.bias_slot, slot)):
                buf.copy_(torch.as_tensor(value, dtype=torch.float32))
            for head in (self.source_head, self.dest_head, self.slot_head):
                head.weight.zero_()
                head.bias.zero_()

    def decode(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probabilities of the three heads for latent vectors ``z`` (B, latent)."""
        h = torch.relu(self.dec(z))
        return (torch.log_softmax(self._cells(self.source_head(h)) + self.bias_source, -1),
                torch.log_softmax(self._cells(self.dest_head(h)) + self.bias_dest, -1),
                torch.log_softmax(self.slot_head(h) + self.bias_slot, -1))

    def _cells(self, x: torch.Tensor) -> torch.Tensor:
        if self.w is None:
            return x
        w = self.w
        return (x[..., :w, None] + x[..., None, w:]).flatten(-2)   # row-major cell id = row * w + col

    def forward(self, source, dest, slot, eps):
        bias_row = torch.full_like(source, 2 * self.n_cells + self.n_time)
        idx = torch.stack([source, self.n_cells + dest, 2 * self.n_cells + slot, bias_row], -1)
        h = torch.relu(self.inputs(idx).sum(-2))
        h = self.enc2(h)
        mu, log_var = self.mean(h), self.log_var(h).clamp(-10.0, 10.0)
        z = mu + torch.exp(0.5 * log_var) * eps
        ls, ld, lt = self.decode(z)
        # -log p of each head's observed value (nll_loss: the same values and gradients as a gather, faster)
        recon = (nll_loss(ls, source, reduction="none") + nll_loss(ld, dest, reduction="none")
                 + nll_loss(lt, slot, reduction="none"))
        kl = 0.5 * (mu ** 2 + log_var.exp() - 1.0 - log_var).sum(-1)
        return recon + kl


def loss_of_one(call, source, dest, slot, eps):
    """One example's loss through ``call`` (the model with the parameters being differentiated)."""
    return call(source[None], dest[None], slot[None], eps[None])[0]


def categorical(logp: torch.Tensor, u: np.ndarray) -> np.ndarray:
    """One draw per row from the rows' probabilities ``exp(logp)`` by inverse CDF at uniforms ``u``."""
    cdf = np.cumsum(logp.exp().double().cpu().numpy(), axis=1)
    return np.minimum((cdf < (u * cdf[:, -1])[:, None]).sum(1), cdf.shape[1] - 1)


@torch.no_grad()
def sample_endpoints(model: Initialiser, n: int, rng: np.random.Generator, device: torch.device,
                     chunk: int = 4096) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` draws of (source, dest, slot) from the decoder: z ~ N(0, I), then each head's softmax
    (post-processing of the released weights; randomness from ``rng``)."""
    model.to(device).eval()
    out = [], [], []
    for lo in range(0, n, chunk):
        m = min(chunk, n - lo)
        z = torch.as_tensor(rng.standard_normal((m, model.latent)), dtype=torch.float32, device=device)
        for heads, logp in zip(out, model.decode(z)):
            heads.append(categorical(logp, rng.random(m)))
    return tuple(np.concatenate(h).astype(np.int64) if h else np.zeros(0, np.int64) for h in out)
