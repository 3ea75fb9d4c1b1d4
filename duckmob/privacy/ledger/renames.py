"""A budget follows its table through ``ALTER TABLE ... RENAME``: the budget mark in the table's comment.

A budget key is a table's name (:mod:`duckmob.source.lineage`), so a rename would give the same rows a second,
fresh budget under the new name. DuckDB 2.0 exposes no identity of a table that survives reopening the file:
``duckdb_tables().table_oid`` is handed out again, in catalog order, each time the file is opened (a table renamed
in one session has another oid in the next), and its ``sql`` names the new name. A table's comment does survive
both a rename and a reopen. So declaring a budget marks the table (or the view over files that is the key): its
comment gets ``[duckmob budget: <key>]`` appended (:func:`stamp`; the owner's own comment is kept before it).

The rule, read from the catalog only (never a value): a table whose mark names another key that has a budget is
that table renamed. Its releases are charged to the budget of the key its mark names (and to its own too, when it
also has one: both must fit), and declaring a fresh budget under the new name is refused with a message naming
the key that holds it (:func:`renamed_from`). Replacing the comment removes the mark and, with it, this link: like
a copy (``CREATE TABLE copy AS ...``), that is the data owner's responsibility (docs/threat_model.md).
"""

from __future__ import annotations

import re

from duckmob.source.schema import quote, split_name

_MARK = re.compile(r"\[duckmob budget: (.+?)\]\s*$")


def mark(key: str) -> str:
    """The text a budgeted table's comment ends with."""
    return f"[duckmob budget: {key}]"


def _object(con, key: str) -> tuple[str, str, str, str | None] | None:
    """('TABLE' or 'VIEW', schema, name, comment) of the object the budget key ``key`` names in ``con``'s current
    database; None for a temporary table's key or a name that no longer resolves (dropped, or renamed)."""
    parts = split_name(key)
    if parts[0] == "temp" and len(parts) > 1 or len(parts) > 2:
        return None
    schema, name = ("main", parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    rows = con.execute(
        "SELECT 'TABLE', comment FROM duckdb_tables() WHERE database_name = current_database() AND NOT temporary "
        "AND schema_name = $s AND table_name = $n UNION ALL SELECT 'VIEW', comment FROM duckdb_views() WHERE "
        "database_name = current_database() AND NOT temporary AND NOT internal AND schema_name = $s AND "
        "view_name = $n", {"s": schema, "n": name}).fetchall()
    return (rows[0][0], schema, name, rows[0][1]) if rows else None


def renamed_from(con, key: str) -> str | None:
    """The budget key that the mark of ``key``'s table names when it is another one (the table was renamed from
    it), else None."""
    found = _object(con, key)
    named = _MARK.search(found[3] or "") if found else None
    return named.group(1) if named and named.group(1) != key else None


def stamp(con, key: str) -> None:
    """Append :func:`mark` of ``key`` to the comment of the table or view ``key`` names (nothing when it already
    ends with it, or the key names no object of this database: a temporary table, a name no longer there)."""
    found = _object(con, key)
    if found is None:
        return
    kind, schema, name, comment = found
    kept = _MARK.sub("", comment or "").rstrip()
    text = f"{kept} {mark(key)}" if kept else mark(key)
    if text != (comment or ""):
        con.execute(f"COMMENT ON {kind} {quote(schema)}.{quote(name)} IS '{text.replace(chr(39), chr(39) * 2)}'")


__all__ = ["mark", "renamed_from", "stamp"]
