"""PateGail's mobility MDP (Wang et al., AAAI 2024, "Method" and App. B "Action Space and State Transition
Probability"), the exploration and preferential return (EPR) model of Song et al. (2010) and TimeGeo, vectorised
over many agents.

Locations are the cells of a public w x w grid over the declared bbox; time is in slots of ``24 h / n_slots``
(the paper's GeoLife uses 48 half-hour slots). One MDP step is one slot: at the start of the slot the agent picks
an action, and its location at the end of the slot follows the appendix's transition rules:

* **stay** (0): the location does not change;
* **home** (1): go home (stays where it is if already home);
* **return** (2): preferential return to a previously visited location other than home and the current one,
  chosen in proportion to the number of slots spent there so far (if there is none, the agent stays);
* **explore** (3): go to a location not visited yet, the k-th nearest cell to the current one (by distance
  between centres, ties by cell id) with probability proportional to ``k^-alpha`` among the ``max_rank``
  nearest (TimeGeo's rank-based exploration; the reference uses alpha = 0.6); if all of them were visited, stay.

The state is the visit history: current cell, home, the slot of the day, and what the policy and the
discriminators read from the history (:func:`state_features`: distinct locations so far, slots spent in the
current one, steps taken). **Home** is the episode's first location. The paper's home is the user's home; a
GeoLife trajectory is a trip, and taking its origin as the anchor keeps each episode a function of one
trajectory only (and what the agent needs to start is sampled from a private start model, never a real user).

Real trajectories become episodes with :func:`episodes`: the location at the start of the first slot is the
first fix, the location at the end of each slot the last fix before that end (carried forward over slots without
fixes), up to ``max_steps`` slots (a public cap). The actions of a real episode are inferred from its
locations (:func:`infer_actions`); generated episodes are judged on the same inferred labels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from duckmob.grid import cell_of, row_col

STAY, HOME, RETURN, EXPLORE = range(4)
ACTIONS = ("stay", "home", "return", "explore")
N_ACTIONS = 4
DAY_US = 86_400_000_000
N_STATE_FEATURES = 11
N_FEATURES = N_STATE_FEATURES + N_ACTIONS


@dataclass(frozen=True)
class Episodes:
    """Episodes as a padded location array.

    ``cells`` (n, max_steps + 1) int64: location at the start of the first slot, then at the end of each slot,
    -1 past the episode; ``steps`` (n,) slots (actions) of each episode, >= 1; ``first_slot`` (n,) slot of the
    day of the first step; ``device`` (n,) the device (privacy unit) each episode belongs to.
    """

    cells: np.ndarray
    steps: np.ndarray
    first_slot: np.ndarray
    device: np.ndarray

    @property
    def n(self) -> int:
        return len(self.steps)


def _slot_fixes(data, n_slots: int, max_steps: int):
    """Per point: its trajectory (``owner``) and slot index within the trajectory's episode (``rel``, >= 0: points
    are sorted by time), whether it is within ``max_steps`` slots of the first fix (``inside``); the indices of
    the last fix of each (trajectory, slot) inside (``last``); each trajectory's first slot of the day (``s0``)."""
    n = data.n_trajectories
    keep = data.lengths > 0
    slot_us = DAY_US // n_slots
    owner = data.point_traj()
    slot_abs = np.floor_divide(data.ts, slot_us)
    s0 = np.zeros(n, dtype=np.int64)
    s0[keep] = slot_abs[data.offsets[:-1][keep]]
    rel = slot_abs - s0[owner]
    inside = rel < max_steps
    # the last fix of each (trajectory, slot): where the key changes next
    key = owner * (max_steps + 1) + np.minimum(rel, max_steps)
    last = np.flatnonzero(np.concatenate([key[1:] != key[:-1], [True]]) & inside)
    return owner, rel, inside, last, s0


def episode_fixes(data, n_slots: int, max_steps: int):
    """The fixes :func:`episodes` reads: each trajectory's first fix and the last fix of each slot within
    ``max_steps`` slots of it. ``episodes`` of them equals ``episodes`` of ``data`` (and so, batch by batch, out
    of core, memory follows the slots, not the fixes). Per trajectory: each output from its own points only."""
    if data.n_points == 0:
        return data
    _owner, _rel, _inside, last, _s0 = _slot_fixes(data, n_slots, max_steps)
    keep = np.zeros(data.n_points, dtype=bool)
    keep[last] = True
    keep[data.offsets[:-1][data.lengths > 0]] = True
    return data.take_points(keep)


