"""The release core: the one protocol every release of a sensitive table goes through.

Every release (``synthesize``, ``mob_fit``, ``mob_transitions``, ``mob_noisy_count``, and any future method; from
SQL, Python, the shell, Jupyter or dbt) is :func:`run`, in this order:

1. **validate** every public argument (``duckmob.validators``, the method's config, its planned event: an eps
   the mechanism cannot honour is refused here). Nothing is read and nothing is spent.
2. **reserve**, under the database's lock and on the core's own connection (never the caller's transaction:
   a ROLLBACK cannot undo it): read the budget and every other release of the source, check the ledger's
   integrity, plan the spend (a method may calibrate it to what is left), check it fits, insert a ``reserved``
   ledger row and commit. Concurrent releases (threads, cursors, one statement with several releases) see each
   other's reservations, so together they never exceed the budget. A model name is claimed just before.
3. **read** the data (:meth:`Release.read`). From here on the reservation stands whatever happens: an
   exception, Ctrl-C (:meth:`Release.check_interrupt`), a full disk while saving. A failure before the read
   cancels the reservation (the row stays, marked ``cancelled``, counting nothing).
4. **compute** (the mechanism). A method whose spend depends on a noisy count (HRNet) re-plans with
   :meth:`Release.settle`, under the lock and against the ledger as it is then; if its new plan does not fit,
   the reservation is cut to what it had drawn noise for, and the release is refused.
5. **finish**: the row becomes ``spent`` (or ``failed`` after an error), with the event actually spent.

Messages on this path never carry anything computed from the table (``duckmob.trajectories.from_points`` with
``private=True`` drops what it cannot use, silently; ``mob_check`` is the exact, non-private diagnostic).

One :class:`Database` per DuckDB database instance in this process holds the core's own connection, the lock,
the releases in progress, the model names being fitted (claimed by :func:`fit` before it reserves) and what was
last verified of the ledger (so each release checks it incrementally). DuckDB lets one process at a time write a
database file, so a per-process lock is a per-database lock.
"""

from __future__ import annotations

import atexit
import hashlib
import signal
import threading
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

import duckdb
import numpy as np
import pyarrow as pa

from duckmob import stream, validators
from duckmob.errors import DuckmobError
from duckmob.privacy import accounting, ledger
from duckmob.privacy.accounting import Event
from duckmob.privacy.noise import check_scale

T = TypeVar("T")


class Interrupted(DuckmobError):
    """A release stopped by Ctrl-C after its data was read: its reservation stays spent, no model is stored."""


# -- databases ------------------------------------------------------------------------------------------------

