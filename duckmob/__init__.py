"""duckmob: differentially private synthetic trajectories from SQL, as a DuckDB extension in Python.

Public Python API: :func:`connect`, :func:`register`, :func:`synthesize`, :func:`sample`, :func:`evaluate` (from
:mod:`duckmob.api`).

The metrics behind :func:`evaluate` live in the package :mod:`duckmob.metrics` (one function per metric, with
its formula); ``duckmob.evaluate`` is the plain function.
"""

from __future__ import annotations

from duckmob.api import (BudgetError, DuckmobError, __version__, budgets, connect, evaluate, noisy_count, register,
                         releases, report, sample, synthesize, transitions)

__all__ = ["connect", "register", "evaluate", "synthesize", "sample", "noisy_count", "transitions", "budgets",
           "releases", "report", "DuckmobError", "BudgetError", "__version__"]


def load_ipython_extension(ipython) -> None:
    """``%load_ext duckmob`` in IPython / Jupyter: see :mod:`duckmob.jupyter`."""
    from duckmob.jupyter import load_ipython_extension as load

    load(ipython)
