"""duckmob: differentially private synthetic trajectories from SQL, as a DuckDB extension in Python.

Public Python API: :func:`connect`, :func:`register` (more — synthesize, evaluate — as they land).
"""

from __future__ import annotations

import duckdb

from duckmob.errors import BudgetError, DuckmobError
from duckmob.sql import register

__version__ = "0.1.0"


def connect(database: str = ":memory:", **kwargs) -> duckdb.DuckDBPyConnection:
    """Open a DuckDB connection with every duckmob function registered."""
    return register(duckdb.connect(database, **kwargs))


def evaluate(con: duckdb.DuckDBPyConnection, real: str, synth: str, **options):
    """Compare table ``synth`` with table ``real`` on ``con``: the rows of ``FROM mob_evaluate(...)`` as a pyarrow
    Table (metric, value, lower_is_better, source, description); ``bbox=[...]`` is required, other options as
    in :class:`duckmob.evaluate.common.Options`. NOT differentially private (it reads the real table exactly).

    (Once the ``duckmob.evaluate`` package is imported, ``duckmob.evaluate`` names that package, which is
    callable the same way.)"""
    from duckmob.evaluate import evaluate_connection

    return evaluate_connection(con, real, synth, **options)


__all__ = ["connect", "register", "evaluate", "DuckmobError", "BudgetError"]
