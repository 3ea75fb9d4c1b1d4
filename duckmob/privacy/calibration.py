"""Noise calibration: the least noise whose composition with a release's other parts fits its (eps, delta), by the
PLD accountant (:func:`duckmob.privacy.composition.epsilon`): DP-SGD's noise multiplier (HRNet, the baseline,
clean-slate) and the per-round multiplier of repeated Gaussian queries (PateGail's rewards). Both depend on public
values only, so their results are cached; both call :func:`duckmob.privacy.stopping.stop_point` between accountant
evaluations."""

from __future__ import annotations

import copy
import logging
import math
from functools import lru_cache

from duckmob.errors import BudgetError, DuckmobError
from duckmob.privacy import composition
from duckmob.privacy.budget import needs_delta
from duckmob.privacy.events import Event, compose, dp_sgd, gaussian_rounds
from duckmob.privacy.stopping import stop_point
from duckmob.validators import positive


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
        return math.log(composition.epsilon(compose(fixed + [gaussian_rounds(sigma, rounds)]), delta) / eps)

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

    stop_point()
    sigma = _calibrate_alone(compose(list(fixed)).to_json(), sample_rate, steps, eps, delta, rtol)
    if prior is None:
        return sigma

    def fits(s):
        stop_point()
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
        stop_point()
        return composition.epsilon(run(sigma), delta)

    fixed_acc = rdp.RdpAccountant().compose(compose(fixed).to_dp_event())   # the fixed parts' RDP, once

    def rdp_eps(sigma):
        # a copy of the fixed parts' accountant plus this run: the same sums in the same order as composing
        # run(sigma) afresh (so the same sigma), without recomputing the fixed parts (another DP-SGD run's RDP
        # costs as much as this one's)
        stop_point()
        acc = copy.deepcopy(fixed_acc)
        acc.compose(dp_sgd(sigma, sample_rate, steps).to_dp_event())
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


__all__ = ["calibrate_noise_multiplier", "calibrate_gaussian_rounds", "MAX_ROUND_SIGMA"]
