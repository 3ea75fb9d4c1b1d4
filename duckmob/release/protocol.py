"""The release protocol: validate, price (outside the database's lock), reserve (under it, on the core's own
connection), read, compute, finish. See :mod:`duckmob.release` for the order and what happens on failure."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

import duckdb

from duckmob.errors import DuckmobError
from duckmob.privacy import ledger, stopping
from duckmob.privacy.events import Event
from duckmob.privacy.noise import NoiseSource
from duckmob.release import interrupts
from duckmob.release.registry import Database

T = TypeVar("T")
P = TypeVar("P")


@dataclass(frozen=True)
class Request:
    """A release to make: the public facts recorded in the ledger and the price of the spend.

    ``price(prior)`` returns ``(event, plan)`` given the source's :class:`~duckmob.privacy.ledger.Prior` (a release
    that spends a fixed event ignores it): the event to reserve, and the plan the computation follows, which the
    reserved :class:`Release` carries as ``release.plan`` (a method's :class:`~duckmob.synth.base.Plan`; None for a
    counting release). It runs before any data is read, outside the database's lock (a calibration may take tens
    of seconds), so it must be a pure function of public parameters and the prior: it is run again when other
    releases changed the prior meanwhile and its event no longer fits; the plan reserved is the last one made.
    """

    source: str
    mechanism: str
    privacy_unit: str
    params: dict
    seeded: bool
    price: Callable[[ledger.Prior], tuple[Event, Any]]


@dataclass(eq=False)
class Release:
    """A release in progress, handed to the computation."""

    db: Database
    source: str
    ledger_id: int
    event: Event
    since: int   # interrupts.since(): the press count when the release was entered; a Ctrl-C after that stops it
    noise: NoiseSource | None = None   # where all of the release's noise comes from
    plan: Any = None   # what the computation follows: the plan the reservation paid for (Request.price)
    was_read: bool = False
    drawn: Event | None = None   # set by stopped(): the event a failed release is recorded with
    interrupted: threading.Event = field(default_factory=threading.Event)

    def read(self, load: Callable[[], T]) -> T:
        """Read the data (``load()``): from here on the reservation stands, whatever happens."""
        self.check_interrupt()
        self.was_read = True
        return load()

    def check_interrupt(self) -> None:
        """Raise :class:`~duckmob.release.interrupts.Interrupted` if Ctrl-C was pressed since the release started
        (long loops call this once a step)."""
        if self.interrupted.is_set() or interrupts.presses() != self.since:
            raise interrupts.stopped(self.was_read)

    def settle(self, price: Callable[[ledger.Prior], tuple[Event, T]], drawn: Event) -> T:
        """Price the spend again after reading data: ``price(prior)`` -> ``(event, result)`` runs outside the lock
        against every other release as it is then (and again if they changed so that ``event`` no longer fits);
        under the lock, ``event`` replaces the reservation if it fits, and ``result`` is returned. Otherwise (or
        if ``price`` raises, or Ctrl-C was pressed) the reservation is cut to ``drawn`` -- the part of it this
        release has already drawn noise for, which must be part of the reserved event -- and the error (a
        BudgetError when it does not fit) propagates.
        """
        written = False

        def replace(p: ledger.Prior, priced: tuple[Event, T]) -> T:
            nonlocal written
            event, result = priced
            p.check(event)
            written = True
            self._set_event(cur, event)
            return result

        with self.db.connection() as cur:
            try:
                return _priced(self.db, cur, self.source, price, replace, exclude=self.ledger_id,
                               check=self.check_interrupt)
            except ledger.LedgerTampered:
                raise   # nothing is written to a ledger found edited
            except BaseException:
                if not written:
                    with self.db.lock:
                        self._set_event(cur, drawn)
                raise

    def stopped(self, drawn: Event) -> None:
        """The computation is stopping (an error or Ctrl-C, propagating) having drawn the noise of ``drawn`` only:
        the reservation is recorded as ``drawn`` when the release finishes as failed -- e.g. the Laplace parts and
        ``dp_sgd(sigma, q, steps that ran)`` of a DP-SGD fit reserved for more steps. Sound because nothing is
        output and every computation on the data that ran had its noise drawn: the composition of the mechanisms
        that ran bounds what was computed (docs/threat_model.md, "A stopped fit is charged what ran"). ``drawn``
        must be within the reservation (:func:`within`: each of its parts one of the reserved ones, a DP-SGD part
        with at most the reserved steps); otherwise the reservation stands whole."""
        if within(drawn, self.event):
            self.drawn = drawn

    def _set_event(self, cur, event: Event) -> None:
        ledger.update(cur, self.ledger_id, event=event, verified=self.db.verified)
        self.event = event


def within(part: Event, whole: Event) -> bool:
    """Whether ``part`` is a sub-event of ``whole``: its parts (leaves) can be matched one to one with parts of
    ``whole`` that are equal; or, for ``dp_sgd``, have the same noise multiplier and sample rate and at least as
    many steps (a prefix of the run); or, for ``gaussian``, a multiplier at most ``part``'s (fewer of PateGail's
    rounds, :func:`~duckmob.privacy.events.gaussian_rounds`). Then ``whole``'s privacy loss bounds
    ``part``'s: fewer mechanisms composed, each dominated by its match."""
    left = list(whole.leaves())
    for leaf in part.leaves():
        i = next((i for i, candidate in enumerate(left) if _dominates(candidate, leaf)), None)
        if i is None:
            return False
        del left[i]
    return True


