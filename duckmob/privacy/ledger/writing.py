"""Writing the ledger: budget declarations (:func:`set_budget`) and release rows (:func:`reserve`, :func:`update`,
:func:`record`), each sealed (:mod:`duckmob.privacy.ledger.seals`) and kept in step with the head file
(:mod:`duckmob.privacy.ledger.headfile`) by :func:`_recorded`.

Each write first checks the ledger as it is (:func:`duckmob.privacy.ledger.integrity.verify`, incremental with
the :class:`~duckmob.privacy.ledger.state.Verified` the caller keeps), which then remembers what was written.
"""

from __future__ import annotations

import json
import math
from typing import Callable, TypeVar

import duckdb

from duckmob.errors import BudgetError, DuckmobError
from duckmob.privacy import accounting
from duckmob.privacy.events import Event
from duckmob.privacy.ledger import headfile, renames, seals
from duckmob.privacy.ledger.headfile import MARK, Head
from duckmob.privacy.ledger.integrity import checked_row, ensure_tables, locate, verify
from duckmob.privacy.ledger.reading import prior
from duckmob.privacy.ledger.renames import renamed_from
from duckmob.privacy.ledger.schema import BUDGET, BUDGET_SEQ, COLUMNS, LEDGER, LEDGER_SEQ, STATUSES, now
from duckmob.privacy.ledger.seals import BUDGET_FINGERPRINT, FINGERPRINT, LedgerTampered
from duckmob.privacy.ledger.spending import SLACK, Prior, rounded_up
from duckmob.privacy.ledger.state import Declaration, Row, Verified
from duckmob.validators import delta_value, positive, source_name

T = TypeVar("T")


def check_budget(eps, delta) -> tuple[float, float]:
    """A budget's (eps, delta) as declared: eps positive and finite, delta in [0, MAX_DELTA]. The one check of a
    budget: :func:`set_budget` makes it, and mob_set_budget asks for it before it resolves the table."""
    return positive("eps", eps), delta_value(delta)


