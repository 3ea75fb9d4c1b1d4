"""A fake synthesizer that pins what the release core relies on (the way opacus tests against dummy accountants).

It implements the contract of duckmob.synth.base with the least machinery: one noisy trajectory count (Laplace,
sensitivity max_trajectories_per_user) and a model that draws two points per trajectory at the bbox's centre.
Every fit records what the release core handed it in ``CALLS`` (test code only), so the contract test can check
that the core reserves the plan it then hands to ``fit``, bounds the source to the unit first, and gives the fit
its seeded noise source.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from duckmob.privacy import accounting
from duckmob.privacy.counting import noisy_count
from duckmob.privacy.unit import PrivacyUnit
from duckmob.source.batches import as_batches
from duckmob.synth.base import Model, Plan, Synthesizer, trajectories_from_cells
from duckmob.synth.config import Config, param

CALLS: list[dict] = []


@dataclass(frozen=True)
class FakeConfig(Config):
    method: ClassVar[str] = "fake"

    count_share: float = param(1.0, float, low=0, high=1, low_open=True, doc="share of eps for the count")
    replan: bool = param(False, bool, doc="re-plan after the noisy count (release.settle), spending half of it")


@dataclass(frozen=True, kw_only=True)
class FakePlan(Plan):
    count_eps: float


class FakeModel(Model):
    method: ClassVar[str] = "fake"
    format_version: ClassVar[int] = 2

    def __init__(self, bbox: list, config: FakeConfig, n_noisy: float):
        self.bbox, self.config, self.n_noisy = bbox, config, float(n_noisy)

    @property
    def default_n(self) -> int:
        return max(int(round(self.n_noisy)), 0)

    @property
    def max_points(self) -> int:
        return 2

    def sample(self, n: int, rng: np.random.Generator):
        lat = (self.bbox[0] + self.bbox[2]) / 2 + rng.normal(0, 1e-4, 2 * n)
        lon = (self.bbox[1] + self.bbox[3]) / 2 + rng.normal(0, 1e-4, 2 * n)
        return trajectories_from_cells(np.full(n, 2), lat, lon)

    def payload(self) -> bytes:
        return json.dumps({"bbox": self.bbox, "config": self.config.as_dict(), "n": self.n_noisy}).encode()

    @classmethod
    def load(cls, payload: bytes, version: int, method: str) -> "FakeModel":
        d = json.loads(payload.decode())
        return cls(d["bbox"], FakeConfig.parse(d["config"]), d["n"])


class Fake(Synthesizer):
    method: ClassVar[str] = "fake"
    config_class: ClassVar[type[Config]] = FakeConfig
    model_class: ClassVar[type[Model]] = FakeModel
    default_delta: ClassVar[float] = 0.0
    needs_time: ClassVar[bool] = False

    def plan(self, eps: float, delta: float, unit: PrivacyUnit = PrivacyUnit(), prior=None) -> FakePlan:
        count_eps = accounting.split(eps, {"count": self.config.count_share})["count"]
        return FakePlan(eps=eps, delta=delta, unit=unit, event=accounting.laplace(count_eps), bbox=self.bbox,
                        max_points=2,
                        needs_time=self.needs_time, count_eps=count_eps)

    def fit(self, source, plan: FakePlan, release) -> FakeModel:
        data = as_batches(source).trajectories()
        k = plan.unit.max_trajectories_per_user
        n = noisy_count(data.n_trajectories, plan.count_eps, release.noise, sensitivity=k)
        if self.config.replan:   # spend half of what was reserved, as a method whose spend depends on a count
            release.settle(lambda prior: (accounting.laplace(plan.count_eps / 2), None), plan.event)
        CALLS.append({"plan": plan, "source": type(source).__name__, "trajectories": data.n_trajectories,
                      "per_user": np.unique(data.user_id, return_counts=True)[1].tolist(), "noisy": n,
                      "noise_seeded": release.noise.seeded})
        return FakeModel(self.bbox.as_list(), self.config, n)


class NeedsDelta(Fake):
    method: ClassVar[str] = "needsdelta"
    needs_delta: ClassVar[bool] = True
    mechanism: ClassVar[str] = "adds Gaussian noise"
