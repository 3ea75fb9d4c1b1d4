"""DP-SGD (Abadi et al. 2016) with opacus for any model whose examples are rows of numpy arrays.

Privacy map of one run of :func:`train`: every privacy unit (a row, i.e. one trajectory; or a user, whose rows
are summed first) enters a step with probability ``sample_rate`` (Poisson sampling, opacus's
``UniformWithReplacementSampler`` at exactly the rate the accountant is told); the caller's per-row gradients
(each row's whole loss) are summed per unit and clipped to L2 norm ``max_grad_norm`` by opacus's ``DPOptimizer``,
so adding or removing one unit moves the summed gradient by at most ``max_grad_norm``; Gaussian noise of standard
deviation ``noise_multiplier * max_grad_norm`` is added to the sum. ``steps`` such steps are
:func:`duckmob.privacy.accounting.dp_sgd(noise_multiplier, sample_rate, steps)` -- the caller accounts it.

A run takes two small values: its :class:`Schedule` (public: the rate, steps, noise multiplier and clipping norm
the accountant is told, and the optimiser's settings) and its :class:`RunContext` (where and how it runs: the
generator, the device, progress, the interrupt check, the steps counter, the worker group; none of it changes
what is spent).

All randomness (the batches, the Gaussian noise) comes from torch generators seeded from a numpy generator that
the caller derives from its :class:`~duckmob.privacy.noise.NoiseSource`. Used by HRNet (``hrnet/train.py``) and
the clean-slate method (``cleanslate/``).

With ``group`` (a worker of :mod:`duckmob.synth.distributed`) the same run is split over processes: every
worker draws the same Poisson batch, clips and sums its own units' gradients, and opacus's distributed optimiser
adds the noise once (rank 0) and all-reduces the sum; the privacy map and the accounted event are unchanged
(the sensitivity argument is in :mod:`duckmob.synth.distributed`).

A run stopped early (Ctrl-C, an error) is charged the steps that ran: the fit opens :func:`charged_as_run` around
its training, and a failed release is recorded with :func:`ran_event` of its event (docs/threat_model.md, "A
stopped fit is charged what ran").
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import torch
from opacus.optimizers import (DistributedDPOptimizer, DistributedDPOptimizerFastGradientClipping, DPOptimizer,
                               DPOptimizerFastGradientClipping)
from opacus.utils.uniform_sampler import UniformWithReplacementSampler
from torch.func import functional_call, grad, vmap

from duckmob.errors import DuckmobError
from duckmob.privacy import accounting
from duckmob.privacy import noise as noise_source
from duckmob.privacy.events import Event
from duckmob.progress import steps as progress_steps
from duckmob.trajectories import ragged_gather


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


@dataclass(frozen=True)
class Schedule:
    """The public schedule of one DP-SGD run: ``steps`` Poisson-sampled steps at ``sample_rate``, each unit's
    gradient clipped to ``max_grad_norm``, Gaussian noise of ``noise_multiplier * max_grad_norm`` (accounted as
    :attr:`event`), the noisy sum divided by the public ``expected_batch_size`` (= sample_rate x the noisy count of
    units, never a data-dependent size); Adam at ``lr``, decaying on a cosine to ``lr_final * lr`` (1: constant);
    ``ema`` in [0, 1): above 0 the model ends with the exponential moving average of its iterates. The learning
    rate schedule and the average are post-processing: they cost nothing."""

    sample_rate: float
    steps: int
    noise_multiplier: float
    max_grad_norm: float
    expected_batch_size: float
    lr: float
    lr_final: float = 1.0
    ema: float = 0.0

    def __post_init__(self):
        if not 0 < self.sample_rate <= 1:
            raise DuckmobError(f"the DP-SGD sampling rate must be in (0, 1], got {self.sample_rate}")

    @property
    def event(self) -> Event:
        """What the run spends: ``dp_sgd(noise_multiplier, sample_rate, steps)`` (the caller accounts it)."""
        return accounting.dp_sgd(self.noise_multiplier, self.sample_rate, self.steps)


@dataclass
class StepsRun:
    """How many steps of one DP-SGD run have begun: 0 until its loop starts; None when they run in worker
    processes (:mod:`duckmob.synth.distributed`), whose steps this process does not see (all are then charged)."""

    steps: int | None = 0


@dataclass(frozen=True)
class RunContext:
    """Where and how one DP-SGD run executes (none of it changes its privacy map): ``rng``, the numpy generator
    (derived from the release's NoiseSource) that seeds the run's torch generators; the torch ``device``;
    ``progress`` (None: DUCKMOB_PROGRESS decides) under the label ``desc``; ``check_interrupt``, called before
    every step (whatever it raises propagates and training stops there: the model holds the steps taken, fewer
    than planned, so the accounted event still bounds them); ``steps_run``, counting the steps begun
    (:func:`charged_as_run`); ``group``: this process is one worker of
    :func:`duckmob.synth.distributed.train_in_workers` (None: the whole run is here), computing the gradients of
    its own sampled units only, the noise and the sum being global."""

    rng: np.random.Generator
    device: torch.device
    progress: bool | None = None
    check_interrupt: Callable[[], None] | None = None
    steps_run: StepsRun | None = None
    desc: str = "DP-SGD"
    group: Any = None


@dataclass
class TrainingLog:
    """Timing only: the loss on the private data is never recorded or shown (it is not a DP release)."""

    steps: int = 0
    seconds: float = 0.0
    epoch_seconds: list | None = None


def ran_event(event: Event, run: int, steps_run: int | None) -> Event:
    """``event`` as far as it ran when its DP-SGD part number ``run`` (0: the first ``dp_sgd`` leaf) stopped
    after ``steps_run`` steps (None: not known, all of them): every part that is not DP-SGD (drawn before any
    training), the earlier DP-SGD parts whole, this one cut to ``dp_sgd(sigma, q, steps_run)`` (left out at 0
    steps), the later ones not at all. Within ``event`` (:func:`duckmob.release.protocol.within`)."""
    parts, seen = [], 0
    for leaf in event.leaves():
        if leaf.kind != "dp_sgd":
            parts.append(leaf)
            continue
        if seen < run:
            parts.append(leaf)
        elif seen == run:
            planned = leaf.param("steps")
            steps = planned if steps_run is None else min(int(steps_run), planned)
            if steps > 0:
                parts.append(accounting.dp_sgd(leaf.param("noise_multiplier"), leaf.param("sample_rate"), steps))
        seen += 1
    return accounting.compose(parts)


@contextlib.contextmanager
def charged_as_run(release, event: Event, run: int = 0) -> Iterator[StepsRun]:
    """Around DP-SGD part ``run`` of ``event`` (the release's event, every non-DP-SGD part already drawn): yields
    the :class:`StepsRun` to hand to the training (``steps_run=``); if the training stops by an exception, the
    release is told (``release.stopped``) that it drew :func:`ran_event` only, and the exception propagates."""
    counter = StepsRun()
    try:
        yield counter
    except BaseException:
        release.stopped(ran_event(event, run, counter.steps))
        raise


def _units(n_rows: int, unit_of_row: np.ndarray | None):
    """(number of units, rows of given units) for Poisson sampling by unit: each row is a unit when
    ``unit_of_row`` is None, else rows are grouped by their unit id."""
    if unit_of_row is None:
        return int(n_rows), lambda units: (units, None)
    ids, unit_index = np.unique(unit_of_row, return_inverse=True)
    order = np.argsort(unit_index, kind="stable")
    unit_count = np.bincount(unit_index, minlength=len(ids))
    unit_start = np.concatenate([[0], np.cumsum(unit_count)[:-1]])

    def rows_of(units):
        rows = order[ragged_gather(unit_start[units], unit_count[units])]
        return rows, torch.as_tensor(np.repeat(np.arange(len(units)), unit_count[units]))
    return len(ids), rows_of


def _dp_optimizer(single: type, distributed: type, params: list, schedule: Schedule, generator: torch.Generator,
                  group) -> torch.optim.Optimizer:
    """opacus's ``single`` optimiser around Adam (:class:`ForeachAdam`), or with a ``group`` its ``distributed``
    variant, which divides each worker's clipped sum (plus the noise, on rank 0 only) by its ``expected_batch_size``,
    all-reduces (sum) and divides by the number of workers: given ``batch / world`` it ends at (all clipped +
    noise) / ``batch``, the single-process gradient."""
    batch = max(1, round(schedule.expected_batch_size))
    cls, divisor = (single, batch) if group is None else (distributed, batch / group.world)
    return cls(ForeachAdam(params, schedule.lr), noise_multiplier=schedule.noise_multiplier,
               max_grad_norm=schedule.max_grad_norm, expected_batch_size=divisor, loss_reduction="mean",
               generator=generator)


def _loop(optimizer, params, n_units: int, one_step: Callable[[np.ndarray, bool], None], schedule: Schedule,
          gen: torch.Generator, *, context: RunContext) -> TrainingLog:
    """The DP-SGD loop shared by :func:`train` and :func:`train_ghost`: Poisson batches of units at exactly
    ``schedule.sample_rate`` drawn by ``gen``, ``one_step(units, empty)`` leaves what the optimizer needs
    (per-sample or clipped summed gradients), then the optimizer's noisy step, the cosine learning rate and the
    EMA of the iterates. With ``context.group`` a worker keeps its part of each batch
    (:meth:`duckmob.synth.distributed.Group.shard`). ``context.steps_run`` counts each step as it begins, after
    ``context.check_interrupt`` and before it touches the data (a step stopped midway is counted whole)."""
    sample_rate, steps, ema = schedule.sample_rate, schedule.steps, schedule.ema
    check_interrupt, steps_run = context.check_interrupt, context.steps_run
    shard = None if context.group is None else context.group.shard
    if n_units > 0:
        sampler = UniformWithReplacementSampler(num_samples=n_units, sample_rate=sample_rate, generator=gen,
                                                steps=steps)
        assert sampler.sample_rate == sample_rate  # the rate the accountant is told is the rate used
    else:
        sampler = [[]] * steps   # no unit: every Poisson batch is empty (opacus's sampler refuses 0 samples)
    steps_per_epoch = max(1, round(1 / sample_rate))
    log = TrainingLog(epoch_seconds=[])
    bar = progress_steps(context.desc, steps, context.progress)   # a bar in a terminal, lines elsewhere, unless off
    start = epoch_start = time.perf_counter()
    average = [p.detach().clone() for p in params] if ema > 0 else None
    try:
        for step, batch in enumerate(sampler):
            if check_interrupt is not None:
                check_interrupt()
            if steps_run is not None:
                steps_run.steps = step + 1
            units = np.asarray(batch, dtype=np.int64)
            if shard is not None:
                units = shard(units)
            empty = len(units) == 0
            if empty:
                # An empty Poisson batch: one stand-in example whose gradient is set to zero, so the step is pure
                # noise, exactly what the accountant assumes.
                units = np.zeros(1, dtype=np.int64)
            optimizer.zero_grad(set_to_none=True)
            one_step(units, empty)
            for group_ in optimizer.param_groups:
                group_["lr"] = cosine_lr(schedule.lr, schedule.lr_final, step, steps)
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


def train(model: torch.nn.Module, row_gradients: Callable[[np.ndarray], dict[str, torch.Tensor]], n_rows: int,
          schedule: Schedule, context: RunContext, *, unit_of_row: np.ndarray | None = None) -> TrainingLog:
    """Train ``model`` in place with DP-SGD by ``schedule`` (Adam on the noisy gradient; :class:`Schedule`), as
    ``context`` says (:class:`RunContext`), from materialised per-example gradients.

    ``row_gradients(rows)`` returns the per-row gradients ``{name: (len(rows), *shape)}`` of every trainable
    parameter (e.g. from :func:`per_example_gradients`), each row's gradient of its own loss only. Gradients
    are averaged by the public ``schedule.expected_batch_size``, never by a data-dependent size.

    ``unit_of_row``: the privacy unit of each row (e.g. user ids; contributions already bounded by the caller),
    or None (each row is a unit). Units, not rows, are Poisson-sampled; a unit's row gradients are summed before
    clipping, so its whole contribution to a step is clipped to ``schedule.max_grad_norm``.
    """
    gen = torch_generator(context.rng, torch.device("cpu"))
    noise_gen = torch_generator(context.rng, context.device)
    model.to(context.device).train()
    named = [(k, p) for k, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    optimizer = _dp_optimizer(DPOptimizer, DistributedDPOptimizer, params, schedule, noise_gen, context.group)
    n_units, rows_of = _units(n_rows, unit_of_row)

    def one_step(units: np.ndarray, empty: bool) -> None:
        rows, unit_pos = rows_of(units)
        grads = row_gradients(rows)
        for name, p in named:
            gs = grads[name]
            if unit_pos is not None:
                gs = gs.new_zeros((len(units),) + gs.shape[1:]).index_add_(0, unit_pos.to(gs.device), gs)
            # DPOptimizer(loss_reduction="mean") clips these, sums, adds noise, divides by the expected batch
            p.grad_sample = torch.zeros_like(gs) if empty else gs

    return _loop(optimizer, params, n_units, one_step, schedule, gen, context=context)


def _embedding_squared(ids: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Each row's squared gradient norm of an embedding table from its ids (B, L) and output gradients (B, L, D):
    :func:`embedding_norm_sample`'s formula."""
    b, n = ids.shape
    if n == 1:
        return (g[:, 0] ** 2).sum(-1)
    if n > PAIRWISE_LOOKUPS:   # long rows: the (row, id) pairs numbered by a sort instead (memory B L, not B L^2)
        row = torch.arange(b, device=ids.device).repeat_interleave(n)
        pairs, slot = torch.unique(torch.stack([row, ids.reshape(-1)]), dim=1, return_inverse=True)
        summed = torch.zeros(pairs.shape[1], g.shape[-1], dtype=g.dtype, device=g.device)
        summed.index_add_(0, slot, g.reshape(-1, g.shape[-1]))
        return torch.zeros(b, dtype=g.dtype, device=g.device).index_add_(0, pairs[0], (summed ** 2).sum(1))
    first = (ids[:, :, None] == ids[:, None, :]).to(torch.uint8).argmax(-1)   # the first l with a_il = a_ij
    slot = (first + torch.arange(0, b * n, n, device=ids.device)[:, None]).reshape(-1)   # as (row, l) rows of g
    summed = torch.zeros(b * n, g.shape[-1], dtype=g.dtype, device=g.device).index_add_(0, slot, g.reshape(b * n, -1))
    return (summed ** 2).sum(1).view(b, n).sum(1)


# Lookups per row up to which the embedding norms compare a row's ids pairwise (B L^2 bytes); a sort above.
PAIRWISE_LOOKUPS = 256


def embedding_norm_sample(layer: torch.nn.Embedding, activations: list, backprops: torch.Tensor
                          ) -> dict[torch.nn.Parameter, torch.Tensor]:
    """Each row's gradient norm of an embedding table, for ghost clipping: row i looks up ids ``a_ij`` with output
    gradients ``g_ij`` (j < L), so its gradient is ``sum_j onehot(a_ij) g_ij^T`` and its squared norm the sum, over
    the row's distinct ids, of ``|sum_{j: a_ij = id} g_ij|^2``: each lookup's gradient is added to that of the
    first lookup of its id in its row (found by an L x L comparison of the row's ids), then squared. The same value
    as opacus's ``compute_embedding_norm_sample`` (Li et al. 2022; up to rounding), without its ``torch.unique``
    over (row, id) pairs nor an L x L Gram matrix of the gradients (B L^2 D multiply-adds; this is B L D) for rows
    of at most :data:`PAIRWISE_LOOKUPS` lookups."""
    ids = activations[0].reshape(activations[0].shape[0], -1)
    return {layer.weight: _embedding_squared(ids, backprops.reshape(ids.shape[0], ids.shape[1], -1)).sqrt()}


def _linear_rows(layer: torch.nn.Linear, a: torch.Tensor, g: torch.Tensor):
    """Each row's squared gradient norm of a linear layer and a function of the rows' clipping factors that gives
    the sum of the clipped row gradients, per parameter. Row i has inputs ``a_it`` (T x n_in) and output gradients
    ``g_it`` (T x n_out): weight gradient ``G_i = sum_t g_it a_it^T``, bias gradient ``sum_t g_it``. ``|G_i|^2``
    is formed from ``G_i`` itself (B T n_in n_out multiply-adds, kept for the sum) or, when that costs more, as
    ``sum_{t,u} <g_it, g_iu> <a_it, a_iu>`` from two T x T Gram matrices (B T^2 (n_in + n_out); Li et al. 2022)."""
    g = g.reshape(g.shape[0], -1, g.shape[-1])
    a = a.to(g.dtype).reshape(a.shape[0], -1, a.shape[-1])            # (B, T, n)
    if a.shape[1] == 1 and layer.weight.requires_grad and (layer.bias is None or layer.bias.requires_grad):
        return _one_position_rows(layer, a[:, 0], g[:, 0])
    squared = torch.zeros(g.shape[0], dtype=g.dtype, device=g.device)
    whole = None
    if layer.weight.requires_grad:
        t, n_in, n_out = a.shape[1], a.shape[2], g.shape[2]
        if n_in * n_out <= t * (n_in + n_out):
            whole = torch.bmm(g.transpose(1, 2), a)                    # (B, n_out, n_in): each row's gradient
            squared = squared + (whole ** 2).sum((1, 2))
        else:
            squared = squared + (torch.bmm(g, g.transpose(1, 2)) * torch.bmm(a, a.transpose(1, 2))).sum((1, 2))
    bias = g.sum(1) if layer.bias is not None and layer.bias.requires_grad else None
    if bias is not None:
        squared = squared + (bias ** 2).sum(1)

    def clipped(coeff: torch.Tensor) -> dict:
        out = {}
        if layer.weight.requires_grad:
            out[layer.weight] = (torch.einsum("b,boi->oi", coeff, whole) if whole is not None else
                                 (g * coeff[:, None, None]).flatten(0, 1).t() @ a.flatten(0, 1))
        if bias is not None:
            out[layer.bias] = coeff @ bias
        return out
    return squared.clamp(min=0), clipped


def _one_position_rows(layer: torch.nn.Linear, a: torch.Tensor, g: torch.Tensor):
    """:func:`_linear_rows` for a layer called on one position per row (inputs ``a`` (B, n_in), output gradients
    ``g`` (B, n_out)), every parameter trained: row i's gradient ``g_i a_i^T`` (and ``g_i`` for the bias) has
    squared norm ``|g_i|^2 (|a_i|^2 + 1)`` (``+ 0`` without a bias), in six operations rather than a batch of
    1 x 1 matrix products."""
    squared = g.square().sum(1) * (a.square().sum(1) + (1.0 if layer.bias is not None else 0.0))

    def clipped(coeff: torch.Tensor) -> dict:
        scaled = g * coeff[:, None]
        out = {layer.weight: scaled.t() @ a}
        if layer.bias is not None:
            out[layer.bias] = scaled.sum(0)
        return out
    return squared, clipped


def _embedding_rows(layer: torch.nn.Embedding, ids: torch.Tensor, g: torch.Tensor):
    """:func:`_linear_rows` for an embedding table (:func:`embedding_norm_sample`'s norms)."""
    ids = ids.reshape(ids.shape[0], -1)
    g = g.reshape(ids.shape[0], ids.shape[1], -1)

    def clipped(coeff: torch.Tensor) -> dict:
        rows = (g * coeff[:, None, None]).reshape(-1, g.shape[-1])
        return {layer.weight: torch.zeros_like(layer.weight).index_add_(0, ids.reshape(-1), rows)}
    return _embedding_squared(ids, g), clipped


class _Taps:
    """Forward hooks on the trainable ``nn.Linear`` and ``nn.Embedding`` layers of a model: each call's input
    (detached) and output, for :func:`_clipped_sum`. Refuses a model with trainable parameters elsewhere, or an
    embedding whose gradient is not the plain one (padding_idx, max_norm, scale_grad_by_freq, sparse)."""

    def __init__(self, model: torch.nn.Module):
        kinds = (torch.nn.Linear, torch.nn.Embedding)
        layers = [m for m in model.modules() if isinstance(m, kinds)
                  and any(p.requires_grad for p in m.parameters(recurse=False))]
        covered = {id(p) for m in layers for p in m.parameters(recurse=False)}
        odd = [m for m in layers if isinstance(m, torch.nn.Embedding)
               and (m.padding_idx is not None or m.max_norm is not None or m.scale_grad_by_freq or m.sparse)]
        if odd or any(p.requires_grad and id(p) not in covered for p in model.parameters()):
            raise DuckmobError("train_ghost trains models built of plain nn.Linear and nn.Embedding layers only")
        self.seen: list = []
        self.handles = [m.register_forward_hook(self._record) for m in layers]

    def _record(self, module, inputs, output):
        if torch.is_grad_enabled():
            self.seen.append((module, inputs[0].detach(), output, output._version))

    def take(self) -> list:
        """(layer, input, output) of each call since the last take."""
        seen, self.seen = self.seen, []
        if len({id(m) for m, *_ in seen}) != len(seen):
            raise DuckmobError("train_ghost needs each layer called at most once per forward pass")
        if any(out._version != version for *_, out, version in seen):   # its gradient would be another tensor's
            raise DuckmobError("train_ghost needs the layers' outputs left unchanged (no in-place operation on them)")
        return [(m, a, out) for m, a, out, _ in seen]

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


def _clipped_sum(loss: torch.Tensor, taps: _Taps, clip: float) -> dict:
    """The sum over rows of each row's gradient of its loss ``loss[i]`` clipped to L2 norm ``clip``, per parameter
    (book-keeping ghost clipping, Bu et al. 2023): one backward pass to every tapped layer's output gives each row's
    output gradients, hence its squared gradient norm per layer (:func:`_linear_rows`, :func:`_embedding_rows`;
    rows are the first dimension and never mix); the factor ``min(1, clip / (norm_i + 1e-6))`` (opacus's) then
    weights each row's gradient in one product per layer, without a second backward pass."""
    seen = taps.take()
    grads = torch.autograd.grad(loss.sum(), [out for _, _, out in seen], allow_unused=True)
    squared = torch.zeros(len(loss), dtype=loss.dtype, device=loss.device)
    parts = []
    for (layer, inputs, _), g in zip(seen, grads):
        if g is None:   # a layer this loss does not reach: zero gradient
            continue
        rows = _linear_rows if isinstance(layer, torch.nn.Linear) else _embedding_rows
        sq, clipped = rows(layer, inputs, g.detach())
        squared = squared + sq
        parts.append(clipped)
    coeff = (clip / (squared.sqrt() + 1e-6)).clamp(max=1.0)
    out: dict = {}
    for clipped in parts:
        out.update(clipped(coeff))
    return out


class _Cloning:
    """opacus's ``accumulate`` of the fast-gradient-clipping optimisers with ``clone`` where it ``copy.deepcopy``-ed
    each clipped sum (the same values; Python's copy machinery took 7% of a clean-slate fit)."""

    def accumulate(self):
        for p in self.params:
            if p.summed_grad is not None:
                p.summed_grad.add_(p.grad.data)
            else:
                p.summed_grad = p.grad.data.clone()


class _GhostOptimizer(_Cloning, DPOptimizerFastGradientClipping):
    pass


class ForeachAdam(torch.optim.Adam):
    """torch's Adam (its single-tensor algorithm, default betas and eps, no weight decay, no amsgrad) in a few
    operations a step: both moments of all parameters kept as one vector each (elementwise updates, the same
    values whatever the layout) and the parameters' update as one ``torch._foreach_addcdiv_`` (on the CPU the same
    kernel on each parameter as the single-tensor loop's), so the weights are the same bit for bit (tested), without
    the Python loop over the parameters (7% of a clean-slate fit). Step hooks run as for any torch optimiser."""

    def __init__(self, params: list, lr: float):
        super().__init__(params, lr=lr)
        self._moments: tuple[list, list] | None = None
        self._steps = 0

    def add_param_group(self, param_group: dict) -> None:
        # torch's own, without the wrapper that keeps TorchDynamo out of it: that wrapper imports TorchDynamo on
        # its first call (0.7 s, a tenth of a clean-slate fit), and nothing here is compiled
        torch.optim.Optimizer.add_param_group.__wrapped__(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        # torch's is wrapped like add_param_group (it would import TorchDynamo); what it does for dense gradients
        for p in self.param_groups[0]["params"]:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.detach_().zero_()

    @torch.no_grad()
    def step(self, closure=None):
        group = self.param_groups[0]
        params, (beta1, beta2), eps = group["params"], group["betas"], group["eps"]
        if self._moments is None:   # both moments of all parameters as one vector each
            self._moments = tuple(torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype,
                                              device=params[0].device) for _ in range(2))
        exp_avg, exp_avg_sq = self._moments
        grad = torch.cat([p.grad.reshape(-1) for p in params])
        self._steps += 1
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step = float(self._steps)   # torch keeps the count in a float32 tensor and reads it as a float
        step_size = group["lr"] / (1 - beta1 ** step)
        denom = (exp_avg_sq.sqrt() / (1 - beta2 ** step) ** 0.5).add_(eps)
        sizes = [p.numel() for p in params]
        exp_avg, denom = ([v.view_as(p) for v, p in zip(t.split(sizes), params)] for t in (exp_avg, denom))
        torch._foreach_addcdiv_(params, exp_avg, denom, value=-step_size)


class _NoisyAdam:
    """opacus's ``DPOptimizerFastGradientClipping`` (``loss_reduction="mean"``, not its secure mode) around
    :class:`ForeachAdam`, for one process: on entry to :meth:`step` each ``p.grad`` is the parameter's clipped sum;
    Gaussian noise of standard deviation ``noise_multiplier * max_grad_norm`` is drawn for each parameter in turn,
    exactly as opacus's ``_generate_noise`` draws it (``torch.normal`` of the parameter's shape from ``generator``;
    none at standard deviation 0), added, and the sum divided by the public expected batch (rounded, as
    :func:`_dp_optimizer` hands it to opacus); Adam then steps. The same draws and operations as opacus's optimiser,
    in a few ``torch._foreach_*`` calls (tested equal to it bit for bit)."""

    def __init__(self, params: list, schedule: Schedule, generator: torch.Generator):
        self.original_optimizer = ForeachAdam(params, schedule.lr)
        self.param_groups = self.original_optimizer.param_groups
        self.params = params
        self.std = schedule.noise_multiplier * schedule.max_grad_norm
        self.divisor = max(1, round(schedule.expected_batch_size))
        self.generator = generator

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        with torch.no_grad():
            noise = noise_source.dp_sgd_gaussian(self.params, self.std, self.generator)
            grads = torch._foreach_add([p.grad for p in self.params], noise)
            torch._foreach_div_(grads, self.divisor)
        for p, g in zip(self.params, grads):
            p.grad = g
        self.original_optimizer.step()


class _DistributedGhostOptimizer(_Cloning, DistributedDPOptimizerFastGradientClipping):
    pass


def train_ghost(model: torch.nn.Module, row_losses: Callable[[torch.nn.Module, np.ndarray], torch.Tensor],
                n_rows: int, schedule: Schedule, context: RunContext, *, unit_of_row: np.ndarray | None = None,
                max_trajectories_per_user: int = 1,
                split_rows: Callable[[np.ndarray], list[np.ndarray]] | None = None) -> TrainingLog:
    """:func:`train` without materialising per-example gradients of whole models, by ghost clipping (each row's
    gradient norm from its layer inputs and output gradients; Li et al. 2022) in its book-keeping form
    (:func:`_clipped_sum`), for models built of ``nn.Linear`` and ``nn.Embedding`` layers, each called at most
    once per forward pass.

    ``row_losses(module, rows)`` returns the loss of each row (``(len(rows),)``), computed by calling
    ``module`` (the model) on those rows only. A step: one backward pass of the summed losses to the layers'
    outputs gives every row's gradient norm ``norm_i`` and, weighted by ``c_i = min(1, C_row / norm_i)``, the sum of
    the clipped row gradients; Gaussian noise of standard deviation ``noise_multiplier * max_grad_norm`` is added
    and the sum divided by the public ``expected_batch_size`` (all of ``schedule``; ``context`` as in
    :func:`train`): in one process by :class:`_NoisyAdam` (opacus's ``DPOptimizerFastGradientClipping``'s draws
    and operations, fewer calls), in workers by opacus's distributed variant.

    Sensitivity: a row is one trajectory, a unit a user of at most k = ``max_trajectories_per_user`` of them (the
    contribution bound, enforced by the caller). Each row is clipped to ``C_row = max_grad_norm / k``; with
    ``unit_of_row`` users are Poisson-sampled with all their rows, so one unit moves the clipped sum by at most
    ``k * C_row = max_grad_norm`` (triangle inequality); with ``unit_of_row`` None each row is a unit (k must be
    1). Accounted as ``schedule.event``. With ``context.group`` (a worker) a unit's rows are all on one worker, so
    the bound holds per worker and for the all-reduced sum.

    ``split_rows(rows)``: the batch's rows in parts (every row in at most one), each part's clipped sum computed
    alone and the parts' sums added before the noise: the same clipped sum (each row is clipped alone), for less
    padding when rows are ragged (e.g. parts of similar length). A row may be left out only when its gradient is
    zero (e.g. a loss that is 0 whatever the weights): it would add nothing. None: one part.
    """
    k = max_trajectories_per_user
    if unit_of_row is None and k != 1:
        raise DuckmobError("max_trajectories_per_user above 1 needs unit_of_row (the user of each trajectory)")
    gen = torch_generator(context.rng, torch.device("cpu"))
    noise_gen = torch_generator(context.rng, context.device)
    model.to(context.device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    taps = _Taps(model)
    optimizer = _NoisyAdam(params, schedule, noise_gen) if context.group is None else \
        _dp_optimizer(_GhostOptimizer, _DistributedGhostOptimizer, params, schedule, noise_gen, context.group)
    n_units, rows_of = _units(n_rows, unit_of_row)

    def one_step(units: np.ndarray, empty: bool) -> None:
        total = {}
        if not empty:
            rows, _ = rows_of(units)
            for part in [rows] if split_rows is None else [part for part in split_rows(rows) if len(part)]:
                for p, summed in _clipped_sum(row_losses(model, part), taps, schedule.max_grad_norm / k).items():
                    total[p] = summed if p not in total else total[p].add_(summed)
        for p in params:
            p.grad = total[p] if p in total else torch.zeros_like(p)

    try:
        return _loop(optimizer, params, n_units, one_step, schedule, gen, context=context)
    finally:
        taps.close()   # the hooks go; ``model`` is left a plain module


__all__ = ["train", "train_ghost", "ForeachAdam", "per_example_gradients", "Schedule", "RunContext", "TrainingLog",
           "torch_generator", "cosine_lr", "StepsRun", "ran_event", "charged_as_run"]
