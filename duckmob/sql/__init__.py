"""The thin SQL layer: registering duckmob's UDFs and table macros on a DuckDB connection.

The areas are listed in :data:`AREAS` (``trajectories``, ``privacy``, ``evaluate``, ``synth``, ``demo``,
``roads``, ``report``). Each
area module gives its hidden Python UDFs in ``udfs(db)`` (a list of :class:`duckmob.sql.udf.Udf`) and the tables its
macros name in ``setup(con)``; its table macros live in the ``.sql`` file of the same name beside it
(``CREATE OR REPLACE TEMP MACRO ...``), executed in order after all UDFs exist. Table-valued functions follow
one pattern: ONE TEMP table macro body gathers the input rows into LISTs with ``list(...)``, builds the request
STRUCT (:class:`duckmob.sql.udf.Request`), calls one hidden arrow UDF (named ``_mob_*``) that returns
LIST(STRUCT(...)), and ``unnest(..., recursive := true)`` turns that into rows (see ../../shared/ENGINEERING.md
for the measurements behind this).

UDFs are database-wide and persist for the life of the database instance: they are registered once per database,
on the release core's own connection (``duckmob.release.Database``), so closing the connection that called
``register`` breaks nothing. Macros are TEMP (per connection): every connection or cursor that calls duckmob's
SQL functions must be registered (``duckmob.register(cur)``: cheap once the database has the UDFs). Nothing
duckmob-specific is written into a user's database file except the ledger, model and output-record
(``duckmob_outputs``, :mod:`duckmob.release.outputs`) tables.
"""

from __future__ import annotations

import importlib
from importlib import resources

import duckdb


AREAS = ("trajectories", "privacy", "evaluate", "synth", "demo", "roads", "report")   # in the order their macros are created


def _areas() -> tuple:
    """Every area module of the SQL layer (``duckmob.sql.<area>``), in the order of :data:`AREAS` (later .sql files
    use earlier macros). Imported when a database is first registered, not with this package: the areas import the
    release core and the methods."""
    return tuple(importlib.import_module(f"duckmob.sql.{area}") for area in AREAS)


def _name(area) -> str:
    return area.__name__.rpartition(".")[2]


def _create_udfs(db) -> None:
    """Register every area's UDFs on the database's own connection, and create the ledger and model tables."""
    areas = _areas()
    for area in areas:
        for udf in area.udfs(db):
            db.con.create_function(
                udf.name, udf.fn, udf.parameters, udf.returns,
                type="native" if udf.native else "arrow",
                null_handling="special" if udf.special_nulls else "default",
                exception_handling="default",
                side_effects=udf.side_effects,
            )
    for area in areas:
        area.setup(db.con)


def register(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """Register every duckmob function on ``con``: idempotent and thread-safe (the UDFs once per database, under
    a lock; the TEMP macros on ``con``). Also lets Ctrl-C reach releases in progress (see
    :func:`duckmob.release.install_interrupt_handler`)."""
    from duckmob import release

    release.database(con, create=_create_udfs)
    release.install_interrupt_handler()
    for area in _areas():
        area.setup(con)   # tables the macros name (a TEMP stand-in on a read-only database)
        con.execute(resources.files("duckmob.sql").joinpath(f"{_name(area)}.sql").read_text())
    return con
