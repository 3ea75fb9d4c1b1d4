"""Synthetic trajectories on the public road network: post-processing of any fitted model's output.

:class:`OnRoads` wraps a fitted model so that every trajectory it samples is driven on a public road network:

1. **Positions.** Each point gets a position on a segment: with the model's released road-segment density
   (PrivTrace and clean-slate with roads), a few candidates drawn near it by that density
   (:class:`duckmob.roads.Placer`), one of them chosen so that its neighbours are a short drive away
   (:func:`duckmob.road_paths.route`); without one (HRNet, its baseline, PateGail), the nearest
   (:func:`duckmob.roads.snap`). With a density, positions are drawn only for *anchor* points, about twice the
   candidates' reach apart along the trajectory (:func:`anchors`; the reach, :meth:`duckmob.roads.Placer.reach`,
   averaged over the trajectory's points: about 90 m in downtown San Francisco, 170 m in central Beijing); the
   points between two anchors take the earlier one's position, and the walk spaces them along the road between.
   Two points closer than that draw from overlapping candidates, each its own street near them, and the route
   would zigzag between parallel streets: on densely sampled trajectories (GeoLife, a fix every few seconds) that
   made them about twice as long; farther apart, their candidates are disjoint, and a point dropped would only
   cut a corner off the trajectory (docs/roads.md).
2. **The walk.** The points move to equal steps along the road path through those positions
   (:func:`duckmob.road_paths.walk`): every point on a segment, consecutive points joined by a road, the first and
   last where they were; an area of the bbox with no road gets no point. With a released density and the model's
   ``road_weight`` above 0, consecutive positions are joined by their cheapest path under costs from that density
   (:mod:`duckmob.road_costs`: streets the release gave traffic cost less), still spaced by length.
3. **Scatter.** With ``scatter_m`` (public, metres), each point then moves by a Gaussian of that standard
   deviation per axis, as a GPS fix scatters around the road.

The network is cut at the bbox's edge first (:meth:`duckmob.roads.Roads.cut`: the same segments), so every point
stays inside the bbox, as every output's do.

The network is a declared public input (``roads := 'table'``), never derived from the sensitive table
(:mod:`duckmob.release.tables` refuses one whose lineage reads it), so this reads no private data and spends no
budget: the output is a function of the released model, the seed and the public roads. The trajectories, their
numbers of points and their times are the model's.
"""

from __future__ import annotations

import numpy as np

from duckmob.grid import BBox, haversine_m
from duckmob.road_costs import weighted_chains
from duckmob.road_paths import route, walk
from duckmob.roads import Placer, Roads, snap
from duckmob.synth.placement import EARTH_M_PER_DEG
from duckmob.trajectories import Trajectories


# anchors lie this many times the candidates' reach apart (two points closer than twice it share candidates)
ANCHOR_REACHES = 2.0


