"""The database registry: one :class:`Database` per DuckDB database in this process (the release core's own
connection, the release lock, the releases in progress, the model names being fitted, what was last verified of the
ledger)."""

from __future__ import annotations

import atexit
import threading
import uuid
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable

import duckdb

from duckmob.errors import DuckmobError
from duckmob.privacy import ledger

if TYPE_CHECKING:
    from duckmob.release.protocol import Release


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
        self.active: set[Release] = set()
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
