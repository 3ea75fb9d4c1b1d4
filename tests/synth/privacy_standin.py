"""Stand-ins for duckmob.privacy pieces that are not committed yet (tests and benchmarks only).

``install()`` registers a minimal module for each of noise, normcut and accounting that cannot be imported,
following the agreed API; the real modules win as soon as they exist.
"""

from __future__ import annotations

import importlib
import json
import sys
import types

import numpy as np


def _noise_module():
    mod = types.ModuleType("duckmob.privacy.noise")

    class NoiseSource:
        def __init__(self, seed=None):
            self.seeded = seed is not None
            self._rng = np.random.default_rng(seed)

        def laplace(self, scale, size):
            return self._rng.laplace(0.0, scale, size)

        def generator(self):
            return np.random.default_rng(self._rng.integers(2**63))

    mod.NoiseSource = NoiseSource
    return mod


def _normcut_module():
    mod = types.ModuleType("duckmob.privacy.normcut")

    def normcut(x, axis=-1):
        x = np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1)
        shape = x.shape
        rows = x.reshape(-1, shape[-1]).copy()
        neg = -np.where(rows < 0, rows, 0).sum(axis=1)
        pos = np.where(rows > 0, rows, np.inf)
        order = np.argsort(pos, axis=1)
        sorted_pos = np.take_along_axis(pos, order, axis=1)
        finite = np.isfinite(sorted_pos)
        csum = np.cumsum(np.where(finite, sorted_pos, 0), axis=1)
        removed = (csum <= neg[:, None]) & finite
        before = np.concatenate([np.zeros((len(rows), 1)), csum[:, :-1]], axis=1)
        partial = (~removed) & finite & (before <= neg[:, None]) & (before < csum)
        new_sorted = np.where(removed, 0.0, sorted_pos)
        new_sorted = np.where(partial, sorted_pos - (neg[:, None] - before), new_sorted)
        new_sorted = np.where(finite, new_sorted, 0.0)
        out = np.zeros_like(rows)
        np.put_along_axis(out, order, new_sorted, axis=1)
        return np.moveaxis(out.reshape(shape), -1, axis)

    mod.normcut = normcut
    return mod


def _accounting_module():
    mod = types.ModuleType("duckmob.privacy.accounting")

    class Event:
        def __init__(self, eps):
            self.eps = float(eps)

        def to_json(self):
            return json.dumps({"eps": self.eps})

        @classmethod
        def from_json(cls, s):
            return cls(json.loads(s)["eps"])

    mod.Event = Event
    mod.laplace = lambda eps: Event(eps)
    mod.compose = lambda events: Event(sum(e.eps for e in events))
    mod.epsilon = lambda event, delta: event.eps
    return mod


def install() -> None:
    import duckmob.privacy as pkg

    for name, make in (("noise", _noise_module), ("normcut", _normcut_module), ("accounting", _accounting_module)):
        full = f"duckmob.privacy.{name}"
        try:
            importlib.import_module(full)
        except ModuleNotFoundError as exc:
            if exc.name != full:
                raise
            mod = make()
            sys.modules[full] = mod
            setattr(pkg, name, mod)
