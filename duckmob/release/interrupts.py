"""Ctrl-C: reaching the releases in progress, which may run inside DuckDB's worker threads.

Every press is counted (:func:`presses`). A release notes the count when it is ENTERED -- the SQL UDF, the Python
API or Spark call opens :func:`entered` as its first act -- and stops once the count changed: a press that comes
while its arguments are checked, torch is imported or its spend is planned, before it is reserved, is not lost,
and a release entered after a press is not affected by it. Before the data is read, stopping cancels the release
(nothing spent); after, the reservation stands, cut to the part of it whose noise was drawn where the computation
says so (:meth:`duckmob.release.protocol.Release.stopped`: the DP-SGD steps that ran).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from contextvars import ContextVar
from typing import Iterator

from duckmob.errors import DuckmobError
from duckmob.release import registry


class Interrupted(DuckmobError):
    """A release stopped by Ctrl-C: cancelled (nothing spent) before its data was read; after, its reservation
    stays spent. No model is stored either way."""


_HANDLER_INSTALLED = False
# How many times Ctrl-C reached the release core in this process. Written by interrupt_all only; an increment
# lost to a race (two presses at once) still changes the count, which is all a release looks at.
_PRESSES = 0
# The press count when the release being made in this context was entered (None: outside any entry point).
_ENTERED: ContextVar[int | None] = ContextVar("duckmob_release_entered", default=None)
# The press count when the statement a shell runs began (None: no shell statement running). DuckDB may call a
# UDF on any of its threads, which a context variable does not reach; the shell runs one statement at a time.
_STATEMENT: int | None = None


def presses() -> int:
    """How many times Ctrl-C (:func:`interrupt_all`) was pressed in this process so far."""
    return _PRESSES


def since() -> int:
    """The press count a release starting now stops on a change of: the count when its entry point was entered
    (:func:`entered`), or when the shell's statement began (:func:`statement`), else the count now."""
    entered_at = _ENTERED.get()
    if entered_at is not None:
        return entered_at
    return _PRESSES if _STATEMENT is None else _STATEMENT


@contextlib.contextmanager
def entered() -> Iterator[None]:
    """The scope of one call of a release's entry point (a SQL UDF, the Python API, Spark): a Ctrl-C from its
    first moment stops the release made inside (:func:`since`). A context manager, or a decorator
    (``@interrupts.entered()``). Nested entries keep the outermost count, the earliest."""
    if _ENTERED.get() is not None:
        yield
        return
    token = _ENTERED.set(since())
    try:
        yield
    finally:
        _ENTERED.reset(token)


@contextlib.contextmanager
def statement() -> Iterator[None]:
    """While a shell statement runs (one at a time, :mod:`duckmob.cli.shell`): a release it makes, on whatever
    DuckDB thread, stops on a press from the statement's first moment, even one before DuckDB calls the UDF."""
    global _STATEMENT
    outer, _STATEMENT = _STATEMENT, (_PRESSES if _STATEMENT is None else _STATEMENT)
    try:
        yield
    finally:
        _STATEMENT = outer


def stopped(was_read: bool) -> Interrupted:
    """The error of a release stopped by Ctrl-C, before (cancelled) or after its data was read."""
    if not was_read:
        return Interrupted("interrupted (Ctrl-C) before the data was read: the release was cancelled, nothing was "
                           "spent and nothing was stored")
    return Interrupted("interrupted (Ctrl-C): the release stopped; since the data had been read, what it computed "
                       "stays spent (mob_ledger() shows the event: a DP-SGD fit, the steps that ran) and nothing "
                       "was stored")


def interrupt_all() -> None:
    """Stop every release in progress in this process (what Ctrl-C does): those planning or not yet reserved see
    the press count change; those reserved are also flagged."""
    global _PRESSES
    _PRESSES += 1
    for db in registry.databases():
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
