"""The thin SQL layer: registering duckmob's UDFs and table macros on a DuckDB connection.

One module per area (``trajectories``, ``privacy``, ``evaluate``, ``synth``) lists its hidden Python UDFs in
``udfs(con)``: a list of :class:`Udf`. Its table macros live in the ``.sql`` file of the same name beside it
(``CREATE OR REPLACE TEMP MACRO ...``), executed in order after all UDFs exist. Table-valued functions follow
one pattern: a TEMP table macro gathers the input rows into one LIST(STRUCT) with ``list(...)``, calls one
hidden arrow UDF (named ``_mob_*``) that returns LIST(STRUCT(...)), and ``unnest(..., recursive := true)``
turns that into rows (see ../../shared/ENGINEERING.md for the measurements behind this).

UDFs are database-wide and persist for the life of the database instance: they are registered once per database,
on the release core's own connection (``duckmob.release.Database``), so closing the connection that called
``register`` breaks nothing. Macros are TEMP (per connection): every connection or cursor that calls duckmob's
SQL functions must be registered (``duckmob.register(cur)``: cheap once the database has the UDFs). Nothing
duckmob-specific is written into a user's database file except the ledger and model tables.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from importlib import resources
from typing import Callable

import duckdb
import pyarrow as pa

AREAS = ("trajectories", "privacy", "evaluate", "synth", "demo")


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


# The struct every trajectory-taking UDF receives (built by the mob_points macro in trajectories.sql).
POINTS_TYPE = "STRUCT(traj_id BIGINT, user_id BIGINT, ts TIMESTAMP, lat DOUBLE, lon DOUBLE, seq BIGINT)[]"


def scalar(arg):
    """The value of a constant UDF argument (arrow UDFs receive whole columns)."""
    value = arg[0]
    return value.as_py() if hasattr(value, "as_py") else value


def points(arg) -> pa.StructArray:
    """The points of a ``list({...})`` argument (one row holding every point) as one StructArray."""
    if isinstance(arg, pa.ChunkedArray):
        arg = arg.combine_chunks()
    values = arg.values if len(arg) == 1 else arg.flatten()
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    return values


def one_row(table: pa.Table | pa.StructArray) -> pa.ListArray:
    """Wrap a result table as the single LIST(STRUCT) value a table macro unnests."""
    if isinstance(table, pa.Table):
        table = table.combine_chunks()
        struct = pa.StructArray.from_arrays([table.column(i).chunk(0) if table.column(i).num_chunks else
                                             pa.array([], table.schema.field(i).type)
                                             for i in range(table.num_columns)], names=table.column_names)
    else:
        struct = table
    return pa.ListArray.from_arrays(pa.array([0, len(struct)], pa.int32()), struct)


def _area_modules():
    for area in AREAS:
        try:
            yield area, importlib.import_module(f"duckmob.sql.{area}")
        except ModuleNotFoundError as exc:  # an area not built yet
            if exc.name != f"duckmob.sql.{area}":
                raise


def _create_udfs(db) -> None:
    """Register every area's UDFs on the database's own connection, and create the ledger and model tables."""
    modules = list(_area_modules())
    for _, module in modules:
        for udf in module.udfs(db):
            db.con.create_function(
                udf.name, udf.fn, udf.params, udf.returns,
                type="native" if udf.native else "arrow",
                null_handling="special" if udf.special_nulls else "default",
                exception_handling="default",
                side_effects=udf.side_effects,
            )
    for _, module in modules:
        if hasattr(module, "setup"):
            module.setup(db.con)


def register(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """Register every duckmob function on ``con``: idempotent and thread-safe (the UDFs once per database, under
    a lock; the TEMP macros on ``con``). Also lets Ctrl-C reach releases in progress (see
    :func:`duckmob.release.install_interrupt_handler`)."""
    from duckmob import release

    release.database(con, create=_create_udfs)
    release.install_interrupt_handler()
    for area, module in _area_modules():
        if hasattr(module, "setup"):
            module.setup(con)   # tables the macros name (a TEMP stand-in on a read-only database)
        sql_file = resources.files("duckmob.sql").joinpath(f"{area}.sql")
        if sql_file.is_file():
            con.execute(sql_file.read_text())
    return con
