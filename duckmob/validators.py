"""Checks of public arguments, shared by every entry point: a bad value becomes a one-line DuckmobError.

Every check here looks only at what the caller passed (never at data), so it runs before a release reserves any
budget; a refusal from here costs nothing.
"""

from __future__ import annotations

import math

from duckmob.errors import DuckmobError
from duckmob.privacy.unit import PrivacyUnit

PRIVACY_UNITS = PrivacyUnit.KINDS
OUTSIDE = ("drop", "fail")
# Largest eps of one release: above it the guarantee means nothing and the noise grid cannot honour it.
MAX_EPSILON = 100.0
# Largest n a synthesize / mob_sample call may ask for (ask again, under another seed, for more).
MAX_N = 50_000_000
# The default of max_rows, the public cap on the rows (points) of one synthetic table: an output of n trajectories is
# refused before anything is drawn when n times the method's public cap on points per trajectory (its max_points)
# exceeds it. Output streams in bounded memory, so the cap guards disk and time, not memory: 30 billion admits the
# default output of a 300 M-fix table (2.6 M trajectories times PrivTrace's 5,000) under every method's default caps.
MAX_ROWS = 30_000_000_000
# Largest delta a budget or a release may have. delta is the chance that the guarantee fails outright (a release
# may then expose someone entirely), so it must be far below 1 / the number of people in the table: 1e-3 already
# suits only tables of well over a thousand people. A larger one would also let a raise of delta buy eps (after
# eps 1 spent at delta 0, a raise to delta 0.5 left room for 14 more releases of eps 0.5).
MAX_DELTA = 1e-3


def _float(value) -> float:
    if isinstance(value, bool):
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def positive(name: str, value, hint: str = "") -> float:
    """``value`` as a positive finite float, or a DuckmobError naming ``name`` (and ``hint``, e.g. the formula)."""
    v = _float(value)
    if not (math.isfinite(v) and v > 0):
        raise DuckmobError(f"{name} must be a positive finite number{hint}; got {value!r}")
    return v


# Largest GPS-like scatter a release may add to points placed on roads (metres): more than this is no longer a
# fix on a road but a point in the block beside it.
MAX_SCATTER_M = 50.0


def scatter_m(value, roads) -> float | None:
    """``scatter_m``: a public GPS-like scatter (metres, a Gaussian's standard deviation per axis) added to points
    placed on ``roads``; None or 0: none. Needs roads, and at most :data:`MAX_SCATTER_M`."""
    if value is None:
        return None
    v = _float(value)
    if not (math.isfinite(v) and 0 <= v <= MAX_SCATTER_M):
        raise DuckmobError(f"scatter_m must be a number of metres from 0 to {MAX_SCATTER_M:g} (a GPS-like scatter "
                           f"of points on the roads, e.g. scatter_m := 4); got {value!r}")
    if roads is None:
        raise DuckmobError("scatter_m scatters points placed on roads: give roads := 'table' too, or leave "
                           "scatter_m out")
    return v or None


def epsilon(value) -> float:
    """A release's eps: positive, finite and at most :data:`MAX_EPSILON` (above it the guarantee means nothing and
    the noise grid cannot honour it)."""
    if value is None:
        raise DuckmobError("eps is required (the privacy budget this release spends): pass e.g. eps := 1.0")
    v = _float(value)
    if not (math.isfinite(v) and v > 0):
        raise DuckmobError(f"eps must be a positive number, got {value!r}: pass e.g. eps := 1.0")
    if v > MAX_EPSILON:
        raise DuckmobError(f"eps = {v:g} is above duckmob's limit of {MAX_EPSILON:g} for one release (such a release "
                           "has no meaningful privacy): use a smaller eps")
    return v


def delta_value(value, default: float | None = None) -> float:
    """A budget's or a release's delta in [0, :data:`MAX_DELTA`] (``default`` when None and a default is given)."""
    if value is None and default is not None:
        return float(default)
    v = _float(value)
    if not 0 <= v <= MAX_DELTA:
        raise DuckmobError(f"delta must be in [0, {MAX_DELTA:g}], got {value!r}: delta is the chance that the privacy "
                           "guarantee fails outright, so it must be far below 1 / the number of people in the table "
                           "(typically 1e-5 or less; 0 for a pure-eps method)")
    return v


def release_delta(value, *, default: float, needs_delta: bool, method: str, mechanism: str = "") -> float:
    """A release's delta (``default`` when None): in [0, :data:`MAX_DELTA`], and above 0 for a method that
    declares ``needs_delta`` (``mechanism`` says why, e.g. 'trains with DP-SGD')."""
    v = delta_value(value, default)
    if needs_delta and v <= 0:
        why = f" {mechanism} and" if mechanism else ""
        raise DuckmobError(f"{method}{why} needs 0 < delta <= {MAX_DELTA:g} (e.g. delta := 1e-5), got {value!r}")
    return v


