"""The ledger's tables and sequences, created in the user's own database, and its rows as they are read back.

Objects (created together by :func:`create`, in the connection's default schema):

- ``duckmob_budget(seq, source, eps, delta, declared_at)``: every declaration, append-only; a source's budget is
  its row with the highest ``seq`` (a sequence, not the clock: a row with a future ``declared_at`` shadows
  nothing). Raising a budget is allowed and stays visible as history; lowering it below what is spent is refused.
- ``duckmob_ledger(id, recorded_at, source, mechanism, epsilon, delta, privacy_unit, params JSON, event JSON,
  seeded, status, seal)``: one row per release. ``id`` comes from the sequence ``duckmob_ledger_id``, so ids are
  unique and contiguous from 1. ``status`` is ``reserved`` (in progress: it already counts as spent), ``spent``,
  ``failed`` (failed or interrupted after the data was read: it counts as spent) or ``cancelled`` (refused
  before any data was read: it counts as nothing). ``event`` is the accounting event
  (``duckmob.privacy.accounting``); ``epsilon`` is that release's own epsilon at the budget's delta, for
  reading. ``seeded`` marks releases made with an explicit seed ("seeded, not for release"). ``seal`` is a
  SHA-256 of the row's other columns (:mod:`duckmob.privacy.ledger.seals`).
- the sequences ``duckmob_ledger_id`` and ``duckmob_budget_seq``.

Whether and when they are created, and the upgrade of an older duckmob's ledger, is
:func:`duckmob.privacy.ledger.integrity.ensure_tables`'s.
"""

from __future__ import annotations

from datetime import datetime, timezone

BUDGET = "duckmob_budget"
LEDGER = "duckmob_ledger"
LEDGER_SEQ = "duckmob_ledger_id"
BUDGET_SEQ = "duckmob_budget_seq"
STATUSES = ("reserved", "spent", "failed", "cancelled")
COLUMNS = ["id", "recorded_at", "source", "mechanism", "epsilon", "delta", "privacy_unit", "params", "event",
            "seeded", "status"]
# What a budget declaration's seal covers (declared_at is shown, not checked: the order is the sequence's).
BUDGET_COLUMNS = ["seq", "source", "eps", "delta"]
OBJECTS = (("the table", LEDGER), ("the sequence", LEDGER_SEQ), ("the table", BUDGET), ("the sequence", BUDGET_SEQ))


def present(con) -> tuple[set, set]:
    """(the ledger's tables, its sequences) that exist in the current schema."""
    tables = {r[0] for r in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = current_schema() AND table_name IN (?, ?)", [BUDGET, LEDGER]).fetchall()}
    seqs = {r[0] for r in con.execute(
        "SELECT sequence_name FROM duckdb_sequences() WHERE database_name = current_database() "
        "AND schema_name = current_schema() AND sequence_name IN (?, ?)", [LEDGER_SEQ, BUDGET_SEQ]).fetchall()}
    return tables, seqs


def create(con) -> None:
    """Create the ledger's sequences and tables (in a database that has none of them)."""
    con.execute(f"CREATE SEQUENCE IF NOT EXISTS {LEDGER_SEQ} START 1")
    con.execute(f"CREATE SEQUENCE IF NOT EXISTS {BUDGET_SEQ} START 1")
    con.execute(f"""CREATE TABLE IF NOT EXISTS {BUDGET} (
            seq BIGINT NOT NULL, source VARCHAR NOT NULL, eps DOUBLE NOT NULL, delta DOUBLE NOT NULL,
            declared_at TIMESTAMP NOT NULL)""")
    con.execute(f"""CREATE TABLE IF NOT EXISTS {LEDGER} (
            id BIGINT NOT NULL, recorded_at TIMESTAMP NOT NULL, source VARCHAR NOT NULL, mechanism VARCHAR NOT NULL,
            epsilon DOUBLE, delta DOUBLE, privacy_unit VARCHAR, params JSON, event JSON NOT NULL,
            seeded BOOLEAN NOT NULL, status VARCHAR NOT NULL, seal VARCHAR NOT NULL)""")


def has_column(con, table: str, column: str) -> bool:
    """Whether ``table`` of the current schema has ``column``."""
    return con.execute("SELECT count(*) FROM duckdb_columns() WHERE database_name = current_database() AND "
                       "schema_name = current_schema() AND table_name = ? AND column_name = ?",
                       [table, column]).fetchall()[0][0] > 0


def has_tables(con) -> bool:
    """Whether the ledger's tables exist (without creating them)."""
    return present(con)[0] == {BUDGET, LEDGER}


def releases(con) -> list[dict]:
    """Every recorded release, oldest first, read unverified (``mob_ledger()`` shows
    :func:`duckmob.privacy.ledger.shown_releases`, verified first)."""
    if not has_tables(con):
        return []
    rows = con.execute(f"SELECT {', '.join(COLUMNS)} FROM {LEDGER} ORDER BY id").fetchall()
    return [dict(zip(COLUMNS, r)) for r in rows]


def release_row(con, ledger_id: int) -> dict | None:
    """One ledger row by id (None when absent)."""
    if not has_tables(con):
        return None
    rows = con.execute(f"SELECT {', '.join(COLUMNS)} FROM {LEDGER} WHERE id = ?", [int(ledger_id)]).fetchall()
    return dict(zip(COLUMNS, rows[0])) if rows else None


def now() -> datetime:
    """The current UTC time, naive (what the TIMESTAMP columns hold)."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


__all__ = ["BUDGET", "LEDGER", "LEDGER_SEQ", "BUDGET_SEQ", "STATUSES", "COLUMNS", "BUDGET_COLUMNS", "OBJECTS",
           "present", "create", "has_column", "has_tables", "releases", "release_row", "now"]
