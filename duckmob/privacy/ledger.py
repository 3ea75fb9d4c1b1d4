"""The privacy ledger: per-source budgets and a record of every release, kept in the user's own database.

Objects (created together by :func:`ensure_tables`, in the connection's default schema):

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
  SHA-256 of the row's other columns.
- the sequences ``duckmob_ledger_id`` and ``duckmob_budget_seq``.

Spent = ``accounting.epsilon(compose(events of every row not cancelled), budget delta)``.

Protocol (``duckmob.release`` is the one caller): under the database's lock, :func:`prior` reads the budget and
the other releases (checking the ledger's integrity), :func:`check` refuses a spend that would exceed the
budget, :func:`reserve` inserts a ``reserved`` row, all before any data is read and on the release core's own
connection (never inside the caller's transaction); :func:`settle` replaces a reserved event by the one a
method actually plans (checked again), and :func:`finish` closes the row.

Threat model. The ledger protects the data owner from spending more than the declared budget by mistake,
including through concurrent releases (threads, one statement with several releases), failures and interrupts
after the data was read (the reservation stands), a ROLLBACK of the caller's transaction (the ledger is written
on its own connection and committed at once: ROLLBACK undoes neither a spend nor a budget declaration), and a
silent reset: deleting or editing ledger rows, or dropping the ledger table or its sequence, while a budget is
declared is detected and every further release of every source refused. It is NOT a security boundary: whoever
can write the database file can recompute the seals, drop every duckmob object at once (the database then looks
new), run another tool on the raw table, or call the numpy functions directly. The budget is per source NAME:
the same data under two names (a copy, a view) has two budgets, and two different tables under one name share
one; releases over a derived table (a filter, a join) are charged to the name given. The privacy unit is
recorded per release; composing releases made with different units is the data owner's responsibility.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone

from duckmob.errors import BudgetError, DuckmobError
from duckmob.privacy import accounting
from duckmob.privacy.accounting import Event
from duckmob.validators import delta_value, positive, source_name

BUDGET = "duckmob_budget"
LEDGER = "duckmob_ledger"
LEDGER_SEQ = "duckmob_ledger_id"
BUDGET_SEQ = "duckmob_budget_seq"
STATUSES = ("reserved", "spent", "failed", "cancelled")
# Spends are compared with a tolerance: the PLD epsilon is a floating-point estimate.
_SLACK = 1e-9
_COLUMNS = ["id", "recorded_at", "source", "mechanism", "epsilon", "delta", "privacy_unit", "params", "event",
            "seeded", "status"]


class LedgerTampered(BudgetError):
    """The ledger no longer holds every release made under a declared budget: releases are refused."""


@dataclass(frozen=True)
class Prior:
    """What a new release of ``source`` composes with: the budget and every other release not cancelled."""

    source: str
    eps: float
    delta: float
    events: tuple

    def spent(self) -> float:
        return accounting.epsilon(accounting.compose(list(self.events)), self.delta)

    def fits(self, event: Event) -> bool:
        after = accounting.epsilon(accounting.compose(list(self.events) + [event]), self.delta)
        return after <= self.eps + _SLACK


# -- tables ---------------------------------------------------------------------------------------------------

def _present(con) -> tuple[set, set]:
    tables = {r[0] for r in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = current_schema() AND table_name IN (?, ?)", [BUDGET, LEDGER]).fetchall()}
    seqs = {r[0] for r in con.execute(
        "SELECT sequence_name FROM duckdb_sequences() WHERE database_name = current_database() "
        "AND schema_name = current_schema() AND sequence_name IN (?, ?)", [LEDGER_SEQ, BUDGET_SEQ]).fetchall()}
    return tables, seqs


def ensure_tables(con) -> None:
    """Create the ledger's tables and sequences when the database has none of them (idempotent; writes nothing
    when they exist, so a read-only database with a ledger works). A database whose ledger was written by an
    older duckmob (no sequences) is upgraded once. A partial set left by a reset is not recreated: it is
    reported by :func:`verify` instead."""
    tables, seqs = _present(con)
    if tables == {BUDGET, LEDGER} and seqs == {LEDGER_SEQ, BUDGET_SEQ}:
        return
    if not tables and not seqs:
        con.execute(f"CREATE SEQUENCE IF NOT EXISTS {LEDGER_SEQ} START 1")
        con.execute(f"CREATE SEQUENCE IF NOT EXISTS {BUDGET_SEQ} START 1")
        con.execute(f"""CREATE TABLE IF NOT EXISTS {BUDGET} (
            seq BIGINT NOT NULL, source VARCHAR NOT NULL, eps DOUBLE NOT NULL, delta DOUBLE NOT NULL,
            declared_at TIMESTAMP NOT NULL)""")
        con.execute(f"""CREATE TABLE IF NOT EXISTS {LEDGER} (
            id BIGINT NOT NULL, recorded_at TIMESTAMP NOT NULL, source VARCHAR NOT NULL, mechanism VARCHAR NOT NULL,
            epsilon DOUBLE, delta DOUBLE, privacy_unit VARCHAR, params JSON, event JSON NOT NULL,
            seeded BOOLEAN NOT NULL, status VARCHAR NOT NULL, seal VARCHAR NOT NULL)""")
        return
    if tables == {BUDGET, LEDGER} and not seqs and not _has_column(con, LEDGER, "seal"):
        _upgrade(con)


def _has_column(con, table: str, column: str) -> bool:
    return con.execute("SELECT count(*) FROM duckdb_columns() WHERE database_name = current_database() AND "
                       "schema_name = current_schema() AND table_name = ? AND column_name = ?",
                       [table, column]).fetchall()[0][0] > 0


def _upgrade(con) -> None:
    """A ledger from before sequences and seals: number budget rows in their old (time, insertion) order, mark
    every release spent, seal the rows and start the sequences after them."""
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(f"ALTER TABLE {BUDGET} ADD COLUMN seq BIGINT")
        con.execute(f"UPDATE {BUDGET} SET seq = o.n FROM (SELECT rowid AS r, row_number() OVER "
                    f"(ORDER BY declared_at, rowid) AS n FROM {BUDGET}) o WHERE {BUDGET}.rowid = o.r")
        con.execute(f"ALTER TABLE {LEDGER} ADD COLUMN status VARCHAR DEFAULT 'spent'")
        con.execute(f"ALTER TABLE {LEDGER} ADD COLUMN seal VARCHAR")
        con.execute(f"UPDATE {LEDGER} SET id = o.n FROM (SELECT rowid AS r, row_number() OVER (ORDER BY id, rowid) "
                    f"AS n FROM {LEDGER}) o WHERE {LEDGER}.rowid = o.r")
        for row in con.execute(f"SELECT {', '.join(_COLUMNS)} FROM {LEDGER}").fetchall():
            con.execute(f"UPDATE {LEDGER} SET status = 'spent', seal = ? WHERE id = ?",
                        [_seal(dict(zip(_COLUMNS, row[:-1]), status="spent")), row[0]])
        n_ledger = con.execute(f"SELECT count(*) FROM {LEDGER}").fetchall()[0][0]
        n_budget = con.execute(f"SELECT count(*) FROM {BUDGET}").fetchall()[0][0]
        con.execute(f"CREATE SEQUENCE {LEDGER_SEQ} START {n_ledger + 1}")
        con.execute(f"CREATE SEQUENCE {BUDGET_SEQ} START {n_budget + 1}")
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise


def has_tables(con) -> bool:
    """Whether the ledger's tables exist (without creating them)."""
    return _present(con)[0] == {BUDGET, LEDGER}