class Database:
    """duckmob's state for one DuckDB database instance: the core's own connection, the release lock, the
    releases in progress (for Ctrl-C), the model names being fitted, and what this process last verified of the
    ledger (:class:`~duckmob.privacy.ledger.Verified`: each release re-checks it with one aggregate query and
    hashes only the rows added since; read and written under the lock)."""

    def __init__(self, con: duckdb.DuckDBPyConnection):
        self.token = uuid.uuid4().hex
        self.path, self.read_only = _location(con)
        self.con = self._connect(con)
        self.lock = threading.RLock()
        self.active: set["Release"] = set()
        self.pending_names: set[str] = set()
        self.verified = ledger.Verified()

    def _connect(self, con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
        """The core's own connection, which the UDFs are registered on and which must outlive the user's.

        A cursor of the registering connection, so that closing the user's connections releases the file (an
        independent connection kept it open with DuckDB's default configuration, and a later connection with
        another configuration -- dbt's -- was refused). Known limit: closing the registering connection while
        another independent connection to the same file stays open leaves the UDFs on a closed connection."""
        return con.cursor()

    @contextmanager
    def connection(self):
        """A new connection to this database for one thread's use, closed on exit."""
        cur = self.cursor()
        try:
            yield cur
        finally:
            cur.close()

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A new connection to this database, for one thread's use (close it after)."""
        try:
            return self.con.cursor()
        except duckdb.ConnectionException:
            raise DuckmobError("the connection duckmob was registered on is closed: run duckmob.register(con) "
                               "on an open connection") from None

    def close(self) -> None:
        try:
            self.con.close()
        except duckdb.Error:
            pass


# The databases this process has registered duckmob on, by token. DuckDB registers Python functions per database
# instance, so this mapping is process state by nature; it is only read through ``_mob_instance()``.
_DATABASES: dict[str, Database] = {}
_REGISTRY_LOCK = threading.Lock()


def _location(con: duckdb.DuckDBPyConnection) -> tuple[str | None, bool]:
    """(file path or None for an in-memory database, read-only) of ``con``'s default database."""
    row = con.execute("SELECT path, readonly FROM duckdb_databases() WHERE database_name = current_database()"
                      ).fetchall()
    return (row[0][0] or None, bool(row[0][1])) if row else (None, False)


def database(con: duckdb.DuckDBPyConnection, create: Callable[[Database], None] | None = None) -> Database:
    """The :class:`Database` of ``con``'s database; with ``create``, made (and ``create(db)`` run: registering
    the UDFs on ``db.con``) when it does not exist yet. Thread-safe: one caller creates, the others wait."""
    found = _lookup(con)
    if found is not None or create is None:
        if found is None:
            raise DuckmobError("duckmob is not registered on this connection: run duckmob.register(con) first")
        return found
    with _REGISTRY_LOCK:
        found = _lookup(con)
        if found is not None:
            return found
        db = Database(con)
        create(db)
        db.con.create_function("_mob_instance", lambda: db.token, [], "VARCHAR", side_effects=False)
        _DATABASES[db.token] = db
        return db


def _lookup(con) -> Database | None:
    try:
        token = con.execute("SELECT _mob_instance()").fetchall()[0][0]
    except duckdb.CatalogException:
        return None
    return _DATABASES.get(token)


@atexit.register
def _close_all() -> None:
    for db in list(_DATABASES.values()):
        db.close()


# -- Ctrl-C ---------------------------------------------------------------------------------------------------

_HANDLER_INSTALLED = False


def interrupt_all() -> None:
    """Flag every release in progress in this process as interrupted (what Ctrl-C does)."""
    for db in list(_DATABASES.values()):
        for release in list(db.active):
            release.interrupted.set()


def install_interrupt_handler() -> None:
    """Make Ctrl-C reach releases in progress (once per process, from the main thread; elsewhere a no-op).

    Python runs signal handlers on the main thread only, while a release may run inside a DuckDB worker thread;
    the handler flags every release in progress (their loops call :meth:`Release.check_interrupt`) and then
    does what the previous handler did (normally: KeyboardInterrupt, which DuckDB turns into an interrupted
    query).
    """
    global _HANDLER_INSTALLED
    if _HANDLER_INSTALLED or threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGINT)

    def handler(signum, frame):
        interrupt_all()
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread of the main interpreter
        return
    _HANDLER_INSTALLED = True


# -- the protocol ---------------------------------------------------------------------------------------------

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


# -- synthesis ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FitRequest:
    """The validated public arguments of a fit (synthesize or mob_fit)."""

    source: str
    eps: float
    delta: float
    method: str
    synthesizer: Any
    privacy_unit: str
    k: int
    params: dict
    seed: int | None
    name: str | None = None
    n: int | None = None


def fit_request(*, source, eps, delta=None, method="privtrace", bbox=None, privacy_unit="trajectory",
                max_trajectories_per_user=None, params=None, outside="drop", seed=None, name=None,
                n=None) -> FitRequest:
    """Validate every public argument of a fit (before anything is reserved or read)."""
    from duckmob import synth

    source = validators.source_name(source)
    cls = synth.get(method)
    params = synth.parse_params(params)
    synthesizer = cls(bbox, **params)
    unit, k = validators.privacy_unit(privacy_unit, max_trajectories_per_user)
    validators.outside(outside)
    return FitRequest(source=source, eps=validators.epsilon(eps),
                      delta=validators.delta_value(delta, cls.default_delta), method=cls.method,
                      synthesizer=synthesizer, privacy_unit=unit, k=k, params=params,
                      seed=validators.seed(seed), name=None if name is None else validators.model_name(name),
                      n=validators.n_trajectories(n))


