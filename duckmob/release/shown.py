"""What the ledger shows: the budgets (``mob_budget()``, :func:`duckmob.budgets`) and the releases
(``mob_ledger()``, :func:`duckmob.releases`), read once here for SQL and Python alike.

The ledger is verified first, as a release verifies it (:func:`duckmob.privacy.ledger.shown_budgets`,
``shown_releases``): a tampered ledger is refused with the LedgerTampered message a release would get, never shown
as a clean one. Read under the database's lock, which guards what this process last verified.
"""

from __future__ import annotations

import pyarrow as pa

from duckmob.privacy import ledger
from duckmob.release.protocol import read_ledger
from duckmob.release.registry import Database

BUDGETS_SCHEMA = pa.schema([("source", pa.string()), ("eps", pa.float64()), ("delta", pa.float64()),
                            ("spent", pa.float64()), ("remaining", pa.float64()), ("releases", pa.int64()),
                            ("declared_at", pa.timestamp("us"))])
LEDGER_SCHEMA = pa.schema([("id", pa.int64()), ("recorded_at", pa.timestamp("us")), ("source", pa.string()),
                           ("mechanism", pa.string()), ("epsilon", pa.float64()), ("delta", pa.float64()),
                           ("privacy_unit", pa.string()), ("params", pa.string()), ("event", pa.string()),
                           ("seeded", pa.bool_()), ("status", pa.string())])


def budgets(db: Database) -> pa.Table:
    """One row per source: its latest budget, what is spent, what remains, how many releases were recorded."""
    return _shown(db, ledger.shown_budgets, BUDGETS_SCHEMA)


def releases(db: Database) -> pa.Table:
    """Every recorded release, oldest first (params and event as JSON text)."""
    return _shown(db, ledger.shown_releases, LEDGER_SCHEMA)


def _shown(db: Database, read, schema: pa.Schema) -> pa.Table:
    with db.lock:
        rows = read_ledger(db, lambda cur: read(cur, db.verified))
    return pa.Table.from_pylist(rows, schema=schema)


__all__ = ["BUDGETS_SCHEMA", "LEDGER_SCHEMA", "budgets", "releases"]
