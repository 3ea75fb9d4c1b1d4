"""``%load_ext duckmob``: jupysql's ``%sql`` / ``%%sql`` on a DuckDB connection where every duckmob function works.

Loading the extension

1. switches jupysql's telemetry off (``PLOOMBER_STATS_ENABLED=false``, ``PLOOMBER_VERSION_CHECK_DISABLED=true``,
   set before ``sql`` is imported, because ploomber-core reads them at import),
2. loads jupysql (``%load_ext sql``),
3. opens an in-memory duckmob connection, hands it to jupysql under the alias ``duckmob`` and puts it in the
   user's namespace as ``duckmob_con`` (for Python cells: ``duckmob.synthesize(duckmob_con, ...)``),
4. adds the line magic ``%duckmob [DATABASE]`` to switch to a database file (``%duckmob trips.duckdb``),
5. installs an exception handler: a duckmob error, or a DuckDB error raised by ``%sql``, prints duckmob's own
   one-line message (``duckmob: no privacy budget declared for 'trips': run ...``) instead of a traceback; a
   ``%sql`` statement stopped by "interrupt the kernel" (jupysql lets DuckDB's ``RuntimeError('Query interrupted')``,
   ``InterruptException`` or a ``KeyboardInterrupt`` through) prints the shell's one line, ``duckmob.cli.INTERRUPTED``;
6. at kernel exit, lets go of the last error's traceback (:func:`_release_last_error`), then closes the duckmob
   connection and lets go of it (:func:`_close_connection`).

Why a wrapper around the connection: jupysql runs every statement on a fresh ``connection.cursor()``, and a DuckDB
cursor is a new connection that does not see the TEMP macros (``synthesize``, ``mob_*``) of its parent. The
wrapper's ``cursor()`` registers the macros on each cursor (about 50 ms; the UDFs are database-wide and are not
registered again). A consequence: ``CREATE TEMP TABLE`` in one ``%sql`` cell is gone in the next; use plain
tables.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import traceback
import weakref

import duckdb

from duckmob.errors import DuckmobError, one_line

ALIAS = "duckmob"
NAMESPACE_NAME = "duckmob_con"
_TELEMETRY_OFF = {"PLOOMBER_STATS_ENABLED": "false", "PLOOMBER_VERSION_CHECK_DISABLED": "true"}
_DUCKMOB_MARKERS = ("DuckmobError: ", "BudgetError: ")


class NotebookConnection:
    """A duckmob DuckDB connection as jupysql sees it: each ``cursor()`` has duckmob's TEMP macros registered.

    Everything else (``execute``, ``close``, ``commit``, ``df``, ...) is the wrapped connection's, so jupysql
    recognises it as a native DuckDB connection.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection):
        self.connection = con
        self._cursors = weakref.WeakSet()
        atexit.register(self.close)

    def cursor(self) -> duckdb.DuckDBPyConnection:
        from duckmob.sql import register

        cur = register(self.connection.cursor())
        self._cursors.add(cur)
        return cur

    def close(self) -> None:
        """Close every cursor handed out, then the connection (DuckDB warns at exit about unclosed ones)."""
        for cur in list(self._cursors):
            cur.close()
        self.connection.close()

    def __getattr__(self, name):
        return getattr(self.connection, name)


def use(ipython, database: str = ":memory:", con: duckdb.DuckDBPyConnection | None = None):
    """Make ``con`` (or a new duckmob connection to ``database``) jupysql's current connection, alias ``duckmob``.

    A previous connection under that alias is closed first. Returns the DuckDB connection, which is also put in the
    user's namespace as ``duckmob_con``.
    """
    from duckmob import api
    from sql.connection import ConnectionManager

    if con is None:
        con = api.connect(database)
    else:
        api.register(con)
    previous = ConnectionManager.connections.get(ALIAS)
    if previous is not None:
        ConnectionManager.close_connection_with_descriptor(ALIAS)
    ipython.user_ns[NAMESPACE_NAME] = con
    ipython.user_ns["_duckmob_notebook_connection"] = NotebookConnection(con)
    ipython.run_line_magic("sql", f"_duckmob_notebook_connection --alias {ALIAS}")
    return con


def duckmob_error(exc: BaseException) -> str | None:
    """duckmob's one-line message for ``exc`` if it is (or was caused by) a duckmob error, or is a DuckDB error or an
    interrupted statement that came through jupysql's ``%sql``; None for anything else (which keeps its normal
    traceback)."""
    from duckmob.cli import INTERRUPTED, is_interrupt

    via_sql = _through_jupysql(exc)
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if via_sql and is_interrupt(exc):
            return INTERRUPTED
        if isinstance(exc, DuckmobError):  # raised in Python, not across DuckDB's UDF boundary
            text = one_line(exc)
            return text if text.startswith("duckmob: ") else "duckmob: " + text
        if any(m in str(exc) for m in _DUCKMOB_MARKERS):
            return one_line(exc)
        if via_sql and isinstance(exc, duckdb.Error):
            return one_line(exc)
        exc = exc.__cause__ or exc.__context__
    return None


