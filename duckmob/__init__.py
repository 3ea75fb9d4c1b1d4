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


__all__ = ["connect", "register", "DuckmobError", "BudgetError"]
