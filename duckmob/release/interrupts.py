"""Ctrl-C: reaching the releases in progress, which may run inside DuckDB's worker threads."""

from __future__ import annotations

import signal
import threading

from duckmob.errors import DuckmobError
from duckmob.release import registry


class Interrupted(DuckmobError):
    """A release stopped by Ctrl-C after its data was read: its reservation stays spent, no model is stored."""


_HANDLER_INSTALLED = False


def interrupt_all() -> None:
    """Flag every release in progress in this process as interrupted (what Ctrl-C does)."""
    for db in list(registry._DATABASES.values()):
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
