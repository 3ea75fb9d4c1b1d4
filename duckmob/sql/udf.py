"""What every area of the SQL layer shares: the :class:`Udf` it registers, the one :class:`Request` STRUCT a UDF
takes besides its data columns, and the decoding/encoding of the one-row columns a table macro passes.

A hidden UDF takes its data columns (the gathered rows, one LIST per column or one LIST(STRUCT)) and then ONE
STRUCT argument, the request, holding everything else. The table macro builds that STRUCT literal in one place
(``{'eps': eps, 'seed': seed, ...}``) and the UDF's :class:`Request` parses it in one place into keyword arguments.
Its keys are matched by name, never by position: DuckDB binds a STRUCT literal to the declared STRUCT type only when
it has exactly the declared keys (in any order), and :meth:`Request.parse` checks the keys again, naming any
missing or unknown one, so an argument can never land in the wrong parameter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import pyarrow as pa

from duckmob.errors import DuckmobError
from duckmob.source.schema import quote

# The struct every trajectory-taking UDF receives (built by the mob_points macro in trajectories.sql).
POINTS_TYPE = "STRUCT(traj_id BIGINT, user_id BIGINT, ts TIMESTAMP, lat DOUBLE, lon DOUBLE, seq BIGINT)[]"

# At most this many parameters per UDF: the data columns and one request (tests/test_sql_adapter.py checks it).
MAX_PARAMS = 8


@dataclass(frozen=True)
class Request:
    """The one STRUCT a UDF takes besides its data columns: its keys (the keyword arguments they become) and their
    SQL types, in one place. ``Request(eps="DOUBLE", seed="BIGINT")``."""

    fields: dict[str, str]

    def __init__(self, **fields: str):
        object.__setattr__(self, "fields", dict(fields))

    @property
    def sql_type(self) -> str:
        """The STRUCT type the UDF declares for its request."""
        return "STRUCT(" + ", ".join(f"{quote(k)} {t}" for k, t in self.fields.items()) + ")"

    def parse(self, arg, udf: str = "a duckmob UDF") -> dict:
        """The request a UDF received (a one-row STRUCT column, or a dict) as keyword arguments; a NULL request,
        or keys other than the declared ones, is refused naming what is wrong (a macro bug, never the user's)."""
        value = scalar(arg) if isinstance(arg, (pa.Array, pa.ChunkedArray)) else arg
        if value is None:
            raise DuckmobError(f"duckmob: {udf} received a NULL request (a bug in its SQL macro)")
        given = dict(value)
        missing = [k for k in self.fields if k not in given]
        unknown = [k for k in given if k not in self.fields]
        if missing or unknown:
            raise DuckmobError(f"duckmob: {udf} received a request with "
                               + "; ".join(part for part in (f"missing keys {missing}" if missing else "",
                                                             f"unknown keys {unknown}" if unknown else "") if part)
                               + f" (expected exactly {list(self.fields)}: a bug in its SQL macro)")
        return given


@dataclass(frozen=True)
class Udf:
    """A hidden Python UDF: an arrow function over whole columns unless ``native``. ``params`` are the SQL types of
    its data columns; with a ``request`` the UDF takes it as its last argument (:class:`Request`)."""

    name: str
    fn: Callable
    params: list[str]
    returns: str
    request: Request | None = None
    side_effects: bool = False
    native: bool = False
    special_nulls: bool = False  # the function sees NULLs itself (otherwise NULL in -> NULL out)
    extra: dict = field(default_factory=dict)

    @property
    def parameters(self) -> list[str]:
        """Every parameter's SQL type, as registered: the data columns, then the request."""
        return list(self.params) + ([self.request.sql_type] if self.request is not None else [])


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


def resolving(cur, database: str, schema: str):
    """``cur`` (a fresh cursor) set to resolve names as the caller does, in its ``database`` and ``schema``; closed
    when that fails."""
    try:
        cur.execute(f"USE {quote(database)}.{quote(schema)}")
    except Exception:
        cur.close()
        raise
    return cur
