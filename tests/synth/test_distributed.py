"""DP-SGD across worker processes (duckmob.synth.distributed): 2 CPU workers over gloo give the single-process
sample, clipped sum, noise, event and model; one unit moves the all-reduced sum by at most max_grad_norm; errors
and interrupts stop every worker."""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import threading
import time

import numpy as np
import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from duckmob.errors import DuckmobError
from duckmob.synth import distributed
from duckmob.trajectories import Trajectories

# what the workers import when they unpickle a function of this module is kept light: the heavier modules are
# imported where they are used

BOX = [39.8, 116.2, 40.2, 116.6]
TINY = dict(w=8, epochs=2, stay_points=False, max_len=6, progress=False, device="cpu", hidden=8, loc_dim=8,
            time_dim=4)
CPU = torch.device("cpu")
C = 1.0           # max_grad_norm
N, D = 24, 5      # units, gradient size
BATCH = 8.0       # expected batch (sample rate 1/3)


def toy_trajectories(n=120, seed=0) -> Trajectories:
    """Trips between a few places, 2-5 hourly fixes."""
    rng = np.random.default_rng(seed)
    places = np.array([[39.85, 116.25], [39.95, 116.35], [40.05, 116.45], [40.15, 116.55]])
    lengths = rng.integers(2, 6, n)
    m = int(lengths.sum())
    which = rng.integers(0, len(places), m)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    step = np.arange(m) - np.repeat(offsets[:-1], lengths)
    ts = np.repeat(1_200_000_000_000_000 + rng.integers(0, 10, n) * 3_600_000_000, lengths) + step * 3_600_000_000
    return Trajectories(offsets, np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int64), ts.astype(np.int64),
                        places[which, 0] + rng.normal(0, 0.005, m), places[which, 1] + rng.normal(0, 0.005, m))


class FixedGradients:
    """Row i's gradient is ``x[i]`` whatever the weights (the loss ``-<w, x_i>``), so the clipped sums are known."""

    def __init__(self, x: np.ndarray):
        self.x = torch.as_tensor(x, dtype=torch.float32)

    def __call__(self, rows: np.ndarray) -> dict:
        return {"weight": self.x[torch.as_tensor(rows, dtype=torch.long)][:, None, :]}


class SquaredErrors:
    """Each row's squared error of a linear model, for ghost clipping."""

    def __init__(self, x: np.ndarray, y: np.ndarray):
        self.x, self.y = torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32)

    def __call__(self, module, rows: np.ndarray) -> torch.Tensor:
        idx = torch.as_tensor(rows, dtype=torch.long)
        return (module(self.x[idx])[:, 0] - self.y[idx]) ** 2


