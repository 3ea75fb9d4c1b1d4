"""A stop point for a long public computation (a noise calibration): the release core sets the check it calls
(its Ctrl-C check, :mod:`duckmob.release.interrupts`, while it plans), the computation calls :func:`stop_point`
between its steps. A context variable: set by the thread that plans, for that plan only; no check set, no stop."""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable

# What a long calibration calls between two accountant evaluations (it raises to stop it: the release core passes
# its Ctrl-C check while it plans). A context variable: set by the thread that plans, for that plan only.
_STOP: ContextVar[Callable[[], None] | None] = ContextVar("duckmob_calibration_stop", default=None)


@contextmanager
def stoppable(check: Callable[[], None]):
    """Within this block, :func:`stop_point` calls ``check()``: a calibration
    (:func:`duckmob.privacy.calibration.calibrate_noise_multiplier`) calls it before every accountant evaluation, so
    a Ctrl-C while planning stops it within one evaluation, not at its end."""
    token = _STOP.set(check)
    try:
        yield
    finally:
        _STOP.reset(token)


def stop_point() -> None:
    """Call the check :func:`stoppable` set in this context (it raises to stop); none set: nothing."""
    check = _STOP.get()
    if check is not None:
        check()


__all__ = ["stoppable", "stop_point"]