def _dominates(big: Event, small: Event) -> bool:
    """Whether the single mechanism ``big`` loses at least as much privacy as ``small`` (see :func:`within`)."""
    if big == small:
        return True
    if big.kind != small.kind or big.kind not in ("dp_sgd", "gaussian"):
        return False
    if big.kind == "gaussian":
        return small.param("noise_multiplier") >= big.param("noise_multiplier")
    return (small.param("noise_multiplier") == big.param("noise_multiplier")
            and small.param("sample_rate") == big.param("sample_rate") and small.param("steps") <= big.param("steps"))


def _priced(db: Database, cur, source: str, price: Callable[[ledger.Prior], tuple[Event, P]],
            then: Callable[[ledger.Prior, tuple[Event, P]], T], *, exclude: int | None = None,
            check: Callable[[], None]) -> T:
    """``then(prior, priced)`` under the database's lock, with ``priced = price(prior')`` (an event and what goes
    with it) computed without it.

    The lock is held only to read the ledger (``prior'``) and, later, to re-read it and write: pricing (a DP-SGD
    noise calibration takes tens of seconds at a large eps) does not hold up other releases. If the budget or
    another release changed meanwhile and the priced event no longer fits, the price is made again against the
    ledger as it is now; an event that still fits is kept (``then`` checks it against the ``prior`` it is given,
    the current one). A new price follows only a change that left less room (more spent, a lower budget), so the
    loop ends once the others stop taking room: with an event that fits, or a refusal. ``check()`` (Ctrl-C) runs
    before each price, within a calibration (``stopping.stoppable``) and under the lock after it."""
    with db.lock:
        p = ledger.prior(cur, source, exclude=exclude, verified=db.verified)
    while True:
        check()
        with stopping.stoppable(check):   # a calibration checks for Ctrl-C between its evaluations
            priced = price(p)
        with db.lock:
            check()
            now = ledger.prior(cur, source, exclude=exclude, verified=db.verified)
            if now == p or now.fits(priced[0]):
                return then(now, priced)
        p = now


def _reserve(db: Database, request: Request, since: int, noise: NoiseSource | None = None) -> Release:
    """Price ``request`` (outside the lock) and reserve its event (under it), the release carrying the plan that
    came with it; refused (Interrupted, nothing reserved) if Ctrl-C was pressed since ``since``
    (:func:`~duckmob.release.interrupts.since`)."""
    def not_interrupted() -> None:
        if interrupts.presses() != since:
            raise interrupts.stopped(was_read=False)

    def reserve(p: ledger.Prior, priced: tuple[Event, Any]) -> tuple[Event, Any, int]:
        event, plan = priced
        p.check(event)
        return event, plan, ledger.reserve(cur, p, event, mechanism=request.mechanism,
                                           privacy_unit=request.privacy_unit, params=request.params,
                                           seeded=request.seeded, verified=db.verified)

    with db.connection() as cur:
        try:
            with db.lock:
                ledger.ensure_tables(cur, db.verified)   # a look at the catalog until the tables are found once
            event, plan, ledger_id = _priced(db, cur, request.source, request.price, reserve, check=not_interrupted)
        except duckdb.Error as exc:
            if "read-only" in str(exc) or "read only" in str(exc):
                raise DuckmobError("the database is opened read-only: a release must be recorded in its "
                                   "privacy ledger; open it writable") from None
            raise
    release = Release(db, request.source, ledger_id, event, since, noise, plan)
    db.active.add(release)
    return release


def _finish(release: Release, status: str, params: dict | None = None) -> None:
    db = release.db
    with db.lock:
        with db.connection() as cur:
            # with its event: the epsilon column gets the PLD's value where the reservation wrote a quick bound
            ledger.update(cur, release.ledger_id, status=status, params=params, event=release.event,
                          verified=db.verified)


def run(db: Database, request: Request, compute: Callable[[Release], T],
        noise: NoiseSource | None = None) -> tuple[T, int]:
    """Make one release: reserve, ``compute(release)`` (which reads the data through ``release.read``),
    finish. Returns ``(result, ledger id)``; see the module docstring for what happens on failure. Ctrl-C from
    the moment the release was entered (:func:`duckmob.release.interrupts.entered`, opened by every entry point:
    the SQL UDFs, the Python API, Spark; else from the call of ``run``) until the data is read cancels the
    release: nothing reserved, or the reservation marked ``cancelled``. After the read, a failure or Ctrl-C
    leaves it ``failed`` with its event, cut to what was drawn where the computation said so
    (:meth:`Release.stopped`)."""
    release = _reserve(db, request, interrupts.since(), noise)
    try:
        result = compute(release)
    except BaseException:
        db.active.discard(release)
        if release.was_read and release.drawn is not None:
            release.event = release.drawn
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
