"""The input of a release, resolved once before anything is reserved, so that each release is written once.

Two kinds, chosen in one place by the caller (the SQL layer from the path its statement was planned with, the
Python API always the first):

- :class:`Relation`: a DuckDB table, view or query read out of core on a connection after the reservation: the
  caller's own (the Python API: it sees its temporary tables) or a cursor of the release core's connection set to
  the caller's database and schema (SQL: a UDF cannot use the calling connection);
- :class:`Gathered`: the rows a SQL macro gathered from the caller's temporary table (a callable giving them when
  the release reads them).

Either is checked on what needs no row when it is made (the caller's catalog for shadowing temporary objects, the
relation's lineage and column types from its plan and schema, :func:`duckmob.source.table.prepare`; or the gathered
columns' types and the temporary table's budget key) and then gives every release the same things: its budget key
(``source``), whether it has a user column, its stability check, the connection its public roads are read on, the
content version a repeated request is recognised by, and its rows in the release's shape -- points (a
:class:`~duckmob.source.PointSource`), the exact count of (traj_id, user_id) pairs, or cell sequences.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable

import pyarrow as pa

from duckmob.errors import DuckmobError
from duckmob.privacy.unit import PrivacyUnit
from duckmob.release.registry import Database
from duckmob.source import ArrowSource, PointSource, lineage
from duckmob.source.schema import Mapping, check_ids, check_points
from duckmob.source.table import (TableSource, content_version, count_query, grouped_sequences, pair_count, prepare,
                                  read_sequences, sequence_arrays, table_version)

# The contract's columns of each shape, in the order a macro gathers their types.
COLUMNS = {"points": ("traj_id", "user_id", "ts", "lat", "lon"), "ids": ("traj_id", "user_id"),
           "sequences": ("traj_id", "user_id", "cells")}


def home(db: Database) -> str:
    """The database whose ledger the release core keeps (its own connection's default database)."""
    with db.connection() as cur:
        return lineage.home(cur)


def check_shadowing(relation: str, temporary: list[str] | None, con=None) -> None:
    """Refuse (before anything is reserved) a relation that mentions one of the caller's temporary tables or
    views while it is read on another connection (``con``, which also finds those names in the views the relation
    reads), where that name means another object."""
    name = lineage.shadowing(relation, temporary, con)
    if name is not None:
        raise DuckmobError(f"duckmob: a temporary table or view named '{name}' hides the table or view of that name "
                           f"that {relation} reads: rename the temporary one (or drop it), then release again")


def _temporary(con) -> list[str]:
    return [r[0] for r in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE temporary UNION ALL "
        "SELECT view_name FROM duckdb_views() WHERE temporary AND NOT internal").fetchall()]


def _committed_shadowed(con, relation: str) -> None:
    """The Python API's shadowing check on the caller's connection: a temporary object that the relation mentions
    and that has the name of a committed one."""
    names = {n.lower() for n in _temporary(con)}
    committed = {r[0].lower() for r in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE NOT temporary UNION ALL "
        "SELECT view_name FROM duckdb_views() WHERE NOT temporary AND NOT internal").fetchall()}
    check_shadowing(relation, sorted(names & committed))


def gathered_key(relation: str, temp_tables: list[str] | None) -> str:
    """The budget key of rows a macro gathered on the caller's connection: its temporary table's, or a refusal."""
    key = lineage.temp_table_key(str(relation), temp_tables)
    if key is None:
        raise DuckmobError(f"duckmob: {relation} is a CTE, a temporary view, a query over temporary tables or a "
                           "table not committed yet: duckmob cannot see from SQL which tables it reads, so it cannot "
                           "charge their budgets (COMMIT a new table first). "
                           "Release from a table, a committed view or a parenthesised query over them, from a "
                           "temporary table by its name, or call duckmob.synthesize(con, ...) from Python, which "
                           "reads through your own connection")
    return key


