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

Integrity checks are incremental. The release core keeps one :class:`Verified` per database: what this process
last found intact (every row's fingerprint -- DuckDB's ``hash`` of all its columns, seal included -- and its
source, status and event). Each release then runs one aggregate query (row count, min and max id, the count
and the sum of the fingerprints of the rows verified before, the sequence's last id, whether a budget exists)
and hashes in Python only the rows added since. Its own writes (:func:`reserve`, :func:`update`) refresh the
fingerprints from the row DuckDB wrote (``RETURNING``). The spend is composed from the verified rows it holds, so
an edit committed between the check and the composition cannot lower it. A new process (or a caller without a
:class:`Verified`, e.g. :func:`record`) starts empty: it hashes every row once, as the full check always did.

Threat model. The ledger protects the data owner from spending more than the declared budget by mistake,
including through concurrent releases (threads, one statement with several releases), failures and interrupts
after the data was read (the reservation stands), a ROLLBACK of the caller's transaction (the ledger is written
on its own connection and committed at once: ROLLBACK undoes neither a spend nor a budget declaration), and a
silent reset by someone with SQL access to the database between two releases (or during a long one):

- deleting ledger rows, or dropping and recreating the table: the ids are no longer exactly 1 .. the last one
  the sequence handed out, or there are fewer rows than this process verified before (a reset sequence too);
- editing any column of a row: its seal no longer matches (seen by any process), and its fingerprint differs
  from the one this process verified (seen even when the editor recomputed the seal); a release in progress
  checks its own row the same way before it rewrites it, so an edit of a ``reserved`` row is not re-sealed;
- dropping the ledger table, its sequence, the budget table or its sequence while the others exist; dropping
  all four at once after this process saw a declared budget.

Each is detected and every further release of every source refused, until the database is restored.

It is NOT a security boundary. Seals are unkeyed SHA-256 and fingerprints 64-bit non-cryptographic hashes:
whoever can write the database can recompute the seals, and against a process that verified the rows before,
also engineer a fingerprint collision. A new process has no memory: it cannot see a reset that dropped every
duckmob table and sequence at once (the database looks new) nor an edit whose seal was recomputed. Budget rows
carry no seal: editing ``duckmob_budget`` directly is a declaration duckmob cannot tell from mob_set_budget
(except that it leaves no history). Anyone can also run another tool on the raw table or call the numpy
functions directly. The budget is per source NAME: the same data under two names (a copy, a view) has two
budgets, and two different tables under one name share one; releases over a derived table (a filter, a join) are
charged to the name given. The privacy unit is recorded per release; composing releases made with different
units is the data owner's responsibility.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone

import duckdb

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


def ensure_tables(con, verified: Verified | None = None) -> None:
    """Create the ledger's tables and sequences when the database has none of them (idempotent; writes nothing
    when they exist, so a read-only database with a ledger works). A database whose ledger was written by an
    older duckmob (no sequences) is upgraded once. A partial set left by a reset is not recreated: it is
    reported by :func:`verify` instead. Nothing to do (not even a look at the catalog) once ``verified`` has
    found the tables."""
    if verified is not None and verified.tables:
        return
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


# DuckDB's hash of every column of a ledger row, seal included: what a :class:`Verified` remembers of each row.
_FINGERPRINT = f"hash({', '.join(_COLUMNS)}, seal)"
_OBJECTS = (("the table", LEDGER), ("the sequence", LEDGER_SEQ), ("the table", BUDGET), ("the sequence", BUDGET_SEQ))
# One query for the per-release check: a missing table raises CatalogException, a missing sequence counts 0.
_SUMMARY = f"""SELECT count(*), count(*) FILTER (WHERE id <= $verified), coalesce(min(id), 1), coalesce(max(id), 0),
    coalesce(sum({_FINGERPRINT}::HUGEINT) FILTER (WHERE id <= $verified), 0),
    (SELECT count(*) > 0 FROM {BUDGET}),
    (SELECT {{'sequences': count(*), 'handed_out': max(coalesce(last_value, start_value - 1))
                                                    FILTER (WHERE sequence_name = '{LEDGER_SEQ}')}}
     FROM duckdb_sequences() WHERE database_name = current_database() AND schema_name = current_schema()
     AND sequence_name IN ('{LEDGER_SEQ}', '{BUDGET_SEQ}'))
FROM {LEDGER}"""


