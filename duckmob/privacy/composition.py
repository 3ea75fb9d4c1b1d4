"""The epsilon of a privacy event (:mod:`duckmob.privacy.events`) at a delta: the tightest of the valid bounds
that cost little.

:func:`epsilon` returns the smallest of the valid bounds it can compute at the given ``delta`` without the cost
running away (a PLD of a Laplace event has ``2 eps / 1e-4`` points: Laplace 1000 took 88 s and Laplace 1e9 asked
for 2.9 TiB):

- basic composition: the exact sum of the Laplace epsilons plus the PLD epsilon of the rest (always; for a
  pure-Laplace composition the sum is the only bound at ``delta = 0``, where the PLD answers ``inf``);
- the PLD accountant (Meiser & Mohammadi 2018; Koskela et al. 2020; dp_accounting 0.6, pessimistic
  discretisation 1e-4), where it is cheap, identical Laplace events composed as one ``SelfComposed`` event:
  over the whole composition when it has a DP-SGD or Gaussian part and its Laplace part is small
  (at most ``PLD_MAX_LAPLACE_GROUPS`` distinct epsilons summing to at most ``PLD_MAX_LAPLACE_TOTAL``), which
  keeps HRNet's noise calibration where it was (to 1e-9: grouping and order move the PLD by ~1e-11); for
  pure-Laplace compositions over the events of at most ``PLD_MAX_LAPLACE_EPSILON`` each (the larger ones are
  added), when there are at least two of them;
- for pure-Laplace compositions at ``delta > 0``, the heterogeneous advanced composition theorem (Kairouz, Oh &
  Viswanath 2015, Thm 3.5), O(n): what a long ledger of small releases gets when the PLD would be too slow.

Laplace 0.5 at delta 1e-5 alone is 0.5 (the PLD would say 0.49998: not worth its time); 50 x Laplace 0.1 at delta
1e-5 -> 2.7966 by PLD (5 by adding). Example (ENGINEERING.md): Laplace 0.5 composed with DP-SGD sigma 1,
q 0.00256, 4000 steps, delta 1e-5 -> 1.284 by PLD (1.326 by adding the two epsilons).
"""

from __future__ import annotations

import importlib
import math
import sys
import threading
from collections import Counter
from functools import lru_cache
from typing import TYPE_CHECKING

from duckmob.errors import DuckmobError
from duckmob.privacy.events import Event, compose

if TYPE_CHECKING:
    import dp_accounting

# When the PLD accountant is used for the Laplace part of a composition (see the module docstring). Its cost grows
# with the support of the composed PLD (2 eps / 1e-4 points per Laplace event, about 0.05 s per unit of eps to
# build on two shared cores) and with the number of distinct epsilons (one convolution each; identical events are
# one self-composition). At these limits the worst case measured 0.5 s (8 distinct epsilons near 1 summing to 20;
# benchmarks/accounting.py); past them the sum (or the advanced composition bound) is used.
PLD_MAX_LAPLACE_TOTAL = 20.0    # sum of the Laplace epsilons: a budget this large is spent however it is counted
PLD_MAX_LAPLACE_GROUPS = 8      # distinct Laplace epsilons
# In a pure-Laplace composition, events above this go to the sum: the PLD saves almost nothing on them
# (5 x Laplace 1 + Laplace 0.5 at delta 1e-5: 5.4994 against 5.5) and costs most.
PLD_MAX_LAPLACE_EPSILON = 1.0


def pure_epsilon(event: Event) -> float | None:
    """The exact epsilon at delta = 0 by basic composition when every part is pure Laplace, else None."""
    leaves = event.leaves()
    if all(leaf.kind == "laplace" for leaf in leaves):
        return math.fsum(leaf.param("eps") for leaf in leaves)
    return None


def pld_loaded() -> bool:
    """Whether the PLD accountant (dp_accounting, which imports much of SciPy) is imported in this process."""
    return "dp_accounting.pld" in sys.modules


def quick_epsilon(event: Event, delta: float) -> float | None:
    """A valid bound of ``epsilon(event, delta)`` computed without the PLD accountant, when :func:`epsilon` would
    first have to import it (about half a second, mostly SciPy): a composition of Laplace events that the PLD
    would tighten, the least of their sum and the advanced composition bound. None when :func:`epsilon` is cheap
    here (the PLD loaded, delta = 0, a single Laplace event, or a part that is not Laplace). Starts the import on
    a thread (:func:`warm_up`), so that a later :func:`epsilon` finds it loaded."""
    delta = float(delta)
    if pld_loaded() or not 0 < delta < 1:
        return None
    leaves = event.leaves()
    if not leaves or any(leaf.kind != "laplace" for leaf in leaves):
        return None
    eps = [leaf.param("eps") for leaf in leaves]
    small = [e for e in eps if e <= PLD_MAX_LAPLACE_EPSILON]
    if len(small) < 2 or not _pld_is_cheap(small):
        return None
    warm_up()
    return min(math.fsum(eps), advanced_composition(eps, delta))