def fit(db: Database, request: FitRequest, load_points: Callable[[], pa.Table]):
    """Fit ``request.method`` on the points ``load_points()`` returns: one release of the source's budget.

    ``load_points()`` returns an Arrow table of points (in memory), or a :class:`duckmob.stream.PointSource` that
    the release reads out of core, bucket by bucket, after the reservation (the same model under the same seed).

    Returns ``(model, ledger id, noise source)``. The points are cleaned privately (invalid points, points
    outside the bbox and short trajectories dropped, per trajectory, silently); with the user unit each user
    keeps at most k trajectories, chosen at random.
    """
    from duckmob.privacy.counting import bound_contributions
    from duckmob.privacy.noise import NoiseSource
    from duckmob.trajectories import from_points

    r = request
    synthesizer, noise = r.synthesizer, NoiseSource(r.seed)
    recorded = {"method": r.method, "max_trajectories_per_user": r.k, **r.params,
                **({"model": r.name} if r.name else {})}

    def compute(release: Release):
        points = release.read(load_points)
        if isinstance(points, stream.PointSource):   # out of core: DuckDB buckets, Spark partitions
            return _fit_batches(release, r, points, noise)
        data, _ = from_points(points, bbox=synthesizer.bbox, outside="drop", time_required=synthesizer.needs_time,
                              private=True)
        if r.privacy_unit == "user":
            keep = bound_contributions(data.user_id, r.k, noise.generator())
            data = data.take(np.asarray(keep, dtype=bool))
        return synthesizer.fit(data, r.eps, r.delta, noise, contribution_bound=r.k, release=release)

    req = Request(source=r.source, mechanism=r.method, privacy_unit=r.privacy_unit, params=recorded,
                  seeded=noise.seeded,
                  plan=lambda p: synthesizer.privacy_event(r.eps, r.delta, contribution_bound=r.k, prior=p))
    if r.name is None:
        model, ledger_id = run(db, req, compute)
        return model, ledger_id, noise
    _claim_name(db, r.name)   # before anything is reserved; a second fit of the same name is refused here
    try:
        model, ledger_id = run(db, req, compute)
        _store(db, r, model, ledger_id)
    finally:   # stored, or nothing stored: the name is no longer being fitted
        db.pending_names.discard(r.name)
    return model, ledger_id, noise


def _fit_batches(release: Release, r: FitRequest, source, noise):
    """The fit of :func:`fit` on a :class:`duckmob.stream.PointSource`: the same cleaning and contribution
    bounding, batch by batch (``stream.clean``; Spark partitions in ``duckmob.spark``), then the method's fit on
    the batches (a method that does not stream gets them concatenated). The same model as the in-memory path
    under the same seed (tests/test_stream.py)."""
    synthesizer = r.synthesizer
    batches = None
    try:
        batches = source.batches(bbox=synthesizer.bbox, time_required=synthesizer.needs_time,
                                 privacy_unit=r.privacy_unit, k=r.k, rng=noise.generator)
        release.check_interrupt()
        if synthesizer.streams:
            return synthesizer.fit(batches, r.eps, r.delta, noise, contribution_bound=r.k, release=release)
        data = batches.trajectories()
        batches.close()          # the temporary files are not needed during a long (neural) fit
        source.close()
        return synthesizer.fit(data, r.eps, r.delta, noise, contribution_bound=r.k, release=release)
    finally:
        if batches is not None:
            batches.close()
        source.close()


def _store(db: Database, r: FitRequest, model, ledger_id: int) -> None:
    """Save a fitted model bound to its ledger row (the row records the model's checksum)."""
    from duckmob.synth import store

    blob = model.to_bytes()
    described = {**model.describe(), "privacy_unit": r.privacy_unit, "max_trajectories_per_user": r.k,
                 "seeded": r.seed is not None}
    digest = store.checksum(r.name, r.method, r.source, described, blob, ledger_id)
    with db.lock:
        with db.connection() as cur:
            ledger.update(cur, ledger_id, params={"model_checksum": digest}, verified=db.verified)
            store.save(cur, r.name, r.method, r.source, described, r.eps, r.delta, blob, ledger_id=ledger_id,
                       checksum=digest)