@dataclass(frozen=True)
class _Row:
    """What a :class:`Verified` holds of one ledger row."""

    fingerprint: int
    source: str
    status: str
    event: Event


class Verified:
    """What this process last found intact in one database's ledger, so that the next check reads only what
    changed (see the module docstring). The release core keeps one per database and uses it under the
    database's lock; a new one knows nothing, and its first :func:`verify` hashes every row.

    ``rows[i]`` is ledger row ``i + 1`` as verified or written by this process; ``total`` is the sum of their
    fingerprints; ``tables`` says the ledger's tables and sequences were found (so :func:`ensure_tables` has
    nothing to do); ``declared`` that a budget was seen.
    """

    def __init__(self) -> None:
        self.rows: list[_Row] = []
        self.total = 0
        self.tables = False
        self.declared = False

    def remember(self, ledger_id: int, row: _Row) -> None:
        """Record row ``ledger_id`` as written by this process. A row beyond the next one (rows were added by
        another caller since the last check) is left for :func:`verify` to hash."""
        if ledger_id <= len(self.rows):
            self.total += row.fingerprint - self.rows[ledger_id - 1].fingerprint
            self.rows[ledger_id - 1] = row
        elif ledger_id == len(self.rows) + 1:
            self.rows.append(row)
            self.total += row.fingerprint

    def fingerprint(self, ledger_id: int) -> int | None:
        """The fingerprint of row ``ledger_id`` as this process last saw it (None if not seen yet)."""
        return self.rows[ledger_id - 1].fingerprint if ledger_id <= len(self.rows) else None

    def events(self, source: str, exclude: int | None = None) -> tuple:
        """Every verified release of ``source`` that counts (not cancelled), in order, leaving out ``exclude``."""
        return tuple(r.event for i, r in enumerate(self.rows, 1)
                     if r.source == source and r.status != "cancelled" and i != exclude)


def _tampered_rows() -> LedgerTampered:
    return LedgerTampered("rows were deleted from duckmob_ledger (its ids are no longer 1, 2, ... up to the last "
                          "one handed out): the spent budget cannot be known. Restore the database from a backup; "
                          "releases are refused until then")


def _tampered_row(ledger_id: int) -> LedgerTampered:
    return LedgerTampered(f"ledger row {ledger_id} was edited after it was recorded (its seal, or what this "
                          "process verified of it, no longer matches): the spent budget cannot be trusted. Restore "
                          "the database from a backup; releases are refused until then")


def _row(values, seal: str, fingerprint: int, ledger_id: int) -> _Row:
    """A fetched row (the :data:`_COLUMNS` values) checked against its seal."""
    row = dict(zip(_COLUMNS, values))
    if seal != _seal(row):
        raise _tampered_row(ledger_id)
    return _Row(int(fingerprint), row["source"], row["status"], Event.from_json(row["event"]))


def verify(con, verified: Verified | None = None) -> None:
    """Refuse (LedgerTampered, saying what happened) when the ledger lost or changed a release.

    Checked: the budget table, ledger table and both sequences exist together (or none does, and ``verified``
    saw no budget); the ledger ids are exactly 1 .. the number the sequence handed out, and no fewer than
    ``verified`` holds (a DELETE leaves a gap or a short tail); the rows ``verified`` holds are unchanged (their
    count and the sum of their fingerprints -- which hash the ids too -- then row by row to name the edited
    one); the other rows are numbered on from there and their seals match their columns. ``verified`` is then
    brought up to date; without it every row is hashed.
    """
    verified = Verified() if verified is None else verified
    known = len(verified.rows)
    try:
        n, n_known, first, last, total, declared, seqs = con.execute(_SUMMARY, {"verified": known}).fetchall()[0]
    except duckdb.CatalogException:
        _missing(con, verified)
        return
    if seqs["sequences"] != 2:
        _missing(con, verified)   # the tables are there: this raises
    if (n and (first != 1 or last != n)) or n != int(seqs["handed_out"]) or n_known != known:
        raise _tampered_rows()
    if int(total) != verified.total:
        fingerprints = con.execute(f"SELECT id, {_FINGERPRINT} FROM {LEDGER} WHERE id <= ? ORDER BY id",
                                   [known]).fetchall()
        changed = next((i for i, fp in fingerprints if int(fp) != verified.fingerprint(i)), known)
        raise _tampered_row(changed)
    added = con.execute(f"SELECT {', '.join(_COLUMNS)}, seal, {_FINGERPRINT} FROM {LEDGER} WHERE id > ? ORDER BY id",
                        [known]).fetchall()
    if [r[0] for r in added] != list(range(known + 1, n + 1)):   # a repeated id stands in for a deleted one
        raise _tampered_rows()
    for *values, seal, fingerprint in added:
        verified.remember(values[0], _row(values, seal, fingerprint, values[0]))
    verified.tables = True
    verified.declared = verified.declared or bool(declared)


