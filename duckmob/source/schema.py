"""The trajectory contract, checked on the schema alone: which columns a release reads and which types they may have.

Every input path (a DuckDB table, view or query read out of core, rows gathered by a macro, a Spark DataFrame)
checks its column types here, from the schema (zero rows), BEFORE a release reserves any budget. A refusal names
columns and types only, never a value, and is the same whether the table is empty or not. Values are then
converted with TRY_CAST (Spark: try_cast): a value that cannot be converted becomes NULL and its point is dropped
by the cleaning, silently, like any other unusable point. No private path holds a cast that can fail on a value.

Columns (the user's names are mapped with ``traj_col := ...`` etc.): ``traj_id`` (integer), ``user_id`` (integer,
optional: a trajectory is the pair (user_id, traj_id), or traj_id alone when the table has no user column),
``ts`` (TIMESTAMP or DATE; epoch seconds and TIMESTAMP WITH TIME ZONE are refused with the conversion to
UTC time to write, :func:`time_fix`), ``lat`` / ``lon`` (numbers, WGS 84 degrees), ``seq`` (optional, orders the points of
a table without time).
"""

from __future__ import annotations

from dataclasses import dataclass

from duckmob.errors import DuckmobError

INTEGER_TYPES = frozenset({"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER",
                           "UBIGINT", "HUGEINT", "UHUGEINT"})
NUMBER_TYPES = INTEGER_TYPES | {"FLOAT", "DOUBLE"}
TIME_TYPES = frozenset({"TIMESTAMP", "TIMESTAMP_S", "TIMESTAMP_MS", "TIMESTAMP_NS", "DATE"})
# the type DuckDB gives a column that is missing (the NULL stand-in of an optional column)
NULL_TYPES = frozenset({"NULL", '"NULL"'})


@dataclass(frozen=True)
class Mapping:
    """The user's column names for the contract's columns (``traj_col := ...`` and so on)."""

    traj_col: str = "traj_id"
    ts_col: str = "ts"
    lat_col: str = "lat"
    lon_col: str = "lon"
    user_col: str = "user_id"
    seq_col: str = "seq"
    cells_col: str = "cells"

    @classmethod
    def of(cls, **names) -> "Mapping":
        """A mapping from keyword arguments (None: the default name); a name must be a non-empty string."""
        out = {}
        for key, value in names.items():
            if value is None:
                continue
            if not isinstance(value, str) or not value.strip():
                raise DuckmobError(f"{key} must name a column (a non-empty string); got {value!r}")
            out[key] = value
        return cls(**out)


def _is_integer(t: str) -> bool:
    return t in INTEGER_TYPES


def _is_number(t: str) -> bool:
    return t in NUMBER_TYPES or t.startswith("DECIMAL")


def _is_time(t: str) -> bool:
    return t in TIME_TYPES


def _refuse(role: str, column: str, param: str, kind: str, t: str, fix: str) -> DuckmobError:
    return DuckmobError(f"duckmob: {role} column {column} has type {t}, not {kind}: {fix}, or name another column "
                        f"with {param} := ...")


def _missing(col: str, name: str, param: str) -> DuckmobError:
    return DuckmobError(f"duckmob: the table has no column {name} for {col} (nor a typed one): name yours with "
                        f"{param} := '...'")


def check_points(types: dict[str, str | None], m: Mapping) -> bool:
    """Refuse a points table whose column types break the contract (``types``: contract column -> DuckDB type
    name as ``typeof`` spells it, None or a NULL type for a column that is missing: refused for traj_id, lat and
    lon, which must exist). Returns whether the table has a user column. The schema only: nothing here looks at a
    value."""
    t = types
    for col, name, param in (("traj_id", m.traj_col, "traj_col"), ("lat", m.lat_col, "lat_col"),
                             ("lon", m.lon_col, "lon_col")):
        if t.get(col) is None or t[col] in NULL_TYPES:
            raise _missing(col, name, param)
    has_user = _check_ids(t, m)
    if t.get("ts") not in NULL_TYPES and t.get("ts") is not None and not _is_time(t["ts"]):
        raise _refuse("time", m.ts_col, "ts_col", "TIMESTAMP", t["ts"], time_fix(t["ts"], m.ts_col))
    for col, name in (("lat", m.lat_col), ("lon", m.lon_col)):
        if not _is_number(t[col]):
            role = "latitude" if col == "lat" else "longitude"
            raise _refuse(role, name, f"{col}_col", "a number", t[col], f"cast it with {name}::DOUBLE (WGS 84 degrees)")
    return has_user


def time_fix(t: str, column: str) -> str:
    """How to turn a time column of type ``t`` into a TIMESTAMP the contract accepts (what a refusal suggests).

    Epoch seconds (a number) and a TIMESTAMP WITH TIME ZONE become their UTC time, ``AT TIME ZONE 'UTC'``: a plain
    cast of a TIMESTAMPTZ (and ``to_timestamp``, which returns one) would take the session's TimeZone setting, so
    the same table would be read as other hours on another machine. TIMESTAMPTZ itself is refused for that reason."""
    if _is_number(t):
        return f"convert epoch seconds to UTC time, e.g. to_timestamp({column}) AT TIME ZONE 'UTC'"
    if t.startswith("TIMESTAMP WITH TIME ZONE") or t == "TIMESTAMPTZ":
        return f"take its UTC time, e.g. {column} AT TIME ZONE 'UTC'"
    return f"cast it, e.g. {column}::TIMESTAMP"


