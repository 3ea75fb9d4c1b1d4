"""Tamper evidence for the ledger's rows: seals, hash chains and fingerprints.

Every ledger row carries a seal (:func:`seal`: SHA-256 of its other columns in a fixed, type-normalised text
form). The rows in id order are chained (:func:`link`: each link is the SHA-256 of the previous link and the
row's seal, from :data:`GENESIS`), and so are the budget declarations in ``seq`` order (over ``seq``, source, eps
and delta: ``declared_at`` is shown, not checked, since the order is the sequence's). The links are computed, not
stored: a chain stored in the rows would have to be rewritten after every update of an earlier row. The end of
both chains is kept outside the database, in the head file (:mod:`duckmob.privacy.ledger.headfile`).

A fingerprint is DuckDB's ``hash`` of all a row's columns, seal included (:data:`FINGERPRINT`): what the
incremental checks (:mod:`duckmob.privacy.ledger.state`) remember of each row to see an edit with one aggregate
query. What this protects against and what it does not: docs/threat_model.md.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime

from duckmob.errors import BudgetError
from duckmob.privacy.ledger.schema import BUDGET_COLUMNS, COLUMNS

# The link before the first row of a chain.
GENESIS = bytes(32)


class LedgerTampered(BudgetError):
    """The ledger no longer holds every release made under a declared budget: releases are refused."""


def seal(row: dict) -> str:
    """SHA-256 of a ledger row's columns other than the seal (a fixed, type-normalised text form)."""
    return _digest(row, COLUMNS)


def budget_seal(row: dict) -> str:
    """SHA-256 of a budget declaration's ``seq``, source, eps and delta (the same text form)."""
    return _digest(row, BUDGET_COLUMNS)


def _digest(row: dict, columns: list[str]) -> str:
    parts = []
    for col in columns:
        v = row[col]
        if isinstance(v, float):
            v = repr(v)
        elif isinstance(v, datetime):
            v = v.isoformat()
        elif col in ("params", "event") and v is not None:
            v = json.dumps(json.loads(v), sort_keys=True, separators=(",", ":"))
        parts.append(f"{col}={v}")
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


def link(previous: bytes, seal: str) -> bytes:
    """The next link of a hash chain: SHA-256 of the previous link and the row's seal."""
    return hashlib.sha256(previous + seal.encode()).digest()


# DuckDB's hash of every column of a ledger row, seal included, and of a declaration's checked columns: what a
# :class:`Verified` remembers of each.
FINGERPRINT = f"hash({', '.join(COLUMNS)}, seal)"
BUDGET_FINGERPRINT = f"hash({', '.join(BUDGET_COLUMNS)})"


def tampered_rows() -> LedgerTampered:
    """The refusal when ledger ids are missing (rows deleted)."""
    return LedgerTampered("rows were deleted from duckmob_ledger (its ids are no longer 1, 2, ... up to the last "
                          "one handed out): the spent budget cannot be known. Restore the database from a backup; "
                          "releases are refused until then")


def tampered_row(ledger_id: int) -> LedgerTampered:
    """The refusal when ledger row ``ledger_id`` no longer matches its seal or what was verified of it."""
    return LedgerTampered(f"ledger row {ledger_id} was edited after it was recorded (its seal, or what this "
                          "process verified of it, no longer matches): the spent budget cannot be trusted. Restore "
                          "the database from a backup; releases are refused until then")


def tampered_budget(what: str) -> LedgerTampered:
    """The refusal when budget declarations changed (``what`` says how)."""
    return LedgerTampered(f"{what} in duckmob_budget after this process verified it: the declared budgets cannot "
                          "be trusted. Restore the database from a backup; releases are refused until then")


__all__ = ["GENESIS", "LedgerTampered", "seal", "budget_seal", "link", "FINGERPRINT", "BUDGET_FINGERPRINT",
           "tampered_rows", "tampered_row", "tampered_budget"]
