"""DP-SGD training (HRNet Algorithm 1; Abadi et al. 2016) with opacus, and its privacy accounting.

Privacy map of one DP-SGD run: every example (one trajectory, the privacy unit) enters a step with probability
``sample_rate`` (Poisson sampling, opacus's ``UniformWithReplacementSampler`` at exactly the rate given to the
accountant); its gradient (the sum of its whole loss over steps and resolutions) is clipped to L2 norm
``max_grad_norm`` (by ghost clipping where :func:`ghost_clipped` allows it, else by opacus's ``DPOptimizer`` fed
with exact per-example gradients from :func:`per_sample_gradients`: the same clipped sum, tested), so adding or
removing one trajectory moves the summed gradient by at most ``max_grad_norm``; Gaussian noise of standard
deviation ``noise_multiplier * max_grad_norm`` is added to the sum. ``steps`` such steps are the
Poisson-subsampled Gaussian mechanism composed ``steps`` times: :func:`duckmob.privacy.accounting.dp_sgd(
noise_multiplier, sample_rate, steps)`.

The loop itself (sampling, clipping, noise, Adam, EMA) is :func:`duckmob.synth.dpsgd.train` or ``train_ghost``;
this module turns HRNet's padded arrays into per-example losses or gradients for it.

Training data are numpy arrays (padded cell/time matrices), never Python objects per trajectory; each step
gathers its batch by fancy indexing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.func import functional_call, grad, vmap

from duckmob.grid import time_slot
from duckmob.synth import dpsgd
# the generic DP-SGD pieces live in duckmob.synth.dpsgd (shared with other methods); re-exported for HRNet's callers
from duckmob.synth.dpsgd import RunContext, Schedule, TrainingLog, cosine_lr, torch_generator  # noqa: F401
from duckmob.synth.hrnet.encoding import morton
from duckmob.synth.hrnet.model import BaselineModel, HRNetModel
from duckmob.trajectories import NO_TIME, CellSequences


@dataclass(frozen=True)
class TrainingData:
    """Padded training arrays: ``cells`` (N, max_len + 1) Z-order leaf indices, ``times`` (N, max_len + 1) time
    slots, ``lengths`` (N,) number of cells (<= max_len; longer sequences are truncated, a per-record
    transformation that needs no budget)."""

    cells: np.ndarray
    times: np.ndarray
    lengths: np.ndarray
    user_id: np.ndarray

    @property
    def n(self) -> int:
        return len(self.lengths)


def training_arrays(seqs: CellSequences, w: int, n_time: int, max_len: int, zorder: bool = True) -> TrainingData:
    """Turn cell sequences into padded arrays (vectorised; no loop over trajectories).

    Times are slots of the day (:func:`duckmob.grid.time_slot`); a table without time gives slot 0 everywhere.
    Cells are Z-order indices (HRNet) when ``zorder`` else grid ids (baseline). Empty sequences are dropped
    (a per-record transformation).
    """
    lengths = np.minimum(seqs.lengths, max_len).astype(np.int64)
    n = len(lengths)
    pos = np.arange(len(seqs.cells), dtype=np.int64) - np.repeat(seqs.offsets[:-1], seqs.lengths)
    owner = np.repeat(np.arange(n, dtype=np.int64), seqs.lengths)
    keep = pos < max_len
    cells = np.zeros((n, max_len + 1), dtype=np.int64)
    times = np.zeros((n, max_len + 1), dtype=np.int64)
    kept = seqs.cells[keep].astype(np.int64)
    cells[owner[keep], pos[keep]] = morton(kept, w) if zorder else kept
    ts = seqs.ts[keep]
    if len(ts) and ts[0] != NO_TIME:
        times[owner[keep], pos[keep]] = time_slot(ts, n_time)
    alive = lengths > 0
    return TrainingData(cells[alive], times[alive], lengths[alive], np.asarray(seqs.user_id)[alive])


def per_sample_gradients(model: torch.nn.Module, cells: torch.Tensor, times: torch.Tensor,
                         lengths: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each example's gradient of its own loss ``model(cells[i:i+1], times[i:i+1], lengths[i:i+1])``, for every
    trainable parameter: ``{name: (B, *shape)}``.

    ``torch.func``: ``vmap`` over the examples of ``grad`` of the loss of a batch of one, which is exactly one
    backward pass per example (tested against that). What does not depend on the example is computed once per
    batch (HRNet's whole location encoding under the 'full' loss); under the default conditional loss the model
    reads the encoding along each example's paths (``HRNetModel.paths``), so the per-example backward runs
    through those few rows only (docs/methods/hrnet.md, "Where a fit's time goes").
    """
    params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}
    buffers = dict(model.named_buffers())

    def loss_of_one(p, c, t, n):
        return functional_call(model, (p, buffers), (c[None], t[None], n[None]))[0]

    return vmap(grad(loss_of_one), in_dims=(None, 0, 0, 0), randomness="error")(params, cells, times, lengths)


