"""The privacy ledger: per-source budgets and a record of every release, kept in the user's own database.

One room per concern, this package holding the operations that read and write the sealed rows:

- :mod:`~duckmob.privacy.ledger.schema`: the tables ``duckmob_budget`` and ``duckmob_ledger``, their sequences
  and columns, and the rows read back (``mob_ledger()``);
- :mod:`~duckmob.privacy.ledger.spending`: budgets, what is spent (PLD composition of every release not
  cancelled) and what is left; the :class:`Prior` a new release composes with, its ``fits`` and ``check``;
- :mod:`~duckmob.privacy.ledger.seals`: tamper evidence, the seal of each row and the hash chains over them;
- :mod:`~duckmob.privacy.ledger.headfile`: the head file ``<database file>.duckmob-ledger`` that keeps the
  chains' ends outside the database;
- :mod:`~duckmob.privacy.ledger.renames`: the budget mark in a budgeted table's comment, so that a budget follows
  its table through ``ALTER TABLE ... RENAME`` (and across reopening the file);
- :mod:`~duckmob.privacy.ledger.state`: :class:`Verified`, what one process last found intact, so that each
  release checks the ledger incrementally.

Protocol (``duckmob.release`` is the one caller): under the database's lock, :func:`prior` reads the budget and
the other releases (checking the ledger's integrity), :func:`check` refuses a spend that would exceed the
budget, :func:`reserve` inserts a ``reserved`` row, all before any data is read and on the release core's own
connection (never inside the caller's transaction); :func:`settle` replaces a reserved event by the one a
method actually plans (checked again), and :func:`finish` closes the row.

Integrity: :func:`verify` refuses a ledger whose rows, declarations, sequences or head file no longer agree
(rows or declarations deleted, edited with seals recomputed or not, inserted, the ledger dropped and recreated);
every write (:func:`reserve`, :func:`update`, :func:`set_budget`) keeps the head file in step (:func:`_recorded`).
What this protects against, what it does not, and what stays the data owner's responsibility (copies, derived
tables, privacy units): docs/threat_model.md.
"""

from __future__ import annotations

import json
import math
from typing import Callable, TypeVar

import duckdb

from duckmob.errors import BudgetError, DuckmobError
from duckmob.privacy import accounting
from duckmob.privacy.accounting import Event, needs_delta
from duckmob.privacy.ledger.headfile import (HEAD_SUFFIX, MARK, Head, _check_head, _comment, _locate, _read_head,
                                             _write_head, head_file, stale)
from duckmob.privacy.ledger import renames
from duckmob.privacy.ledger.renames import renamed_from
from duckmob.privacy.ledger.schema import (_BUDGET_COLUMNS, _COLUMNS, _OBJECTS, BUDGET, BUDGET_SEQ, LEDGER, LEDGER_SEQ,
                                           STATUSES, _has_column, _now, _present, create, has_tables, release_row,
                                           releases)
from duckmob.privacy.ledger.seals import (_BUDGET_FINGERPRINT, _FINGERPRINT, LedgerTampered, _budget_seal, _seal,
                                          _tampered_budget, _tampered_row, _tampered_rows)
from duckmob.privacy.ledger.spending import (_SLACK, Prior, _no_budget, _up, budget, budgets, events, join_keys,
                                             keys_of, spent)
from duckmob.privacy.ledger.state import Verified, _Declaration, _Row
from duckmob.validators import delta_value, positive, source_name

T = TypeVar("T")

# -- tables ---------------------------------------------------------------------------------------------------


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
        create(con)
        return
    if tables == {BUDGET, LEDGER} and not seqs and not _has_column(con, LEDGER, "seal"):
        _upgrade(con)


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


# -- integrity ------------------------------------------------------------------------------------------------

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
        raise stale(verified.head_file, stored[0] if not stored[0].empty() else stored[1])
    if len(missing) == len(_OBJECTS):
        raise LedgerTampered("the tables duckmob_budget and duckmob_ledger and their sequences were dropped after "
                             "this process saw a privacy budget declared: the record of earlier releases is lost, "
                             "so no spend can be checked. Restore the database from a backup taken before the drop; "
                             "releases are refused until then")
    raise LedgerTampered(f"{' and '.join(missing)} {'was' if len(missing) == 1 else 'were'} dropped while a privacy "
                         "budget is declared: the record of earlier releases is lost, so no spend can be checked. "
                         "Restore the database from a backup taken before the drop; releases are refused until then")


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

def prior(con, source: str, exclude: int | None = None, verified: Verified | None = None) -> Prior:
    """The budget of ``source`` and the releases a new one composes with; refuses a source with no budget and
    a tampered ledger (:func:`verify`, incremental with the ``verified`` the release core keeps). The releases
    are the verified rows themselves, not a second read that an edit could slip in before."""
    source = source_name(source)
    verified = Verified() if verified is None else verified
    verify(con, verified)
    keys = _followed(con, verified, keys_of(source))
    if len(keys) > 1:   # a release over several base tables: each one's budget (the verification is done)
        parts = tuple(_prior_of(verified, key, exclude) for key in keys)
        tight = min(parts, key=lambda p: p.eps - p.spent())
        return Prior(join_keys(keys), tight.eps, min(p.delta for p in parts), tight.events, parts)
    return _prior_of(verified, keys[0], exclude)


