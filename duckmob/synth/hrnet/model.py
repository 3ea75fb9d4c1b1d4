"""The HRNet generator (HRNet §3, Algorithm 1) and the paper's baseline (§2.3), as torch modules.

Both model a stay-point trajectory ``v = [(l_1, t_1), ..., (l_L, t_L)]`` by the chain rule (eq. 1):
``Pr(v) = prod_i Pr(l_i | v_<i) Pr(t_i | v_<i)`` followed by an end token, so the start cell, the length and the
times are all learned (nothing is copied from real trajectories at generation).

* Input at step i: ``encode(v_{i-1}) = [M_time[t_{i-1}], loc(l_{i-1})]`` (eq. 2); step 1 sees a learned start
  token (time index ``n_time``, location vector ``start``). HRNet's ``loc(l)`` is ``hiencode_d(l)``
  (``input_levels='finest'``) or, the synthesizer's default, ``sum_r hiencode_r(up_r(l))`` (``'all'``, see
  :meth:`HRNetModel.input_table`).
* Prefix encoder: opacus ``DPGRU`` (a GRU written in plain tensor operations: per-example gradients through it
  are ordinary autograd under ``torch.func.vmap``), its equations run by :func:`gru_states`, which calls each of
  its two linear layers once per forward pass (so ghost clipping sees them: ``hrnet/train.py: ghost_clipped``).
* Time head: ``softmax(g_time(h_i))`` over ``n_time`` slots of the day.
* Baseline location head: ``softmax(g_POI(h_i))`` over the ``w*w`` cells plus the end token; location input
  from an embedding matrix (O(w^2) parameters).
* HRNet location head (§3.3, §3.4): ``query = f_query(h_i)``, ``key_l = f_key(hiencode_r(l))`` for every cell
  ``l`` of every resolution ``r = 1..d`` (plus one learned end key shared by all resolutions). The multi-task loss
  sums one cross entropy per resolution against the ancestor ``up_r(l_i)`` of the true cell
  (``multitask=False`` keeps resolution d only, over all its cells; ``finest_weight`` scales resolution d's
  term, 1 in the paper). ``multitask_loss`` says over which cells resolution r's softmax runs:

  - ``'full'`` (the paper, §3.4): ``Pr(l^r | v_<i) = softmax over all 4**r cells of query . key_l`` (end token
    included at every resolution);
  - ``'conditional'``: resolution 1 over its 4 cells and the end token, then resolution r over the 4 children
    of the true resolution r-1 cell ``up_{r-1}(l_i)``. The sum over r is then exactly ``-log Pr(l_i | v_<i)``
    of the coarse-to-fine decoder that generation samples from (:func:`duckmob.synth.hrnet.generate.
    coarse_to_fine`), so training maximises the likelihood of what is generated; it needs 4 scores per
    resolution instead of 4**r. Same parameters, same per-example clipping. The synthesizer's default (the
    module's default stays the paper's). Pre-training (§4) keeps the paper's KL against each resolution's
    softmax over all its cells (fitting the coarse-to-fine distribution there did worse: docs/methods/hrnet.md).

``forward`` returns the per-example loss (sum over steps and resolutions), so DP-SGD clips one trajectory's
whole contribution.
"""

from __future__ import annotations

import torch
from opacus.layers import DPGRU
from torch import nn
from torch.nn import functional as F

from duckmob.synth.hrnet.encoding import HierarchicalEncoding


MULTITASK_LOSSES = ("conditional", "full")
INPUT_LEVELS = ("finest", "all")


def ancestor_targets(z: torch.Tensor, depth: int, level: int) -> torch.Tensor:
    """``up_level`` (HRNet §3.4.2) of Z-order leaf indices: the Z-order index of the covering cell at ``level``."""
    return z >> (2 * (depth - level))