class Input:
    """The input of one release (see the module docstring). ``relation``: the name or query the caller gave (quoted
    by refusals); ``source``: the budget key of the base tables it reads; ``sensitive``: those tables' keys (a
    public road network may read none of them); ``select`` and ``identity``: what, besides ``source`` and the
    request, tells one input from another for :class:`~duckmob.release.registry.Recent`."""

    relation: str
    source: str
    sensitive: tuple[str, ...]
    has_user: bool
    mapping: Mapping
    select: str = ""
    identity: dict

    @property
    def user_col(self) -> str | None:
        """The table's user column, None when it has none (the user unit and counting users are then refused)."""
        return self.mapping.user_col if self.has_user else None

    def stable(self, declared):
        """The release's stability, checked against what the input's plan can do to one base row."""
        return declared

    def roads_connection(self, db: Database):
        """A context giving the connection a public road network is read on."""
        return db.connection()   # a public table the core's connection reads (committed)

    def version(self) -> tuple[int, int]:
        """The content version of the rows the release would read (:func:`duckmob.source.table.content_version`)."""
        raise NotImplementedError

    def points(self) -> PointSource:
        """The points a fit reads after its reservation (shape 'points')."""
        raise NotImplementedError

    def count(self, what: str, unit: PrivacyUnit) -> int:
        """The exact count a noisy count noises, made after the reservation (shape 'ids')."""
        raise NotImplementedError

    def sequences(self, privacy_unit) -> Callable:
        """What ``counting.transitions`` loads after its reservation (shape 'sequences')."""
        raise NotImplementedError

    def close(self) -> None:
        """Free what the input holds (a cursor it owns); a release closes its input when it is over."""


class Relation(Input):
    """``relation`` read out of core on ``con`` in ``shape`` ('points', 'ids' or 'sequences'), checked when made.
    ``owned``: ``con`` is a cursor opened for this release, closed with the input (also on a refusal here).
    ``caller_checked``: the caller's catalog was checked for shadowing already (SQL)."""

    def __init__(self, db: Database, con, relation: str, mapping: Mapping, *, shape: str, owned: bool = False,
                 caller_checked: bool = False):
        self.con, self.relation, self.mapping, self.owned = con, relation, mapping, owned
        try:
            if not caller_checked:
                _committed_shadowed(con, relation)
            self.prepared = prepare(con, relation, mapping, home=home(db), shape=shape)
        except BaseException:
            self.close()
            raise
        self.source, self.sensitive = self.prepared.lineage.source, self.prepared.lineage.keys
        self.has_user, self.select, self.identity = self.prepared.has_user, self.prepared.select, {}

    def stable(self, declared):
        """Refused, before anything is reserved, when the plan can fan rows out and no stability was declared
        (:func:`duckmob.source.lineage.check_stability`). ``declared`` was checked with the release's arguments."""
        return lineage.check_stability(self.prepared.lineage, declared)

    def roads_connection(self, db: Database):
        return nullcontext(self.con)   # the connection the relation is resolved on

    def version(self) -> tuple[int, int]:
        return content_version(self.con, self.select)

    def points(self) -> PointSource:
        return TableSource(self.con, self.select, owned=self.owned)

    def count(self, what: str, unit: PrivacyUnit) -> int:
        return int(self.con.sql(count_query(self.select, what=what, unit=unit)).fetchall()[0][0])

    def sequences(self, privacy_unit) -> Callable:
        unit = str(privacy_unit or "trajectory").strip().lower()
        return lambda: (lambda: read_sequences(self.con, self.select, unit))   # batches, read out of core

    def close(self) -> None:
        if self.owned:
            self.con.close()


class Gathered(Input):
    """Rows a SQL macro gathered from the caller's temporary table ``relation`` in ``shape``: ``types`` are their
    column types (the schema, checked here), ``rows()`` gives them when the release reads them -- an Arrow table of
    points, (traj_id, user_id) arrays (-1: NULL) or a StructArray of sequences. A relation that is no temporary
    table (a CTE, a temporary view: what it reads cannot be seen from here) is refused."""

    def __init__(self, relation: str, temp_tables: list[str] | None, types, mapping: Mapping, rows: Callable, *,
                 shape: str):
        check = check_points if shape == "points" else check_ids
        self.has_user = check(dict(zip(COLUMNS[shape], types)), mapping)
        self.relation, self.mapping, self.rows, self.shape = relation, mapping, rows, shape
        self.source = gathered_key(relation, temp_tables)
        self.sensitive, self.identity = (self.source,), {"mapping": mapping}
        self._table = None   # the points, once loaded for their version (then read from here by the release)

    def version(self) -> tuple[int, int]:
        if self.shape == "points":
            self._table = self.rows()
            return table_version(self._table)
        if self.shape == "ids":
            return table_version(pa.table(dict(zip(("traj_id", "user_id"), self.rows()))))
        rows = self.rows()
        return (0, 0) if rows is None else table_version(pa.Table.from_struct_array(rows))

    def points(self) -> PointSource:
        return ArrowSource(self.rows if self._table is None else self._table)

    def count(self, what: str, unit: PrivacyUnit) -> int:
        traj, user = self.rows()
        return pair_count(traj, user, what=what, unit=unit)

    def sequences(self, privacy_unit) -> Callable:
        return lambda: sequence_arrays(grouped_sequences(self.rows()))


__all__ = ["Input", "Relation", "Gathered", "home", "check_shadowing", "gathered_key", "COLUMNS"]