def set_budget(con, source: str, eps: float, delta: float, verified: Verified | None = None) -> None:
    """Declare (or raise) the (eps, delta) budget of ``source``; refuses one below what is already spent and a
    tampered ledger (checked with ``verified`` as in :func:`~duckmob.privacy.ledger.reading.prior`, which then
    remembers the declaration)."""
    source = source_name(source)
    eps, delta = check_budget(eps, delta)
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
    if used > eps + SLACK:
        raise BudgetError(f"cannot set the budget of '{source}' to eps {eps:g} at delta {delta:g}: "
                          f"eps {used:.4g} is already spent, and a budget cannot go below what is spent: declare at "
                          f"least {rounded_up(used)}")
    row = {"seq": int(con.execute(f"SELECT nextval('{BUDGET_SEQ}')").fetchall()[0][0]), "source": source,
           "eps": eps, "delta": delta}
    seal = seals.budget_seal(row)
    fingerprint = _recorded(con, verified, verified.after(budget_seal=seal), lambda: con.execute(
        f"INSERT INTO {BUDGET} (seq, source, eps, delta, declared_at) VALUES (?, ?, ?, ?, ?) "
        f"RETURNING {BUDGET_FINGERPRINT}", [row["seq"], source, eps, delta, now()]).fetchall()[0][0])
    verified.declare(Declaration(row["seq"], int(fingerprint), seal, source, eps, delta))


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
    row = {"recorded_at": now(), "source": p.source, "mechanism": str(mechanism),
           "epsilon": _own_epsilon(event, p.delta, quick=True), "delta": p.delta, "privacy_unit": str(privacy_unit),
           "params": json.dumps(params, default=_jsonable, sort_keys=True), "event": event.to_json(),
           "seeded": bool(seeded), "status": "reserved"}
    # the id is the sequence's next one (verified: the sequence handed out exactly the rows there are), taken by
    # the INSERT itself, so that a crash cannot consume an id without writing its row
    row["id"] = len(verified.rows) + 1
    seal = seals.seal(row)
    written, fingerprint = _recorded(con, verified, verified.after(ledger_id=row["id"], seal=seal), lambda: con.execute(
        f"INSERT INTO {LEDGER} ({', '.join(COLUMNS)}, seal) VALUES (nextval('{LEDGER_SEQ}'), "
        f"{', '.join('?' * (len(COLUMNS) - 1))}, ?) RETURNING id, {FINGERPRINT}",
        [row[c] for c in COLUMNS[1:]] + [seal]).fetchall()[0])
    if written != row["id"]:   # another writer took ids without the lock: the row's seal names the wrong one
        raise LedgerTampered(f"duckmob_ledger's sequence handed out id {written} where {row['id']} was expected: "
                             "something else writes the ledger. Restore the database from a backup; releases are "
                             "refused until then")
    verified.remember(row["id"], Row(int(fingerprint), seal, p.source, "reserved", event))
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
        rows = con.execute(f"SELECT {', '.join(COLUMNS)}, seal, {FINGERPRINT} FROM {LEDGER} WHERE id = ?",
                           [int(ledger_id)]).fetchall()
    except duckdb.CatalogException:
        rows = []
    if not rows:
        raise LedgerTampered(f"ledger row {ledger_id} of a release in progress disappeared: the ledger was "
                             "edited; releases are refused until the database is restored")
    *values, seal, fingerprint = rows[0]
    checked_row(values, seal, fingerprint, ledger_id)
    if verified.fingerprint(ledger_id) not in (None, int(fingerprint)):
        raise seals.tampered_row(ledger_id)
    row = dict(zip(COLUMNS, values))
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
    seal = seals.seal(row)
    fingerprint = _recorded(con, verified, verified.after(ledger_id=ledger_id, seal=seal), lambda: con.execute(
        f"UPDATE {LEDGER} SET status = ?, event = ?, epsilon = ?, params = ?, seal = ? WHERE id = ? "
        f"RETURNING {FINGERPRINT}",
        [row["status"], row["event"], row["epsilon"], row["params"], seal, int(ledger_id)]).fetchall()[0][0])
    verified.remember(ledger_id, Row(int(fingerprint), seal, row["source"], row["status"],
                                     Event.from_json(row["event"])))


def record(con, source: str, event: Event, *, mechanism: str, privacy_unit: str, params: dict,
           seeded: bool) -> int:
    """Check and record one finished release in one step (for releases made outside ``duckmob.release``, e.g.
    by tests); returns its id."""
    verified = Verified()
    ensure_tables(con, verified)
    p = prior(con, source, verified=verified)
    p.check(event)
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
    locate(con, verified)
    if not verified.tables or (again and verified.head_file is not None and not verified.read_only):
        verify(con, verified)
    return verified


def _recorded(con, verified: Verified, after: Head, write: Callable[[], T]) -> T:
    """Run ``write`` (one autocommitted statement that takes the verified ledger to ``after``) with the head file
    kept in step: ``after`` is recorded as pending first, then as the head once the statement committed. If the
    statement fails, the pending state stays (an interrupted statement may have committed or not: it accepts
    both) until the next write. The first write also marks the ledger
    (:data:`~duckmob.privacy.ledger.headfile.MARK`)."""
    path = None if verified.read_only else verified.head_file
    if path is None:
        return write()
    headfile.write_head(path, verified.head(), pending=after)
    result = write()
    headfile.write_head(path, after)
    verified.anchored = True
    if not verified.marked:
        try:
            if headfile.comment(con) != MARK:
                con.execute(f"COMMENT ON TABLE {LEDGER} IS '{MARK}'")
            verified.marked = True
        except duckdb.Error:
            pass   # tried again at the next write; the head file protects the ledger meanwhile
    return result


def _jsonable(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


__all__ = ["set_budget", "reserve", "update", "record"]