# -- integrity ------------------------------------------------------------------------------------------------

def _seal(row: dict) -> str:
    """SHA-256 of a ledger row's columns other than the seal (a fixed, type-normalised text form)."""
    parts = []
    for col in _COLUMNS:
        v = row[col]
        if isinstance(v, float):
            v = repr(v)
        elif isinstance(v, datetime):
            v = v.isoformat()
        elif col in ("params", "event") and v is not None:
            v = json.dumps(json.loads(v), sort_keys=True, separators=(",", ":"))
        parts.append(f"{col}={v}")
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


def _handed_out(con) -> int:
    """How many ledger ids the sequence has handed out (0 when none)."""
    row = con.execute("SELECT last_value, start_value FROM duckdb_sequences() WHERE database_name = "
                      "current_database() AND schema_name = current_schema() AND sequence_name = ?",
                      [LEDGER_SEQ]).fetchall()
    if not row:
        return 0
    last, start = row[0]
    return int(last) if last is not None else int(start) - 1  # an unused sequence starts after the ids it owns


def verify(con) -> None:
    """Refuse (LedgerTampered, saying what happened) when the ledger lost or changed a release.

    Checked: the budget table, ledger table and both sequences exist together (or none does); the ledger ids are
    exactly 1 .. the number the sequence handed out (a DELETE leaves a gap or a short tail); every row's seal
    matches its columns (an UPDATE of a spend is seen).
    """
    tables, seqs = _present(con)
    if not tables and not seqs:
        return
    if BUDGET in tables and (LEDGER not in tables or LEDGER_SEQ not in seqs):
        missing = "the table duckmob_ledger" if LEDGER not in tables else "the sequence duckmob_ledger_id"
        raise LedgerTampered(f"{missing} was dropped while a privacy budget is declared: the record of earlier "
                             "releases is lost, so no spend can be checked. Restore the database from a backup "
                             "taken before the drop; releases are refused until then")
    if LEDGER not in tables:
        return
    rows = con.execute(f"SELECT {', '.join(_COLUMNS)}, seal FROM {LEDGER} ORDER BY id").fetchall()
    ids = [r[0] for r in rows]
    if ids != list(range(1, len(ids) + 1)) or len(ids) != _handed_out(con):
        raise LedgerTampered("rows were deleted from duckmob_ledger (its ids are no longer 1, 2, ... up to the "
                             "last one handed out): the spent budget cannot be known. Restore the database from "
                             "a backup; releases are refused until then")
    for r in rows:
        if r[-1] != _seal(dict(zip(_COLUMNS, r[:-1]))):
            raise LedgerTampered(f"ledger row {r[0]} was edited after it was recorded (its seal does not match): "
                                 "the spent budget cannot be trusted. Restore the database from a backup; "
                                 "releases are refused until then")


