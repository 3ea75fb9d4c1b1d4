"""TEMPORARY bridge to duckmob.privacy: noise and normcut are the privacy core's; accounting is a minimal
stand-in with the agreed API until duckmob.privacy.accounting is committed (then this file goes)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import dp_accounting
import numpy as np

from duckmob.privacy.noise import NoiseSource  # noqa: F401  (committed)
from duckmob.privacy.normcut import normcut  # noqa: F401  (committed)

try:
    from duckmob.privacy import accounting  # noqa: F401
    HAVE_CORE = True
except ImportError:
    HAVE_CORE = False

if not HAVE_CORE:
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