def _through_jupysql(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside jupysql (a frame of its ``sql`` package on the traceback)."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__", "").split(".")[0] == "sql":
            return True
        tb = tb.tb_next
    return False


def _install_error_handler(ipython) -> None:
    previous_types, previous_handler = ipython.custom_exceptions, ipython.CustomTB

    def handler(shell, etype, value, tb, tb_offset=None):
        message = duckmob_error(value)
        if message is not None:
            shown = DuckmobError if message.startswith("duckmob: ") else duckdb.Error
            shell._showtraceback(shown, message, [message])
            return [message]
        if previous_types and isinstance(value, previous_types):
            return previous_handler(etype, value, tb, tb_offset=tb_offset)
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        return None

    ipython._duckmob_previous_exc = (previous_types, previous_handler)
    ipython.set_custom_exc((Exception, KeyboardInterrupt), handler)


def _duckmob_magic(ipython):
    def duckmob(line: str = ""):
        """%duckmob [DATABASE]: switch %sql to a duckmob connection on DATABASE (default: a new in-memory one)."""
        database = line.strip().strip("'\"") or ":memory:"
        use(ipython, database)
        print(f"%sql now runs on a duckmob connection to {database} (duckmob_con in Python)")

    return duckmob


def _close_connection(ipython) -> None:
    """Close jupysql's duckmob connection and drop every reference to it (at ``%unload_ext`` and at interpreter
    exit).

    Why at exit: DuckDB's Python bindings (nanobind) print about 60 lines of ``nanobind: leaked ... instances`` when a
    connection object is still alive as the interpreter finalises. jupysql's own exit hook closes its connections
    but keeps the current one in ``ConnectionManager.current``, a class attribute that lives to the end, and with it
    our wrapper, the DuckDB connection and the cursors of its result sets. Run by :func:`_at_exit`, registered
    after jupysql's hook and IPython's, so it runs before them (``atexit`` runs last-registered first).
    """
    from sql.connection import ConnectionManager

    ours = ConnectionManager.connections.get(ALIAS)
    if ours is not None:
        ConnectionManager.close_connection_with_descriptor(ALIAS)
    if ConnectionManager.current is not None and ConnectionManager.current is ours:
        ConnectionManager.current = None
    ipython.user_ns.pop(NAMESPACE_NAME, None)
    ipython.user_ns.pop("_duckmob_notebook_connection", None)


def _release_last_error(ipython) -> None:
    """Let go of the tracebacks IPython keeps of the last errors, clearing their frames first (at interpreter exit).

    Why: IPython (9.18) formats every error raised in a cell for its history, a duckmob error too (although the
    cell shows one line), which leaves its traceback in ``InteractiveTB.tb`` until the next error; a full
    traceback also leaves it in ``sys.last_traceback``. The frames of a failed release or ``%sql`` statement hold
    DuckDB connections, cursors and relations in their locals, and the shell lives to the very end of finalisation:
    DuckDB's bindings then print about 40 lines of ``nanobind: leaked ...``. Dropping IPython's references is what
    the notebooks in tests/test_jupyter.py need; clearing the frames also frees their objects when something else
    still holds the exception, and the collection frees, while DuckDB is still loaded, what was left in cycles.
    """
    errors = [getattr(sys, "last_value", None), getattr(sys, "last_exc", None),
              getattr(ipython.last_execution_result, "error_in_exec", None)]
    tracebacks = [getattr(ipython.InteractiveTB, "tb", None), getattr(sys, "last_traceback", None)]
    seen = set()
    while errors:
        exc = errors.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        tracebacks.append(exc.__traceback__)
        errors += [exc.__cause__, exc.__context__]
    for tb in tracebacks:
        if tb is not None:
            traceback.clear_frames(tb)
    ipython.InteractiveTB.tb = None
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            setattr(sys, name, None)
    gc.collect()


def _at_exit(ipython) -> None:
    """Kernel exit: the last error's frames first (they may hold our connection's cursors), then the connection."""
    _release_last_error(ipython)
    _close_connection(ipython)


def load_ipython_extension(ipython) -> None:
    """``%load_ext duckmob``: jupysql with telemetry off, a duckmob connection, ``%duckmob`` and one-line errors."""
    os.environ.update(_TELEMETRY_OFF)
    ipython.extension_manager.load_extension("sql")
    ipython.register_magic_function(_duckmob_magic(ipython), magic_kind="line", magic_name="duckmob")
    if not hasattr(ipython, "_duckmob_previous_exc"):
        _install_error_handler(ipython)
    use(ipython)
    atexit.unregister(_at_exit)  # once, however often the extension is loaded
    atexit.register(_at_exit, ipython)


def unload_ipython_extension(ipython) -> None:
    """``%unload_ext duckmob``: restore the previous exception handler and close the duckmob connection."""
    if hasattr(ipython, "_duckmob_previous_exc"):
        types, handler = ipython._duckmob_previous_exc
        ipython.custom_exceptions, ipython.CustomTB = types, handler
        del ipython._duckmob_previous_exc
    _close_connection(ipython)
    atexit.unregister(_at_exit)
