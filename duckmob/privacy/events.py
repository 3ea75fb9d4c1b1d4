"""Privacy events: what a release spends, by its mechanism's public parameters, stored as JSON.

An :class:`Event` describes one release (or a composition of releases):

- ``laplace(eps)``: one pure ``eps``-DP Laplace release (noise scale = L1 sensitivity / eps; see
  ``duckmob.privacy.noise`` for why our grid sampler is accounted exactly as the continuous Laplace mechanism).
  dp_accounting: ``LaplaceDpEvent(1 / eps)`` (the noise scale in units of the sensitivity).
- ``gaussian(noise_multiplier)``: one Gaussian release with noise sd = multiplier x L2 sensitivity;
  ``gaussian_rounds(sigma, rounds)``: repeated ones, recorded as the one Gaussian of the same privacy loss.
- ``dp_sgd(noise_multiplier, sample_rate, steps)``: DP-SGD (Abadi et al., 2016) with Poisson sampling at rate
  ``q`` and per-example clipping: ``SelfComposed(PoissonSampled(q, Gaussian(sigma)), steps)``.
- ``compose(events)``: all of them on the same data; ``grouped(event, s)``: its cost through a relation of
  stability ``s``.

Neighbouring datasets differ by adding or removing one privacy unit (a trajectory, or a user with at most k
trajectories; each mechanism states its sensitivity for that relation) — dp_accounting's default
``ADD_OR_REMOVE_ONE``. The epsilon of an event is :func:`duckmob.privacy.composition.epsilon`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from duckmob.errors import DuckmobError
from duckmob.validators import MAX_EPSILON, positive

if TYPE_CHECKING:
    import dp_accounting

KINDS = ("laplace", "gaussian", "dp_sgd", "compose")

# MAX_EPSILON (from duckmob.validators) is the largest epsilon of one Laplace event. Past it the guarantee is
# meaningless (an observer's odds may move by e^100 = 3e43) and the noise grid cannot honour it for realistic
# counts: the noise scale is sensitivity / eps and its grid step 2^-20 of that, and ``NoiseSource.add_laplace`` keeps
# values exact only up to 2^51 grid steps, so at eps 100 (sensitivity 1) counts up to about 2e7 stay exact, at eps
# 1000 only up to about 2e6.


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


def gaussian_rounds(noise_multiplier: float, rounds: int) -> Event:
    """``rounds`` Gaussian releases, each with noise sd = ``noise_multiplier`` x its L2 sensitivity, on the same data.

    Recorded as one ``gaussian(noise_multiplier / sqrt(rounds))`` event, which has exactly the same privacy loss:
    a Gaussian mechanism of multiplier sigma is mu-GDP with mu = 1 / sigma, and T of them compose to
    sqrt(T) / sigma-GDP (Dong, Roth & Su, "Gaussian differential privacy", JRSS B 2022, Cor. 3.3), whose privacy
    loss distribution is that of one Gaussian of multiplier sigma / sqrt(T). dp_accounting's
    ``SelfComposedDpEvent(GaussianDpEvent(sigma), T)`` gives the same epsilon
    (tests/privacy/test_accounting_pategail.py).
    Adaptively chosen queries (each round's query depends on earlier outputs) compose the same way.
    """
    if isinstance(rounds, bool) or int(rounds) != rounds or rounds < 1:
        raise DuckmobError(f"rounds must be a positive integer; got {rounds!r}")
    sigma = positive("noise_multiplier", noise_multiplier)
    return gaussian(sigma / math.sqrt(int(rounds)))


__all__ = ["Event", "KINDS", "MAX_EPSILON", "laplace", "gaussian", "dp_sgd", "compose", "grouped", "gaussian_rounds"]
