"""Ctrl-C: reaching the releases in progress, which may run inside DuckDB's worker threads.

Every press is counted (:func:`presses`). A release notes the count when it starts and stops once it changed: a
press that comes while it plans, before it is reserved, is not lost, and a release started after a press is not
affected by it. Before the data is read, stopping cancels the release (nothing spent); after, the reservation
stands.
"""

from __future__ import annotations

import signal
import threading

from duckmob.errors import DuckmobError
from duckmob.release import registry


class Interrupted(DuckmobError):
    """A release stopped by Ctrl-C: cancelled (nothing spent) before its data was read; after, its reservation
    stays spent. No model is stored either way."""


_HANDLER_INSTALLED = False
# How many times Ctrl-C reached the release core in this process. Written by interrupt_all only; an increment
# lost to a race (two presses at once) still changes the count, which is all a release looks at.
_PRESSES = 0


def presses() -> int:
    """How many times Ctrl-C (:func:`interrupt_all`) was pressed in this process so far."""
    return _PRESSES


def stopped(was_read: bool) -> Interrupted:
    """The error of a release stopped by Ctrl-C, before (cancelled) or after its data was read."""
    if not was_read:
        return Interrupted("interrupted (Ctrl-C) before the data was read: the release was cancelled, nothing was "
                           "spent and nothing was stored")
    return Interrupted("interrupted (Ctrl-C): the release stopped; the budget it reserved stays spent, since the "
                       "data had been read, and nothing was stored")


def interrupt_all() -> None:
    """Stop every release in progress in this process (what Ctrl-C does): those planning or not yet reserved see
    the press count change; those reserved are also flagged."""
    global _PRESSES
    _PRESSES += 1
    for db in list(registry._DATABASES.values()):
        for release in list(db.active):
            release.interrupted.set()


def install_interrupt_handler() -> None:
    """Make Ctrl-C reach releases in progress (once per process, from the main thread; elsewhere a no-op).

    Python runs signal handlers on the main thread only, while a release may run inside a DuckDB worker thread;
    the handler counts the press, which stops every release in progress, planning ones included (their loops call
    :meth:`Release.check_interrupt`), and then does what the previous handler did (normally: KeyboardInterrupt,
    which DuckDB turns into an interrupted query).
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