def dp_sgd_train(model: torch.nn.Module, data: TrainingData, schedule: Schedule, context: RunContext, *,
                 by_user: bool = False, workers: int = 1) -> TrainingLog:
    """Train ``model`` in place with DP-SGD (HRNet Algorithm 1) by ``schedule``, as ``context`` says
    (:func:`duckmob.synth.dpsgd.train`: the Poisson-sampled steps, the public expected batch, the cosine learning
    rate, the EMA of the iterates, the interrupt check and the steps counter).

    ``model(cells, times, lengths)`` must return the per-example loss.

    ``by_user``: the privacy unit is the user (``data.user_id``; contributions already bounded by the caller).
    Users, not trajectories, are Poisson-sampled; the per-trajectory gradients are summed per user before
    clipping, so each user's whole contribution to a step is clipped to ``max_grad_norm``.
    Where :func:`ghost_clipped` says so (the default conditional loss, the baseline, the trajectory unit) each
    trajectory's clipped gradient comes from ghost clipping (:func:`duckmob.synth.dpsgd.train_ghost`); elsewhere
    per-example gradients come from :func:`per_sample_gradients` and opacus's ``DPOptimizer`` clips them (it reads
    ``p.grad_sample``). Either way the clipped sum is the sum of each unit's own gradient clipped to
    ``max_grad_norm``, and the batch sampler and the Gaussian noise are opacus's draws, from torch generators seeded
    from ``context.rng``. Privacy: see the module docstring; the caller accounts ``schedule.event``. A stopped run
    leaves the model mid-training (no EMA swap) with fewer steps than planned, which the event still bounds;
    ``context.steps_run`` counts them in this process only (with ``workers`` above 1 it is set to None: all
    charged).

    ``workers``: above 1, the same run data-parallel in that many processes
    (:func:`duckmob.synth.distributed.train_in_workers`: the same Poisson batches, noise and accounted event;
    each worker with this process's torch threads).
    """
    if workers > 1:
        from duckmob.synth.distributed import train_in_workers

        if context.steps_run is not None:
            context.steps_run.steps = None   # the workers' steps are not seen here: a stop is charged all of them

        return train_in_workers(_in_worker, model, data, schedule, rng=context.rng, workers=workers,
                                device=context.device, progress=context.progress,
                                check_interrupt=context.check_interrupt, by_user=by_user, desc=context.desc)
    cells = torch.from_numpy(data.cells)
    times = torch.from_numpy(data.times)
    lengths = torch.from_numpy(data.lengths)
    width = data.cells.shape[1]
    device = context.device

    def batch(rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(rows, dtype=torch.long)
        lb = lengths[idx]
        t = min(int(lb.max()) + 1, width)   # the batch's padded width, not the data's
        return cells[idx, :t].to(device), times[idx, :t].to(device), lb.to(device)

    if ghost_clipped(model, by_user):
        return dpsgd.train_ghost(model, lambda module, rows: module(*batch(rows)), data.n, schedule, context)

    def row_gradients(rows: np.ndarray) -> dict[str, torch.Tensor]:
        return per_sample_gradients(model, *batch(rows))

    return dpsgd.train(model, row_gradients, data.n, schedule, context,
                       unit_of_row=data.user_id if by_user else None)


def ghost_clipped(model: torch.nn.Module, by_user: bool) -> bool:
    """Whether :func:`dp_sgd_train` clips ``model``'s per-trajectory gradients by ghost clipping
    (:func:`duckmob.synth.dpsgd.train_ghost`: each trajectory's gradient norm from its layers' inputs and output
    gradients, no per-example gradient materialised; the same clipped sum, noise and Adam as opacus's ``DPOptimizer``
    up to floating-point rounding, tested) rather than from ``vmap`` per-example gradients (:func:`dpsgd.train`).

    It needs every trainable layer called once per forward pass on rows that never mix: the baseline, and HRNet
    under the conditional loss (the encoding read along each trajectory's own paths, the GRU's recurrent layer
    called once on the states of every step: :func:`duckmob.synth.hrnet.model.gru_states`). HRNet's 'full' loss
    reads the whole encoding tree, shared by the batch, so it keeps ``vmap``. Under the user unit (``by_user``) a
    user's trajectories are summed before clipping, which ghost clipping of single rows does not do: ``vmap``."""
    if by_user:
        return False
    if isinstance(model, HRNetModel):
        return model.conditional
    return isinstance(model, BaselineModel)


def _in_worker(model: torch.nn.Module, data: TrainingData, schedule: Schedule, *, by_user: bool,
               **context) -> TrainingLog:
    """:func:`dp_sgd_train` in one worker of :func:`duckmob.synth.distributed.train_in_workers`, which hands it the
    worker's ``rng``, ``device``, ``group``, ``check_interrupt`` and ``progress`` (and the caller's ``desc``)."""
    return dp_sgd_train(model, data, schedule, RunContext(**context), by_user=by_user)
