"""TEMPORARY stand-in for duckmob.privacy (noise, accounting, counting, normcut) until the privacy core is
committed; the agreed API, minimal implementations. Removed as soon as duckmob.privacy lands."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import dp_accounting
import numpy as np

try:
    from duckmob.privacy import accounting  # noqa: F401
    from duckmob.privacy.noise import NoiseSource  # noqa: F401
    from duckmob.privacy.normcut import normcut  # noqa: F401
    HAVE_CORE = True
except ImportError:
    HAVE_CORE = False

if not HAVE_CORE:
    class NoiseSource:  # noqa: D101
        def __init__(self, seed: int | None = None):
            self.seeded = seed is not None
            self._rng = np.random.default_rng(seed)

        def laplace(self, scale: float, size) -> np.ndarray:
            return self._rng.laplace(0.0, scale, size)

        def generator(self) -> np.random.Generator:
            return np.random.default_rng(self._rng.integers(2 ** 63))

    @dataclass
    class Event:
        kind: str
        params: dict = field(default_factory=dict)
        children: list = field(default_factory=list)

        def to_json(self) -> str:
            return json.dumps({"kind": self.kind, "params": self.params,
                               "children": [json.loads(c.to_json()) for c in self.children]})

        def to_dp_event(self):
            if self.kind == "laplace":
                return dp_accounting.LaplaceDpEvent(1.0 / self.params["eps"])
            if self.kind == "dp_sgd":
                p = self.params
                return dp_accounting.SelfComposedDpEvent(
                    dp_accounting.PoissonSampledDpEvent(p["sample_rate"],
                                                        dp_accounting.GaussianDpEvent(p["noise_multiplier"])),
                    p["steps"])
            return dp_accounting.ComposedDpEvent([c.to_dp_event() for c in self.children])

    class _Accounting:
        Event = Event

        @staticmethod
        def laplace(eps: float) -> Event:
            return Event("laplace", {"eps": float(eps)})

        @staticmethod
        def dp_sgd(noise_multiplier: float, sample_rate: float, steps: int) -> Event:
            return Event("dp_sgd", {"noise_multiplier": float(noise_multiplier),
                                    "sample_rate": float(sample_rate), "steps": int(steps)})

        @staticmethod
        def compose(events) -> Event:
            return Event("compose", {}, list(events))

        @staticmethod
        def epsilon(event: Event, delta: float) -> float:
            acc = dp_accounting.pld.PLDAccountant()
            acc.compose(event.to_dp_event())
            return float(acc.get_epsilon(max(delta, 1e-12)))

    accounting = _Accounting()

    def normcut(x: np.ndarray, axis: int = -1) -> np.ndarray:
        """Keep the largest entries whose sum reaches the (clipped) noisy total; zero the rest."""
        x = np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1)
        total = np.clip(x.sum(-1, keepdims=True), 0, None)
        order = np.argsort(-x, axis=-1)
        xs = np.take_along_axis(x, order, -1)
        cum = np.cumsum(np.clip(xs, 0, None), -1)
        keep_sorted = (cum - np.clip(xs, 0, None) < total) & (xs > 0)
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, -1)
        return np.moveaxis(np.where(keep, x, 0.0), -1, axis)
