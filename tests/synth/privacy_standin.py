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

        def add_laplace(self, x, scale):
            return np.asarray(x, dtype=np.float64) + self.laplace(scale, np.shape(x))

        def generator(self):
            return np.random.default_rng(self._rng.integers(2**63))

    mod.NoiseSource = NoiseSource
    mod.granularity = lambda scale: 2.0 ** (np.floor(np.log2(scale)) - 20)
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


def _ledger_module():
    mod = types.ModuleType("duckmob.privacy.ledger")
    from duckmob.errors import BudgetError

    def ensure_tables(con):
        con.execute("CREATE TABLE IF NOT EXISTS duckmob_budget (source VARCHAR PRIMARY KEY, eps DOUBLE, delta DOUBLE)")
        con.execute("CREATE TABLE IF NOT EXISTS duckmob_ledger (source VARCHAR, event VARCHAR, mechanism VARCHAR, "
                    "privacy_unit VARCHAR, params VARCHAR, seeded BOOLEAN)")

    def set_budget(con, source, eps, delta):
        ensure_tables(con)
        con.execute("INSERT OR REPLACE INTO duckmob_budget VALUES (?, ?, ?)", [source, eps, delta])

    def check(con, source, event):
        from duckmob.privacy import accounting

        ensure_tables(con)
        row = con.execute("SELECT eps, delta FROM duckmob_budget WHERE source = ?", [source]).fetchone()
        if row is None:
            raise BudgetError(f"no privacy budget declared for '{source}': run "
                              f"SELECT mob_set_budget('{source}', eps := 1.0, delta := 1e-6)")
        past = [accounting.Event.from_json(r[0]) for r in
                con.execute("SELECT event FROM duckmob_ledger WHERE source = ?", [source]).fetchall()]
        if accounting.epsilon(accounting.compose(past + [event]), row[1]) > row[0] + 1e-9:
            raise BudgetError(f"the budget of '{source}' would be exceeded")

    def record(con, source, event, *, mechanism, privacy_unit, params, seeded):
        ensure_tables(con)
        con.execute("INSERT INTO duckmob_ledger VALUES (?, ?, ?, ?, ?, ?)",
                    [source, event.to_json(), mechanism, privacy_unit, json.dumps(params), seeded])

    mod.ensure_tables, mod.set_budget, mod.check, mod.record = ensure_tables, set_budget, check, record
    return mod


def _counting_module():
    mod = types.ModuleType("duckmob.privacy.counting")

    def bound_contributions(user_id, max_trajectories_per_user, rng):
        user_id = np.asarray(user_id)
        order = rng.permutation(len(user_id))
        u = user_id[order]
        srt = np.argsort(u, kind="stable")
        us = u[srt]
        start = np.r_[0, np.flatnonzero(us[1:] != us[:-1]) + 1]
        rank = np.arange(len(us)) - np.repeat(start, np.diff(np.r_[start, len(us)]))
        keep = np.zeros(len(user_id), bool)
        keep[order[srt]] = rank < max_trajectories_per_user
        return keep

    mod.bound_contributions = bound_contributions
    return mod


def install() -> None:
    import duckmob.privacy as pkg

    for name, make in (("noise", _noise_module), ("normcut", _normcut_module), ("accounting", _accounting_module),
                       ("ledger", _ledger_module), ("counting", _counting_module)):
        full = f"duckmob.privacy.{name}"
        try:
            importlib.import_module(full)
        except ModuleNotFoundError as exc:
            if exc.name != full:
                raise
            mod = make()
            sys.modules[full] = mod
            setattr(pkg, name, mod)
