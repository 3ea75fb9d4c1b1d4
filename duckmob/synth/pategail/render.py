"""How PateGail's episodes become points (post-processing of a fitted model; nothing here reads data).

An episode is a cell at the start of its first slot and at the end of each slot (``mdp.Episodes``). Each
(episode, cell) visit gets one point drawn uniformly inside the cell (an episode that comes back to a cell
comes back to its point). Two renderings of the visits:

* **slots** (``step_m = 0``, the default): one point per slot end, at the end of the slot (the start of the
  first slot for the first point): ``steps + 1`` points per episode.
* **lines** (``step_m > 0``): the move of each slot, from the previous slot's point to this one, is drawn as a
  straight line cut into ``k = ceil(distance / step_m)`` equal segments (at most ``slot_points``; 1 for a
  stay), with times spread evenly over the slot: a GPS-like track of fixes about ``step_m`` metres apart
  instead of one jump per slot. ``step_m`` is a public parameter (the release's sampling interval times a
  speed, chosen by the user), never measured on the data.
"""

from __future__ import annotations

import numpy as np

from duckmob.grid import haversine_m
from duckmob.synth.base import points_in_cells, trajectories_from_cells
from duckmob.synth.pategail import mdp
from duckmob.trajectories import Trajectories


def visit_points(ep: mdp.Episodes, bbox, w: int, rng: np.random.Generator):
    """Every position of every episode, row-major (episode, slot): (rows, cols, lat, lon), one uniform point per
    (episode, cell) shared by its repeated visits."""
    m = ep.cells.shape[1]
    valid = np.arange(m)[None, :] <= ep.steps[:, None]
    rows, cols = np.nonzero(valid)
    cells = ep.cells[rows, cols]
    c = w * w
    visits, inverse = np.unique(rows * c + cells, return_inverse=True)
    lat, lon = points_in_cells(visits % c, bbox, w, rng)
    inverse = inverse.reshape(-1)
    return rows, cols, lat[inverse], lon[inverse]


def render(ep: mdp.Episodes, bbox, w: int, n_slots: int, base_us: int, rng: np.random.Generator,
           step_m: float = 0.0, slot_points: int = 1) -> Trajectories:
    """The episodes as trajectories (see the module docstring); times from ``base_us`` (µs) plus the slot."""
    rows, cols, lat, lon = visit_points(ep, bbox, w, rng)
    slot_us = mdp.DAY_US // n_slots
    if step_m <= 0:
        ts = base_us + (ep.first_slot[rows] + cols) * slot_us
        return trajectories_from_cells(ep.steps + 1, lat, lon, ts)
    first = cols == 0
    d = np.zeros(len(lat))
    d[1:] = haversine_m(lat[:-1], lon[:-1], lat[1:], lon[1:])
    # k points per position: 1 for an episode's first; k segments of the move that ends at every other position
    k = np.where(first, 1, np.clip(np.ceil(d / step_m), 1, slot_points)).astype(np.int64)
    idx = np.repeat(np.arange(len(lat)), k)
    i = np.arange(len(idx)) - np.repeat(np.cumsum(k) - k, k) + 1
    f = np.where(first[idx], 1.0, i / k[idx])                  # fraction of the slot's move done at each point
    prev = np.maximum(idx - 1, 0)
    plat = lat[prev] + (lat[idx] - lat[prev]) * f
    plon = lon[prev] + (lon[idx] - lon[prev]) * f
    # position j > 0 ends slot j - 1 of the episode: its i-th point lies at fraction i/k of that slot
    ts = base_us + np.round((ep.first_slot[rows[idx]] + cols[idx] - 1 + f) * slot_us).astype(np.int64)
    return trajectories_from_cells(np.bincount(rows[idx], minlength=ep.n), plat, plon, ts)
