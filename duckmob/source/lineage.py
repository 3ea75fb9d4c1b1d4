"""Whose budget a release draws on: the base tables a relation reads, as DuckDB's own plan names them.

The budget belongs to the data, not to a name: ``'trips'``, ``'TRIPS'``, ``'main.trips'``, ``'"trips"'``, a view
over ``trips`` and ``'(SELECT * FROM trips WHERE ...)'`` all read the base table ``trips``, so they all draw on its
budget. DuckDB's planner resolves names, views, CTEs and subqueries; ``EXPLAIN`` (which reads no row) lists the
tables its scans read. A release draws on the budget of every base table it reads and is refused when one has none.

A budget key names a base table of the database that holds the ledger: ``trips`` (schema main), ``other.trips``
(another schema), ``temp.trips`` (a temporary table of the caller's connection). A table of another attached
database is refused: its budget and ledger live in that database's file. A relation that reads files (a view over
``read_parquet('x.parquet')``, ``FROM 'trips/*.csv'``) draws on the budget of each file, ``file:/real/path``, so
every view, query or spelling over one file shares its budget; one that reads other table functions (``range()``)
needs a named view over them, which is then its own budget key; a query over them without such a view is refused.

Stability: the same plan says, before any row is read, whether one row of a base table can become several rows of
the relation (a join, a union, unnest, a window, an aggregate, a limit: anything but projections, filters and
ordering). Such a release is refused unless the caller declares a public ``stability := s`` (the most rows one base
row becomes), which multiplies every sensitivity (:func:`check_stability`). These are facts about the catalog and
the plan, never about a value.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

import duckdb

from duckmob.errors import DuckmobError
from duckmob.privacy.ledger import join_keys
from duckmob.source.schema import quote, split_name

# plan leaves that read no data of their own: their rows come from elsewhere in the same plan, or from nothing
_NO_DATA = {"DUMMY_SCAN", "EMPTY_RESULT", "CTE_SCAN", "DELIM_SCAN", "CHUNK_SCAN", "RECURSIVE_CTE_SCAN",
            "RECURSIVE_RECURRING_CTE_SCAN", "COLUMN_DATA_SCAN_REFERENCE"}
_SIMPLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# Plan operators through which one base row stays at most one row (stability 1): they only project, rename, cast,
# filter on the row's own values or reorder. Every other inner operator -- joins (semi and anti joins too: one row of
# the other table can admit many), unions, unnest, window functions, aggregates, limits -- can turn one base row into
# several rows or make one row's presence change others: a release over it is refused unless the caller declares a
# public stability (:func:`check_stability`).
_STABLE = {"PROJECTION", "FILTER", "ORDER_BY", "CTE"}


class Unplannable(DuckmobError):
    """The relation cannot be planned: a name that does not exist, a column or syntax error."""


@dataclass(frozen=True)
class Lineage:
    """What a release of ``relation`` reads: the budget keys of its base tables, in order; ``fan_out``: the plan's
    operators that can turn one base row into several (empty: stability 1, known before any read); ``own_key``:
    the key of the view ``relation`` names when that view itself carries the budget (it reads table functions that
    are no files), else None."""

    relation: str
    keys: tuple[str, ...]
    fan_out: tuple[str, ...] = ()
    own_key: str | None = None

    @property
    def source(self) -> str:
        """The ledger's source text: the keys joined (one key: the table's name)."""
        return join_keys(self.keys)


def _part(name: str) -> str:
    return name if _SIMPLE.match(name) else quote(name)


def key(catalog: str, schema: str, table: str, home: str) -> str:
    """The budget key of ``catalog.schema.table`` in the database ``home`` (the one whose ledger is used)."""
    if catalog == "temp":
        return f"temp.{_part(table)}" if schema == "main" else f"temp.{_part(schema)}.{_part(table)}"
    if catalog != home:
        raise DuckmobError(f"duckmob: the table {catalog}.{schema}.{table} lives in the attached database "
                           f"'{catalog}', whose privacy budget and ledger are kept in that database's own file, not in "
                           f"'{home}' where duckmob keeps this connection's ledger: open that file with "
                           "duckmob.connect('...') (or duckmob.register a connection whose database it is) and "
                           "release from there")
    return _part(table) if schema == "main" else f"{_part(schema)}.{_part(table)}"


def _walk(node, tables: list, others: list, operators: list) -> None:
    info = node.get("extra_info") or {}
    table = info.get("Table") if isinstance(info, dict) else None
    children = node.get("children") or []
    name = str(node.get("name") or "").strip()
    if table:
        tables.append(table)
    elif not children and name not in _NO_DATA:
        others.append(name)
    if children and name not in _STABLE:
        join = info.get("Join Type") if isinstance(info, dict) else None
        operators.append(f"{name} ({join} join)" if join else name)
    for child in children:
        _walk(child, tables, others, operators)


def _plan(con, relation: str) -> tuple[list[str], list[str], list[str]]:
    """(tables read, leaves that read no table, operators that can fan rows out) of ``relation``'s plan."""
    try:
        rows = con.execute(f"EXPLAIN (FORMAT JSON) SELECT * FROM {relation}").fetchall()
    except duckdb.Error as exc:
        raise Unplannable(f"duckmob: cannot read {relation}: {_schema_message(exc)}") from None
    tables, others, operators = [], [], []
    for row in rows:
        plan = row[-1]
        for node in json.loads(plan) if isinstance(plan, str) else plan:
            _walk(node, tables, others, operators)
    return tables, others, operators


