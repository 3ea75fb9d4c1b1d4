"""Privacy events and their epsilon: what a release spent, stored as JSON, composed by the PLD accountant.

An :class:`Event` describes one release (or a composition of releases) by its mechanism's public parameters:

- ``laplace(eps)``: one pure ``eps``-DP Laplace release (noise scale = L1 sensitivity / eps; see
  ``duckmob.privacy.noise`` for why our grid sampler is accounted exactly as the continuous Laplace mechanism).
  dp_accounting: ``LaplaceDpEvent(1 / eps)`` (the noise scale in units of the sensitivity).
- ``gaussian(noise_multiplier)``: one Gaussian release with noise sd = multiplier x L2 sensitivity.
- ``dp_sgd(noise_multiplier, sample_rate, steps)``: DP-SGD (Abadi et al., 2016) with Poisson sampling at rate
  ``q`` and per-example clipping: ``SelfComposed(PoissonSampled(q, Gaussian(sigma)), steps)``.
- ``compose(events)``: all of them on the same data.

Neighbouring datasets differ by adding or removing one privacy unit (a trajectory, or a user with at most k
trajectories; each mechanism states its sensitivity for that relation) — dp_accounting's default
``ADD_OR_REMOVE_ONE``.

:func:`epsilon` returns the smallest of the valid bounds it can compute at the given ``delta`` without the cost
running away (a PLD of a Laplace event has ``2 eps / 1e-4`` points: Laplace 1000 took 88 s and Laplace 1e9 asked
for 2.9 TiB):

- basic composition: the exact sum of the Laplace epsilons plus the PLD epsilon of the rest (always; for a
  pure-Laplace composition the sum is the only bound at ``delta = 0``, where the PLD answers ``inf``);
- the PLD accountant (Meiser & Mohammadi 2018; Koskela et al. 2020; dp_accounting 0.6, pessimistic
  discretisation 1e-4), where it is cheap, identical Laplace events composed as one ``SelfComposed`` event:
  over the whole composition when it has a DP-SGD or Gaussian part and its Laplace part is small
  (at most ``PLD_MAX_LAPLACE_GROUPS`` distinct epsilons summing to at most ``PLD_MAX_LAPLACE_TOTAL``), which
  keeps HRNet's noise calibration where it was (to 1e-9: grouping and order move the PLD by ~1e-11); for pure-Laplace compositions over the events of at most
  ``PLD_MAX_LAPLACE_EPSILON`` each (the larger ones are added), when there are at least two of them;
- for pure-Laplace compositions at ``delta > 0``, the heterogeneous advanced composition theorem (Kairouz, Oh &
  Viswanath 2015, Thm 3.5), O(n): what a long ledger of small releases gets when the PLD would be too slow.

Laplace 0.5 at delta 1e-5 alone is 0.5 (the PLD would say 0.49998: not worth its time); 50 x Laplace 0.1 at delta
1e-5 -> 2.7966 by PLD (5 by adding). Example (ENGINEERING.md): Laplace 0.5 composed with DP-SGD sigma 1,
q 0.00256, 4000 steps, delta 1e-5 -> 1.284 by PLD (1.326 by adding the two epsilons).
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import sys
import threading
from collections import Counter
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Callable


from duckmob.errors import BudgetError, DuckmobError
from duckmob.validators import MAX_EPSILON, positive

if TYPE_CHECKING:
    import dp_accounting

KINDS = ("laplace", "gaussian", "dp_sgd", "compose")

# MAX_EPSILON (from duckmob.validators) is the largest epsilon of one Laplace event. Past it the guarantee is
# meaningless (an observer's odds may move by e^100 = 3e43) and the noise grid cannot honour it for realistic
# counts: the noise scale is sensitivity / eps and its grid step 2^-20 of that, and ``NoiseSource.add_laplace`` keeps
# values exact only up to 2^51 grid steps, so at eps 100 (sensitivity 1) counts up to about 2e7 stay exact, at eps
# 1000 only up to about 2e6.

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


@dataclass(frozen=True)
class Event:
    """A privacy event: ``kind`` (one of KINDS), its public ``params``, and ``children`` for ``compose``."""

    kind: str
    params: tuple = ()
    children: tuple = field(default=())

    def param(self, name: str):
        return dict(self.params)[name]

    def to_json(self) -> str:
        """A compact JSON form: {"kind": "laplace", "eps": 0.5} or {"kind": "compose", "events": [...]}."""
        return json.dumps(self._to_obj(), separators=(",", ":"))

    def _to_obj(self) -> dict:
        obj = {"kind": self.kind, **dict(self.params)}
        if self.kind == "compose":
            obj["events"] = [c._to_obj() for c in self.children]
        return obj

    @classmethod
    def from_json(cls, s: str) -> "Event":
        """Inverse of :meth:`to_json`; a malformed string raises DuckmobError."""
        try:
            return _from_obj(json.loads(s))
        except (ValueError, TypeError, KeyError) as exc:
            raise DuckmobError(f"not a privacy event in JSON ({exc}): {str(s)[:80]!r}") from None

    def to_dp_event(self) -> dp_accounting.DpEvent:
        """The dp_accounting DpEvent with the same privacy loss."""
        import dp_accounting

        if self.kind == "laplace":
            return dp_accounting.LaplaceDpEvent(1.0 / self.param("eps"))
        if self.kind == "gaussian":
            return dp_accounting.GaussianDpEvent(self.param("noise_multiplier"))
        if self.kind == "dp_sgd":
            step = dp_accounting.PoissonSampledDpEvent(self.param("sample_rate"),
                                                       dp_accounting.GaussianDpEvent(self.param("noise_multiplier")))
            return dp_accounting.SelfComposedDpEvent(step, self.param("steps"))
        if not self.children:
            return dp_accounting.NoOpDpEvent()
        return dp_accounting.ComposedDpEvent([c.to_dp_event() for c in self.children])

    def leaves(self) -> list["Event"]:
        """The non-compose events inside, in order."""
        if self.kind != "compose":
            return [self]
        return [leaf for c in self.children for leaf in c.leaves()]

    def __str__(self) -> str:
        if self.kind == "compose":
            return "compose(" + ", ".join(str(c) for c in self.children) + ")"
        return f"{self.kind}(" + ", ".join(f"{k}={v:g}" for k, v in self.params) + ")"


def _from_obj(obj) -> Event:
    kind = obj["kind"]
    if kind == "laplace":
        # a recorded release is a fact: one made before MAX_EPSILON existed still reads (and is summed)
        return Event("laplace", (("eps", positive("eps", obj["eps"])),))
    if kind == "gaussian":
        return gaussian(obj["noise_multiplier"])
    if kind == "dp_sgd":
        return dp_sgd(obj["noise_multiplier"], obj["sample_rate"], obj["steps"])
    if kind == "compose":
        return compose([_from_obj(o) for o in obj["events"]])
    raise ValueError(f"unknown kind {kind!r}, expected one of {KINDS}")


def laplace(eps: float) -> Event:
    """One pure eps-DP Laplace release (noise scale = sensitivity / eps); ``eps`` at most :data:`MAX_EPSILON`."""
    eps = positive("eps", eps)
    if eps > MAX_EPSILON:
        raise DuckmobError(f"eps = {eps:g} is above the limit of {MAX_EPSILON:g} for one Laplace release (its "
                           "guarantee would mean nothing and the noise grid cannot honour it): use a smaller eps")
    return Event("laplace", (("eps", eps),))


def gaussian(noise_multiplier: float) -> Event:
    """One Gaussian release, noise sd = noise_multiplier x L2 sensitivity."""
    return Event("gaussian", (("noise_multiplier", positive("noise_multiplier", noise_multiplier)),))


def dp_sgd(noise_multiplier: float, sample_rate: float, steps: int) -> Event:
    """DP-SGD: ``steps`` Poisson-subsampled (rate ``sample_rate``) Gaussian steps with multiplier ``sigma``."""
    sigma = positive("noise_multiplier", noise_multiplier)
    q = positive("sample_rate", sample_rate)
    if q > 1:
        raise DuckmobError(f"sample_rate must be in (0, 1]; got {sample_rate!r}")
    if isinstance(steps, bool) or int(steps) != steps or steps < 0:
        raise DuckmobError(f"steps must be a non-negative integer; got {steps!r}")
    return Event("dp_sgd", (("noise_multiplier", sigma), ("sample_rate", q), ("steps", int(steps))))


def compose(events) -> Event:
    """All ``events`` on the same data (nested compositions are flattened)."""
    flat = []
    for e in events:
        if not isinstance(e, Event):
            raise DuckmobError(f"compose takes privacy events; got {type(e).__name__}")
        flat.extend(e.children if e.kind == "compose" else (e,))
    return Event("compose", (), tuple(flat))


def grouped(event: Event, stability: int) -> Event:
    """What ``event`` costs the base tables when the release read a relation of stability ``s`` (one base unit is at
    most ``s`` of its units: a fan-out view declared with ``stability := s``): group privacy, exact for pure DP.
    Each Laplace leaf of ``eps`` on the relation becomes ``laplace(s * eps)``, i.e. its sensitivity is multiplied by
    ``s`` (a release that asked for eps runs its mechanism at ``eps / s`` and is charged eps). Only pure Laplace
    events can be grouped this way: a Gaussian or DP-SGD part is refused (its group privacy is not this map)."""
    s = int(stability)
    if s == 1:
        return event
    if any(leaf.kind != "laplace" for leaf in event.leaves()):
        raise DuckmobError(f"stability := {s} needs a release made of Laplace mechanisms only (privtrace, "
                           "mob_noisy_count, mob_transitions): this one has a Gaussian or DP-SGD part, whose cost "
                           "for s copies of one trajectory duckmob does not account. Release from a relation that "
                           "keeps one row one row (stability 1)")

    def scaled(e: Event) -> Event:
        if e.kind == "compose":
            return compose([scaled(c) for c in e.children])
        return laplace(e.param("eps") * s)

    return scaled(event)


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


__all__ = ["Event", "KINDS", "MAX_EPSILON", "PLD_MAX_LAPLACE_TOTAL", "PLD_MAX_LAPLACE_GROUPS",
           "PLD_MAX_LAPLACE_EPSILON", "laplace", "gaussian", "dp_sgd", "compose", "epsilon", "pure_epsilon",
           "advanced_composition", "quick_epsilon", "pld_loaded", "warm_up"]


# -- repeated Gaussian rounds (PateGail's reward queries) ---------------------------------------------------------

def gaussian_rounds(noise_multiplier: float, rounds: int) -> Event:
    """``rounds`` Gaussian releases, each with noise sd = ``noise_multiplier`` x its L2 sensitivity, on the same data.

    Recorded as one ``gaussian(noise_multiplier / sqrt(rounds))`` event, which has exactly the same privacy loss:
    a Gaussian mechanism of multiplier sigma is mu-GDP with mu = 1 / sigma, and T of them compose to
    sqrt(T) / sigma-GDP (Dong, Roth & Su, "Gaussian differential privacy", JRSS B 2022, Cor. 3.3), whose privacy
    loss distribution is that of one Gaussian of multiplier sigma / sqrt(T). dp_accounting's
    ``SelfComposedDpEvent(GaussianDpEvent(sigma), T)`` gives the same epsilon (tests/privacy/test_accounting_pategail.py).
    Adaptively chosen queries (each round's query depends on earlier outputs) compose the same way.
    """
    if isinstance(rounds, bool) or int(rounds) != rounds or rounds < 1:
        raise DuckmobError(f"rounds must be a positive integer; got {rounds!r}")
    sigma = positive("noise_multiplier", noise_multiplier)
    return gaussian(sigma / math.sqrt(int(rounds)))


def _gaussian_mu(eps: float, delta: float) -> float:
    """The largest mu such that one mu-GDP Gaussian mechanism is (eps, delta)-DP (Balle & Wang 2018, Thm. 8:
    delta(eps) = Phi(-eps / mu + mu / 2) - e^eps Phi(-eps / mu - mu / 2)), by bisection."""
    from scipy.stats import norm

    def delta_of(mu):
        return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)

    lo, hi = 1e-6, 1.0
    while delta_of(hi) < delta and hi < 1e6:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if delta_of(mid) < delta else (lo, mid)
    return lo


# Largest per-round noise multiplier calibration will consider (a run that needs more carries no information).
MAX_ROUND_SIGMA = 1e7


@lru_cache(maxsize=64)
def _calibrate_rounds(fixed_json: str, rounds: int, eps: float, delta: float, rtol: float) -> float:
    fixed = Event.from_json(fixed_json).leaves()
    laplace_sum = math.fsum(e.param("eps") for e in fixed if e.kind == "laplace")
    if any(e.kind != "laplace" for e in fixed) or laplace_sum >= eps:
        raise DuckmobError("the fixed releases leave no epsilon for the Gaussian rounds: give them a smaller "
                           "share of eps or raise eps")
    root = math.sqrt(rounds)
    # Bracket: the Gaussian part alone at eps is infeasible once Laplace parts are added (lo); at eps minus the
    # Laplace sum it is feasible by basic composition, which the PLD never exceeds (hi).
    lo = root / _gaussian_mu(eps, delta) if delta > 0 else math.inf
    hi = root / _gaussian_mu(eps - laplace_sum, delta) if delta > 0 else math.inf
    if not math.isfinite(hi) or hi > MAX_ROUND_SIGMA:
        raise DuckmobError(f"eps = {eps:g} at delta = {delta:g} is too small for {rounds} Gaussian rounds: raise "
                           "eps or delta, or use fewer rounds")

    def excess(sigma):
        return math.log(epsilon(compose(fixed + [gaussian_rounds(sigma, rounds)]), delta) / eps)

    if not fixed:
        return hi
    f_lo, f_hi = excess(lo), excess(hi)
    if f_lo <= 0:
        return lo
    while hi / lo > 1 + rtol:   # Illinois regula falsi in log sigma: a few PLD evaluations
        x_lo, x_hi = math.log(lo), math.log(hi)
        x = x_hi - f_hi * (x_hi - x_lo) / (f_hi - f_lo)
        x = min(max(x, x_lo + 0.1 * rtol), x_hi - 0.1 * rtol)
        mid = math.exp(x)
        f_mid = excess(mid)
        if f_mid <= 0:
            hi, f_hi, f_lo = mid, f_mid, f_lo / 2
        else:
            lo, f_lo, f_hi = mid, f_mid, f_hi / 2
        if f_mid <= 0 and -f_mid < rtol / 10:
            break
    return hi


def calibrate_gaussian_rounds(fixed: list, rounds: int, eps: float, delta: float, rtol: float = 1e-3) -> float:
    """Smallest per-round noise multiplier sigma (to ``rtol``, rounded up) with
    ``epsilon(compose(fixed + [gaussian_rounds(sigma, rounds)]), delta) <= eps`` by the PLD accountant.

    ``fixed``: the other (Laplace) events of the same release. The analytic Gaussian mechanism (Balle & Wang, ICML
    2018) brackets sigma; regula falsi in log sigma with the PLD accountant then needs a handful of evaluations.
    Raises DuckmobError when no sigma up to :data:`MAX_ROUND_SIGMA` fits (or delta is 0: a Gaussian needs delta > 0).
    """
    eps = positive("eps", eps)
    if not 0 < float(delta) < 1:
        raise DuckmobError(f"Gaussian rounds need 0 < delta < 1 (e.g. delta := 1e-5); got {delta!r}")
    if isinstance(rounds, bool) or int(rounds) != rounds or rounds < 1:
        raise DuckmobError(f"rounds must be a positive integer; got {rounds!r}")
    return _calibrate_rounds(compose(list(fixed)).to_json(), int(rounds), float(eps), float(delta), float(rtol))


__all__ += ["gaussian_rounds", "calibrate_gaussian_rounds", "MAX_ROUND_SIGMA"]


# -- DP-SGD noise calibration (HRNet, the baseline, clean-slate) ------------------------------------------------

def split(eps: float, shares: dict[str, float]) -> dict[str, float]:
    """The one budget split of every method (PipelineDP's ``request_budget`` in one call): each named part's
    epsilon, ``eps * share``, for public shares in [0, 1] whose sum is at most 1. Sequential composition makes the
    parts together cost at most eps; what the shares leave (1 - their sum) is the caller's remainder, e.g. the part
    a DP-SGD noise calibration fills."""
    total = 0.0
    for name, share in shares.items():
        if not (0 <= share <= 1):
            raise DuckmobError(f"the budget share {name} must be in [0, 1], got {share!r}")
        total += share
    if total > 1 + 1e-9:
        raise DuckmobError(f"the budget shares {', '.join(shares)} add up to {total:g}, more than the whole budget: "
                           "lower them so that their sum is at most 1")
    return {name: eps * share for name, share in shares.items()}


def needs_delta(source: str, eps: float, what: str) -> BudgetError:
    """The refusal of a release that needs delta > 0 (Gaussian noise, DP-SGD) against a budget with delta 0: no eps
    is enough there, so it says to declare a positive delta or use a pure-eps method, never to raise eps."""
    return BudgetError(f"the privacy budget of '{source}' has delta 0, and {what} needs delta > 0: declare a "
                       f"positive delta, e.g. FROM mob_set_budget('{source}', eps := {eps:g}, delta := 1e-5), or "
                       "use a pure-eps method (method := 'privtrace')")


# What a long calibration calls between two accountant evaluations (it raises to stop it: the release core passes
# its Ctrl-C check while it plans). A context variable: set by the thread that plans, for that plan only.
_STOP: ContextVar[Callable[[], None] | None] = ContextVar("duckmob_calibration_stop", default=None)


@contextmanager
def stoppable(check: Callable[[], None]):
    """Within this block, :func:`calibrate_noise_multiplier` calls ``check()`` before every accountant evaluation
    (a Ctrl-C while planning then stops the calibration within one evaluation, not at its end)."""
    token = _STOP.set(check)
    try:
        yield
    finally:
        _STOP.reset(token)


def _stop_point() -> None:
    check = _STOP.get()
    if check is not None:
        check()


def calibrate_noise_multiplier(fixed: list, sample_rate: float, steps: int, eps: float, delta: float,
                               rtol: float = 0.005, prior: tuple | None = None) -> float:
    """Smallest noise multiplier sigma (to ``rtol``) with
    ``epsilon(compose(fixed + [dp_sgd(sigma, sample_rate, steps)]), delta) <= eps`` by the PLD accountant.

    ``prior``: the source's :class:`~duckmob.privacy.ledger.Prior` (its budget and every other release, reserved
    ones included). Then sigma also keeps the whole composition ``prior events + this run`` within the declared
    budget at the budget's delta -- on every release, the first included (the ledger recomposes every release by
    PLD at the budget's delta, which may be smaller than the release's own). Raises BudgetError when no
    sigma <= 1000 does.

    The RDP accountant (fast, never tighter than PLD) brackets sigma first; bisection in log sigma with the PLD
    accountant then needs a handful of evaluations. Raises DuckmobError when even sigma = 1000 does not fit. The
    sigma against (eps, delta) alone is cached (it depends on public values only and takes a second or more): a
    method that plans the same release twice, or several releases alike, calibrates once.
    """
    if prior is not None and prior.delta == 0:   # DP-SGD needs delta > 0: no eps at delta 0 holds it
        raise needs_delta(prior.source, prior.eps, "DP-SGD")

    _stop_point()
    sigma = _calibrate_alone(compose(list(fixed)).to_json(), sample_rate, steps, eps, delta, rtol)
    if prior is None:
        return sigma

    def fits(s):
        _stop_point()
        return prior.fits(compose(fixed + [dp_sgd(s, sample_rate, steps)]))

    if fits(sigma):
        return sigma
    if not fits(1e3):
        raise BudgetError(f"the privacy budget of '{prior.source}' ({prior.eps:g} at delta {prior.delta:g}, with "
                          "the releases already in the ledger) cannot hold this run: use a smaller eps or raise the "
                          "budget with mob_set_budget")
    return _bisect_log(fits, sigma, 1e3, 1 + rtol)


def _bisect_log(fits, lo: float, hi: float, ratio: float) -> float:
    """Bisection in log sigma between an infeasible ``lo`` and a feasible ``hi`` (``fits`` monotone: more noise
    never costs more privacy), until ``hi / lo <= ratio``; returns the feasible end."""
    while hi / lo > ratio:
        mid = math.sqrt(hi * lo)
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


@lru_cache(maxsize=256)
def _calibrate_alone(fixed_json: str, sample_rate: float, steps: int, eps: float, delta: float, rtol: float) -> float:
    """:func:`calibrate_noise_multiplier` against (eps, delta) alone; ``fixed_json``: ``compose(fixed)`` in JSON
    (the cache's key; the JSON form keeps every float exactly, so the sigma is the one of the events themselves)."""
    from dp_accounting import rdp

    fixed = list(Event.from_json(fixed_json).children)

    def run(sigma):
        return compose(fixed + [dp_sgd(sigma, sample_rate, steps)])

    def pld_eps(sigma):
        _stop_point()
        return epsilon(run(sigma), delta)

    def rdp_eps(sigma):
        _stop_point()
        acc = rdp.RdpAccountant()
        acc.compose(run(sigma).to_dp_event())
        return acc.get_epsilon(delta)

    logging.getLogger("absl").setLevel(logging.ERROR)  # RDP's "failed to converge" notes at tiny orders
    lo, hi = 1e-2, 1e3
    if rdp_eps(hi) > eps and pld_eps(hi) > eps:
        raise DuckmobError(f"eps = {eps} is too small for DP-SGD with {steps} steps after the other releases: "
                           "raise eps or lower epochs")
    # RDP bracket: rdp_eps(hi) <= eps, so pld_eps(hi) <= eps too
    hi = _bisect_log(lambda s: rdp_eps(s) <= eps, lo, hi, 1.01)
    # Illinois regula falsi on f(log sigma) = log pld_eps(sigma) - log eps: a few PLD evaluations
    lo = hi / 1.5
    f_hi, f_lo = math.log(pld_eps(hi) / eps), math.log(pld_eps(lo) / eps)
    while f_lo <= 0:                           # rare: make sure lo is infeasible for PLD
        hi, f_hi = lo, f_lo
        lo /= 1.5
        f_lo = math.log(pld_eps(lo) / eps)
    side = 0
    while hi / lo > 1 + rtol:
        x_lo, x_hi = math.log(lo), math.log(hi)
        x = x_hi - f_hi * (x_hi - x_lo) / (f_hi - f_lo)
        x = min(max(x, x_lo + 0.1 * rtol), x_hi - 0.1 * rtol)
        mid = math.exp(x)
        f_mid = math.log(pld_eps(mid) / eps)
        if f_mid <= 0:
            hi, f_hi = mid, f_mid
            if side == 1:
                f_lo /= 2
            side = 1
        else:
            lo, f_lo = mid, f_mid
            if side == -1:
                f_hi /= 2
            side = -1
        if abs(f_mid) < rtol / 10 and f_mid <= 0:
            break
    return hi
