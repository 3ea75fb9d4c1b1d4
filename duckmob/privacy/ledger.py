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

Integrity. Every ledger row carries a seal (SHA-256 of its other columns). The rows in id order are chained
(each link is the SHA-256 of the previous link and the row's seal), and so are the budget declarations in ``seq``
order (over ``seq``, source, eps and delta: ``declared_at`` is shown, not checked, since the order is the
sequence's). The links are computed, not stored: a chain stored in the rows would have to be rewritten after
every update of an earlier row. For a database file, the head of both chains (how many rows, how many
declarations, the last link of each) is kept in a file beside it, ``<database file>.duckmob-ledger``
(:func:`head_file`), replaced atomically with every reservation, update and declaration, under the release lock;
:func:`verify` compares the database with it, so a new process too sees rows or declarations deleted, edited
(seals recomputed or not), inserted, or the ledger dropped and recreated. A write records the state it leads to
as ``pending`` first, then commits, then records it as done (a crash in between leaves a head file that accepts
either state). The first write marks ``duckmob_ledger`` with a comment (:data:`MARK`): from then on a missing
head file is a lost one, while a ledger with neither was written by an older duckmob and gets its head file at
its next write. An in-memory database has no head file (no other process can open it); a read-only one is read
without writing it.

The checks are incremental. The release core keeps one :class:`Verified` per database: what this process last
found intact (every row's fingerprint -- DuckDB's ``hash`` of all its columns, seal included -- its seal, source,
status and event, the chain's links; the same for budget declarations). Each release then runs one aggregate query
(row count, min and max id, the count and the sum of the fingerprints of the rows and declarations verified
before, the sequence's last id), reads the head file, and hashes in Python only the rows added since. Its own
writes (:func:`reserve`, :func:`update`, :func:`set_budget`) refresh the fingerprints from the row DuckDB wrote
(``RETURNING``) and extend the chain from the row written (an update of row k re-links k .. the last row, from
the seals in memory). The spend and the budget are taken from the verified rows, so an edit committed between
the check and the composition cannot lower them. A new process (or a caller without a :class:`Verified`, e.g.
:func:`record`) starts empty: it hashes every row once.

What this protects against, what it does not, and what stays the data owner's responsibility (copies, derived
tables, privacy units): docs/threat_model.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from functools import lru_cache
from typing import Callable, TypeVar

import duckdb

from duckmob.errors import BudgetError, DuckmobError
from duckmob.privacy import accounting
from duckmob.privacy.accounting import Event, needs_delta
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
# What a budget declaration's seal covers (declared_at is shown, not checked: the order is the sequence's).
_BUDGET_COLUMNS = ["seq", "source", "eps", "delta"]
HEAD_SUFFIX = ".duckmob-ledger"
# The comment on duckmob_ledger once its head file was written: a missing head file is then a lost one. (No quote
# in it: it is written into the COMMENT statement.)
MARK = ("duckmob privacy ledger: its head is the file <database file>.duckmob-ledger beside the database; keep "
        "the two together (see docs/threat_model.md in duckmob)")
# The link before the first row of a chain.
_GENESIS = bytes(32)
T = TypeVar("T")


class LedgerTampered(BudgetError):
    """The ledger no longer holds every release made under a declared budget: releases are refused."""


@dataclass(frozen=True)
class Prior:
    """What a new release of ``source`` composes with: the budget and every other release not cancelled.

    A release that reads several base tables (a join) draws on each one's budget: its ``source`` is their keys
    joined (:func:`join_keys`), ``parts`` holds the :class:`Prior` of each, and it fits only if it fits every one;
    ``eps`` and ``events`` are then those of the part with the least left, ``delta`` the smallest."""

    source: str
    eps: float
    delta: float
    events: tuple
    parts: tuple = ()

    def spent(self) -> float:
        return accounting.epsilon(accounting.compose(list(self.events)), self.delta)

    def fits(self, event: Event) -> bool:
        if self.parts:
            return all(p.fits(event) for p in self.parts)
        after = accounting.epsilon(accounting.compose(list(self.events) + [event]), self.delta)
        return after <= self.eps + _SLACK


def join_keys(keys) -> str:
    """The ledger's source text of a release that reads the base tables ``keys`` (sorted, comma-separated; one key:
    the table's name)."""
    return ", ".join(sorted(set(keys)))


@lru_cache(maxsize=4096)
def keys_of(source: str) -> tuple[str, ...]:
    """The base tables of a ledger source text (:func:`join_keys`); a quoted key may hold ', '."""
    out, cur, quoted, i = [], [], False, 0
    while i < len(source):
        ch = source[i]
        if ch == '"':
            quoted = not quoted
        if not quoted and source.startswith(", ", i):
            out.append("".join(cur))
            cur = []
            i += 2
            continue
        cur.append(ch)
        i += 1
    out.append("".join(cur))
    return tuple(out)


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
    return _digest(row, _COLUMNS)


def _budget_seal(row: dict) -> str:
    """SHA-256 of a budget declaration's ``seq``, source, eps and delta (the same text form)."""
    return _digest(row, _BUDGET_COLUMNS)


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


def _link(previous: bytes, seal: str) -> bytes:
    """The next link of a hash chain: SHA-256 of the previous link and the row's seal."""
    return hashlib.sha256(previous + seal.encode()).digest()


# DuckDB's hash of every column of a ledger row, seal included, and of a declaration's checked columns: what a
# :class:`Verified` remembers of each.
_FINGERPRINT = f"hash({', '.join(_COLUMNS)}, seal)"
_BUDGET_FINGERPRINT = f"hash({', '.join(_BUDGET_COLUMNS)})"
_OBJECTS = (("the table", LEDGER), ("the sequence", LEDGER_SEQ), ("the table", BUDGET), ("the sequence", BUDGET_SEQ))
# One query for the per-release check: a missing table raises CatalogException, a missing sequence counts 0.
_SUMMARY = f"""SELECT count(*), count(*) FILTER (WHERE id <= $verified), coalesce(min(id), 1), coalesce(max(id), 0),
    coalesce(sum({_FINGERPRINT}::HUGEINT) FILTER (WHERE id <= $verified), 0),
    (SELECT {{'known': count(*) FILTER (WHERE seq <= $budget_seq),
              'total': coalesce(sum({_BUDGET_FINGERPRINT}::HUGEINT) FILTER (WHERE seq <= $budget_seq), 0)}}
     FROM {BUDGET}),
    (SELECT {{'sequences': count(*), 'handed_out': max(coalesce(last_value, start_value - 1))
                                                    FILTER (WHERE sequence_name = '{LEDGER_SEQ}')}}
     FROM duckdb_sequences() WHERE database_name = current_database() AND schema_name = current_schema()
     AND sequence_name IN ('{LEDGER_SEQ}', '{BUDGET_SEQ}'))
FROM {LEDGER}"""


@dataclass(frozen=True)
class _Row:
    """What a :class:`Verified` holds of one ledger row."""

    fingerprint: int
    seal: str
    source: str
    status: str
    event: Event


@dataclass(frozen=True)
class _Declaration:
    """What a :class:`Verified` holds of one budget declaration."""

    seq: int
    fingerprint: int
    seal: str
    source: str
    eps: float
    delta: float


@dataclass(frozen=True)
class Head:
    """A ledger's state as its head file records it: the number of release rows and of budget declarations, and
    the last link of the hash chain over each (hex)."""

    releases: int = 0
    release_chain: str = _GENESIS.hex()
    budgets: int = 0
    budget_chain: str = _GENESIS.hex()

    def empty(self) -> bool:
        return self.releases == 0 and self.budgets == 0


class Verified:
    """What this process last found intact in one database's ledger, so that the next check reads only what
    changed (see the module docstring). The release core keeps one per database and uses it under the
    database's lock; a new one knows nothing, and its first :func:`verify` hashes every row.

    ``rows[i]`` is ledger row ``i + 1`` as verified or written by this process and ``links[i]`` the chain through
    it; ``total`` is the sum of their fingerprints; ``declarations``, ``budget_links`` and ``budget_total`` the
    same for budget declarations, in ``seq`` order. ``tables`` says the ledger's tables and sequences were found
    (so :func:`ensure_tables` has nothing to do). ``head_file`` is the database's head file (None in memory;
    found by the first :func:`verify`), ``anchored`` that it was seen or written, ``marked`` that the database
    carries :data:`MARK`.
    """

    def __init__(self) -> None:
        self.rows: list[_Row] = []
        self.links: list[bytes] = []
        self.total = 0
        self.declarations: list[_Declaration] = []
        self.budget_links: list[bytes] = []
        self.budget_total = 0
        self.tables = False
        self.located = False
        self.head_file: str | None = None
        self.read_only = False
        self.anchored = False
        self.marked = False

    @property
    def declared(self) -> bool:
        """Whether a budget was seen."""
        return bool(self.declarations)

    def remember(self, ledger_id: int, row: _Row) -> None:
        """Record row ``ledger_id`` as written by this process. A row beyond the next one (rows were added by
        another caller since the last check) is left for :func:`verify` to hash."""
        if ledger_id <= len(self.rows):
            self.total += row.fingerprint - self.rows[ledger_id - 1].fingerprint
            self.rows[ledger_id - 1] = row
            del self.links[ledger_id - 1:]
            previous = self.links[-1] if self.links else _GENESIS
            for r in self.rows[ledger_id - 1:]:
                previous = _link(previous, r.seal)
                self.links.append(previous)
        elif ledger_id == len(self.rows) + 1:
            self.rows.append(row)
            self.total += row.fingerprint
            self.links.append(_link(self.links[-1] if self.links else _GENESIS, row.seal))

    def declare(self, declaration: _Declaration) -> None:
        """Record a budget declaration (the next by ``seq``) as verified or written by this process."""
        self.declarations.append(declaration)
        self.budget_total += declaration.fingerprint
        self.budget_links.append(_link(self.budget_links[-1] if self.budget_links else _GENESIS,
                                       declaration.seal))

    def fingerprint(self, ledger_id: int) -> int | None:
        """The fingerprint of row ``ledger_id`` as this process last saw it (None if not seen yet)."""
        return self.rows[ledger_id - 1].fingerprint if ledger_id <= len(self.rows) else None

    def events(self, source: str, exclude: int | None = None) -> tuple:
        """Every verified release of ``source`` that counts (not cancelled), in order, leaving out ``exclude``."""
        return tuple(r.event for i, r in enumerate(self.rows, 1)
                     if source in keys_of(r.source) and r.status != "cancelled" and i != exclude)

    def budget(self, source: str) -> tuple[float, float] | None:
        """The verified (eps, delta) of ``source``: its declaration with the highest ``seq`` (None if none)."""
        return next(((d.eps, d.delta) for d in reversed(self.declarations) if d.source == source), None)

    def head(self) -> Head:
        """The state verified: what the head file must record."""
        return Head(len(self.rows), (self.links[-1] if self.links else _GENESIS).hex(),
                    len(self.declarations), (self.budget_links[-1] if self.budget_links else _GENESIS).hex())

    def after(self, *, ledger_id: int | None = None, seal: str | None = None, budget_seal: str | None = None) -> Head:
        """The state after one write: ledger row ``ledger_id`` (re)written with ``seal``, or a declaration with
        ``budget_seal`` added."""
        head = self.head()
        if budget_seal is not None:
            last = self.budget_links[-1] if self.budget_links else _GENESIS
            return replace(head, budgets=head.budgets + 1, budget_chain=_link(last, budget_seal).hex())
        k = min(ledger_id, len(self.rows) + 1)
        previous = self.links[k - 2] if k >= 2 else _GENESIS
        for s in [seal] + [r.seal for r in self.rows[k:]]:
            previous = _link(previous, s)
        return replace(head, releases=max(k, len(self.rows)), release_chain=previous.hex())


def _tampered_rows() -> LedgerTampered:
    return LedgerTampered("rows were deleted from duckmob_ledger (its ids are no longer 1, 2, ... up to the last "
                          "one handed out): the spent budget cannot be known. Restore the database from a backup; "
                          "releases are refused until then")


def _tampered_row(ledger_id: int) -> LedgerTampered:
    return LedgerTampered(f"ledger row {ledger_id} was edited after it was recorded (its seal, or what this "
                          "process verified of it, no longer matches): the spent budget cannot be trusted. Restore "
                          "the database from a backup; releases are refused until then")


def _tampered_budget(what: str) -> LedgerTampered:
    return LedgerTampered(f"{what} in duckmob_budget after this process verified it: the declared budgets cannot "
                          "be trusted. Restore the database from a backup; releases are refused until then")


def _row(values, seal: str, fingerprint: int, ledger_id: int) -> _Row:
    """A fetched row (the :data:`_COLUMNS` values) checked against its seal."""
    row = dict(zip(_COLUMNS, values))
    if seal != _seal(row):
        raise _tampered_row(ledger_id)
    return _Row(int(fingerprint), seal, row["source"], row["status"], Event.from_json(row["event"]))


def verify(con, verified: Verified | None = None) -> None:
    """Refuse (LedgerTampered, saying what happened) when the ledger lost or changed a release or a budget.

    Checked: the budget table, ledger table and both sequences exist together (or none does, ``verified`` saw no
    budget and the head file records nothing); the ledger ids are exactly 1 .. the number the sequence handed
    out, and no fewer than ``verified`` holds (a DELETE leaves a gap or a short tail); the rows and declarations
    ``verified`` holds are unchanged (their count and the sum of their fingerprints -- which hash the ids too --
    then row by row to name the edited one); the other rows are numbered on from there and their seals match
    their columns; last, both chains end where the head file says (:func:`_check_head`). ``verified`` is then
    brought up to date; without it every row is hashed.
    """
    verified = Verified() if verified is None else verified
    _locate(con, verified)
    known = len(verified.rows)
    known_seq = verified.declarations[-1].seq if verified.declarations else 0
    try:
        n, n_known, first, last, total, budgets, seqs = con.execute(
            _SUMMARY, {"verified": known, "budget_seq": known_seq}).fetchall()[0]
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
    if budgets["known"] != len(verified.declarations):
        raise _tampered_budget("budget declarations were deleted (or inserted with old numbers)")
    if int(budgets["total"]) != verified.budget_total:
        raise _tampered_budget("a budget declaration was edited")
    added = con.execute(f"SELECT {', '.join(_COLUMNS)}, seal, {_FINGERPRINT} FROM {LEDGER} WHERE id > ? ORDER BY id",
                        [known]).fetchall()
    if [r[0] for r in added] != list(range(known + 1, n + 1)):   # a repeated id stands in for a deleted one
        raise _tampered_rows()
    for *values, seal, fingerprint in added:
        verified.remember(values[0], _row(values, seal, fingerprint, values[0]))
    declared = con.execute(f"SELECT {', '.join(_BUDGET_COLUMNS)}, {_BUDGET_FINGERPRINT} FROM {BUDGET} "
                           "WHERE seq > ? ORDER BY seq", [known_seq]).fetchall()
    for *values, fingerprint in declared:
        row = dict(zip(_BUDGET_COLUMNS, values))
        verified.declare(_Declaration(int(row["seq"]), int(fingerprint), _budget_seal(row), row["source"],
                                      float(row["eps"]), float(row["delta"])))
    verified.tables = True
    _check_head(con, verified)


def _missing(con, verified: Verified) -> None:
    """Some of the ledger's tables and sequences are missing: fine when all are, ``verified`` saw no budget and
    the head file (if any) records nothing (a new database: :func:`ensure_tables` creates them), a reset
    otherwise."""
    tables, seqs = _present(con)
    missing = [f"{kind} {name}" for kind, name in _OBJECTS if name not in tables | seqs]
    if len(missing) == len(_OBJECTS) and not verified.declared and not verified.rows:
        stored = _read_head(verified.head_file) if verified.head_file else None
        if stored is None or all(h is None or h.empty() for h in stored):
            verified.tables = False
            return
        head = stored[0] if not stored[0].empty() else stored[1]
        raise LedgerTampered(f"the tables duckmob_budget and duckmob_ledger and their sequences are gone, but the "
                             f"ledger's head file {verified.head_file} records {_count(head.releases, 'release')} "
                             f"and {_count(head.budgets, 'budget declaration')}: the record of earlier releases is "
                             "lost, so no spend can be checked. Restore the database together with its head file "
                             "from a backup; releases are refused until then")
    if len(missing) == len(_OBJECTS):
        raise LedgerTampered("the tables duckmob_budget and duckmob_ledger and their sequences were dropped after "
                             "this process saw a privacy budget declared: the record of earlier releases is lost, "
                             "so no spend can be checked. Restore the database from a backup taken before the drop; "
                             "releases are refused until then")
    raise LedgerTampered(f"{' and '.join(missing)} {'was' if len(missing) == 1 else 'were'} dropped while a privacy "
                         "budget is declared: the record of earlier releases is lost, so no spend can be checked. "
                         "Restore the database from a backup taken before the drop; releases are refused until then")


# -- the head file --------------------------------------------------------------------------------------------

def head_file(database: str) -> str:
    """The head file of the database file ``database``: ``<database file>.duckmob-ledger`` beside it (links
    resolved). Whoever deletes, moves or copies a database file must do the same with this one."""
    return os.path.realpath(database) + HEAD_SUFFIX


def _locate(con, verified: Verified) -> None:
    """Find (once) the head file of ``con``'s database and whether it is read-only."""
    if verified.located:
        return
    rows = con.execute("SELECT path, readonly FROM duckdb_databases() WHERE database_name = current_database()"
                       ).fetchall()
    path = rows[0][0] if rows else None
    # an in-memory database has no path; a remote one (s3://, md:) no place for a file beside it
    local = bool(path) and path != ":memory:" and "://" not in path and not path.startswith("md:")
    verified.head_file = head_file(path) if local else None
    verified.read_only = bool(rows[0][1]) if rows else False
    verified.located = True


def _read_head(path: str) -> tuple[Head, Head | None] | None:
    """(head, pending) as the head file at ``path`` records them; None when there is no such file."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        head = Head(**data["head"])
        pending = Head(**data["pending"]) if data.get("pending") else None
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise LedgerTampered(f"the ledger's head file {path} cannot be read ({type(exc).__name__}: {exc}): it was "
                             "damaged or replaced, so the ledger cannot be checked. Restore it together with the "
                             "database from a backup; releases are refused until then") from None
    return head, pending


def _write_head(path: str, head: Head, pending: Head | None = None) -> None:
    """Replace the head file atomically (a temporary file, flushed to disk, renamed over it). A pending state
    must be on disk before the database commits, so its rename is flushed too (the folder, where POSIX allows)."""
    data = {"about": "duckmob's privacy ledger head for the database file beside it: keep the two together",
            "format": 1, "head": asdict(head)}
    if pending is not None:
        data["pending"] = asdict(pending)
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
        if pending is not None and hasattr(os, "O_DIRECTORY"):
            folder = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
    except OSError as exc:
        try:
            os.remove(temporary)
        except OSError:
            pass
        raise DuckmobError(f"cannot write the ledger's head file {path} ({exc}): every release and budget "
                           "declaration is recorded there too; make its folder writable") from None


def _check_head(con, verified: Verified) -> None:
    """Refuse when the verified ledger is not the one the head file records (nothing to check in memory).

    No head file: fine for a ledger never marked (an older duckmob's, or nothing recorded yet: the next write
    creates it), a loss otherwise."""
    if verified.head_file is None:
        return
    stored = _read_head(verified.head_file)
    if stored is None:
        if verified.anchored or _comment(con) == MARK:
            raise LedgerTampered(
                f"the ledger's head file {verified.head_file} is missing, but this database's ledger was recorded "
                "with one: it was deleted, or the database was copied or moved without it (copy it along, to the "
                "same name with the suffix .duckmob-ledger). Releases are refused until it is restored")
        return
    verified.anchored = True
    now = verified.head()
    if now not in stored:
        raise _diverged(verified.head_file, now, stored[0])


def _diverged(path: str, now: Head, head: Head) -> LedgerTampered:
    if (now.releases, now.budgets) == (head.releases, head.budgets):
        what = ("a row of duckmob_ledger was edited" if now.release_chain != head.release_chain else
                "a budget declaration in duckmob_budget was edited")
        found = f"its rows, seals included, no longer hash to the chain its head file {path} records"
    else:
        what = ("releases or budget declarations were deleted, the ledger dropped and recreated, or the database "
                "replaced by an older copy" if now.releases < head.releases or now.budgets < head.budgets else
                "rows were added to it, or its head file was replaced by an older copy")
        found = (f"the database holds {_count(now.releases, 'release')} and {_count(now.budgets, 'budget declaration')}"
                 f", its head file {path} records {head.releases} and {head.budgets}")
    return LedgerTampered(f"the privacy ledger was rewritten outside duckmob: {what} ({found}), so the spent budget "
                          "cannot be known. Restore the database together with its head file from the same backup; "
                          "releases are refused until then")


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _comment(con) -> str | None:
    rows = con.execute("SELECT comment FROM duckdb_tables() WHERE database_name = current_database() AND "
                       "schema_name = current_schema() AND table_name = ?", [LEDGER]).fetchall()
    return rows[0][0] if rows else None


def _recorded(con, verified: Verified, after: Head, write: Callable[[], T]) -> T:
    """Run ``write`` (one autocommitted statement that takes the verified ledger to ``after``) with the head file
    kept in step: ``after`` is recorded as pending first, then as the head once the statement committed. If the
    statement fails, the pending state stays (an interrupted statement may have committed or not: it accepts
    both) until the next write. The first write also marks the ledger (:data:`MARK`)."""
    path = None if verified.read_only else verified.head_file
    if path is None:
        return write()
    _write_head(path, verified.head(), pending=after)
    result = write()
    _write_head(path, after)
    verified.anchored = True
    if not verified.marked:
        try:
            if _comment(con) != MARK:
                con.execute(f"COMMENT ON TABLE {LEDGER} IS '{MARK}'")
            verified.marked = True
        except duckdb.Error:
            pass   # tried again at the next write; the head file protects the ledger meanwhile
    return result


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
    rows = con.execute(f"SELECT source, event FROM {LEDGER} WHERE status <> 'cancelled' AND id <> ? ORDER BY id",
                       [-1 if exclude is None else int(exclude)]).fetchall()
    return [Event.from_json(e) for s, e in rows if source in keys_of(s)]


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


def _up(x: float) -> str:
    """``x`` rounded up to 3 significant digits (a budget to raise to)."""
    if not math.isfinite(x) or x <= 0:
        return f"{x:g}"
    step = 10 ** (math.floor(math.log10(x)) - 2)
    return f"{math.ceil(x / step - 1e-9) * step:.3g}"


def prior(con, source: str, exclude: int | None = None, verified: Verified | None = None) -> Prior:
    """The budget of ``source`` and the releases a new one composes with; refuses a source with no budget and
    a tampered ledger (:func:`verify`, incremental with the ``verified`` the release core keeps). The releases
    are the verified rows themselves, not a second read that an edit could slip in before."""
    source = source_name(source)
    verified = Verified() if verified is None else verified
    verify(con, verified)
    keys = keys_of(source)
    if len(keys) > 1:   # a release over several base tables: each one's budget (the verification is done)
        parts = tuple(_prior_of(verified, key, exclude) for key in keys)
        tight = min(parts, key=lambda p: p.eps - p.spent())
        return Prior(source, tight.eps, min(p.delta for p in parts), tight.events, parts)
    return _prior_of(verified, source, exclude)


def _prior_of(verified: Verified, source: str, exclude: int | None) -> Prior:
    declared = verified.budget(source) if verified.tables else None
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
    for part in p.parts:   # a release over several tables: refused by the first budget it does not fit
        check(part, event)
    if p.fits(event):
        return
    before = p.spent()
    after = accounting.epsilon(accounting.compose(list(p.events) + [event]), p.delta)
    if math.isinf(after) and p.delta == 0:
        raise needs_delta(p.source, p.eps, f"this release ({event})")
    own = accounting.epsilon(event, p.delta)
    raise BudgetError(
        f"privacy budget of '{p.source}' exceeded: eps {before:.4g} of {p.eps:g} is spent ({max(p.eps - before, 0):.4g} "
        f"left) and this release needs eps {own:.4g}; use a smaller eps, or raise the budget to at least "
        f"{_up(after)}: FROM mob_set_budget('{p.source}', eps := {_up(after)}, delta := {p.delta:g})")


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
    tampered ledger (checked with ``verified`` as in :func:`prior`, which then remembers the declaration)."""
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
                          f"eps {used:.4g} is already spent, and a budget cannot go below what is spent: declare at "
                          f"least {_up(used)}")
    row = {"seq": int(con.execute(f"SELECT nextval('{BUDGET_SEQ}')").fetchall()[0][0]), "source": source,
           "eps": eps, "delta": delta}
    seal = _budget_seal(row)
    fingerprint = _recorded(con, verified, verified.after(budget_seal=seal), lambda: con.execute(
        f"INSERT INTO {BUDGET} (seq, source, eps, delta, declared_at) VALUES (?, ?, ?, ?, ?) "
        f"RETURNING {_BUDGET_FINGERPRINT}", [row["seq"], source, eps, delta, _now()]).fetchall()[0][0])
    verified.declare(_Declaration(row["seq"], int(fingerprint), seal, source, eps, delta))


def _own_epsilon(event: Event, delta: float) -> float | None:
    own = accounting.epsilon(event, delta)
    return own if math.isfinite(own) else None


def reserve(con, p: Prior, event: Event, *, mechanism: str, privacy_unit: str, params: dict,
            seeded: bool, verified: Verified | None = None) -> int:
    """Insert a ``reserved`` row for ``event`` (already checked against ``p``, read with ``verified``, which
    then remembers the row; without it the ledger is verified first); returns its id."""
    verified = _current(con, verified, again=False)
    row = {"recorded_at": _now(), "source": p.source, "mechanism": str(mechanism),
           "epsilon": _own_epsilon(event, p.delta), "delta": p.delta, "privacy_unit": str(privacy_unit),
           "params": json.dumps(params, default=_jsonable, sort_keys=True), "event": event.to_json(),
           "seeded": bool(seeded), "status": "reserved"}
    # the id is the sequence's next one (verified: the sequence handed out exactly the rows there are), taken by
    # the INSERT itself, so that a crash cannot consume an id without writing its row
    row["id"] = len(verified.rows) + 1
    seal = _seal(row)
    written, fingerprint = _recorded(con, verified, verified.after(ledger_id=row["id"], seal=seal), lambda: con.execute(
        f"INSERT INTO {LEDGER} ({', '.join(_COLUMNS)}, seal) VALUES (nextval('{LEDGER_SEQ}'), "
        f"{', '.join('?' * (len(_COLUMNS) - 1))}, ?) RETURNING id, {_FINGERPRINT}",
        [row[c] for c in _COLUMNS[1:]] + [seal]).fetchall()[0])
    if written != row["id"]:   # another writer took ids without the lock: the row's seal names the wrong one
        raise LedgerTampered(f"duckmob_ledger's sequence handed out id {written} where {row['id']} was expected: "
                             "something else writes the ledger. Restore the database from a backup; releases are "
                             "refused until then")
    verified.remember(row["id"], _Row(int(fingerprint), seal, p.source, "reserved", event))
    return row["id"]


def update(con, ledger_id: int, *, event: Event | None = None, status: str | None = None,
           params: dict | None = None, verified: Verified | None = None) -> None:
    """Change a row's event, status or params (merged into the recorded ones), re-sealing it. The row is first
    checked against its seal and against what ``verified`` remembers of it, so an edit made while the release
    was in progress is refused rather than sealed; ``verified`` then remembers the new row. Where the ledger has a
    head file, the whole ledger is verified first (one aggregate query): the head written must follow the
    ledger as it is, rows other callers added included."""
    verified = _current(con, verified, again=True)
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
    if verified.fingerprint(ledger_id) not in (None, int(fingerprint)):
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
    seal = _seal(row)
    fingerprint = _recorded(con, verified, verified.after(ledger_id=ledger_id, seal=seal), lambda: con.execute(
        f"UPDATE {LEDGER} SET status = ?, event = ?, epsilon = ?, params = ?, seal = ? WHERE id = ? "
        f"RETURNING {_FINGERPRINT}",
        [row["status"], row["event"], row["epsilon"], row["params"], seal, int(ledger_id)]).fetchall()[0][0])
    verified.remember(ledger_id, _Row(int(fingerprint), seal, row["source"], row["status"],
                                      Event.from_json(row["event"])))


def record(con, source: str, event: Event, *, mechanism: str, privacy_unit: str, params: dict,
           seeded: bool) -> int:
    """Check and record one finished release in one step (for releases made outside ``duckmob.release``, e.g.
    by tests); returns its id."""
    verified = Verified()
    ensure_tables(con, verified)
    p = prior(con, source, verified=verified)
    check(p, event)
    ledger_id = reserve(con, p, event, mechanism=mechanism, privacy_unit=privacy_unit, params=params,
                        seeded=seeded, verified=verified)
    update(con, ledger_id, status="spent", verified=verified)
    return ledger_id


def _current(con, verified: Verified | None, again: bool) -> Verified:
    """``verified``, or when None a new one, verified now (as is a given one that never was). With ``again``, a
    given one is verified again where the ledger has a head file: the head a write records must extend the
    ledger as it is, rows another caller added included."""
    if verified is None:
        verified = Verified()
        verify(con, verified)
        return verified
    _locate(con, verified)
    if not verified.tables or (again and verified.head_file is not None and not verified.read_only):
        verify(con, verified)
    return verified


def _jsonable(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


__all__ = ["ensure_tables", "has_tables", "verify", "Verified", "set_budget", "prior", "check", "reserve", "update",
           "record", "budget", "budgets", "spent", "events", "releases", "release_row", "Prior", "LedgerTampered",
           "head_file", "Head", "BUDGET", "LEDGER", "STATUSES", "HEAD_SUFFIX", "MARK", "join_keys", "keys_of",
           "needs_delta"]