def episodes(data, bbox, w: int, n_slots: int, max_steps: int, device: np.ndarray) -> Episodes:
    """Real trajectories (``duckmob.trajectories.Trajectories`` with time, points inside ``bbox``) as episodes.

    Vectorised over points: the last fix of each (trajectory, slot) is found from sorted keys, placed at that
    slot's column and carried forward. Points more than ``max_steps`` slots after the first fix are ignored.
    """
    n = data.n_trajectories
    keep = data.lengths > 0
    out = np.full((n, max_steps + 1), -1, dtype=np.int64)
    if data.n_points == 0:
        return Episodes(out[:0], np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    cells = cell_of(data.lat, data.lon, bbox, w)
    owner, rel, inside, last, s0 = _slot_fixes(data, n_slots, max_steps)
    first = data.offsets[:-1][keep]
    out[owner[last], rel[last] + 1] = cells[last]
    out[keep, 0] = cells[first]
    steps = np.zeros(n, dtype=np.int64)
    np.maximum.at(steps, owner[inside], rel[inside] + 1)
    # carry each location forward over the slots without fixes
    col = np.where(out >= 0, np.arange(max_steps + 1), 0)
    np.maximum.accumulate(col, axis=1, out=col)
    out = np.take_along_axis(out, col, axis=1)
    out[np.arange(max_steps + 1)[None, :] > steps[:, None]] = -1
    ok = keep & (steps >= 1)
    return Episodes(out[ok], steps[ok], (s0 % n_slots)[ok], np.asarray(device)[ok])


def infer_actions(cells: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """The EPR action each step of each episode took, from its locations (n, max_steps); -1 past the end.

    stay: same cell; home: to the first cell; return: to a cell visited before (not home); explore: a new cell.
    """
    cur, nxt = cells[:, :-1], cells[:, 1:]
    home = cells[:, :1]
    m = cells.shape[1]
    # seen[i, j]: cells[i, j + 1] equals one of cells[i, 0 .. j]
    earlier = np.arange(m)[None, :] <= np.arange(m - 1)[:, None]
    seen = ((nxt[:, :, None] == cells[:, None, :]) & earlier[None]).any(axis=2)
    act = np.where(nxt == cur, STAY, np.where(nxt == home, HOME, np.where(seen, RETURN, EXPLORE)))
    act[np.arange(m - 1)[None, :] >= steps[:, None]] = -1
    return act


def history(cells: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each step j of each episode (n, max_steps): distinct locations among cells[0 .. j] and the number of
    consecutive positions up to j spent in cells[j] (>= 1)."""
    n, m = cells.shape
    new = np.ones((n, m), dtype=bool)
    if m > 1:
        same = (cells[:, :, None] == cells[:, None, :]) & (np.arange(m)[None, :] < np.arange(m)[:, None])[None]
        new = ~same.any(axis=2)
    distinct = np.cumsum(new, axis=1)
    change = np.ones((n, m), dtype=bool)
    change[:, 1:] = cells[:, 1:] != cells[:, :-1]
    idx = np.where(change, np.arange(m), 0)
    np.maximum.accumulate(idx, axis=1, out=idx)
    run = np.arange(m)[None, :] - idx + 1
    return distinct[:, :-1], run[:, :-1]


def state_features(cur, home, slot, distinct, run, step, w: int, n_slots: int, max_steps: int) -> np.ndarray:
    """The state as the policy and the discriminators read it: (..., N_STATE_FEATURES) float32.

    Slot of the day as (sin, cos); current cell and home as (row, col) scaled to [-1, 1]; their distance in
    cells / w; log(1 + distinct locations) / log(1 + max_steps); log(1 + slots in the current cell) /
    log(1 + max_steps); steps taken / max_steps; whether the agent is home. Inputs broadcast together.
    """
    cur, home = np.asarray(cur), np.asarray(home)
    r, c = row_col(np.maximum(cur, 0), w)
    hr, hc = row_col(np.maximum(home, 0), w)
    angle = 2 * np.pi * np.asarray(slot, dtype=np.float64) / n_slots
    scale = 2.0 / max(w - 1, 1)
    log_cap = np.log1p(max_steps)
    parts = [np.sin(angle), np.cos(angle), r * scale - 1, c * scale - 1, hr * scale - 1, hc * scale - 1,
             np.hypot(r - hr, c - hc) / w, np.log1p(distinct) / log_cap, np.log1p(run) / log_cap,
             np.asarray(step, dtype=np.float64) / max_steps, (cur == home).astype(np.float64)]
    parts = np.broadcast_arrays(*parts)
    return np.stack(parts, axis=-1).astype(np.float32)


def pair_features(state: np.ndarray, action: np.ndarray) -> np.ndarray:
    """State features with the action one-hot appended: (..., N_FEATURES) float32 (the discriminator's input)."""
    onehot = np.eye(N_ACTIONS, dtype=np.float32)[np.maximum(action, 0)]
    return np.concatenate([state, onehot], axis=-1)


def episode_pairs(ep: Episodes, w: int, n_slots: int, max_steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (state, inferred action) pair of the episodes: features (P, N_FEATURES), the episode of each pair
    and its step index (pairs listed episode by episode, step by step)."""
    cells = ep.cells
    act = infer_actions(cells, ep.steps)
    distinct, run = history(cells, ep.steps)
    j = np.arange(cells.shape[1] - 1)[None, :]
    slot = (ep.first_slot[:, None] + j) % n_slots
    valid = j < ep.steps[:, None]
    feats = state_features(cells[:, :-1], cells[:, :1], slot, distinct, run, j, w, n_slots, max_steps)
    x = pair_features(feats, act)
    rows, cols = np.nonzero(valid)
    return x[rows, cols], rows, cols


def nearest_ranks(w: int, max_rank: int) -> np.ndarray:
    """(w*w, R) the R = min(max_rank, w*w - 1) nearest other cells of each cell, by centre distance then id."""
    n = w * w
    r, c = row_col(np.arange(n), w)
    d2 = (r[:, None] - r[None, :]) ** 2 + (c[:, None] - c[None, :]) ** 2
    np.fill_diagonal(d2, np.iinfo(np.int64).max)
    order = np.argsort(d2, axis=1, kind="stable")
    return order[:, :min(max_rank, n - 1)]


class Env:
    """``n`` EPR agents stepping together (numpy); ``rng`` draws the stochastic transitions.

    Holds each agent's current cell, home, slot-visit counts per cell and the history features.
    """

    def __init__(self, start_cell: np.ndarray, first_slot: np.ndarray, steps: np.ndarray, *, w: int, n_slots: int,
                 max_steps: int, alpha: float, ranks: np.ndarray, rng: np.random.Generator,
                 attraction: np.ndarray | None = None):
        self.n = len(start_cell)
        # per cell weight multiplying the rank weight of an exploration (None: rank alone, the paper's rule)
        self.attraction = attraction
        self.w, self.n_slots, self.max_steps = w, n_slots, max_steps
        self.rng, self.ranks = rng, ranks
        self.rank_weight = np.arange(1, ranks.shape[1] + 1, dtype=np.float64) ** -float(alpha)
        self.home = np.asarray(start_cell, dtype=np.int64)
        self.cur = self.home.copy()
        self.first_slot = np.asarray(first_slot, dtype=np.int64)
        self.steps = np.asarray(steps, dtype=np.int64)
        self.visits = np.zeros((self.n, w * w), dtype=np.int32)
        self.visits[np.arange(self.n), self.cur] = 1
        self.distinct = np.ones(self.n, dtype=np.int64)
        self.run = np.ones(self.n, dtype=np.int64)
        self.j = 0
        self.cells = np.full((self.n, max_steps + 1), -1, dtype=np.int64)
        self.cells[:, 0] = self.cur

    def features(self) -> np.ndarray:
        """(n, N_STATE_FEATURES) of the current step."""
        slot = (self.first_slot + self.j) % self.n_slots
        return state_features(self.cur, self.home, slot, self.distinct, self.run, self.j, self.w, self.n_slots,
                              self.max_steps)

    def _categorical(self, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One index per row drawn in proportion to ``weights`` (n, k); (index, row has mass)."""
        cum = np.cumsum(weights, axis=1)
        total = cum[:, -1]
        u = self.rng.random(len(weights)) * total
        idx = np.minimum((cum <= u[:, None]).sum(axis=1), weights.shape[1] - 1)
        return idx, total > 0

    def step(self, action: np.ndarray) -> None:
        """Apply one action per agent (agents past their episode are left alone)."""
        action = np.asarray(action)
        live = self.j < self.steps
        nxt = self.cur.copy()
        home = live & (action == HOME)
        nxt[home] = self.home[home]
        ret = np.flatnonzero(live & (action == RETURN))
        if len(ret):
            weights = self.visits[ret].astype(np.float64)
            weights[np.arange(len(ret)), self.home[ret]] = 0
            weights[np.arange(len(ret)), self.cur[ret]] = 0
            idx, ok = self._categorical(weights)
            nxt[ret[ok]] = idx[ok]
        exp = np.flatnonzero(live & (action == EXPLORE))
        if len(exp):
            cand = self.ranks[self.cur[exp]]
            fresh = self.visits[exp[:, None], cand] == 0
            weight = self.rank_weight[None, :] if self.attraction is None else \
                self.rank_weight[None, :] * self.attraction[cand]
            idx, ok = self._categorical(np.where(fresh, weight, 0.0))
            nxt[exp[ok]] = cand[ok, idx[ok]]
        moved = live & (nxt != self.cur)
        self.run = np.where(moved, 1, self.run + live)
        self.distinct += live & (self.visits[np.arange(self.n), nxt] == 0)
        self.cur = nxt
        self.visits[np.flatnonzero(live), nxt[live]] += 1
        self.j += 1
        self.cells[live, self.j] = nxt[live]

    def episodes(self) -> Episodes:
        return Episodes(self.cells, self.steps, self.first_slot, np.full(self.n, -1, dtype=np.int64))