def recorded_gradients(group, x: np.ndarray, y: np.ndarray, sigma: float, seed: int) -> dict:
    """Run as one process (``group`` None) or one worker: the gradient Adam receives at every step (= (clipped sum
    + noise) / batch) and the final weights, for materialised per-example gradients (x; x with unit 0 huge; x with
    unit 0 zero; x with users of 3 rows as the units) and for ghost clipping."""
    from duckmob.synth import dpsgd

    schedule = dpsgd.Schedule(sample_rate=BATCH / N, steps=6, noise_multiplier=sigma, max_grad_norm=C,
                              expected_batch_size=BATCH, lr=0.1)

    def context() -> dpsgd.RunContext:
        return dpsgd.RunContext(np.random.default_rng(seed), CPU, progress=False, group=group)

    out = {}
    seen: list = []
    hook = register_optimizer_step_pre_hook(
        lambda opt, args, kwargs: seen.append(torch.cat([p.grad.flatten() for g in opt.param_groups
                                                         for p in g["params"]]).clone()))
    try:
        for name, rows, users in [("x", x, None), ("huge", np.vstack([x[:1] * 100, x[1:]]), None),
                                  ("zero", np.vstack([x[:1] * 0, x[1:]]), None), ("users", x, np.arange(N) // 3)]:
            seen.clear()
            torch.manual_seed(0)
            model = torch.nn.Linear(D, 1, bias=False)
            dpsgd.train(model, FixedGradients(rows), N, schedule, context(), unit_of_row=users)
            out[name] = (torch.stack(seen), model.weight.detach().clone())
        seen.clear()
        torch.manual_seed(0)
        model = torch.nn.Linear(D, 1)
        dpsgd.train_ghost(model, SquaredErrors(x, y), N, schedule, context())
        out["ghost"] = (torch.stack(seen), torch.cat([p.detach().flatten() for p in model.parameters()]))
    finally:
        hook.remove()
    return out


@pytest.fixture(scope="module")
def gradients():
    """Two workers and one process on the same data and seed (noise multiplier 0.7)."""
    rng = np.random.default_rng(5)
    x, y = rng.normal(0, 1, (N, D)) * 2, rng.normal(0, 1, N)   # norms about 4.5: clipping is active
    workers = distributed.spawn(recorded_gradients, x, y, 0.7, 11, workers=2, device=CPU)
    return workers, recorded_gradients(None, x, y, 0.7, 11)


def test_workers_give_the_single_process_gradients_noise_and_weights(gradients):
    """Same Poisson batches, clipped sum and noise (rank 0's generator is seeded as one process's): the gradient
    of every step and the final weights equal one process's to float tolerance, and both ranks end identical."""
    workers, single = gradients
    for name in ("x", "huge", "zero", "users", "ghost"):
        grads0, w0 = workers[0][name]
        grads1, w1 = workers[1][name]
        assert torch.equal(grads0, grads1) and torch.equal(w0, w1)    # identical models on every rank
        assert torch.allclose(grads0, single[name][0], atol=1e-6)
        assert torch.allclose(w0, single[name][1], atol=1e-6)
        assert grads0.abs().sum() > 0


def test_one_unit_moves_the_all_reduced_sum_by_at_most_max_grad_norm(gradients):
    """Unit 0 with a gradient 100 times too large, against unit 0 absent (gradient 0, same Poisson sample): the
    all-reduced clipped sums (gradient x batch; the same noise draws cancel) differ by at most C, and by exactly C
    at the steps that sampled unit 0."""
    workers, _ = gradients
    diff = ((workers[0]["huge"][0] - workers[0]["zero"][0]) * BATCH).norm(dim=1)
    assert (diff <= C + 1e-5).all()
    assert ((diff < 1e-5) | (abs(diff - C) < 1e-5)).all() and (diff > 0.5).any()


def test_two_workers_fit_the_same_event_and_model_as_one():
    """The baseline with workers := 2 spends the event of workers := 1 (same noisy count, rate, steps, sigma), and
    its weights and training loss equal the single-process ones to float tolerance under the same seed."""
    from duckmob.privacy import accounting
    from duckmob.privacy.noise import NoiseSource
    from duckmob.synth.base import fit_unrecorded
    from duckmob.synth.hrnet import Baseline
    from duckmob.synth.hrnet.train import training_arrays

    data = toy_trajectories()
    one = fit_unrecorded(Baseline(BOX, **TINY), data, 2.0, 1e-5, NoiseSource(3))
    two = fit_unrecorded(Baseline(BOX, **TINY, workers=2), data, 2.0, 1e-5, NoiseSource(3))
    assert two.event_json == one.event_json
    assert accounting.epsilon(two.event, 1e-5) == accounting.epsilon(one.event, 1e-5) <= 2.0 + 1e-9
    for key in ("sample_rate", "steps", "noise_multiplier", "n_noisy", "expected_batch"):
        assert two.info[key] == one.info[key]
    assert two.config == one.config and two.config.workers == 1 and "workers" not in two.stored_config()
    assert all(torch.allclose(two.state[k], one.state[k], atol=1e-5) for k in one.state)
    synth = Baseline(BOX, **TINY)
    arrays = training_arrays(synth.cell_sequences(synth.stays(data)), 8, 5, 6, zorder=False)

    def loss(model):
        with torch.no_grad():
            return float(model.network()(torch.from_numpy(arrays.cells), torch.from_numpy(arrays.times),
                                         torch.from_numpy(arrays.lengths)).mean())
    assert loss(two) == pytest.approx(loss(one), rel=1e-4)


def failing(group, when: str):
    if group.rank == 1:
        raise ValueError(f"boom {when}")
    blocked(group)


def blocked(group, folder: str | None = None):
    """A worker that marks itself up (a file ``up-<rank>`` in ``folder``) and then blocks until it is stopped:
    nothing sets the event it waits on (the 120 s bound only ends a worker that the caller failed to stop)."""
    if folder is not None:
        pathlib.Path(folder, f"up-{group.rank}").touch()
    threading.Event().wait(120)


def test_a_worker_error_stops_every_worker_and_is_a_duckmob_error():
    start = time.perf_counter()
    with pytest.raises(DuckmobError, match="DP-SGD worker 1 of 2 failed: ValueError: boom now"):
        distributed.spawn(failing, "now", workers=2, device=CPU)
    assert not multiprocessing.active_children() and time.perf_counter() - start < 50


def test_an_interrupt_stops_every_worker(tmp_path):
    up, deadline = [], time.monotonic() + 60

    def check():   # Ctrl-C once both workers are up and blocked
        up[:] = sorted(p.name for p in tmp_path.glob("up-*"))
        if len(up) == 2 or time.monotonic() > deadline:
            raise KeyboardInterrupt

    start = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        distributed.spawn(blocked, str(tmp_path), workers=2, device=CPU, check_interrupt=check)
    assert up == ["up-0", "up-1"]
    assert not multiprocessing.active_children() and time.perf_counter() - start < 50


def test_workers_are_checked():
    from duckmob.synth.hrnet import Baseline

    with pytest.raises(DuckmobError, match="workers"):
        Baseline(BOX, workers=0)
    with pytest.raises(DuckmobError, match="workers"):
        distributed.spawn(blocked, workers=1, device=CPU)
    if torch.cuda.device_count() < 2:
        with pytest.raises(DuckmobError, match="one GPU per worker"):
            distributed.worker_devices(torch.device("cuda"), 2)
    with pytest.raises(SystemExit):
        distributed.Group(0, 2, CPU, parent_pid=os.getpid()).check_parent()   # not this process's parent
    distributed.Group(0, 2, CPU, parent_pid=os.getppid()).check_parent()
    assert list(distributed.Group(1, 2, CPU, 0).shard(np.array([0, 1, 2, 3, 5]))) == [1, 3, 5]
