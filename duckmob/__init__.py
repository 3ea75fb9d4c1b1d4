"""duckmob: differentially private synthetic trajectories from SQL, as a DuckDB extension in Python.

Public Python API: :func:`connect`, :func:`register`, :func:`synthesize`, :func:`evaluate`.
"""

from __future__ import annotations

import atexit

import duckdb

from duckmob.errors import BudgetError, DuckmobError
from duckmob.sql import register

__version__ = "0.1.0"


def connect(database: str = ":memory:", **kwargs) -> duckdb.DuckDBPyConnection:
    """Open a DuckDB connection with every duckmob function registered.

    The connection is closed at interpreter exit if the caller has not closed it (an open one makes DuckDB's
    bindings print "leaked instances" warnings); closing it twice is harmless.
    """
    con = duckdb.connect(database, **kwargs)
    atexit.register(con.close)
    return register(con)


def evaluate(con: duckdb.DuckDBPyConnection, real: str, synth: str, **options):
    """Compare table ``synth`` with table ``real`` on ``con``: the rows of ``FROM mob_evaluate(...)`` as a pyarrow
    Table (metric, value, lower_is_better, source, description); ``bbox=[...]`` is required, other options as
    in :class:`duckmob.evaluate.common.Options`. NOT differentially private (it reads the real table exactly).

    (Once the ``duckmob.evaluate`` package is imported, ``duckmob.evaluate`` names that package, which is
    callable the same way.)"""
    from duckmob.evaluate import evaluate_connection

    return evaluate_connection(con, real, synth, **options)


def synthesize(con: duckdb.DuckDBPyConnection, table: str, eps: float, method: str = "privtrace", **params):
    """Fit ``method`` on ``table`` under (eps, delta)-DP (one spend of its budget) and sample a synthetic table.

    The Python twin of ``FROM synthesize('table', eps := ..., method := ..., bbox := [...], ...)``: the same
    keyword parameters (``bbox``, ``delta``, ``n``, ``seed``, ``privacy_unit``, ``max_trajectories_per_user``,
    ``outside``, the column mapping ``traj_col`` ... ``user_col``, ``params``) plus method hyper-parameters as
    keywords (e.g. ``K=8``). Returns a pyarrow Table (traj_id, seq, lat, lon, ts), already materialised, so
    reading it again spends nothing.
    """
    from duckmob.sql.synth import synthesize_table

    return synthesize_table(con, table, eps, method, **params)


__all__ = ["connect", "register", "evaluate", "synthesize", "DuckmobError", "BudgetError"]


def load_ipython_extension(ipython) -> None:
    """``%load_ext duckmob`` in IPython / Jupyter: see :mod:`duckmob.jupyter`."""
    from duckmob.jupyter import load_ipython_extension as load

    load(ipython)
