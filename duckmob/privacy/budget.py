"""Dividing a release's budget between its parts, and refusing a release that a budget's delta cannot hold."""

from __future__ import annotations

from duckmob.errors import BudgetError, DuckmobError


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


__all__ = ["split", "needs_delta"]