def _check_ids(t: dict[str, str | None], m: Mapping) -> bool:
    """The trajectory id (present) and the user id (optional) are integers; whether there is a user column."""
    if not _is_integer(t["traj_id"]):
        raise _refuse("trajectory id", m.traj_col, "traj_col", "an integer", t["traj_id"],
                      f"number the trajectories, e.g. dense_rank() OVER (ORDER BY {m.traj_col})")
    user = t.get("user_id")
    if user is None or user in NULL_TYPES:
        return False
    if not _is_integer(user):
        raise _refuse("user id", m.user_col, "user_col", "an integer", user,
                      f"number the users, e.g. dense_rank() OVER (ORDER BY {m.user_col})")
    return True


def check_ids(types: dict[str, str | None], m: Mapping) -> bool:
    """Refuse a table of trajectories (one row each: traj_id, user_id and, when ``types`` has it, cells) whose id or
    cell types break the contract; returns whether it has a user column. The schema only."""
    if types.get("traj_id") is None or types["traj_id"] in NULL_TYPES:
        raise _missing("traj_id", m.traj_col, "traj_col")
    if types.get("cells") in NULL_TYPES:
        raise _missing("cells", m.cells_col, "cells_col")
    has_user = _check_ids(types, m)
    cells = types.get("cells", "BIGINT[]")
    if not (cells.endswith("[]") and _is_integer(cells[:-2])):
        raise DuckmobError(f"duckmob: cells column {m.cells_col} has type {cells}, not a list of integer cell ids "
                           "(the cells of mob_cell_sequences): name it with cells_col := ...")
    return has_user


# -- the SQL every DuckDB path reads ----------------------------------------------------------------------------

def quote(name: str) -> str:
    """An identifier quoted for DuckDB."""
    return '"' + name.replace('"', '""') + '"'


def literal(text) -> str:
    """A SQL string literal (NULL for None)."""
    return "NULL" if text is None else "'" + str(text).replace("'", "''") + "'"


def resolve_columns(columns: list[str], m: Mapping, *, what: tuple[str, ...]) -> dict[str, str | None]:
    """The table's own column names for the contract's columns ``what`` (case-insensitive, as DuckDB resolves
    identifiers), None for a missing optional one (user_id, seq, ts). A missing required column is refused, naming
    the mapping parameter and the table's columns (schema, not data)."""
    by_lower = {c.lower(): c for c in columns}
    out: dict[str, str | None] = {}
    for col in what:
        param = {"traj_id": "traj_col", "user_id": "user_col", "ts": "ts_col", "lat": "lat_col", "lon": "lon_col",
                 "seq": "seq_col", "cells": "cells_col"}[col]
        name = getattr(m, param)
        found = by_lower.get(name.lower())
        if found is None and col in ("user_id", "seq"):
            out[col] = None
            continue
        if found is None:
            listed = ", ".join(columns[:20]) + (", ..." if len(columns) > 20 else "")
            raise DuckmobError(f"duckmob: the table has no column {name} for {col}: name yours with {param} := "
                               f"'...' (its columns: {listed})")
        out[col] = found
    return out


def split_name(text: str) -> list[str]:
    """The parts of a dotted, possibly quoted identifier (``memory."My S".t`` -> ['memory', 'My S', 't'])."""
    parts, cur, quoted, i = [], [], False, 0
    while i < len(text):
        ch = text[i]
        if quoted:
            if ch == '"' and text[i + 1:i + 2] == '"':
                cur.append('"')
                i += 1
            elif ch == '"':
                quoted = False
            else:
                cur.append(ch)
        elif ch == '"':
            quoted = True
        elif ch == ".":
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    parts.append("".join(cur))
    return parts


def select_sql(table_sql: str, names: dict[str, str | None]) -> str:
    """``SELECT`` of the contract's columns from ``table_sql`` (a relation: a name or a parenthesised query), every
    value converted with TRY_CAST (NULL when it cannot be converted: the cleaning drops that point); a missing
    optional column is NULL."""
    target = {"traj_id": "BIGINT", "user_id": "BIGINT", "ts": "TIMESTAMP", "lat": "DOUBLE", "lon": "DOUBLE",
              "seq": "BIGINT", "cells": "BIGINT[]"}
    parts = [f"TRY_CAST({quote(src)} AS {target[col]}) AS {col}" if src is not None else
             f"NULL::{target[col]} AS {col}" for col, src in names.items()]
    return f"SELECT {', '.join(parts)} FROM {table_sql}"



__all__ = ["Mapping", "split_name", "check_points", "time_fix", "check_ids", "resolve_columns", "select_sql", "quote", "literal",
           "INTEGER_TYPES", "NUMBER_TYPES", "TIME_TYPES", "NULL_TYPES"]
