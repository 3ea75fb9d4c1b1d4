"""Where the neural methods compute: the torch device and the number of CPU threads (public settings, no data).

Every torch-based method (HRNet, the baseline, clean-slate, PateGail) takes ``device`` and ``threads`` params and
runs its fit and its sampling inside :func:`cpu_threads`.

One CPU thread by default: the models are small (a GRU of 64 units, batches of a few hundred), so torch's
intra-op parallelism gains little, and when another process shares the cores its threads spin-wait (the
measurements are in docs/methods/hrnet.md). ``threads := n`` uses n threads (a big model on an idle many-core box).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from duckmob.errors import DuckmobError

DEFAULT_CPU_THREADS = 1


def device(spec: str | None, method: str = "the method") -> torch.device:
    """``spec`` as a torch device; None: CUDA when available, else the CPU."""
    if spec is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(spec)
    except (RuntimeError, TypeError):
        raise DuckmobError(f"{method} parameter device must be a torch device such as 'cpu' or 'cuda', "
                           f"got {spec!r}") from None


@contextmanager
def cpu_threads(n: int | None = None):
    """Run the block with ``n`` torch CPU threads (None: :data:`DEFAULT_CPU_THREADS`), restoring the process's
    setting afterwards, whatever happens in the block."""
    previous = torch.get_num_threads()
    torch.set_num_threads(int(n) if n is not None else DEFAULT_CPU_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
