"""Hierarchical location encoding (HRNet §2.5, §3.2): a root vector expanded by a 2x2 quad deconvolution per
quadtree depth, so ``w * w`` location vectors cost O(log w) parameters instead of an O(w^2) embedding matrix.

Level ``l`` (0..d, ``w = 2**d``) is the ``2**l`` x ``2**l`` grid over the public bounding box, cells numbered as
in :mod:`duckmob.grid` (``id = row * 2**l + col``, row from latitude, column from longitude); inside the model
cells are held in Z-order (:func:`morton`), where a parent's four children are contiguous. One quad
deconvolution maps each vector ``M[x, y]`` of level ``l`` to its four children ``M'[2x + dx, 2y + dy]``
(HRNet §2.5: ``M'[2x+dx, 2y+dy, k] = sum_k' kernel_k[dx, dy, k'] M[x, y, k']``, plus a bias): a
``Linear(dim, 4 dim)`` whose output is reshaped into the 2 x 2 children, which is exactly a
``ConvTranspose2d(dim, dim, kernel_size=2, stride=2)``.

Per-sample gradients: the encoding does not depend on the input, but DP-SGD needs each example's gradient
with respect to the deconvolution weights. :func:`duckmob.synth.hrnet.train.per_sample_gradients` takes them
with ``torch.func`` (``vmap`` of ``grad`` over the examples), which evaluates the tree once per batch and
carries only its gradients per example.
"""

from __future__ import annotations

import torch
from torch import nn

from duckmob.errors import DuckmobError


def morton(cells, w: int):
    """Z-order (Morton) index of grid cells ``row * w + col`` on a ``w = 2**d`` grid: the bits of row and column
    interleaved (row bit above column bit), so the four children of Morton index ``z`` at the next level are
    ``4 z + 2 dx + dy`` and the ancestor at ``k`` levels up is ``z >> 2 k`` (HRNet's up_i). Works on numpy
    arrays and torch tensors of integers."""
    row, col = cells // w, cells % w
    z = row * 0
    bit = 0
    while (1 << bit) < w:
        z = z + (((row >> bit) & 1) << (2 * bit + 1)) + (((col >> bit) & 1) << (2 * bit))
        bit += 1
    return z


def unmorton(z, w: int):
    """Inverse of :func:`morton`: grid cell ids ``row * w + col`` from Z-order indices."""
    row = z * 0
    col = z * 0
    bit = 0
    while (1 << bit) < w:
        row = row + (((z >> (2 * bit + 1)) & 1) << bit)
        col = col + (((z >> (2 * bit)) & 1) << bit)
        bit += 1
    return row * w + col


class QuadDeconv(nn.Module):
    """One 2D quad deconvolution layer (HRNet §2.5): (4**l, dim) -> (4**(l+1), dim), in Z-order, where the
    children of vector ``z`` are rows ``4 z .. 4 z + 3`` (a reshape of the Linear's output, no copy)."""

    def __init__(self, dim: int, activation: bool = False):
        super().__init__()
        self.dim = dim
        self.linear = nn.Linear(dim, 4 * dim)
        self.activation = nn.Tanh() if activation else nn.Identity()

    def forward(self, m: torch.Tensor) -> torch.Tensor:
        n, dim = m.shape
        return self.activation(self.linear(m).reshape(4 * n, dim))


class HierarchicalEncoding(nn.Module):
    """``theta_root`` followed by ``depth`` quad deconvolutions (HRNet §3.2.1: M_d = deconv^d(theta_root)).

    ``forward()`` returns the list ``[M_0, M_1, ..., M_depth]`` with ``M_l`` of shape ``(4**l, dim)``: the
    encoding ``hiencode_l`` of every cell of level l in Z-order (:func:`morton`). (The root is held as a
    one-row ``nn.Embedding`` weight.)
    Parameters: ``dim + depth * (4 dim^2 + 4 dim)``, i.e. O(log n_cells).
    """

    def __init__(self, dim: int, depth: int, activation: bool = False):
        super().__init__()
        if depth < 1:
            raise DuckmobError(f"the hierarchical encoding needs a grid of at least 2x2 (depth >= 1), got depth "
                               f"{depth}: use w >= 2")
        self.dim, self.depth = dim, depth
        self.root = nn.Embedding(1, dim)
        nn.init.normal_(self.root.weight, std=1.0)
        self.deconvs = nn.ModuleList(QuadDeconv(dim, activation) for _ in range(depth))

    def forward(self) -> list[torch.Tensor]:
        levels = [self.root.weight]
        for layer in self.deconvs:
            levels.append(layer(levels[-1]))
        return levels
