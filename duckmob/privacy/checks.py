"""Argument checks shared by the privacy modules: a bad number becomes a one-line DuckmobError."""

from __future__ import annotations

import math

from duckmob.errors import DuckmobError


def positive(name: str, value, hint: str = "") -> float:
    """``value`` as a positive finite float, or a DuckmobError naming ``name`` (and ``hint``, e.g. the formula)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = math.nan
    if not (math.isfinite(v) and v > 0):
        raise DuckmobError(f"{name} must be a positive finite number{hint}; got {value!r}")
    return v
