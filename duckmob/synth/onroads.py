"""Synthetic points on the public road network: post-processing of any fitted model's output.

:class:`OnRoads` wraps a fitted model so that every point it samples is moved onto a road segment of a public road
network: one drawn near it by the model's released road-segment density when it has one (PrivTrace and clean-slate
with roads, :class:`duckmob.roads.Placer`), else the nearest (:func:`duckmob.roads.snap`); an exact projection either way, so
every point lies on a segment. The network is a declared public input (``roads := 'table'``), never derived from
the sensitive table (:mod:`duckmob.release.tables` refuses one whose lineage reads it), so this reads no private
data and spends no budget: the output is a function of the released model, the seed and the public roads. Nothing
else about the output changes (the trajectories, their lengths, their times); points far from every road are moved
all the same, so an area of the bbox with no road gets no point.
"""

from __future__ import annotations

import numpy as np

from duckmob.road_paths import route, walk
from duckmob.roads import Placer, Roads, snap
from duckmob.trajectories import Trajectories


class OnRoads:
    """``model`` (any fitted model) whose samples are placed on ``roads``; every other attribute is the
    model's own (its size, its cap on points, whether it may be sampled on several threads)."""

    def __init__(self, model, roads: Roads):
        self.model, self.roads = model, roads
        self._placer = None       # built on the first sample (post-processing of the released weights)

    def __getattr__(self, name):
        return getattr(self.model, name)

    def sample(self, n: int, rng) -> Trajectories:
        """``model.sample(n, rng)`` with every point moved onto a road segment: drawn near it by the model's
        released road-segment density when it has one (:func:`duckmob.roads.place`, with ``rng`` after the model's
        own draws), else the nearest (:func:`duckmob.roads.snap`). Under a seed, the same rows."""
        part = self.model.sample(n, rng)
        if part.n_points == 0:
            return part
        weights = getattr(self.model, "road_density", None)
        if weights is not None and len(weights) == len(self.roads) and np.sum(weights) > 0:
            # the model released a density of these very segments (PrivTrace and clean-slate with roads): each
            # point goes to a segment near it drawn by that density, chosen so that its neighbours are a short
            # drive away, so the streets people use get the points
            if self._placer is None:
                self._placer = Placer(self.roads, weights)
            seg, t = route(self._placer, part.offsets, part.lat, part.lon, rng)
        else:
            seg, t, _, _, _ = snap(self.roads, part.lat, part.lon)
        lat, lon = walk(self.roads, part.offsets, seg, t)   # then along the road path through them
        return Trajectories(part.offsets, part.traj_id, part.user_id, part.ts, lat, lon)


__all__ = ["OnRoads"]
