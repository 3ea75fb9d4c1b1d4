"""Synthetic points on the public road network: post-processing of any fitted model's output.

:class:`OnRoads` wraps a fitted model so that every point it samples is moved to its nearest road segment of a
public road network (:func:`duckmob.roads.snap`: an exact projection, so every point lies on a segment). The
network is a declared public input (``roads := 'table'``), never derived from the sensitive table
(:mod:`duckmob.release.tables` refuses one whose lineage reads it), so this reads no private data and spends no
budget: the output is a function of the released model, the seed and the public roads. Nothing else about the
output changes (the trajectories, their lengths, their times); points far from every road are moved all the same,
so an area of the bbox with no road gets no point.
"""

from __future__ import annotations

from duckmob.roads import Roads, snap
from duckmob.trajectories import Trajectories


class OnRoads:
    """``model`` (any fitted model) whose samples are snapped onto ``roads``; every other attribute is the
    model's own (its size, its cap on points, whether it may be sampled on several threads)."""

    def __init__(self, model, roads: Roads):
        self.model, self.roads = model, roads

    def __getattr__(self, name):
        return getattr(self.model, name)

    def sample(self, n: int, rng) -> Trajectories:
        """``model.sample(n, rng)`` with every point moved onto its nearest road segment (deterministic: the rows
        under a seed are the model's, snapped)."""
        part = self.model.sample(n, rng)
        if part.n_points == 0:
            return part
        _, _, lat, lon, _ = snap(self.roads, part.lat, part.lon)
        return Trajectories(part.offsets, part.traj_id, part.user_id, part.ts, lat, lon)


__all__ = ["OnRoads"]
