"""duckmob: differentially private synthetic trajectories from SQL, as a DuckDB extension in Python.

Public Python API: :func:`connect`, :func:`register`, :func:`synthesize`, :func:`evaluate` (from
:mod:`duckmob.api`).

``duckmob.evaluate`` is the function :func:`duckmob.api.evaluate`, whatever was imported before. The metric package
``duckmob/evaluate/`` keeps its module name: ``from duckmob.evaluate import load_side`` (or
``importlib.import_module("duckmob.evaluate")``) reaches it. Python's import system would otherwise rebind the
attribute ``duckmob.evaluate`` to that package the first time it is imported, anywhere (the SQL layer imports it
lazily); :class:`_Package` keeps the public function in its place instead. So ``import duckmob.evaluate as m`` gives
the function too: import the package's names with ``from``.
"""

from __future__ import annotations

import sys
import types

from duckmob.api import (BudgetError, DuckmobError, __version__, connect, evaluate, noisy_count, register,
                         synthesize, transitions)

__all__ = ["connect", "register", "evaluate", "synthesize", "noisy_count", "transitions", "DuckmobError",
           "BudgetError", "__version__"]


class _Package(types.ModuleType):
    """The ``duckmob`` package, whose attribute ``evaluate`` stays the public function when the import system
    binds the submodule ``duckmob.evaluate`` of the same name to it (``sys.modules`` still holds the submodule)."""

    def __setattr__(self, name, value):
        if name == "evaluate" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def load_ipython_extension(ipython) -> None:
    """``%load_ext duckmob`` in IPython / Jupyter: see :mod:`duckmob.jupyter`."""
    from duckmob.jupyter import load_ipython_extension as load

    load(ipython)
