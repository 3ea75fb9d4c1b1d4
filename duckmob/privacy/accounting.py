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

:func:`epsilon` returns the smallest of the valid bounds it can compute at the given ``delta``:
the PLD accountant (Meiser & Mohammadi 2018; Koskela et al. 2020; dp_accounting 0.6, pessimistic
discretisation 1e-4) over the whole composition, and basic composition (the exact sum of the pure Laplace
epsilons plus the PLD epsilon of the rest). For pure-Laplace compositions the sum is the only bound at
``delta = 0`` (the PLD answers ``inf`` there); at ``delta > 0`` the PLD bound is slightly smaller (Laplace 0.5 at
delta 1e-5: 0.49998). Example (ENGINEERING.md): Laplace 0.5 composed with DP-SGD sigma 1, q 0.00256, 4000 steps,
delta 1e-5 -> 1.284 by PLD (1.326 by adding the two epsilons).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache

import dp_accounting
from dp_accounting import pld

from duckmob.errors import DuckmobError
from duckmob.privacy.checks import positive

KINDS = ("laplace", "gaussian", "dp_sgd", "compose")


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
        return laplace(obj["eps"])
    if kind == "gaussian":
        return gaussian(obj["noise_multiplier"])
    if kind == "dp_sgd":
        return dp_sgd(obj["noise_multiplier"], obj["sample_rate"], obj["steps"])
    if kind == "compose":
        return compose([_from_obj(o) for o in obj["events"]])
    raise ValueError(f"unknown kind {kind!r}, expected one of {KINDS}")


def laplace(eps: float) -> Event:
    """One pure eps-DP Laplace release (noise scale = sensitivity / eps)."""
    return Event("laplace", (("eps", positive("eps", eps)),))


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


def pure_epsilon(event: Event) -> float | None:
    """The exact epsilon at delta = 0 by basic composition when every part is pure Laplace, else None."""
    leaves = event.leaves()
    if all(leaf.kind == "laplace" for leaf in leaves):
        return math.fsum(leaf.param("eps") for leaf in leaves)
    return None


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
    pure = [leaf for leaf in leaves if leaf.kind == "laplace"]
    rest = [leaf for leaf in leaves if leaf.kind != "laplace"]
    pure_sum = math.fsum(leaf.param("eps") for leaf in pure)
    if delta == 0:
        return pure_sum if not rest else math.inf
    bounds = [_pld(event, delta)]
    if not rest:
        bounds.append(pure_sum)
    elif pure:
        bounds.append(pure_sum + _pld(compose(rest), delta))
    return min(bounds)


def _pld(event: Event, delta: float) -> float:
    accountant = pld.PLDAccountant()
    accountant.compose(event.to_dp_event())
    return float(accountant.get_epsilon(delta))


__all__ = ["Event", "KINDS", "laplace", "gaussian", "dp_sgd", "compose", "epsilon", "pure_epsilon"]