# -- reading --------------------------------------------------------------------------------------------------

def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def budget(con, source: str) -> tuple[float, float] | None:
    """The declared (eps, delta) of ``source`` (its latest declaration by sequence), or None."""
    source = source_name(source)
    if not has_tables(con):
        return None
    rows = con.execute(f"SELECT eps, delta FROM {BUDGET} WHERE source = ? ORDER BY seq DESC LIMIT 1",
                       [source]).fetchall()
    return (float(rows[0][0]), float(rows[0][1])) if rows else None


def events(con, source: str, exclude: int | None = None) -> list[Event]:
    """Every release of ``source`` that counts (not cancelled), in order, leaving out the row ``exclude``."""
    source = source_name(source)
    if not has_tables(con):
        return []
    rows = con.execute(f"SELECT event FROM {LEDGER} WHERE source = ? AND status <> 'cancelled' AND id <> ? "
                       "ORDER BY id", [source, -1 if exclude is None else int(exclude)]).fetchall()
    return [Event.from_json(r[0]) for r in rows]


def spent(con, source: str, delta: float | None = None) -> float:
    """Epsilon spent on ``source`` so far (reserved releases included), composed at ``delta`` (default: the
    declared budget's)."""
    if delta is None:
        declared = budget(con, source)
        delta = declared[1] if declared else 0.0
    return accounting.epsilon(accounting.compose(events(con, source)), delta)


def _no_budget(source: str) -> BudgetError:
    return BudgetError(f"no privacy budget declared for '{source}': run FROM mob_set_budget('{source}', "
                       "eps := ..., delta := ...) first")


def prior(con, source: str, exclude: int | None = None) -> Prior:
    """The budget of ``source`` and the releases a new one composes with; refuses a source with no budget and
    a tampered ledger (:func:`verify`)."""
    source = source_name(source)
    verify(con)
    declared = budget(con, source)
    if declared is None:
        raise _no_budget(source)
    return Prior(source, declared[0], declared[1], tuple(events(con, source, exclude)))


def check(prior_or_con, source_or_event, event: Event | None = None) -> None:
    """Refuse (BudgetError, saying what to run) if the release ``event`` would take the source past its budget.

    ``check(prior, event)``, or ``check(con, source, event)`` which reads the prior first. Writes nothing.
    """
    if isinstance(prior_or_con, Prior):
        p, event = prior_or_con, source_or_event
    else:
        p = prior(prior_or_con, source_or_event)
    if not isinstance(event, Event):
        raise DuckmobError(f"check takes a privacy event; got {type(event).__name__}")
    if p.fits(event):
        return
    before = p.spent()
    after = accounting.epsilon(accounting.compose(list(p.events) + [event]), p.delta)
    need = "" if math.isinf(after) else f" (total {after:.6g})"
    raise BudgetError(
        f"privacy budget of '{p.source}' exceeded: eps {before:.6g} of {p.eps:g} spent at delta {p.delta:g}, this "
        f"release ({event}) needs more{need}; use a smaller eps or raise the budget with "
        f"FROM mob_set_budget('{p.source}', eps := ..., delta := {p.delta:g})")


def budgets(con) -> list[dict]:
    """One dict per source (source, eps, delta, spent, remaining, releases, declared_at): what mob_budget() shows."""
    if not has_tables(con):
        return []
    rows = con.execute(f"""SELECT source, eps, delta, declared_at FROM {BUDGET}
        QUALIFY row_number() OVER (PARTITION BY source ORDER BY seq DESC) = 1 ORDER BY source""").fetchall()
    out = []
    for source, eps, delta, declared_at in rows:
        recorded = events(con, source)
        used = accounting.epsilon(accounting.compose(recorded), delta)
        out.append({"source": source, "eps": eps, "delta": delta, "spent": used,
                    "remaining": max(eps - used, 0.0), "releases": len(recorded), "declared_at": declared_at})
    return out


