"""One DP-SGD step (per-example gradients, clipping, noise, Adam) two ways: opacus's per-module hooks
(``GradSampleModule``; the location encoding must then be evaluated once per example, as duckmob did before) and
``torch.func`` (:func:`duckmob.synth.hrnet.train.per_sample_gradients`; the encoding once per batch).

Batches are random cell sequences of GeoLife's shape (32 x 32 grid, lengths 1-16, 5 time slots), so no data is
needed. One thread; best of a few repeats (the machine is shared).

    python benchmarks/per_sample_grads.py            # HRNet at 32-d and 64-d vectors, baseline; batch 400 and 100
"""

from __future__ import annotations

import warnings

import torch
from opacus import GradSampleModule
from opacus.optimizers import DPOptimizer
from torch import nn

from duckmob.synth.hrnet.model import BaselineModel, HRNetModel
from duckmob.synth.hrnet.train import per_sample_gradients
from timing import best_of

DEPTH = 5


class PerExampleTree(nn.Module):
    """The encoding tree evaluated once per example (what opacus's hooks need: batched activations)."""

    def __init__(self, encoding):
        super().__init__()
        self.inner = encoding
        self.batch = 1

    def forward(self):
        idx = torch.zeros(self.batch, 1, dtype=torch.long)
        levels = [self.inner.root(idx)]
        for layer in self.inner.deconvs:
            b, n, dim = levels[-1].shape
            levels.append(layer.activation(layer.linear(levels[-1]).reshape(b, 4 * n, dim)))
        return levels


class HooksHRNet(HRNetModel):
    """HRNetModel whose forward uses the per-example tree (same function, opacus-compatible)."""

    def __init__(self, **kw):
        super().__init__(DEPTH, **kw)
        self.tree = PerExampleTree(self.encoding)

    def scores(self, query, m_r):
        cell = torch.einsum("btk,bnk->bnt", self.f_key_t(query), m_r)
        return torch.cat([cell, self.end_key(query).transpose(1, 2)], dim=1)

    def run(self, cells, times):
        b, steps = cells.shape
        self.tree.batch = b
        m = self.tree()
        leaf = m[self.depth]
        idx = cells[:, : steps - 1].clamp(0, self.n_cells - 1)
        loc = torch.gather(leaf, 1, idx[..., None].expand(-1, -1, leaf.shape[-1]))
        start = self.start(torch.zeros(b, 1, dtype=torch.long))
        h, _ = self.gru(self.encode_inputs(torch.cat([start, loc], dim=1), times))
        return h, m


def batch(b: int, gen: torch.Generator):
    lengths = torch.randint(1, 17, (b,), generator=gen)
    t = int(lengths.max()) + 1
    return (torch.randint(0, 4 ** DEPTH, (b, t), generator=gen), torch.randint(0, 5, (b, t), generator=gen),
            lengths)


def step_hooks(model, b, gen):
    gsm = GradSampleModule(model, batch_first=True, loss_reduction="mean")
    opt = DPOptimizer(torch.optim.Adam(gsm.parameters(), lr=1e-3), noise_multiplier=1.0, max_grad_norm=1.0,
                      expected_batch_size=b)

    def step():
        opt.zero_grad(set_to_none=True)
        gsm(*batch(b, gen)).mean().backward()
        opt.step()
    return step


def step_func(model, b, gen):
    named = list(model.named_parameters())
    opt = DPOptimizer(torch.optim.Adam([p for _, p in named], lr=1e-3), noise_multiplier=1.0, max_grad_norm=1.0,
                      expected_batch_size=b)

    def step():
        opt.zero_grad(set_to_none=True)
        grads = per_sample_gradients(model, *batch(b, gen))
        for name, p in named:
            p.grad_sample = grads[name]
        opt.step()
    return step


def main() -> None:
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    cases = [("hrnet 32-d", lambda: HooksHRNet(), 400), ("hrnet 64-d", lambda: HooksHRNet(loc_dim=64, key_dim=64), 400),
             ("baseline", lambda: BaselineModel(DEPTH), 100)]
    print(f"{'model':12s} {'batch':>5s} {'opacus hooks s/step':>20s} {'torch.func s/step':>18s} {'ratio':>6s}")
    for name, make, b in cases:
        times = []
        for stepper in (step_hooks, step_func):
            torch.manual_seed(0)
            step = stepper(make(), b, torch.Generator().manual_seed(1))
            step()  # warm-up
            times.append(best_of(step, repeat=5))
        print(f"{name:12s} {b:5d} {times[0]:20.3f} {times[1]:18.3f} {times[0] / times[1]:6.2f}", flush=True)


if __name__ == "__main__":
    main()