def check_stability(found: "Lineage", stability: int | None) -> int:
    """The stability of a release over ``found``: the caller's public ``stability`` (how many rows one base row can
    become at most; it multiplies every sensitivity), or 1 when the plan provably keeps one base row one row.
    Refused (before anything is reserved) when the plan can fan rows out and no stability was declared: charging it
    as 1 would let one trajectory of the base table move a release by many trajectories' worth."""
    if stability is not None:
        return int(stability)
    if found.fan_out:
        ops = ", ".join(sorted(set(found.fan_out)))
        raise DuckmobError(f"duckmob: {found.relation} reads its tables through {ops}, which can turn one row of a "
                           "table into several rows (or make one row change others), so one trajectory could count "
                           "several times: release from the table itself or a view that only filters and projects "
                           "it, or declare the most rows one base row can become with stability := s (public; the "
                           "noise grows s-fold and the ledger records it)")
    return 1


def _schema_message(exc: Exception) -> str:
    """DuckDB's message for a relation it cannot plan: binding and catalog errors name objects and columns only
    (planning reads no row)."""
    return str(exc).split("\n")[0]


def _named_object(con, relation: str) -> tuple[str, str, str] | None:
    """(catalog, schema, name) of the table or view ``relation`` names, as this connection resolves it, or None
    for a query."""
    text = relation.strip()
    if text.startswith("("):
        return None
    parts = split_name(text)
    if not all(parts):
        return None
    db, schema = con.execute("SELECT current_database(), current_schema()").fetchall()[0]
    rows = con.execute(
        "SELECT database_name, schema_name, name, temporary FROM (SELECT database_name, schema_name, table_name AS "
        "name, temporary FROM duckdb_tables() UNION ALL SELECT database_name, schema_name, view_name, temporary "
        "FROM duckdb_views() WHERE NOT internal)").fetchall()
    low = [p.lower() for p in parts]
    for c, s, n, temporary in sorted(rows, key=lambda r: not r[3]):   # temporary objects shadow the others
        full = [c.lower(), s.lower(), n.lower()]
        if (len(low) == 1 and low == full[2:] and (temporary or (c == db and s == schema))) or \
                (len(low) == 2 and (low == full[1:] and (temporary or c == db) or low == [full[0], full[2]]
                                    and s == "main")) or \
                (len(low) == 3 and low == full):
            return c, s, n
    return None


def resolve(con, relation: str, home: str) -> Lineage:
    """The :class:`Lineage` of ``relation`` (a table or view name in any spelling, or a parenthesised query) as the
    connection ``con`` sees it, for a ledger kept in database ``home``. Refuses (before any row is read) a relation
    that cannot be planned, one that reads another attached database's tables, and one that reads neither a base
    table nor a named view over files."""
    tables, others, operators = _plan(con, relation)
    # a window over row positions (row_number() OVER ()) or rowid is folded by DuckDB's optimiser into a plain
    # projection, yet makes each row's values depend on the rows around it: found in the texts read instead
    texts = _texts(con, relation)
    words = set().union(*(identifiers(t) for t in texts))
    operators += [w.upper() for w in ("over", "rowid") if w in words]
    keys = [key(*_three(t, con), home) for t in tables]
    own = None
    if others:
        files = _files(con, texts)
        keys.extend(file_key(f) for f in files)
        if not files or any(not _reads_files(o) for o in others):
            named = _named_object(con, relation)
            if named is None:
                raise DuckmobError(f"duckmob: {relation} reads table functions ({', '.join(sorted(set(others)))}) "
                                   "that are not files, so no budget can follow them: create a view over them "
                                   "(CREATE VIEW trips AS ...), declare its budget with mob_set_budget, and release "
                                   "from it")
            own = key(*named, home)
            keys.append(own)
    if not keys:
        raise DuckmobError(f"duckmob: {relation} reads no table: release from the table that holds the trajectories")
    return Lineage(relation, tuple(sorted(set(keys))), tuple(operators), own)


