"""DP-SGD (Abadi et al. 2016) with opacus for any model whose examples are rows of numpy arrays.

Privacy map of one run of :func:`train`: every privacy unit (a row, i.e. one trajectory; or a user, whose rows
are summed first) enters a step with probability ``sample_rate`` (Poisson sampling, opacus's
``UniformWithReplacementSampler`` at exactly the rate the accountant is told); the caller's per-row gradients
(each row's whole loss) are summed per unit and clipped to L2 norm ``max_grad_norm`` by opacus's ``DPOptimizer``,
so adding or removing one unit moves the summed gradient by at most ``max_grad_norm``; Gaussian noise of standard
deviation ``noise_multiplier * max_grad_norm`` is added to the sum. ``steps`` such steps are
:func:`duckmob.privacy.accounting.dp_sgd(noise_multiplier, sample_rate, steps)` -- the caller accounts it.

All randomness (the batches, the Gaussian noise) comes from torch generators seeded from a numpy generator that
the caller derives from its :class:`~duckmob.privacy.noise.NoiseSource`. Used by HRNet (``hrnet/train.py``) and
the clean-slate method (``cleanslate/``).
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from opacus.optimizers import DPOptimizer
from opacus.utils.uniform_sampler import UniformWithReplacementSampler
from torch.func import functional_call, grad, vmap

from duckmob.errors import DuckmobError
from duckmob.trajectories import ragged_gather


def progress_enabled() -> bool:
    """tqdm on in a terminal, off in CI or when stderr is not a terminal."""
    return sys.stderr.isatty() and not os.environ.get("CI")


def torch_generator(rng: np.random.Generator, device: torch.device) -> torch.Generator:
    """A torch generator seeded from ``rng`` (itself derived from the NoiseSource)."""
    g = torch.Generator(device=device)
    g.manual_seed(int(rng.integers(2 ** 62)))
    return g


def cosine_lr(lr: float, lr_final: float, step: int, steps: int) -> float:
    """Learning rate of step ``step`` (0-based) of ``steps``: ``lr`` at the first step, ``lr_final * lr`` at the
    last, on a half cosine in between (``lr_final = 1``: constant). Depends on public values only."""
    frac = step / max(1, steps - 1)
    return lr * (lr_final + (1.0 - lr_final) * 0.5 * (1.0 + math.cos(math.pi * frac)))


def per_example_gradients(model: torch.nn.Module, loss_of_one: Callable, *batch: torch.Tensor
                          ) -> dict[str, torch.Tensor]:
    """Each example's gradient ``{name: (B, *shape)}`` of ``loss_of_one(model_call, *row)`` where ``row`` is
    example i of every tensor in ``batch`` (without its batch axis) and ``model_call(*args)`` runs ``model``
    with the parameters being differentiated. ``torch.func``: ``vmap`` of ``grad``, one backward pass per
    example in effect."""
    params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}
    buffers = dict(model.named_buffers())

    def one(p, *row):
        return loss_of_one(lambda *args: functional_call(model, (p, buffers), args), *row)

    return vmap(grad(one), in_dims=(None,) + (0,) * len(batch), randomness="error")(params, *batch)


@dataclass
class TrainingLog:
    """Timing only: the loss on the private data is never recorded or shown (it is not a DP release)."""

    steps: int = 0
    seconds: float = 0.0
    epoch_seconds: list | None = None


def train(model: torch.nn.Module, row_gradients: Callable[[np.ndarray], dict[str, torch.Tensor]], n_rows: int, *,
          sample_rate: float, steps: int, noise_multiplier: float, max_grad_norm: float, lr: float,
          expected_batch_size: float, rng: np.random.Generator, device: torch.device,
          progress: bool | None = None, unit_of_row: np.ndarray | None = None, ema: float = 0.0,
          lr_final: float = 1.0, check_interrupt: Callable[[], None] | None = None,
          desc: str = "DP-SGD") -> TrainingLog:
    """Train ``model`` in place with DP-SGD for ``steps`` Poisson-sampled steps (Adam on the noisy gradient).

    ``row_gradients(rows)`` returns the per-row gradients ``{name: (len(rows), *shape)}`` of every trainable
    parameter (e.g. from :func:`per_example_gradients`), each row's gradient of its own loss only. Gradients
    are averaged by the public ``expected_batch_size`` (= sample_rate x the noisy count of units), never by a
    data-dependent size.

    ``unit_of_row``: the privacy unit of each row (e.g. user ids; contributions already bounded by the caller),
    or None (each row is a unit). Units, not rows, are Poisson-sampled; a unit's row gradients are summed before
    clipping, so its whole contribution to a step is clipped to ``max_grad_norm``.

    ``ema``: in [0, 1); above 0 the model ends with the exponential moving average of its DP-SGD iterates
    (post-processing). ``lr_final``: cosine decay from ``lr`` to ``lr_final * lr`` (a public schedule).

    ``check_interrupt``: called before every step; whatever it raises propagates and training stops there (the
    model holds the steps already taken, fewer than ``steps``, so the accounted event still bounds them).
    """
    if not 0 < sample_rate <= 1:
        raise DuckmobError(f"the DP-SGD sampling rate must be in (0, 1], got {sample_rate}")
    gen = torch_generator(rng, torch.device("cpu"))
    noise_gen = torch_generator(rng, device)
    model.to(device).train()
    named = [(k, p) for k, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    optimizer = DPOptimizer(torch.optim.Adam(params, lr=lr), noise_multiplier=noise_multiplier,
                            max_grad_norm=max_grad_norm, expected_batch_size=max(1, round(expected_batch_size)),
                            loss_reduction="mean", generator=noise_gen)
    by_unit = unit_of_row is not None
    if by_unit:
        units_, unit_index = np.unique(unit_of_row, return_inverse=True)
        order = np.argsort(unit_index, kind="stable")
        unit_count = np.bincount(unit_index, minlength=len(units_))
        unit_start = np.concatenate([[0], np.cumsum(unit_count)[:-1]])
        n_units = len(units_)
    else:
        n_units = int(n_rows)
    sampler = UniformWithReplacementSampler(num_samples=n_units, sample_rate=sample_rate, generator=gen,
                                            steps=steps)
    assert sampler.sample_rate == sample_rate  # the rate the accountant is told is the rate used
    steps_per_epoch = max(1, round(1 / sample_rate))
    log = TrainingLog(epoch_seconds=[])
    show = progress_enabled() if progress is None else progress
    from tqdm import tqdm

    bar = tqdm(total=steps, desc=desc, unit="step", disable=not show, leave=False)
    start = epoch_start = time.perf_counter()
    average = [p.detach().clone() for p in params] if ema > 0 else None
    try:
        for step, batch in enumerate(sampler):
            if check_interrupt is not None:
                check_interrupt()
            units = np.asarray(batch, dtype=np.int64)
            empty = len(units) == 0
            if empty:
                # An empty Poisson batch: one stand-in example whose per-sample gradient is set to zero, so the
                # step is pure noise, exactly what the accountant assumes.
                units = np.zeros(1, dtype=np.int64)
            if by_unit:
                rows = order[ragged_gather(unit_start[units], unit_count[units])]
                group = torch.as_tensor(np.repeat(np.arange(len(units)), unit_count[units]))
            else:
                rows = units
            optimizer.zero_grad(set_to_none=True)
            grads = row_gradients(rows)
            for name, p in named:
                gs = grads[name]
                if by_unit:
                    gs = gs.new_zeros((len(units),) + gs.shape[1:]).index_add_(0, group.to(gs.device), gs)
                # DPOptimizer(loss_reduction="mean") clips these, sums, adds noise, divides by the expected batch
                p.grad_sample = torch.zeros_like(gs) if empty else gs
            for group_ in optimizer.param_groups:
                group_["lr"] = cosine_lr(lr, lr_final, step, steps)
            optimizer.step()
            if average is not None:
                with torch.no_grad():
                    for a, p in zip(average, params):
                        a.lerp_(p, 1.0 - ema)
            bar.update(1)
            if (step + 1) % steps_per_epoch == 0:
                now = time.perf_counter()
                log.epoch_seconds.append(now - epoch_start)
                epoch_start = now
    finally:
        bar.close()  # also on the way out of an interrupt, so the terminal is left clean
    log.steps = steps
    log.seconds = time.perf_counter() - start
    optimizer.zero_grad(set_to_none=True)  # drops the last per-sample gradients
    if average is not None:
        with torch.no_grad():
            for p, a in zip(params, average):
                p.copy_(a)
    return log


__all__ = ["train", "per_example_gradients", "TrainingLog", "torch_generator", "cosine_lr", "progress_enabled"]
