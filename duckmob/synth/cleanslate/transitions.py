"""The transition probability generator (TPG): a feed-forward network with a location embedding that maps
(current cell, destination cell, time slot) to a distribution over the (2r+1)^2 next-hop cells within r cells
(Lestyan et al. §7.3.2, §8.3.2).

The current and destination cells are embedded "separately into the same space" (two tables of size
``embed``: ghost clipping needs each layer used once per forward pass), concatenated with the one-hot slot, then a dense ``hidden`` layer (ReLU) and a softmax over the (2r+1)^2 classes. Classes that leave
the grid or stay in place are masked (public structure: the grid and r).

**Privacy unit = one trajectory** (not one gram, as in the paper's §8.3.3 sampling, which does not account for a
trajectory contributing many grams). One training example is a whole trajectory: its loss is the MEAN of the
cross-entropies of its (at most ``max_grams``) grams, so its gradient is the mean of its grams' gradients and the
DP-SGD clipping bounds the whole trajectory's contribution to a step by ``max_grad_norm`` (a user's k
trajectories: their gradients are summed and clipped together). Trajectories are Poisson-sampled at rate q, the
rate the accountant is told. A trajectory without a gram (one cell) has loss 0 and gradient 0.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn.functional import nll_loss

from duckmob.synth.cleanslate.trips import valid_moves


class Transitions(nn.Module):
    """TPG: ``forward(current, dest, slot, label, count)`` -> per-trajectory mean cross-entropy (nats)."""

    def __init__(self, w: int, r: int, n_time: int, embed: int, hidden: int):
        super().__init__()
        self.w, self.r, self.n_time = w, r, n_time
        k = (2 * r + 1) ** 2
        self.embed_current = nn.Embedding(w * w, embed)
        self.embed_dest = nn.Embedding(w * w, embed)
        self.time = nn.Embedding(n_time, hidden)        # the dense layer's weights on the one-hot slot
        self.current_in = nn.Linear(embed, hidden)
        self.dest_in = nn.Linear(embed, hidden, bias=False)
        self.out = nn.Linear(hidden, k)
        mask = np.where(valid_moves(w, r), 0.0, -1e9).astype(np.float32)
        self.register_buffer("log_mask", torch.from_numpy(mask))

    def logits(self, current, dest, slot):
        """Masked logits (..., (2r+1)^2) for cells ``current`` heading to ``dest`` in ``slot`` (broadcast)."""
        h = self.current_in(self.embed_current(current)) + self.dest_in(self.embed_dest(dest)) + self.time(slot)
        return self.out(torch.relu(h)) + self.log_mask[current]

    def forward(self, current, dest, slot, label, count):
        logp = torch.log_softmax(self.logits(current, dest[..., None], slot[..., None]), -1)
        nll = nll_loss(logp.flatten(0, -2), label.flatten(), reduction="none").view(label.shape)   # (B, G)
        used = torch.arange(current.shape[-1], device=current.device) < count[..., None]
        return (nll * used).sum(-1) / count.clamp(min=1)

    @torch.no_grad()
    def log_probs_for(self, dest: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        """(G, w^2, (2r+1)^2) log next-hop probabilities from every cell, for G (destination, slot) pairs.
        The dense layer is split so the per-cell and per-group parts are computed once each; the (G, w^2, hidden)
        activations are made in place (call with a few dozen groups at a time: they stay in cache)."""
        cells = torch.arange(self.w * self.w, device=dest.device)
        a = self.current_in(self.embed_current(cells))                          # (w^2, H)
        b = self.dest_in(self.embed_dest(dest)) + self.time(slot)                # (G, H)
        h = a[None] + b[:, None]
        h.relu_()
        out = torch.matmul(h, self.out.weight.t())
        out += self.out.bias + self.log_mask
        return out - torch.logsumexp(out, -1, keepdim=True)


def loss_of_one(call, current, dest, slot, label, count):
    """One trajectory's loss through ``call`` (the model with the parameters being differentiated)."""
    return call(current[None], dest[None], slot[None], label[None], count[None])[0]


def by_width(count: np.ndarray, widths=(2, 4, 8, 16, 24), min_rows: int = 16):
    """``split_rows`` for :func:`duckmob.synth.dpsgd.train_ghost`: a batch's rows in parts of at most 2, 4, 8, 16,
    24 and more grams (public edges), so each part is padded to its own longest row rather than the batch's (a few
    long trajectories would make every row of a batch ``max_grams`` wide). A part of fewer than ``min_rows`` rows
    joins the next wider one (each part costs a forward and backward pass whatever its size: on short trips the
    wide parts hold a row or two). Rows without a gram are in no part: their loss is 0 whatever the weights and
    their gradient 0, so they add nothing to the clipped sum (on short trips they are most rows: 56% of the
    taxi-like benchmark's)."""
    edges = np.asarray(widths)

    def split(rows: np.ndarray) -> list[np.ndarray]:
        rows = rows[count[rows] > 0]
        part = np.searchsorted(edges, count[rows])
        parts, carry = [], rows[:0]
        for j in range(len(edges) + 1):
            carry = np.concatenate([carry, rows[part == j]])
            if len(carry) >= min_rows:
                parts.append(carry)
                carry = rows[:0]
        return parts + [carry] if len(carry) else parts
    return split
