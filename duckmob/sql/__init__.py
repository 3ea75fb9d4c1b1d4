"""The thin SQL layer: registering duckmob's UDFs and table macros on a DuckDB connection.

One module per area (``trajectories``, ``privacy``, ``evaluate``, ``synth``) lists its hidden Python UDFs in
``udfs(con)``: a list of :class:`Udf`. Its table macros live in the ``.sql`` file of the same name beside it
(``CREATE OR REPLACE TEMP MACRO ...``), executed in order after all UDFs exist. Table-valued functions follow
one pattern: a TEMP table macro gathers the input rows into one LIST(STRUCT) with ``list(...)``, calls one
hidden arrow UDF (named ``_mob_*``) that returns LIST(STRUCT(...)), and ``unnest(..., recursive := true)``
turns that into rows (see ../../shared/ENGINEERING.md for the measurements behind this).

UDFs are database-wide and persist for the life of the database instance; macros are TEMP (per connection),
so nothing duckmob-specific is written into a user's database file except the ledger and model tables.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from importlib import resources
from typing import Callable

import duckdb

AREAS = ("trajectories", "privacy", "evaluate", "synth")


@dataclass(frozen=True)
class Udf:
    """A hidden Python UDF: an arrow function over whole columns unless ``native``."""

    name: str
    fn: Callable
    params: list[str]
    returns: str
    side_effects: bool = False
    native: bool = False
    special_nulls: bool = False  # the function sees NULLs itself (otherwise NULL in -> NULL out)
    extra: dict = field(default_factory=dict)


def _area_modules():
    for area in AREAS:
        try:
            yield area, importlib.import_module(f"duckmob.sql.{area}")
        except ModuleNotFoundError as exc:  # an area not built yet
            if exc.name != f"duckmob.sql.{area}":
                raise


def _existing_functions(con) -> set[str]:
    rows = con.execute("SELECT DISTINCT function_name FROM duckdb_functions() WHERE function_name LIKE '\\_mob\\_%' ESCAPE '\\'").fetchall()
    return {r[0] for r in rows}


def register(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """Register every duckmob function on ``con``; calling it again is harmless (idempotent)."""
    existing = _existing_functions(con)
    modules = list(_area_modules())
    for _, module in modules:
        for udf in module.udfs(con):
            if udf.name in existing:
                continue
            con.create_function(
                udf.name, udf.fn, udf.params, udf.returns,
                type="native" if udf.native else "arrow",
                null_handling="special" if udf.special_nulls else "default",
                exception_handling="default",
                side_effects=udf.side_effects,
            )
    for area, module in modules:
        if hasattr(module, "setup"):
            module.setup(con)
        sql_file = resources.files("duckmob.sql").joinpath(f"{area}.sql")
        if sql_file.is_file():
            con.execute(sql_file.read_text())
    return con