def _missing(con, verified: Verified) -> None:
    """Some of the ledger's tables and sequences are missing: fine when all are and ``verified`` saw no budget
    (a new database: :func:`ensure_tables` creates them), a reset otherwise."""
    tables, seqs = _present(con)
    missing = [f"{kind} {name}" for kind, name in _OBJECTS if name not in tables | seqs]
    if len(missing) == len(_OBJECTS) and not verified.declared and not verified.rows:
        verified.tables = False
        return
    if len(missing) == len(_OBJECTS):
        raise LedgerTampered("the tables duckmob_budget and duckmob_ledger and their sequences were dropped after "
                             "this process saw a privacy budget declared: the record of earlier releases is lost, "
                             "so no spend can be checked. Restore the database from a backup taken before the drop; "
                             "releases are refused until then")
    raise LedgerTampered(f"{' and '.join(missing)} {'was' if len(missing) == 1 else 'were'} dropped while a privacy "
                         "budget is declared: the record of earlier releases is lost, so no spend can be checked. "
                         "Restore the database from a backup taken before the drop; releases are refused until then")


# -- reading --------------------------------------------------------------------------------------------------

def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def budget(con, source: str) -> tuple[float, float] | None:
    """The declared (eps, delta) of ``source`` (its latest declaration by sequence), or None."""
    source = source_name(source)
    return _declared(con, source) if has_tables(con) else None


def _declared(con, source: str) -> tuple[float, float] | None:
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


def needs_delta(source: str, eps: float, what: str) -> BudgetError:
    """The refusal of a release that needs delta > 0 (Gaussian noise, DP-SGD) against a budget with delta 0: no eps
    is enough there, so it says to declare a positive delta or use a pure-eps method, never to raise eps."""
    return BudgetError(f"the privacy budget of '{source}' has delta 0, and {what} needs delta > 0: declare a "
                       f"positive delta, e.g. FROM mob_set_budget('{source}', eps := {eps:g}, delta := 1e-5), or "
                       "use a pure-eps method (method := 'privtrace')")


def prior(con, source: str, exclude: int | None = None, verified: Verified | None = None) -> Prior:
    """The budget of ``source`` and the releases a new one composes with; refuses a source with no budget and
    a tampered ledger (:func:`verify`, incremental with the ``verified`` the release core keeps). The releases
    are the verified rows themselves, not a second read that an edit could slip in before."""
    source = source_name(source)
    verified = Verified() if verified is None else verified
    verify(con, verified)
    declared = _declared(con, source) if verified.tables else None
    if declared is None:
        raise _no_budget(source)
    return Prior(source, declared[0], declared[1], verified.events(source, exclude))


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
    if math.isinf(after) and p.delta == 0:
        raise needs_delta(p.source, p.eps, f"this release ({event})")
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