def _followed(con, verified: Verified, keys: tuple[str, ...]) -> tuple[str, ...]:
    """``keys`` with a renamed table's key replaced by the key its budget mark names (both kept when it has a
    budget of its own): :mod:`duckmob.privacy.ledger.renames`. The catalog is read only when some budget is
    declared under a key outside ``keys`` (one a mark could name)."""
    if not verified.tables or all(d.source in keys for d in verified.declarations):
        return keys
    out = []
    for key in keys:
        other = renamed_from(con, key)
        if other is not None and verified.budget(other) is not None:
            out.append(other)
            if verified.budget(key) is None:
                continue
        out.append(key)
    return tuple(sorted(set(out)))


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
    p.check(event)


# -- showing (mob_budget(), mob_ledger()) ------------------------------------------------------------------------

def shown_budgets(con, verified: Verified | None = None) -> list[dict]:
    """What ``mob_budget()`` shows, from the ledger as :func:`verify` found it (a tampered ledger is refused with
    the same LedgerTampered a release gets, never shown clean): one dict per source (source, eps, delta, spent,
    remaining, releases, declared_at), its latest declaration and the PLD composition of its verified releases
    that count, at that declaration's delta."""
    verified = Verified() if verified is None else verified
    verify(con, verified)
    if not verified.tables:
        return []
    latest = {d.source: d for d in verified.declarations}   # in seq order: the last one wins
    declared_at = dict(con.execute(f"SELECT seq, declared_at FROM {BUDGET}").fetchall())
    out = []
    for source in sorted(latest):
        d = latest[source]
        recorded = verified.events(source)
        used = accounting.epsilon(accounting.compose(list(recorded)), d.delta)
        out.append({"source": source, "eps": d.eps, "delta": d.delta, "spent": used,
                    "remaining": max(d.eps - used, 0.0), "releases": len(recorded),
                    "declared_at": declared_at.get(d.seq)})
    return out


def shown_releases(con, verified: Verified | None = None) -> list[dict]:
    """What ``mob_ledger()`` shows: every release row, oldest first, after :func:`verify`; each row read is the
    one verified (its fingerprint), so an edit made between the check and the read is refused too."""
    verified = Verified() if verified is None else verified
    verify(con, verified)
    if not verified.tables:
        return []
    out = []
    for *values, fingerprint in con.execute(f"SELECT {', '.join(_COLUMNS)}, {_FINGERPRINT} FROM {LEDGER} ORDER BY id"
                                            ).fetchall():
        if verified.fingerprint(values[0]) != int(fingerprint):
            raise _tampered_row(values[0])
        out.append(dict(zip(_COLUMNS, values)))
    return out


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
    other = renamed_from(con, source)
    if other is not None and verified.budget(other) is not None:
        if verified.budget(source) is None:
            raise BudgetError(f"'{source}' is the table '{other}' renamed (its comment carries duckmob's budget mark "
                              f"{renames.mark(other)}): its rows already draw on the budget of '{other}', which "
                              f"releases from '{source}' are charged to; raise that one: FROM mob_set_budget("
                              f"'{other}', eps := ..., delta := ...)")
    else:
        renames.stamp(con, source)   # the budget follows the table through a rename (renames.py)
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


def _own_epsilon(event: Event, delta: float, *, quick: bool = False) -> float | None:
    """The ``epsilon`` column: the event's own epsilon at ``delta`` (what budgets compose are the events, not this
    column). ``quick`` (a reservation): where the PLD would first need its imports (half a second before any data
    is read), a valid upper bound of it (:func:`accounting.quick_epsilon`, which starts those imports on a
    thread); the release's end writes the PLD's value (:func:`update` with the event)."""
    own = accounting.quick_epsilon(event, delta) if quick else None
    if own is None:
        own = accounting.epsilon(event, delta)
    return own if math.isfinite(own) else None


def reserve(con, p: Prior, event: Event, *, mechanism: str, privacy_unit: str, params: dict,
            seeded: bool, verified: Verified | None = None) -> int:
    """Insert a ``reserved`` row for ``event`` (already checked against ``p``, read with ``verified``, which
    then remembers the row; without it the ledger is verified first); returns its id."""
    verified = _current(con, verified, again=False)
    row = {"recorded_at": _now(), "source": p.source, "mechanism": str(mechanism),
           "epsilon": _own_epsilon(event, p.delta, quick=True), "delta": p.delta, "privacy_unit": str(privacy_unit),
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


__all__ = ["ensure_tables", "has_tables", "verify", "shown_budgets", "shown_releases", "Verified", "set_budget", "prior", "check", "reserve", "update",
           "record", "budget", "budgets", "spent", "events", "releases", "release_row", "Prior", "LedgerTampered",
           "head_file", "Head", "BUDGET", "LEDGER", "STATUSES", "HEAD_SUFFIX", "MARK", "join_keys", "keys_of",
           "needs_delta"]