class OnRoads:
    """``model`` (any fitted model) whose samples are placed on ``roads``; every other attribute is the
    model's own (its size, its cap on points, whether it may be sampled on several threads)."""

    def __init__(self, model, roads: Roads, bbox, scatter_m: float | None = None):
        self.model, self.scatter_m = model, scatter_m
        self.bbox = BBox.of(bbox)
        self.roads = roads.cut(self.bbox.as_list())   # the same segments, cut at the bbox's edge
        self._placer = None       # built on the first sample (post-processing of the released weights)
        self._costs = None        # the walk's road costs (road_weight > 0), built on the first sample too

    def __getattr__(self, name):
        return getattr(self.model, name)

    def sample(self, n: int, rng) -> Trajectories:
        """``model.sample(n, rng)`` driven on the roads (the module docstring), with ``rng`` after the model's own
        draws. Under a seed, the same rows."""
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
            # with released flows between street pieces (PrivTrace), the moves the flows favour are favoured
            link = getattr(self.model, "road_link", None)
            link = link if link is not None and len(link.piece) == len(self.roads) else None
            keep = anchors(part.offsets, part.lat, part.lon, self._anchor_spacing(part))
            kept = np.concatenate([[0], np.cumsum(keep)])  # anchors before each point, and in all
            seg, t = route(self._placer, kept[part.offsets], part.lat[keep], part.lon[keep], rng, link=link)
            last_anchor = kept[1:] - 1                     # each point takes its last anchor's position
            seg, t = seg[last_anchor], t[last_anchor]
            costs = self._road_costs(weights)
        else:
            seg, t, _, _, _ = snap(self.roads, part.lat, part.lon)
            costs = None
        lat, lon = walk(self.roads, part.offsets, seg, t, costs=costs)   # then along the road path through them
        if self.scatter_m:
            north, east = rng.normal(0.0, self.scatter_m, (2, len(lat)))
            lat, lon = lat + north / EARTH_M_PER_DEG, lon + east / (EARTH_M_PER_DEG * np.cos(np.radians(lat)))
        # inside the bbox, as every output's points are: a scattered point, or one on a segment that touches the
        # edge with under a centimetre inside, is moved onto the edge
        b = self.bbox
        lat, lon = np.clip(lat, b.min_lat, b.max_lat), np.clip(lon, b.min_lon, b.max_lon)
        return Trajectories(part.offsets, part.traj_id, part.user_id, part.ts, lat, lon)

    def _anchor_spacing(self, part) -> np.ndarray:
        """Each trajectory's anchor spacing: :data:`ANCHOR_REACHES` times the mean reach of its points' candidates
        (the module docstring); a function of its own points and the public roads."""
        counts = np.diff(part.offsets)
        traj = np.repeat(np.arange(len(counts)), counts)
        reach = np.bincount(traj, weights=self._placer.reach(part.lat, part.lon), minlength=len(counts))
        return ANCHOR_REACHES * reach / np.maximum(counts, 1)

    def _road_costs(self, weights):
        """The walk's road costs from the released density (:func:`duckmob.road_costs.weighted_chains`) when the
        model's config asks for them (``road_weight`` above 0), else None; built once per wrapped model (its
        junction table at most the size of the network's)."""
        strength = float(getattr(getattr(self.model, "config", None), "road_weight", 0.0) or 0.0)
        if strength <= 0.0:
            return None
        if self._costs is None:
            self._costs = weighted_chains(self.roads, weights, strength)
        return self._costs


def anchors(offsets, lat, lon, spacing_m) -> np.ndarray:
    """Which points of the trajectories ``offsets`` (ragged) are anchors: each trajectory's first and last point,
    and each point whose distance travelled from the trajectory's start (the sum of its straight steps, in whole
    centimetres) enters a new multiple of ``spacing_m`` (metres: one for all, or one per trajectory). So anchors
    lie about ``spacing_m`` apart along the trajectory, and a trajectory whose steps are all longer keeps every
    point. Each trajectory's anchors depend on its own points only."""
    offsets = np.asarray(offsets, dtype=np.int64)
    counts = np.diff(offsets)
    traj = np.repeat(np.arange(len(counts)), counts)
    keep = np.ones(len(lat), bool)
    if len(lat) < 2:
        return keep
    same = traj[1:] == traj[:-1]
    step = np.zeros(len(lat))
    step[1:] = np.where(same, haversine_m(lat[:-1], lon[:-1], lat[1:], lon[1:]), 0.0)
    # in whole centimetres, so the running sum over the block is exact integers and each trajectory's own share
    # of it (less its start's) carries nothing of the trajectories before it
    travelled = np.cumsum(np.round(step * 100.0).astype(np.int64))
    travelled -= travelled[offsets[:-1]][traj]
    spacing_cm = np.maximum(np.round(np.broadcast_to(np.asarray(spacing_m, np.float64), counts.shape) * 100.0), 1)
    band = travelled // spacing_cm.astype(np.int64)[traj]
    keep[1:] = (band[1:] != band[:-1]) | ~same
    keep[offsets[1:][counts > 0] - 1] = True
    return keep


__all__ = ["ANCHOR_REACHES", "OnRoads", "anchors"]