def set_budget(con, source: str, eps: float, delta: float, verified: Verified | None = None) -> None:
    """Declare (or raise) the (eps, delta) budget of ``source``; refuses one below what is already spent and a
    tampered ledger (checked with ``verified`` as in :func:`prior`)."""
    source = source_name(source)
    eps = positive("eps", eps)
    delta = delta_value(delta)
    verified = Verified() if verified is None else verified
    ensure_tables(con, verified)
    verify(con, verified)
    if not verified.tables:   # every object was dropped before any budget was seen: a new database again
        ensure_tables(con)
    used = accounting.epsilon(accounting.compose(list(verified.events(source))), delta)
    if used > eps + _SLACK:
        raise BudgetError(f"cannot set the budget of '{source}' to eps {eps:g} at delta {delta:g}: "
                          f"eps {used:.6g} is already spent; a budget can only be raised, to at least {used:.6g}")
    con.execute(f"INSERT INTO {BUDGET} (seq, source, eps, delta, declared_at) "
                f"VALUES (nextval('{BUDGET_SEQ}'), ?, ?, ?, ?)", [source, eps, delta, _now()])
    verified.declared = True


def _own_epsilon(event: Event, delta: float) -> float | None:
    own = accounting.epsilon(event, delta)
    return own if math.isfinite(own) else None


def reserve(con, p: Prior, event: Event, *, mechanism: str, privacy_unit: str, params: dict,
            seeded: bool, verified: Verified | None = None) -> int:
    """Insert a ``reserved`` row for ``event`` (already checked against ``p``, read with ``verified``, which
    then remembers the row); returns its id."""
    row = {"recorded_at": _now(), "source": p.source, "mechanism": str(mechanism),
           "epsilon": _own_epsilon(event, p.delta), "delta": p.delta, "privacy_unit": str(privacy_unit),
           "params": json.dumps(params, default=_jsonable, sort_keys=True), "event": event.to_json(),
           "seeded": bool(seeded), "status": "reserved"}
    row["id"] = int(con.execute(f"SELECT nextval('{LEDGER_SEQ}')").fetchall()[0][0])
    fingerprint = con.execute(
        f"INSERT INTO {LEDGER} ({', '.join(_COLUMNS)}, seal) VALUES ({', '.join('?' * len(_COLUMNS))}, ?) "
        f"RETURNING {_FINGERPRINT}", [row[c] for c in _COLUMNS] + [_seal(row)]).fetchall()[0][0]
    if verified is not None:
        verified.remember(row["id"], _Row(int(fingerprint), p.source, "reserved", event))
    return row["id"]


def update(con, ledger_id: int, *, event: Event | None = None, status: str | None = None,
           params: dict | None = None, verified: Verified | None = None) -> None:
    """Change a row's event, status or params (merged into the recorded ones), re-sealing it. The row is first
    checked against its seal and against what ``verified`` remembers of it, so an edit made while the release
    was in progress is refused rather than sealed; ``verified`` then remembers the new row."""
    try:
        rows = con.execute(f"SELECT {', '.join(_COLUMNS)}, seal, {_FINGERPRINT} FROM {LEDGER} WHERE id = ?",
                           [int(ledger_id)]).fetchall()
    except duckdb.CatalogException:
        rows = []
    if not rows:
        raise LedgerTampered(f"ledger row {ledger_id} of a release in progress disappeared: the ledger was "
                             "edited; releases are refused until the database is restored")
    *values, seal, fingerprint = rows[0]
    _row(values, seal, fingerprint, ledger_id)
    if verified is not None and verified.fingerprint(ledger_id) not in (None, int(fingerprint)):
        raise _tampered_row(ledger_id)
    row = dict(zip(_COLUMNS, values))
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
    fingerprint = con.execute(
        f"UPDATE {LEDGER} SET status = ?, event = ?, epsilon = ?, params = ?, seal = ? WHERE id = ? "
        f"RETURNING {_FINGERPRINT}",
        [row["status"], row["event"], row["epsilon"], row["params"], _seal(row), int(ledger_id)]).fetchall()[0][0]
    if verified is not None:
        verified.remember(ledger_id, _Row(int(fingerprint), row["source"], row["status"],
                                          Event.from_json(row["event"])))


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


__all__ = ["ensure_tables", "has_tables", "verify", "Verified", "set_budget", "prior", "check", "reserve", "update",
           "record", "budget", "budgets", "spent", "events", "releases", "release_row", "Prior", "LedgerTampered",
           "BUDGET", "LEDGER", "STATUSES"]