# Plan leaves that scan files (read_parquet, read_csv, read_json, a FROM 'x.parquet', ...): their budget follows the
# files, found by :func:`_files`.
def _reads_files(leaf: str) -> bool:
    return leaf.startswith("READ_") or leaf.endswith("_SCAN")


def file_key(path: str) -> str:
    """The budget key of a file a relation reads: ``file:`` and its real path (links and ``..`` resolved), so every
    view, query or spelling that reads the file draws on one budget."""
    return "file:" + os.path.realpath(path)


def _files(con, texts: list[str]) -> list[str]:
    """The files a relation reads, from ``texts`` (its text and its views', :func:`_texts`): the string literals
    and quoted names that name existing files or globs (expanded by DuckDB's ``glob``, which lists names and reads
    no row). A fact about the catalog and the file system, never about a value of the data."""
    seen, found = set(), set()
    for text in texts:
        for literal in _LITERAL.findall(text):   # a string, or a quoted name (a replacement scan: FROM "x.csv")
            q = literal[0]
            path = literal[1:-1].replace(q + q, q)
            if path in seen:
                continue
            seen.add(path)
            try:
                rows = con.execute("SELECT file FROM glob(?)", [path]).fetchall()
            except duckdb.Error:
                rows = []
            found.update(r[0] for r in rows if os.path.isfile(r[0]))
    return sorted(found)


def _texts(con, relation: str) -> list[str]:
    """``relation``'s text and the definitions of the views it mentions, recursively (as ``con`` sees them)."""
    texts, out = [relation], []
    views = {(r[0].lower(), r[1] or "") for r in con.execute(
        "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal").fetchall()}
    while texts:
        text = texts.pop()
        out.append(text)
        mentioned = identifiers(text)
        for name, sql in list(views):
            if name in mentioned:
                views.discard((name, sql))
                texts.append(sql)
    return out


_LITERAL = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"")


def _three(full: str, con) -> tuple[str, str, str]:
    parts = split_name(full)
    if len(parts) == 3:
        return parts[0], parts[1], parts[2]
    db, schema = con.execute("SELECT current_database(), current_schema()").fetchall()[0]
    return (db, parts[0], parts[1]) if len(parts) == 2 else (db, schema, parts[0])


def home(con) -> str:
    """The database whose ledger ``con`` (the release core's own connection) keeps."""
    return con.execute("SELECT current_database()").fetchall()[0][0]



_TOKEN = re.compile(r'"(?:[^"]|"")*"|[A-Za-z_][A-Za-z0-9_$]*')


def identifiers(relation: str) -> set[str]:
    """The identifiers ``relation`` mentions, unquoted and lower-cased (a superset of the objects it reads)."""
    return {t[1:-1].replace('""', '"').lower() if t.startswith('"') else t.lower() for t in _TOKEN.findall(relation)}


def shadowing(relation: str, temporary: list[str] | None, con=None) -> str | None:
    """The first of the caller's temporary tables or views (``temporary``, their names) that ``relation``
    mentions -- or, with ``con`` (the connection the release reads on), that a view it reads mentions, however
    deep -- or None: a release that reads ``relation`` on another connection would read something else under that
    name than the caller sees, so it is refused. A fact about the catalog, not the data."""
    if not temporary:
        return None
    mentioned = set().union(*(identifiers(t) for t in _texts(con, relation))) if con is not None else \
        identifiers(relation)
    return next((name for name in temporary or [] if name.lower() in mentioned), None)


def temp_table_key(relation: str, temp_tables: list[str] | None) -> str | None:
    """The budget key of the caller's temporary table that ``relation`` names (``tt``, ``temp.tt``,
    ``temp.main.tt``, quoted or not, in any case), or None when it names none."""
    parts = [p.lower() for p in split_name(relation.strip())]
    if len(parts) == 3 and parts[:2] == ["temp", "main"] or len(parts) == 2 and parts[0] == "temp":
        parts = parts[-1:]
    if len(parts) != 1:
        return None
    found = next((t for t in temp_tables or [] if t.lower() == parts[0]), None)
    return None if found is None else f"temp.{_part(found)}"


__all__ = ["Lineage", "Unplannable", "resolve", "key", "file_key", "check_stability", "split_name", "home",
           "identifiers", "shadowing", "temp_table_key"]