def warm_up() -> None:
    """Import the PLD accountant on a daemon thread when it is not loaded (about half a second, mostly SciPy's
    imports), so that a release that reserved with a quick bound finds it loaded by the time it finishes. Public
    code only; no data."""
    if not pld_loaded():
        threading.Thread(target=_import_pld, name="duckmob-pld-import", daemon=True).start()


def _import_pld() -> None:
    try:
        importlib.import_module("dp_accounting.pld")
    except Exception:   # the release's end imports it again, and reports what fails there
        pass


def epsilon(event: Event, delta: float) -> float:
    """The epsilon of ``event`` at ``delta`` (the tightest of PLD and basic composition; see module docstring).

    ``inf`` when no finite bound exists at this delta (e.g. a Gaussian part at delta = 0).
    """
    if not isinstance(event, Event):
        raise DuckmobError(f"epsilon takes a privacy event; got {type(event).__name__}")
    try:
        delta = float(delta)
    except (TypeError, ValueError):
        raise DuckmobError(f"delta must be a number in [0, 1); got {delta!r}") from None
    if not (0 <= delta < 1):
        raise DuckmobError(f"delta must be in [0, 1); got {delta!r}")
    return _epsilon(event.to_json(), delta)


@lru_cache(maxsize=512)
def _epsilon(event_json: str, delta: float) -> float:
    event = Event.from_json(event_json)
    leaves = event.leaves()
    if not leaves:
        return 0.0
    laplace_eps = [leaf.param("eps") for leaf in leaves if leaf.kind == "laplace"]
    rest = [leaf for leaf in leaves if leaf.kind != "laplace"]
    laplace_sum = math.fsum(laplace_eps)
    if delta == 0:
        return laplace_sum if not rest else math.inf
    if not rest:
        return _pure_laplace_epsilon(laplace_eps, delta)
    from dp_accounting import pld   # (dp_accounting imports scipy: 1.5 s, paid only when a spend is composed)

    accountant = pld.PLDAccountant()
    accountant.compose(compose(rest).to_dp_event())
    bounds = [laplace_sum + float(accountant.get_epsilon(delta))]
    if laplace_eps and _pld_is_cheap(laplace_eps):
        accountant.compose(_laplace_dp_event(laplace_eps))  # now the PLD of the whole composition
        bounds.append(float(accountant.get_epsilon(delta)))
    return min(bounds)


def _pure_laplace_epsilon(eps: list[float], delta: float) -> float:
    """The epsilon at ``delta > 0`` of Laplace events of these epsilons: the least of the sum, the advanced
    composition bound, and the sum of the large ones plus the PLD of the small ones when that is cheap."""
    bounds = [math.fsum(eps), advanced_composition(eps, delta)]
    small = [e for e in eps if e <= PLD_MAX_LAPLACE_EPSILON]
    if len(small) >= 2 and _pld_is_cheap(small):
        large = math.fsum(e for e in eps if e > PLD_MAX_LAPLACE_EPSILON)
        bounds.append(large + _pld(_laplace_dp_event(small), delta))
    return min(bounds)


def advanced_composition(eps: list[float], delta: float) -> float:
    """The heterogeneous advanced composition bound for pure ``eps_i``-DP mechanisms at ``delta`` in (0, 1)
    (Kairouz, Oh & Viswanath, "The composition theorem for differential privacy", ICML 2015, Thm 3.5, third term):
    ``sum_i eps_i (e^eps_i - 1) / (e^eps_i + 1) + sqrt(2 ln(1 / delta) sum_i eps_i^2)``.

    Valid for any pure-DP mechanisms, Laplace included; looser than the PLD (50 x Laplace 0.1 at delta 1e-5: 3.64
    against 2.80), but O(n).
    """
    drift = math.fsum(e * math.tanh(e / 2) for e in eps)  # (e^x - 1) / (e^x + 1) = tanh(x / 2)
    return drift + math.sqrt(2 * math.log(1 / delta) * math.fsum(e * e for e in eps))


def _pld_is_cheap(eps: list[float]) -> bool:
    return math.fsum(eps) <= PLD_MAX_LAPLACE_TOTAL and len(set(eps)) <= PLD_MAX_LAPLACE_GROUPS


def _laplace_dp_event(eps: list[float]) -> dp_accounting.DpEvent:
    """Laplace events of these epsilons, identical ones as one self-composition (same PLD to ~1e-10, far faster)."""
    import dp_accounting

    groups = [dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(1.0 / e), k) if k > 1
              else dp_accounting.LaplaceDpEvent(1.0 / e) for e, k in Counter(eps).items()]
    return groups[0] if len(groups) == 1 else dp_accounting.ComposedDpEvent(groups)


def _pld(event: dp_accounting.DpEvent, delta: float) -> float:
    from dp_accounting import pld

    accountant = pld.PLDAccountant()
    accountant.compose(event)
    return float(accountant.get_epsilon(delta))


__all__ = ["PLD_MAX_LAPLACE_TOTAL", "PLD_MAX_LAPLACE_GROUPS", "PLD_MAX_LAPLACE_EPSILON", "epsilon", "pure_epsilon",
           "advanced_composition", "quick_epsilon", "pld_loaded", "warm_up"]
