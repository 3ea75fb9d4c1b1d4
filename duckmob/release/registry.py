"""The database registry: one :class:`Database` per DuckDB database in this process (the release core's own
connection, the release lock, the releases in progress, the model names being fitted, what was last verified of the
ledger).

A database file is known by its identity (device and inode), not by the path it was opened under. DuckDB itself
opens one instance for every path that resolves to the same name (a symlink, a relative path, ``./``), so those
share one :class:`Database`; but a hard link (or a bind mount) gives a second, independent instance of the same
file, which does not see the first one's writes, and whichever checkpoints last overwrites the other's (measured
with DuckDB 2.0: a ledger row reserved through one path is gone from the file). A shared lock cannot make that
safe, so registering duckmob on a second instance of a file this process already has open is refused. The lock,
the releases in progress and the model names being fitted are kept per file all the same: a :class:`Database`
whose connection was closed and one opened on the same file afterwards share them.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Protocol

import duckdb

from duckmob.errors import DuckmobError
from duckmob.privacy import ledger


class InProgress(Protocol):
    """What the registry knows of a release in progress (a :class:`duckmob.release.protocol.Release`, which
    registers itself in :attr:`Database.active` once reserved): the flag Ctrl-C sets
    (:func:`duckmob.release.interrupts.interrupt_all`)."""

    interrupted: threading.Event


class Database:
    """duckmob's state for one DuckDB database instance: the core's own connection, the release lock, the
    releases in progress (for Ctrl-C), the model names being fitted, and what this process last verified of the
    ledger (:class:`~duckmob.privacy.ledger.Verified`: each release re-checks it with one aggregate query and
    hashes only the rows added since; read and written under the lock). The lock, the releases in progress and
    the model names are those of the database file (:class:`_File`); an in-memory database has its own."""

    def __init__(self, con: duckdb.DuckDBPyConnection):
        self.token = uuid.uuid4().hex
        self.path, self.read_only = _location(con)
        self.file = _identity(self.path)
        self.con = self._connect(con)
        shared = _File() if self.file is None else _FILES.setdefault(self.file, _File())
        self.lock, self.active, self.pending_names = shared.lock, shared.active, shared.pending_names
        self.verified = ledger.Verified()
        self.recent = Recent()
        self.outputs = Outputs()
        self.models = Loaded()
        self.networks = Networks()

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

    def is_open(self) -> bool:
        """Whether the core's connection is still open (closing the connection it was registered on closes it)."""
        try:
            self.con.cursor().close()
        except duckdb.Error:
            return False
        return True

    def close(self) -> None:
        try:
            self.con.close()
        except duckdb.Error:
            pass


class Recent:
    """The last few releases made through one database, by their exact request (:mod:`duckmob.release.tables`).

    A DuckDB relation runs its query again every time it is printed or fetched (``con.sql(...)`` is lazy), so one
    request reached a release twice and was charged twice. The same request (the same base tables, SELECT and
    public arguments) within ``WINDOW`` seconds of a release gets that release's result again, charged nothing:
    returning a released result again is post-processing. At most ``SIZE`` requests are kept (a fitted model and
    its sampling state, or a count: not the output rows)."""

    WINDOW = 600.0
    SIZE = 8

    def __init__(self) -> None:
        self._items: dict[str, tuple[float, object]] = {}
        self._lock = threading.Lock()

    def get(self, key: str):
        """The result kept for ``key``, or None (never made, or older than the window)."""
        now = time.monotonic()
        with self._lock:
            hit = self._items.get(key)
            if hit is None or now - hit[0] > self.WINDOW:
                self._items.pop(key, None)
                return None
            return hit[1]

    def put(self, key: str, value) -> None:
        with self._lock:
            self._items.pop(key, None)
            self._items[key] = (time.monotonic(), value)
            while len(self._items) > self.SIZE:
                self._items.pop(next(iter(self._items)))