def count(name: str, value, *, minimum: int = 1, maximum: int | None = None, example: str = "") -> int:
    """An integer in [minimum, maximum]."""
    v = _float(value)
    if not (math.isfinite(v) and v == int(v) and v >= minimum and (maximum is None or v <= maximum)):
        upper = f" and at most {maximum:,}" if maximum is not None else ""
        raise DuckmobError(f"{name} must be an integer of at least {minimum}{upper}, got {value!r}"
                           + (f": pass e.g. {example}" if example else ""))
    return int(v)


def n_trajectories(value) -> int | None:
    """``n`` of synthesize / mob_sample: None (the model's noisy count) or 1 .. MAX_N."""
    if value is None:
        return None
    return count("n", value, maximum=MAX_N, example="n := 1000")


def max_rows(value) -> int:
    """``max_rows`` of synthesize / mob_sample: None (the default :data:`MAX_ROWS`) or a positive integer."""
    if value is None:
        return MAX_ROWS
    return count("max_rows", value, example="max_rows := 50000000000")


def stability(value) -> int | None:
    """``stability`` of a release: None (the plan must keep one base row one row, checked on it) or the public
    number of rows one row of the base tables can become at most (1 .. 10,000): it multiplies every sensitivity."""
    if value is None:
        return None
    return count("stability", value, maximum=10_000, example="stability := 3 (one base row becomes at most 3 rows)")


def seed(value) -> int | None:
    """None (OS entropy) or a non-negative integer."""
    if value is None:
        return None
    v = _float(value)
    if not (math.isfinite(v) and v == int(v) and v >= 0):
        raise DuckmobError(f"seed must be a non-negative integer, got {value!r}")
    return int(v)


def source_name(value) -> str:
    """A source table name: a non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise DuckmobError(f"source must be a table name (a non-empty string); got {value!r}")
    return value


def model_name(value) -> str:
    """A model name: a non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise DuckmobError(f"a model needs a name (a non-empty string), got {value!r}: "
                           "FROM mob_fit('trips', 'my_model', eps := 1.0, ...)")
    return value


def privacy_unit(unit, max_trajectories_per_user, needs_bound: bool = True) -> PrivacyUnit:
    """The :class:`~duckmob.privacy.unit.PrivacyUnit` the caller asked for: 'trajectory' (bound 1), or 'user' with
    the public bound ``max_trajectories_per_user`` (required unless ``needs_bound`` is False, e.g. for a count of
    users, whose sensitivity is 1 anyway)."""
    k = max_trajectories_per_user
    name = str(unit if unit is not None else "trajectory").strip().lower()
    if name not in PRIVACY_UNITS:
        raise DuckmobError(f"privacy_unit := '{unit}' is not an option: use 'trajectory' (one trajectory is "
                           "protected) or 'user' (all of a user's trajectories, with max_trajectories_per_user := k)")
    if name == "trajectory":
        if k is not None and _float(k) != 1:
            raise DuckmobError("max_trajectories_per_user only applies with privacy_unit := 'user': drop it, or "
                               "add privacy_unit := 'user'")
        return PrivacyUnit.trajectory()
    if k is None:
        if not needs_bound:
            return PrivacyUnit.user(1)
        raise DuckmobError("privacy_unit := 'user' needs a contribution bound: pass max_trajectories_per_user := k "
                           "(a user's trajectories beyond k are dropped at random; noise grows with k)")
    return PrivacyUnit.user(count("max_trajectories_per_user", k, maximum=10_000))


def outside(value) -> str:
    """What a release does with points outside the bbox. Only 'drop' is possible on a private path: refusing
    would tell whether such points exist, which no mechanism accounts for."""
    v = str(value if value is not None else "drop").strip().lower()
    if v not in OUTSIDE:
        raise DuckmobError(f"outside := '{value}' is not an option: use 'drop'")
    if v == "fail":
        raise DuckmobError("outside := 'fail' cannot be honoured by a private release (a refusal would reveal "
                           "that points lie outside the bbox): releases drop them (outside := 'drop'); "
                           "FROM mob_check('tbl', bbox := [...]) counts them exactly (not private)")
    return v


__all__ = ["positive", "epsilon", "delta_value", "release_delta", "count", "n_trajectories", "seed", "source_name", "model_name",
           "privacy_unit", "outside", "PRIVACY_UNITS", "MAX_N", "MAX_ROWS", "max_rows", "MAX_EPSILON",
           "MAX_DELTA"]
