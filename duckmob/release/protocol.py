"""The release protocol: validate, reserve (under the database's lock, on the core's own connection), read,
compute, finish. See :mod:`duckmob.release` for the order and what happens on failure."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

import duckdb

from duckmob.errors import DuckmobError
from duckmob.privacy import ledger
from duckmob.privacy.accounting import Event
from duckmob.release.interrupts import Interrupted
from duckmob.release.registry import Database

T = TypeVar("T")


@dataclass(frozen=True)
class Request:
    """A release to make: the public facts recorded in the ledger and the planned spend.

    ``plan(prior)`` returns the event to reserve given the source's :class:`~duckmob.privacy.ledger.Prior`
    (a method that spends a fixed event ignores it); it runs under the lock, before any data is read.
    """

    source: str
    mechanism: str
    privacy_unit: str
    params: dict
    seeded: bool
    plan: Callable[[ledger.Prior], Event]


@dataclass(eq=False)
class Release:
    """A release in progress, handed to the computation."""

    db: Database
    source: str
    ledger_id: int
    event: Event
    was_read: bool = False
    interrupted: threading.Event = field(default_factory=threading.Event)

    def read(self, load: Callable[[], T]) -> T:
        """Read the data (``load()``): from here on the reservation stands, whatever happens."""
        self.check_interrupt()
        self.was_read = True
        return load()

    def check_interrupt(self) -> None:
        """Raise :class:`Interrupted` if Ctrl-C was pressed (long loops call this once a step)."""
        if self.interrupted.is_set():
            raise Interrupted("interrupted (Ctrl-C): the release stopped; the budget it reserved stays spent, "
                              "since the data had been read, and nothing was stored")

    def settle(self, plan: Callable[[ledger.Prior], tuple[Event, T]], drawn: Event) -> T:
        """Re-plan the spend after reading data: ``plan(prior)`` -> ``(event, result)`` runs under the lock
        against every other release as it is now; ``event`` replaces the reservation if it fits, and
        ``result`` is returned. Otherwise (or if ``plan`` raises) the reservation is cut to ``drawn`` -- the
        part of it this release has already drawn noise for, which must be part of the reserved event -- and
        the error (a BudgetError when it does not fit) propagates.
        """
        with self.db.lock:
            with self.db.connection() as cur:
                p = ledger.prior(cur, self.source, exclude=self.ledger_id, verified=self.db.verified)
                try:
                    event, result = plan(p)
                    ledger.check(p, event)
                except BaseException:
                    self._set_event(cur, drawn)
                    raise
                self._set_event(cur, event)
                return result

    def _set_event(self, cur, event: Event) -> None:
        ledger.update(cur, self.ledger_id, event=event, verified=self.db.verified)
        self.event = event


def _reserve(db: Database, request: Request) -> Release:
    with db.lock, db.connection() as cur:
        try:
            ledger.ensure_tables(cur, db.verified)   # a look at the catalog until the tables are found once
            p = ledger.prior(cur, request.source, verified=db.verified)
            event = request.plan(p)
            ledger.check(p, event)
            ledger_id = ledger.reserve(cur, p, event, mechanism=request.mechanism,
                                       privacy_unit=request.privacy_unit, params=request.params,
                                       seeded=request.seeded, verified=db.verified)
        except duckdb.Error as exc:
            if "read-only" in str(exc) or "read only" in str(exc):
                raise DuckmobError("the database is opened read-only: a release must be recorded in its "
                                   "privacy ledger; open it writable") from None
            raise
    release = Release(db, request.source, ledger_id, event)
    db.active.add(release)
    return release


def _claim_name(db: Database, name: str) -> None:
    """Claim a model name for one fit (refused when stored or being fitted); release it with
    ``db.pending_names.discard(name)`` once the fit is over."""
    from duckmob.synth import store

    with db.lock, db.connection() as cur:
        taken = name in db.pending_names or store.exists(cur, name)
        if not taken:
            db.pending_names.add(name)
    if taken:
        raise DuckmobError(f"a model named '{name}' already exists or is being fitted: choose another name, or "
                           f"delete it first with DELETE FROM {store.TABLE} WHERE name = '{name}'")


def _finish(release: Release, status: str, params: dict | None = None) -> None:
    db = release.db
    with db.lock:
        with db.connection() as cur:
            ledger.update(cur, release.ledger_id, status=status, params=params, verified=db.verified)


def run(db: Database, request: Request, compute: Callable[[Release], T]) -> tuple[T, int]:
    """Make one release: reserve, ``compute(release)`` (which reads the data through ``release.read``),
    finish. Returns ``(result, ledger id)``; see the module docstring for what happens on failure."""
    release = _reserve(db, request)
    try:
        result = compute(release)
    except BaseException:
        db.active.discard(release)
        _finish(release, "failed" if release.was_read else "cancelled")
        raise
    db.active.discard(release)
    _finish(release, "spent")
    return result, release.ledger_id


def set_budget(db: Database, source, eps, delta) -> dict:
    """Declare or raise a budget (on the core's connection, under the lock); returns the source's budget row."""
    with db.lock:
        with db.connection() as cur:
            ledger.set_budget(cur, source, eps, delta, verified=db.verified)
            return next(b for b in ledger.budgets(cur) if b["source"] == source)


def read_ledger(db: Database, what: Callable) -> Any:
    """``what(cursor)`` on the core's connection (mob_budget, mob_ledger, loading a model)."""
    with db.connection() as cur:
        return what(cur)