def child_scores(qk: torch.Tensor, m_r: torch.Tensor, parent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 4 children ``4 parent + 0..3`` (Z-order, resolution r) of resolution r-1 cells ``parent`` (...,) and
    their logits ``qk . M_r[child]`` (..., 4), from query-side keys ``qk = f_key^T(query)`` (..., dim): one
    decision of the coarse-to-fine factorisation, shared by the conditional loss and generation."""
    kids = 4 * parent[..., None] + torch.arange(4, device=parent.device)
    return kids, (qk[..., None, :] * m_r[kids]).sum(-1)


def gru_states(gru: DPGRU, x: torch.Tensor) -> torch.Tensor:
    """The outputs (B, T, hidden) of the one-layer, batch-first ``gru`` from a zero state over inputs ``x``
    (B, T, in): opacus's ``DPGRUCell`` equations step by step, with the same parameters, arranged so that a
    per-example gradient (``torch.func.vmap`` of ``grad``) gathers each weight's gradient over the steps in one
    product instead of one outer product per step added up (those were most of a DP-SGD step once the encoding
    ran along paths: docs/methods/hrnet.md):

    - the input projection of every step at once (``ih`` on (B, T, in));
    - the recurrent weight enters each step as a constant of the same value (``W.detach()``: the gradient still
      flows back through the states, BPTT), plus ``Z = H @ (W - W.detach())^T``, exactly zero in value, over
      the states ``H`` of every step taken from a first pass without gradients (the same operations on the same
      values): the gradient of ``W`` is then ``sum_t delta_t h_{t-1}^T`` from Z alone, in one product.

    The same function and gradients as ``gru(x)`` up to floating-point rounding (tests/synth/test_hrnet.py)."""
    cell = gru.l0
    size = gru.hidden_size
    gates_x = cell.ih(x)
    w_hh, b_hh = cell.hh.weight, cell.hh.bias
    fixed = w_hh.detach()

    def run(gx: torch.Tensor, bias: torch.Tensor, extra: torch.Tensor | None) -> list[torch.Tensor]:
        h = gx.new_zeros(gx.shape[0], size)
        out = []
        for t in range(gx.shape[1]):
            gh = h @ fixed.T + bias if extra is None else h @ fixed.T + bias + extra[:, t]
            r_x, z_x, n_x = torch.split(gx[:, t], size, 1)
            r_h, z_h, n_h = torch.split(gh, size, 1)
            r = torch.sigmoid(r_x + r_h)
            z = torch.sigmoid(z_x + z_h)
            h = (1 - z) * torch.tanh(n_x + r * n_h) + z * h
            out.append(h)
        return out

    values = run(gates_x.detach(), b_hh.detach(), None)          # the states' values, no gradient
    prev = torch.stack([torch.zeros_like(values[0])] + values[:-1], dim=1).detach()   # h_{t-1} (B, T, hidden)
    # zeros (the same operation on the same values, subtracted); their gradient is W_hh's and b_hh's, through one
    # call of the layer (so ghost clipping sees it as a linear layer on (B, T, hidden): dpsgd.train_ghost)
    zero = cell.hh(prev) - F.linear(prev, fixed, b_hh.detach())
    return torch.stack(run(gates_x, b_hh.detach(), zero), dim=1)


class _Sequence(nn.Module):
    """Shared parts: time embedding, start token, DPGRU prefix encoder, time head."""

    def __init__(self, depth: int, n_time: int, loc_dim: int, time_dim: int, hidden: int):
        super().__init__()
        self.depth, self.n_time = depth, n_time
        self.n_cells = 4 ** depth
        self.end = self.n_cells  # index of the end token in location targets
        self.time_emb = nn.Embedding(n_time + 1, time_dim)  # index n_time = start token
        self.gru = DPGRU(loc_dim + time_dim, hidden, batch_first=True)
        self.time_head = nn.Linear(hidden, n_time)

    def encode_inputs(self, loc_in: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
        """[M_time[t], loc] for the shifted inputs: position 0 is the start token."""
        b = times.shape[0]
        t_in = torch.cat([torch.full((b, 1), self.n_time, dtype=times.dtype, device=times.device),
                          times[:, :-1]], dim=1)
        return torch.cat([self.time_emb(t_in), loc_in], dim=-1)

    def time_loss(self, h: torch.Tensor, times: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        logits = self.time_head(h)
        ce = F.cross_entropy(logits.transpose(1, 2), times.clamp(0, self.n_time - 1), reduction="none")
        return (ce * valid).sum(1)


def _masks(lengths: torch.Tensor, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(location-target mask incl. the end token, time-target mask) of shape (B, steps)."""
    pos = torch.arange(steps, device=lengths.device)[None, :]
    return (pos <= lengths[:, None]).float(), (pos < lengths[:, None]).float()


def _loc_targets(cells: torch.Tensor, lengths: torch.Tensor, end: int) -> torch.Tensor:
    """Targets per step: the cell, then the end token at position ``length`` (truncated sequences: none)."""
    pos = torch.arange(cells.shape[1], device=cells.device)[None, :]
    return torch.where(pos == lengths[:, None], torch.full_like(cells, end), cells)


class HRNetModel(_Sequence):
    """HRNet: hierarchical location encoding + DPGRU + multi-resolution query/key scoring + time head.

    Cells are Z-order leaf indices (:func:`duckmob.synth.hrnet.encoding.morton`). ``f_key`` is linear, so
    ``query . f_key(m) = f_key^T(query) . m + query . b_key`` and the bias term is the same for every cell:
    scores are computed as ``f_key^T(query) . m`` without materialising a key per cell and example
    (same function, a fraction of the cost). The end token's key is a learned vector in query space.
    """

    def __init__(self, depth: int, n_time: int = 5, loc_dim: int = 32, time_dim: int = 16, hidden: int = 64,
                 key_dim: int = 32, multitask: bool = True, deconv_activation: bool = False,
                 finest_weight: float = 1.0, multitask_loss: str = "full", input_levels: str = "finest"):
        super().__init__(depth, n_time, loc_dim, time_dim, hidden)
        if multitask_loss not in MULTITASK_LOSSES:
            raise ValueError(f"multitask_loss must be one of {MULTITASK_LOSSES}, got {multitask_loss!r}")
        if input_levels not in INPUT_LEVELS:
            raise ValueError(f"input_levels must be one of {INPUT_LEVELS}, got {input_levels!r}")
        self.input_levels = input_levels
        self.multitask = multitask
        self.conditional = multitask and multitask_loss == "conditional"
        self.finest_weight = float(finest_weight)  # weight of the finest resolution's CE (the paper's: 1)
        self.encoding = HierarchicalEncoding(loc_dim, depth, deconv_activation)
        self.start = nn.Embedding(1, loc_dim)
        self.f_query = nn.Linear(hidden, key_dim)
        self.f_key_t = nn.Linear(key_dim, loc_dim, bias=False)  # f_key's weight, applied on the query side
        self.end_key = nn.Linear(key_dim, 1, bias=False)        # query . key_end

    @property
    def levels(self) -> list[int]:
        return list(range(1, self.depth + 1)) if self.multitask else [self.depth]

    def scores(self, query: torch.Tensor, m_r: torch.Tensor) -> torch.Tensor:
        """Logits (B, 4**r + 1, T): ``query . key_l`` for every cell of one level (``m_r``: (4**r, dim)), the
        end token last."""
        cell = torch.einsum("btk,nk->bnt", self.f_key_t(query), m_r)
        return torch.cat([cell, self.end_key(query).transpose(1, 2)], dim=1)

    def run(self, cells: torch.Tensor, times: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """GRU states h_i (B, T, hidden) for inputs shifted by one (start token first), and the encoding."""
        b, steps = cells.shape
        m = self.encoding()
        loc = self.input_table(m)[cells[:, : steps - 1].clamp(0, self.n_cells - 1)]
        start = self.start(torch.zeros(b, 1, dtype=torch.long, device=cells.device))
        x = self.encode_inputs(torch.cat([start, loc], dim=1), times)
        h = gru_states(self.gru, x)
        return h, m

    def forward(self, cells: torch.Tensor, times: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Per-example loss: sum over steps of the multi-resolution location CE (incl. end) + the time CE.

        ``cells`` (Z-order leaf indices), ``times`` (slots): (B, T) int64, padded; ``lengths``: (B,) true
        lengths; position ``lengths`` (when < T) is the end target.
        """
        loc_valid, time_valid = _masks(lengths, cells.shape[1])
        targets = _loc_targets(cells, lengths, -1)
        if self.conditional:
            return self.conditional_loss(cells, times, targets, loc_valid, time_valid)
        h, m = self.run(cells, times)
        query = self.f_query(h)
        loss = self.time_loss(h, times, time_valid)
        for r in self.levels:
            n_r = 4 ** r
            tgt = torch.where(targets < 0, torch.full_like(targets, n_r),
                              ancestor_targets(targets.clamp(min=0), self.depth, r))
            ce = F.cross_entropy(self.scores(query, m[r]), tgt, reduction="none")
            weight = self.finest_weight if r == self.depth and self.multitask else 1.0
            loss = loss + weight * (ce * loc_valid).sum(1)
        return loss

    def conditional_loss(self, cells: torch.Tensor, times: torch.Tensor, targets: torch.Tensor,
                         loc_valid: torch.Tensor, time_valid: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` under the conditional loss, from the encoding's root-to-leaf paths of the target cells
        only (:meth:`paths`): the same function of the parameters as with the whole tree (the loss reads no other
        row of it), but a trajectory's gradient then runs back through a few rows of the tree instead of every
        cell of every resolution, which was most of a DP-SGD step (docs/methods/hrnet.md, "Where a fit's time
        goes"), and each trajectory reads the tree on its own rows only (ghost clipping: dpsgd.train_ghost).

        The GRU input at step j + 1 is the cell of step j, which is the target of step j up to the trajectory's
        end: the paths of the targets serve both. After the end token the two differ (padding either way), and
        nothing there reaches the loss: the states after the end feed only masked terms."""
        b, steps = cells.shape
        siblings, nodes = self.paths(targets.clamp(min=0))
        if self.input_levels == "finest":
            loc = nodes[-1][:, : steps - 1]
        else:
            loc = sum(v[:, : steps - 1] for v in nodes)
        start = self.start(torch.zeros(b, 1, dtype=torch.long, device=cells.device))
        h = gru_states(self.gru, self.encode_inputs(torch.cat([start, loc], dim=1), times))
        query = self.f_query(h)
        # resolution 1 (the root's 4 children, the same at every target) and 2..d: (B, T, 4, dim) each
        nll = self.conditional_ce(query, siblings[0], siblings[1:], targets)
        return self.time_loss(h, times, time_valid) + (nll * loc_valid).sum(1)

    def paths(self, leaves: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The encoding along each leaf's path from the root: (siblings, nodes), one entry per resolution r =
        1..d: ``nodes[r-1]`` (..., dim) is ``hiencode_r(up_r(leaf))`` and ``siblings[r-1]`` (..., 4, dim) the
        4 children of ``up_{r-1}(leaf)`` (rows ``4 up_{r-1}(leaf) + 0..3`` of ``M_r``), each computed by the
        same quad deconvolutions as :class:`HierarchicalEncoding` applied to that one parent row."""
        enc = self.encoding
        v = enc.root(torch.zeros_like(leaves))     # the root vector at every leaf (one lookup per row: ghost norms)
        siblings, nodes = [], []
        for r, layer in enumerate(enc.deconvs, start=1):
            sib = layer.activation(layer.linear(v)).reshape(*leaves.shape, 4, enc.dim)
            digit = ancestor_targets(leaves, self.depth, r) & 3
            v = sib.gather(-2, digit[..., None, None].expand(*leaves.shape, 1, enc.dim)).squeeze(-2)
            siblings.append(sib)
            nodes.append(v)
        return siblings, nodes

    def conditional_ce(self, query: torch.Tensor, top: torch.Tensor, kids: list[torch.Tensor],
                       targets: torch.Tensor) -> torch.Tensor:
        """(B, T) ``-log Pr(target | prefix)`` under the coarse-to-fine factorisation (``multitask_loss =
        'conditional'``): resolution 1 over its 4 cells (``top``: M_1, (4, dim) or (B, T, 4, dim)) + end, then at
        each resolution r the 4 children of the true resolution r-1 cell (``kids[r-2]``: their vectors, (B, T, 4,
        dim)); after an end target only the first term counts. Resolution d's term is scaled by ``finest_weight``.
        ``targets``: Z-order leaves, -1 for the end token."""
        qk = self.f_key_t(query)                                           # (B, T, dim)
        end = targets < 0
        leaf = targets.clamp(min=0)
        first = torch.cat([(qk[..., None, :] * top).sum(-1), self.end_key(query)], dim=-1)   # (B, T, 4 + 1)
        head = torch.where(end, torch.full_like(leaf, 4), ancestor_targets(leaf, self.depth, 1))
        nll = F.cross_entropy(first.transpose(1, 2), head, reduction="none")
        for r in range(2, self.depth + 1):
            logits = (qk[..., None, :] * kids[r - 2]).sum(-1)                # (B, T, 4): as child_scores
            child = ancestor_targets(leaf, self.depth, r) & 3
            ce = F.cross_entropy(logits.transpose(1, 2), child, reduction="none")
            weight = self.finest_weight if r == self.depth else 1.0
            nll = nll + weight * ce.masked_fill(end, 0.0)
        return nll

    def next_logits(self, h: torch.Tensor, leaf: torch.Tensor) -> torch.Tensor:
        """Finest-resolution logits (B, 4**d + 1), end last, for states h (B, hidden) and leaf vectors (n, dim)."""
        query = self.f_query(h)
        return torch.cat([self.f_key_t(query) @ leaf.T, self.end_key(query)], dim=1)

    def input_table(self, m: list[torch.Tensor]) -> torch.Tensor:
        """(n_cells, loc_dim) GRU input vector of every leaf (Z-order) from the encoding ``m``: ``hiencode_d(l)``
        (``input_levels = 'finest'``, the paper's eq. 2), or ``sum_{r=1..d} hiencode_r(up_r(l))`` (``'all'``:
        the cell's vectors at every resolution, so the prefix encoder sees where a cell lies at each scale;
        no extra parameters). In Z-order the leaves under a resolution-r cell are contiguous, so ``up_r`` is
        a ``repeat_interleave``."""
        if self.input_levels == "finest":
            return m[self.depth]
        return sum(m[r].repeat_interleave(4 ** (self.depth - r), dim=0) for r in range(1, self.depth + 1))

    def input_vectors(self) -> torch.Tensor:
        """(n_cells, loc_dim) GRU input vectors of the leaf cells (Z-order)."""
        return self.input_table(self.encoding())

    def leaf_vectors(self) -> torch.Tensor:
        """(n_cells, loc_dim) encodings ``hiencode_d`` of the leaf cells (Z-order): the finest resolution's keys."""
        return self.encoding()[self.depth]

    def start_vector(self) -> torch.Tensor:
        return self.start.weight[0]


class BaselineModel(_Sequence):
    """The paper's baseline (§2.3): embedding matrices + GRU + a linear scoring head over all cells."""

    def __init__(self, depth: int, n_time: int = 5, loc_dim: int = 64, time_dim: int = 16, hidden: int = 64):
        super().__init__(depth, n_time, loc_dim, time_dim, hidden)
        self.loc_emb = nn.Embedding(self.n_cells + 1, loc_dim)  # index n_cells = start token
        self.loc_head = nn.Linear(hidden, self.n_cells + 1)     # index n_cells = end token

    def forward(self, cells: torch.Tensor, times: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        b, steps = cells.shape
        loc_in = torch.cat([torch.full((b, 1), self.n_cells, dtype=cells.dtype, device=cells.device),
                            cells[:, : steps - 1].clamp(0, self.n_cells - 1)], dim=1)
        h = gru_states(self.gru, self.encode_inputs(self.loc_emb(loc_in), times))
        loc_valid, time_valid = _masks(lengths, steps)
        logits = self.loc_head(h)
        tgt = _loc_targets(cells, lengths, self.end)
        ce = F.cross_entropy(logits.transpose(1, 2), tgt, reduction="none")
        return (ce * loc_valid).sum(1) + self.time_loss(h, times, time_valid)

    def input_vectors(self) -> torch.Tensor:
        return self.loc_emb.weight[: self.n_cells]

    def start_vector(self) -> torch.Tensor:
        return self.loc_emb.weight[self.n_cells]