def sample(model, n: int | None, rng: np.random.Generator):
    """``n`` trajectories from a fitted model (None: the model's noisy trajectory count): free post-processing."""
    if n is None:
        n = model.default_n
        if n is None or n < 1:
            raise DuckmobError("this model has no default size (its noisy trajectory count is below 1): pass "
                               "n := number of trajectories")
    return model.sample(validators.n_trajectories(n), rng)


# -- counting releases ----------------------------------------------------------------------------------------

def _needs_users(source: str, user_col: str | None, what: str, instead: str) -> None:
    """Refuse, before anything is reserved, a release that needs user ids from a table without a user column.
    Which columns a table has is public schema, not data, so saying so releases nothing."""
    if user_col is None:
        raise DuckmobError(f"'{source}' has no user_id column (nor one named with user_col := ...), so {what}: "
                           f"name its user column with user_col := '...', or {instead}")


def noisy_count(db: Database, *, source, eps, seed=None, privacy_unit="trajectory", max_trajectories_per_user=None,
                what="trajectories", user_col: str | None = "user_id",
                load: Callable[[], tuple[np.ndarray, np.ndarray]]) -> float:
    """An eps-DP count of the trajectories or users of ``source`` (``mob_noisy_count``).

    ``load()`` returns ``(traj_id, user_id)`` per trajectory (user -1 when unknown), or the exact number of items
    counted where the data lives (an int: ``duckmob.stream.noisy_count``). ``user_col`` names the
    table's user column, None when it has none: counting users, or the user unit, is then refused before anything
    is reserved (it would count no one and release noise around 0). Privacy map: one trajectory
    changes the trajectory count by 1; under the user unit at most k trajectories per user are counted (sensitivity
    k); one trajectory or user changes the user count by at most 1. Laplace(sensitivity / eps), accounted as
    ``accounting.laplace(eps)``.
    """
    from duckmob.privacy import counting
    from duckmob.privacy.noise import NoiseSource

    if what not in ("trajectories", "users"):
        raise DuckmobError(f"what must be 'trajectories' or 'users'; got {what!r}")
    unit, k = validators.privacy_unit(privacy_unit, max_trajectories_per_user, needs_bound=what == "trajectories")
    source = validators.source_name(source)
    if what == "users":
        _needs_users(source, user_col, "its users cannot be counted", "count trajectories with what := 'trajectories'")
    elif unit == "user":
        _needs_users(source, user_col, "privacy_unit := 'user' cannot tell whose each trajectory is",
                     "use privacy_unit := 'trajectory'")
    eps = validators.epsilon(eps)
    sensitivity = k if what == "trajectories" else 1
    check_scale(sensitivity / eps)
    noise = NoiseSource(validators.seed(seed))
    event = accounting.laplace(eps)

    def compute(release: Release) -> float:
        loaded = release.read(load)
        if isinstance(loaded, (int, np.integer)):   # counted where the data lives (duckmob.stream.noisy_count)
            return counting.noisy_count(int(loaded), eps, noise, sensitivity)
        _traj, users = loaded
        if what == "users":
            # users without an id are not counted; one trajectory (or user) adds at most one user
            n_items = int(np.unique(users[users >= 0]).size)
        elif unit == "user":
            keep = counting.bound_contributions(users, k, noise.generator())
            n_items = int(keep.sum())
        else:
            n_items = len(users)
        return counting.noisy_count(n_items, eps, noise, sensitivity)

    params = {"eps": eps, "what": what, "sensitivity": sensitivity,
              "max_trajectories_per_user": k if unit == "user" and what == "trajectories" else None}
    value, _ = run(db, Request(source=source, mechanism=f"count({what})",
                               privacy_unit=unit, params=params, seeded=noise.seeded, plan=lambda p: event), compute)
    return value


