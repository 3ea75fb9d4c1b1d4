"""DP-SGD across worker processes: data-parallel training over ``torch.distributed`` (gloo on CPU, NCCL on GPUs).

What changes and what does not (Abadi et al. 2016, Algorithm 1, run by ``world`` processes):

* **The Poisson sample is the single-process one.** Every worker receives the caller's numpy generator in the
  same state, so every worker seeds the same torch generator and draws the same Poisson batch of units at
  ``sample_rate`` (opacus's ``UniformWithReplacementSampler``) that one process would draw: the sampled set, the
  rate and the number of steps are exactly what the accountant is told. Worker ``rank`` then keeps the sampled
  units with ``unit % world == rank`` (:meth:`Group.shard`): every unit belongs to exactly one worker.
* **Clipping is local, the sum is global, the noise is added once.** Each worker clips the gradients of its
  own sampled units to ``max_grad_norm`` (per unit: a user's rows are all on the worker of that user) and sums
  them; opacus's ``DistributedDPOptimizer`` (``DistributedDPOptimizerFastGradientClipping`` for ghost clipping)
  adds Gaussian noise of standard deviation ``noise_multiplier * max_grad_norm`` on rank 0 only, and the
  all-reduce (sum) gives every worker ``sum of all clipped gradients + that one noise draw``, divided by the
  public expected batch. Every worker then takes the same Adam step, so the models stay identical (checked at
  the end: :func:`train_in_workers` compares a digest of every worker's weights).
* **Sensitivity is unchanged.** One unit's clipped gradient lives on exactly one worker, so adding or removing
  it moves that worker's clipped sum, hence the all-reduced sum, by at most ``max_grad_norm`` in L2; the noise
  is one Gaussian of standard deviation ``noise_multiplier * max_grad_norm`` on that sum. Each step is the same
  subsampled Gaussian mechanism as in one process: the run is still
  ``accounting.dp_sgd(noise_multiplier, sample_rate, steps)``.

The noise comes from rank 0's torch generator, seeded (like one process's) from the caller's generator, which
the caller derives from its :class:`~duckmob.privacy.noise.NoiseSource`; the caller's generator ends in the
state rank 0's ended in, as after a single-process run.

Processes: :func:`spawn` starts ``world`` workers with ``torch.multiprocessing`` (``spawn`` start method); the
calling process only waits, calling ``check_interrupt`` between polls. Whatever stops the wait (Ctrl-C, the
release's interrupt, a worker's error) terminates every worker before it propagates; workers ignore SIGINT (the
caller decides) and stop by themselves when the caller's process is gone. A worker's exception comes back as a
:class:`DuckmobError` naming the worker and the exception (its type and message, what one process would have
raised); the collective messages carry gradients, which never leave the workers' process group.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import queue as queue_module
import signal
import tempfile
import threading
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from duckmob.errors import DuckmobError

POLL_S = 0.05        # how often the waiting caller checks for interrupts and dead workers (seconds)
STOP_GRACE_S = 5.0   # how long a terminated worker may take to exit before it is killed (seconds)


@dataclass(frozen=True)
class Group:
    """One worker's place in the group: its ``rank`` of ``world``, its torch ``device`` and the caller's pid."""

    rank: int
    world: int
    device: torch.device
    parent_pid: int

    def shard(self, units: np.ndarray) -> np.ndarray:
        """This worker's part of a step's Poisson batch of unit indices: the units with ``unit % world == rank``.
        Every unit is on exactly one worker."""
        return units[units % self.world == self.rank]

    def check_parent(self) -> None:
        """Stop (SystemExit) when the calling process is gone, so no worker outlives it."""
        if os.getppid() != self.parent_pid:
            raise SystemExit("the calling process is gone")


def worker_devices(device: torch.device, workers: int) -> tuple[str, list[torch.device]]:
    """The backend and each worker's device: gloo and the CPU, or NCCL and one GPU per worker."""
    if device.type == "cpu":
        return "gloo", [torch.device("cpu")] * workers
    if device.type == "cuda":
        found = torch.cuda.device_count()
        if found < workers:
            raise DuckmobError(f"workers := {workers} on CUDA needs one GPU per worker (NCCL), found {found}: use "
                               f"fewer workers or device := 'cpu'")
        return "nccl", [torch.device("cuda", i) for i in range(workers)]
    raise DuckmobError(f"workers above 1 run on device 'cpu' (gloo) or 'cuda' (NCCL), not {device.type!r}")