class Outputs(Recent):
    """The synthetic outputs SQL is streaming, by handle (:class:`duckmob.release.sampling.Output`: a model, n and
    the output's seed; never its rows). ``_mob_sample`` / ``_mob_synthesize`` open one and return its handle; the
    macro's ``_mob_draw`` calls draw its blocks by handle, so the model is not loaded again per call. An entry lives
    ``WINDOW`` seconds after its LAST use (a long COPY keeps its own alive) and at most ``SIZE`` are kept (the
    oldest opened goes first), so the registry never grows without bound."""

    WINDOW = 3600.0
    SIZE = 16

    def get(self, key: str):
        with self._lock:
            hit = self._items.get(key)
            now = time.monotonic()
            if hit is None or now - hit[0] > self.WINDOW:
                self._items.pop(key, None)
                return None
            self._items[key] = (now, hit[1])   # used now: the window starts again, the order (age) stays
            return hit[1]

    def open(self, output) -> str:
        """Keep ``output`` under a new handle and return it."""
        handle = uuid.uuid4().hex
        self.put(handle, output)
        return handle


class Loaded(Recent):
    """Stored models ``mob_sample`` loaded, by name and checksum, with what their sampling built (PrivTrace's route
    tables), so that the next output of the same stored model starts warm (:func:`duckmob.release.tables.sample`)."""

    SIZE = 2


class Networks(Recent):
    """Public road networks releases and ``mob_sample`` read, by the digest of their clipped rows, with what their
    outputs built of them (the network cut at the bbox, its road graph and junction distances), so the next output
    on the same roads starts warm. The roads are read and checked by digest at every call all the same."""

    SIZE = 2


@dataclass
class _File:
    """What every :class:`Database` of one database file shares: the release lock, the releases in progress and
    the model names being fitted."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    active: set[InProgress] = field(default_factory=set)
    pending_names: set[str] = field(default_factory=set)


# The databases this process has registered duckmob on, by token. DuckDB registers Python functions per database
# instance, so this mapping is process state by nature; it is read through ``_mob_instance()`` and
# :func:`databases`.
_DATABASES: dict[str, Database] = {}
# Per database file (device, inode): what its Databases share, and the Database last registered on it.
_FILES: dict[tuple[int, int], _File] = {}
_OPEN: dict[tuple[int, int], Database] = {}
_REGISTRY_LOCK = threading.Lock()


def _location(con: duckdb.DuckDBPyConnection) -> tuple[str | None, bool]:
    """(file path or None for an in-memory database, read-only) of ``con``'s default database."""
    row = con.execute("SELECT path, readonly FROM duckdb_databases() WHERE database_name = current_database()"
                      ).fetchall()
    return (row[0][0] or None, bool(row[0][1])) if row else (None, False)


def _identity(path: str | None) -> tuple[int, int] | None:
    """(device, inode) of the database file at ``path``; None for an in-memory database or a path that is not a
    local file."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino)


def database(con: duckdb.DuckDBPyConnection, create: Callable[[Database], None] | None = None) -> Database:
    """The :class:`Database` of ``con``'s database; with ``create``, made (and ``create(db)`` run: registering
    the UDFs on ``db.con``) when it does not exist yet. Thread-safe: one caller creates, the others wait.

    Refused (DuckmobError) when ``con`` is a second DuckDB instance of a file that a registered, open instance
    already holds under another path (a hard link): see the module docstring."""
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
        other = _OPEN.get(db.file) if db.file is not None else None
        if other is not None and other.is_open():
            db.close()
            raise DuckmobError(f"'{db.path}' is the database file this process already has open as "
                               f"'{other.path}' (a hard link or another mount of it): DuckDB would hold two copies "
                               "of it that overwrite each other's writes, the privacy ledger included. Open it "
                               f"through '{other.path}', or close the connections to that path first")
        create(db)
        db.con.create_function("_mob_instance", lambda: db.token, [], "VARCHAR", side_effects=False)
        _DATABASES[db.token] = db
        if db.file is not None:
            _OPEN[db.file] = db
        return db


def databases() -> list[Database]:
    """Every database this process has registered duckmob on (a copy, safe to walk while another registers):
    what Ctrl-C walks to reach the releases in progress."""
    return list(_DATABASES.values())


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