def transitions(db: Database, *, source, order=1, eps, n_states, seed=None, privacy_unit="trajectory",
                max_trajectories_per_user=None, max_length=None, support=None, w=None, user_col: str | None = "user_id",
                load: Callable[[], tuple[np.ndarray, np.ndarray, np.ndarray]]):
    """eps-DP length-normalised transition counts of a table of cell sequences (``mob_transitions``).

    ``load()`` returns ``(offsets, cells, user_id)``, or a callable yielding such batches (read out of core:
    ``duckmob.stream.transitions``; the same release); ``user_col`` is as in :func:`noisy_count` (the user unit
    on a table without a user column is refused before anything is reserved). The mechanism and its privacy map are
    ``duckmob.privacy.counting.noisy_transition_counts`` (dense) / ``..._sparse`` (support 'neighbours'):
    Laplace(k / eps) on every entry of a data-independent support, accounted as ``accounting.laplace(eps)``.
    Returns ``(states (n, order + 1), counts)`` of the entries left positive by NormCut.
    """
    from duckmob.privacy import counting
    from duckmob.privacy.noise import NoiseSource

    example = f"FROM mob_transitions('{source}', eps := 0.5, n_states := 1024)"
    unit, k = validators.privacy_unit(privacy_unit, max_trajectories_per_user)
    source = validators.source_name(source)
    if unit == "user":
        _needs_users(source, user_col, "privacy_unit := 'user' cannot tell whose each sequence is",
                     "use privacy_unit := 'trajectory'")
    eps = validators.epsilon(eps)
    if n_states is None:
        raise DuckmobError(f"n_states is required (public: w * w for a w x w grid), e.g. {example}")
    n_states = validators.count("n_states", n_states, maximum=1 << 40)
    order = 1 if order is None else order
    if order not in (1, 2):
        raise DuckmobError(f"markov_order must be 1 or 2; got {order!r}")
    if max_length is not None:
        max_length = validators.count("max_length", max_length)
    check_scale(k / eps)
    if support not in (None, "full", "neighbours"):
        raise DuckmobError(f"support must be NULL, 'full' or 'neighbours'; got {support!r}")
    if support == "neighbours" and (w is None or validators.count("w", w) ** 2 != n_states):
        raise DuckmobError(f"support := 'neighbours' needs the grid width w with w * w = n_states ({n_states}); "
                           f"got w = {w!r}")
    if support != "neighbours" and (n_states + 2) ** (order + 1) > counting.MAX_DENSE:
        raise DuckmobError(f"a dense order-{order} table over {n_states} states is too large: use fewer states, "
                           "support := 'neighbours' (with w), or markov_order := 1")
    noise = NoiseSource(validators.seed(seed))
    event = accounting.laplace(eps)

    def compute(release: Release):
        loaded = release.read(load)
        # a callable yields (offsets, cells, user_id) batches read out of core (duckmob.stream.transitions)
        batches = loaded if callable(loaded) else (lambda: iter([loaded]))
        args = dict(privacy_unit=unit, max_trajectories_per_user=k if unit == "user" else None,
                    max_length=max_length, support=support, w=w)
        if support == "neighbours":
            return counting.noisy_transition_counts_sparse_batches(batches, n_states, order, eps, noise, **args)
        counts = counting.noisy_transition_counts_batches(batches, n_states, order, eps, noise,
                                                          dtype=np.float64 if order == 1 else np.float32, **args)
        nz = np.nonzero(counts)
        return np.stack(nz, axis=1), counts[nz].astype(np.float64)

    params = {"order": order, "eps": eps, "n_states": n_states, "max_length": max_length,
              "max_trajectories_per_user": k if unit == "user" else None, "support": support, "w": w,
              "normcut": True}
    result, _ = run(db, Request(source=source, mechanism=f"transition_counts(order={order})",
                                privacy_unit=unit, params=params, seeded=noise.seeded, plan=lambda p: event), compute)
    return result


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


__all__ = ["Database", "database", "Release", "Request", "Interrupted", "run", "fit_request", "fit", "sample",
           "noisy_count", "transitions", "set_budget", "read_ledger", "install_interrupt_handler", "interrupt_all"]