def _worker(rank: int, world: int, init: str, backend: str, device: torch.device, threads: int, payload: bytes,
            results, parent_pid: int) -> None:
    """One worker: join the group, run ``fn(group, *args)`` and report (``done``, rank 0's result pickled) or
    (``error``, the exception's type and message)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C goes to the caller, which terminates the workers
    # tqdm's default lock is a multiprocessing semaphore that a worker's exit leaks; one process, one bar
    tqdm.set_lock(threading.RLock())
    try:
        torch.set_num_threads(threads)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend, init_method=init, rank=rank, world_size=world)
        fn, args = pickle.loads(payload)
        out = fn(Group(rank, world, device, parent_pid), *args)
        results.put(("done", rank, pickle.dumps(out)))
    except BaseException as e:  # noqa: BLE001 -- reported to the caller, which raises it
        results.put(("error", rank, f"{type(e).__name__}: {e}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _stop(processes: list) -> None:
    """Terminate the workers still running, kill those that do not exit within :data:`STOP_GRACE_S`."""
    for p in processes:
        if p.is_alive():
            p.terminate()
    for p in processes:
        p.join(STOP_GRACE_S)
        if p.is_alive():
            p.kill()
            p.join()


def spawn(fn: Callable[..., Any], *args, workers: int, device: torch.device, threads: int = 1,
          check_interrupt: Callable[[], None] | None = None) -> list:
    """Run ``fn(group, *args)`` in ``workers`` processes joined in one ``torch.distributed`` group (gloo on the
    CPU, NCCL with one GPU per worker) with ``threads`` torch threads each; return every worker's result, by rank.

    ``fn`` and ``args`` are pickled once, by value (a tensor in ``args`` is copied, never shared with this
    process or between workers); ``fn`` must be importable (a module-level function). ``check_interrupt`` is
    called while waiting; whatever it raises propagates after every worker is stopped. A worker's exception
    is raised here as a :class:`DuckmobError`."""
    if int(workers) != workers or workers < 2:
        raise DuckmobError(f"spawn needs at least 2 workers, got {workers!r}")
    backend, devices = worker_devices(device, workers)
    payload = pickle.dumps((fn, args))
    ctx = torch.multiprocessing.get_context("spawn")
    results = ctx.Queue()
    processes = []
    with tempfile.TemporaryDirectory(prefix="duckmob-dist-") as tmp:
        init = "file://" + os.path.join(tmp, "rendezvous")   # a file, not a port: nothing to collide with
        try:
            for rank in range(workers):
                p = ctx.Process(target=_worker, name=f"duckmob-worker-{rank}", daemon=True,
                                args=(rank, workers, init, backend, devices[rank], int(threads), payload, results,
                                      os.getpid()))
                p.start()
                processes.append(p)
            outs: dict[int, Any] = {}
            while len(outs) < workers:
                if check_interrupt is not None:
                    check_interrupt()
                try:
                    kind, rank, value = results.get(timeout=POLL_S)
                except queue_module.Empty:
                    dead = [(r, p.exitcode) for r, p in enumerate(processes) if r not in outs and p.exitcode]
                    if dead:
                        raise DuckmobError(f"DP-SGD worker {dead[0][0]} of {workers} died (exit code {dead[0][1]}), "
                                           f"e.g. out of memory: try fewer workers") from None
                    continue
                if kind == "error":
                    raise DuckmobError(f"DP-SGD worker {rank} of {workers} failed: {value}")
                outs[rank] = pickle.loads(value)
            return [outs[r] for r in range(workers)]
        finally:
            _stop(processes)
            results.close()


def digest(model: torch.nn.Module) -> str:
    """A hash of the model's weights (to check that the workers' models are identical)."""
    h = hashlib.sha256()
    for name, v in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _train_worker(group: Group, train_fn: Callable, model: torch.nn.Module, rng: np.random.Generator,
                  progress: bool | None, args: tuple, kwargs: dict):
    """A worker of :func:`train_in_workers`: rank 0 returns the weights, its generator's state and what
    ``train_fn`` returned; every rank returns the digest of its weights."""
    out = train_fn(model, *args, rng=rng, device=group.device, group=group, check_interrupt=group.check_parent,
                   progress=progress if group.rank == 0 else False, **kwargs)
    mine = digest(model)
    if group.rank != 0:
        return mine, None
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return mine, (state, rng.bit_generator.state, out)


def train_in_workers(train_fn: Callable, model: torch.nn.Module, *args, rng: np.random.Generator, workers: int,
                     device: torch.device, threads: int | None = None, progress: bool | None = None,
                     check_interrupt: Callable[[], None] | None = None, **kwargs):
    """``train_fn(model, *args, rng=rng, device=..., group=..., check_interrupt=..., progress=..., **kwargs)`` in
    ``workers`` processes (see the module docstring), e.g. HRNet's ``hrnet.train._in_worker``; ``train_fn`` must
    pass them on to the DP-SGD loop (its :class:`~duckmob.synth.dpsgd.RunContext`). Every worker starts from
    ``model`` and ``rng`` as they are; at the end ``model`` holds the trained weights, ``rng`` is in the state rank 0's
    generator ended in (as after one process's run) and rank 0's return value is returned.

    ``threads``: torch CPU threads per worker (None: this process's current setting). ``check_interrupt``: called
    while waiting; what it raises propagates once every worker is stopped (the model is then left untouched)."""
    outs = spawn(_train_worker, train_fn, model, rng, progress, args, kwargs, workers=workers, device=device,
                 threads=torch.get_num_threads() if threads is None else threads, check_interrupt=check_interrupt)
    if len({d for d, _ in outs}) != 1:
        raise DuckmobError("the DP-SGD workers' models differ after training (the all-reduce did not give every "
                           "worker the same gradient): use workers := 1 and report this")
    state, rng_state, out = outs[0][1]
    model.load_state_dict(state)
    rng.bit_generator.state = rng_state
    return out


__all__ = ["Group", "spawn", "train_in_workers", "worker_devices", "digest"]