def releases(con) -> list[dict]:
    """Every recorded release, oldest first (what mob_ledger() shows)."""
    if not has_tables(con):
        return []
    rows = con.execute(f"SELECT {', '.join(_COLUMNS)} FROM {LEDGER} ORDER BY id").fetchall()
    return [dict(zip(_COLUMNS, r)) for r in rows]


def release_row(con, ledger_id: int) -> dict | None:
    """One ledger row by id (None when absent)."""
    if not has_tables(con):
        return None
    rows = con.execute(f"SELECT {', '.join(_COLUMNS)} FROM {LEDGER} WHERE id = ?", [int(ledger_id)]).fetchall()
    return dict(zip(_COLUMNS, rows[0])) if rows else None


# -- writing --------------------------------------------------------------------------------------------------

def set_budget(con, source: str, eps: float, delta: float) -> None:
    """Declare (or raise) the (eps, delta) budget of ``source``; refuses one below what is already spent."""
    source = source_name(source)
    eps = positive("eps", eps)
    delta = delta_value(delta)
    ensure_tables(con)
    verify(con)
    used = spent(con, source, delta)
    if used > eps + _SLACK:
        raise BudgetError(f"cannot set the budget of '{source}' to eps {eps:g} at delta {delta:g}: "
                          f"eps {used:.6g} is already spent; a budget can only be raised, to at least {used:.6g}")
    con.execute(f"INSERT INTO {BUDGET} (seq, source, eps, delta, declared_at) "
                f"VALUES (nextval('{BUDGET_SEQ}'), ?, ?, ?, ?)", [source, eps, delta, _now()])


def _own_epsilon(event: Event, delta: float) -> float | None:
    own = accounting.epsilon(event, delta)
    return own if math.isfinite(own) else None


def reserve(con, p: Prior, event: Event, *, mechanism: str, privacy_unit: str, params: dict,
            seeded: bool) -> int:
    """Insert a ``reserved`` row for ``event`` (already checked against ``p``); returns its id."""
    row = {"recorded_at": _now(), "source": p.source, "mechanism": str(mechanism),
           "epsilon": _own_epsilon(event, p.delta), "delta": p.delta, "privacy_unit": str(privacy_unit),
           "params": json.dumps(params, default=_jsonable, sort_keys=True), "event": event.to_json(),
           "seeded": bool(seeded), "status": "reserved"}
    row["id"] = int(con.execute(f"SELECT nextval('{LEDGER_SEQ}')").fetchall()[0][0])
    con.execute(f"INSERT INTO {LEDGER} ({', '.join(_COLUMNS)}, seal) VALUES ({', '.join('?' * len(_COLUMNS))}, ?)",
                [row[c] for c in _COLUMNS] + [_seal(row)])
    return row["id"]


def update(con, ledger_id: int, *, event: Event | None = None, status: str | None = None,
           params: dict | None = None) -> None:
    """Change a row's event, status or params (merged into the recorded ones), re-sealing it."""
    row = release_row(con, ledger_id)
    if row is None:
        raise LedgerTampered(f"ledger row {ledger_id} of a release in progress disappeared: the ledger was "
                             "edited; releases are refused until the database is restored")
    if status is not None:
        if status not in STATUSES:
            raise DuckmobError(f"status must be one of {STATUSES}; got {status!r}")
        row["status"] = status
    if event is not None:
        row["event"] = event.to_json()
        row["epsilon"] = _own_epsilon(event, row["delta"])
    if params:
        row["params"] = json.dumps({**json.loads(row["params"] or "{}"), **params}, default=_jsonable,
                                   sort_keys=True)
    con.execute(f"UPDATE {LEDGER} SET status = ?, event = ?, epsilon = ?, params = ?, seal = ? WHERE id = ?",
                [row["status"], row["event"], row["epsilon"], row["params"], _seal(row), int(ledger_id)])


def record(con, source: str, event: Event, *, mechanism: str, privacy_unit: str, params: dict,
           seeded: bool) -> int:
    """Check and record one finished release in one step (for releases made outside ``duckmob.release``, e.g.
    by tests); returns its id."""
    ensure_tables(con)
    p = prior(con, source)
    check(p, event)
    ledger_id = reserve(con, p, event, mechanism=mechanism, privacy_unit=privacy_unit, params=params,
                        seeded=seeded)
    update(con, ledger_id, status="spent")
    return ledger_id


def _jsonable(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


__all__ = ["ensure_tables", "has_tables", "verify", "set_budget", "prior", "check", "reserve", "update", "record",
           "budget", "budgets", "spent", "events", "releases", "release_row", "Prior", "LedgerTampered", "BUDGET",
           "LEDGER", "STATUSES"]
