"""Road costs from a released traffic density: which street a synthetic trip takes between two positions.

The walk (:func:`duckmob.road_paths.walk`) joins consecutive positions by a road path. By length alone, many
paths tie in a street grid, and the one taken is an accident of the numbering; drivers prefer the streets that
carry traffic. A model fitted with roads released a density of the network's segments (PrivTrace's street pieces,
clean-slate's ``road_share``): it says which those are. With ``road_weight`` s in [0, 1) (public), a segment's
cost is its length times

    g(r) = (1 - s r / (1 + r)) / (1 - s),        r = (its released density per metre) / (the network's mean),

the mean taken over the whole network's length (the sum of the released density over the sum of the lengths).
So g runs from 1 / (1 - s) on a street the release gave no traffic down to 1 as r grows: an arterial costs about
its length, a quiet street up to 1 / (1 - s) times it (s = 0.5: twice), and no path is chosen that is more than
1 / (1 - s) times longer than the shortest. Why this form:

- **Relative to the mean, half way at the mean.** r has no unit and does not move with eps, the number of trips
  or the size of the city (scaling the density scales the mean). The only constant is where g is half way, and the
  network's own mean traffic is the one scale a density carries: nothing is fitted to one city.
- **Bounded and monotone.** More released traffic never costs more; r / (1 + r) saturates, so a piece the noise
  pushed far up is no cheaper than an arterial, and a piece the noise cut to 0 costs at most 1 / (1 - s) its length.
- **Never below the length.** Dividing by 1 - s (a constant: no path changes) keeps every cost at least the
  length, so the local searches of :mod:`duckmob.road_search` stay exact (they hold every path up to a cost only
  because a road is never shorter than the straight line), on the same local subgraphs as the lengths', so the
  junction table of costs up to the walk's limit takes the same memory as the table of lengths (or, kept as a
  hash of pairs past its bound, fewer pairs).

**The default, s = 0.5** (PrivTrace's and clean-slate's ``road_weight``): the middle of s's range, where a street
the release saw no traffic on costs twice its length. It was not fitted to a city: on simulated San Francisco taxi
trips 0.3 and 0.5 measured alike and 0.75 gave back half the gain, and on GeoLife Beijing none of them moved
anything (docs/roads.md), so the round middle is kept rather than the best of one table. Models stored before the
parameter existed read 0 (the shortest paths they walked).

A chain (a run of segments between junctions, :class:`duckmob.road_paths.Chains`) costs its length times the
length-weighted mean of its segments' g (a chain is about one block; a released piece covers one or more). Its
junction graph keeps, per pair of junctions, the chain of least cost, and the table of every junction-to-junction
cost up to the walk's limit (:class:`duckmob.road_search.TileTable`; downtown San Francisco: 0.2-0.3 s of CPU, 51 MB)
is built on first use, once per fitted model (:class:`duckmob.synth.onroads.OnRoads` keeps it with the model it
wraps).

Post-processing: a function of the released density and the public roads only; no budget.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from duckmob.errors import DuckmobError
from duckmob.road_paths import Chains, chains_of, junction_graph

ROAD_WEIGHT_MAX = 0.9      # g at most 10 times the length: the table of costs stays a table of nearby pairs


def cost_factor(density, length_m, strength: float) -> np.ndarray:
    """g of each segment (module docstring): in [1, 1 / (1 - strength)], 1 everywhere when strength is 0 or the
    density is nowhere positive. ``density``: the released density of each segment (mass, not per metre; negative
    entries read as 0); ``length_m``: each segment's length."""
    s = float(strength)
    if not 0.0 <= s <= ROAD_WEIGHT_MAX:
        raise DuckmobError(f"road_weight must be between 0 and {ROAD_WEIGHT_MAX}, got {s:g}")
    density = np.maximum(np.asarray(density, dtype=np.float64), 0.0)
    length_m = np.asarray(length_m, dtype=np.float64)
    total, metres = float(density.sum()), float(length_m.sum())
    if s == 0.0 or total <= 0.0 or metres <= 0.0:
        return np.ones(len(density))
    r = density / np.maximum(length_m, 1e-9) / (total / metres)
    return (1.0 - s * r / (1.0 + r)) / (1.0 - s)


def weighted_chains(roads, density, strength: float) -> Chains:
    """The chains of ``roads`` (:func:`duckmob.road_paths.chains_of`) with each chain's cost per metre (the
    length-weighted mean of its segments' :func:`cost_factor`) and the junction graph of least costs: what
    :func:`duckmob.road_paths.walk` takes as ``costs``. Its junction table is built on its first look-up."""
    ch = chains_of(roads)
    g = cost_factor(density, roads.length_m, strength)
    n_chains = len(ch.length)
    seg_len = roads.length_m
    on = ch.seg_chain >= 0
    metres = np.bincount(ch.seg_chain[on], weights=seg_len[on], minlength=n_chains)
    weighted = np.bincount(ch.seg_chain[on], weights=(seg_len * g)[on], minlength=n_chains)
    # at least 1 (g is; the mean's rounding could dip below): the local searches' reach stays exact
    per_metre = np.maximum(np.where(metres > 0, weighted / np.maximum(metres, 1e-12), 1.0), 1.0)
    matrix, edge_chain = junction_graph(ch.ends, ch.length * per_metre, len(ch.junction))
    return dataclasses.replace(ch, matrix=matrix, edge_chain=edge_chain, cost=per_metre)


__all__ = ["ROAD_WEIGHT_MAX", "cost_factor", "weighted_chains"]
