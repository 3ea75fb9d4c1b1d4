"""``privtrace_paper``: the AdaTrace utility metrics PrivTrace reports (§5.1), as AdaTrace's reference code
computes them.

PrivTrace's repository (DpTrace/PrivTrace) publishes no evaluation code; its §5.1 compares against AdaTrace with
AdaTrace's metrics, whose reference is git-disl/AdaTrace ``src/Evaluation.java`` (line numbers below are of that
file unless another is named), run by ``src/Experiments.java`` with its settings (lines 11-19): 200 queries,
sanity bound 1 %, a 6 x 6 grid for trips, 20 buckets for length and diameter.

Everything is in the data's own coordinates, DEGREES, with planar Euclidean distances (``Point.euclideanDistTo``):
no cos(latitude), so an east-west degree counts as much as a north-south one (about 1.3 times too much in
Beijing). Grids and queries lie on the REAL data's bounding box (``Main.getDataBoundaries``), not the declared one.

* Length error (``calculateTravelDistanceError``, 91-141): the sum of the degree distances between consecutive
  points; 20 buckets of width ``(max - min) / 20`` (min and max over the real trajectories) that start at 0, not
  at min, so lengths above ``max - min`` fall in no bucket; each bucket's share is its count over ALL the side's
  trajectories (shares need not sum to 1); :func:`duckmob.metrics.paper.plain_jsd` (natural log, no smoothing,
  no normalisation).
* Diameter error (``calculateDiameterError``, 39-89): the same on the largest degree distance between two points
  of a trajectory (``Trajectory.getDiameter``). Computed here without the all-pairs scan: the widest of 64
  projection directions picks a real pair of points, within 0.05 % of the exact diameter.
* Trip error (``calculateTripError``, 14-37): the (first cell, last cell) distribution on the 6 x 6 grid over the
  real data's bounds (``TripDistribution``, its Laplace noise at eps 10000 rounds away); a point outside that box
  (only synthetic points can be) goes to cell (0, 0) as ``GridTrajectory``'s fallback puts it, unless it is within
  0.001 degree of it; JSD as above.
* Query AvRE (``calculateQueryError``, 157-184; ``Query.java``): 200 circles, centres uniform over the real data's
  bounds, radius the longer side / 2.5 (the reference's GeoLife setting; 3.0 for other file names); a trajectory
  answers a query when a segment between consecutive points comes within the radius, or (the reference's quirk)
  when it has two identical consecutive points, whatever the circle; one-point trajectories never answer;
  ``|syn - real| / max(real, 0.01 n_real)`` averaged, no rescaling of the synthetic counts. The centres come from
  the evaluation's seeded generator (the reference: an unseeded ``java.util.Random``).

Frequent-pattern F1 and location-coverage Kendall tau are duckmob's ``adatrace`` family (its docstring lists how
it departs from this code).
"""

from __future__ import annotations

import numpy as np

from duckmob.metrics.common import Metric, Options, Side
from duckmob.metrics.paper import plain_jsd

SOURCE = "AdaTrace reference code (git-disl/AdaTrace src/Evaluation.java), as PrivTrace §5.1 reports it"
BUCKETS = 20          # Experiments.java 14
TRIP_GRID = 6         # Experiments.java 13
QUERIES = 200         # Experiments.java 11
SANITY = 0.01         # Experiments.java 12
RADIUS_DIVISOR = 2.5  # Query.java: GeoLife
SHIFT = 0.001         # GridTrajectory.java: the second try at a cell
DIRECTIONS = 64       # diameter: projection directions


def bounds(side: Side) -> tuple[float, float, float, float]:
    """(min lat, max lat, min lon, max lon) of the side's points: the reference's data boundaries."""
    t = side.traj
    return float(t.lat.min()), float(t.lat.max()), float(t.lon.min()), float(t.lon.max())


def lengths_deg(side: Side) -> np.ndarray:
    """Sum of planar degree distances between consecutive points of each trajectory (Trajectory.java 100-108)."""
    t = side.traj
    own = side.owner
    d = np.hypot(np.diff(t.lat), np.diff(t.lon))
    same = own[1:] == own[:-1]
    return np.bincount(own[1:][same], weights=d[same], minlength=side.n)


def diameters_deg(side: Side) -> np.ndarray:
    """Largest planar degree distance between two points of each trajectory (Trajectory.java 86-98), from the
    widest of 64 projection directions (the pair found is a real pair: exact to within cos(pi / 128))."""
    t = side.traj
    starts = t.offsets[:-1]
    own = side.owner
    best = np.full(side.n, -1.0)
    best_k = np.zeros(side.n, dtype=np.int64)
    for k in range(DIRECTIONS):   # 64 vectorised passes over all points
        th = np.pi * k / DIRECTIONS
        proj = t.lat * np.cos(th) + t.lon * np.sin(th)
        width = np.maximum.reduceat(proj, starts) - np.minimum.reduceat(proj, starts)
        better = width > best
        best[better], best_k[better] = width[better], k
    th = np.pi * best_k / DIRECTIONS
    proj = t.lat * np.cos(th)[own] + t.lon * np.sin(th)[own]
    hi = _first(proj >= np.maximum.reduceat(proj, starts)[own], own)
    lo = _first(proj <= np.minimum.reduceat(proj, starts)[own], own)
    return np.hypot(t.lat[hi] - t.lat[lo], t.lon[hi] - t.lon[lo])


def _first(mask: np.ndarray, owner: np.ndarray) -> np.ndarray:
    idx = np.flatnonzero(mask)
    _, first = np.unique(owner[idx], return_index=True)
    return idx[first]


def bucket_shares(values: np.ndarray, lo: float, hi: float, n: int) -> np.ndarray:
    """Evaluation.java 59-86 / 111-138: buckets ``[i s, (i + 1) s)``, ``s = (hi - lo) / n``, i = 0..n-1 (from 0,
    not from lo); each bucket's count over ``len(values)``."""
    size = (hi - lo) / n
    if size <= 0 or len(values) == 0:
        return np.zeros(n)
    idx = np.floor(values / size)
    ok = (idx >= 0) & (idx < n)
    return np.bincount(idx[ok].astype(np.int64), minlength=n)[:n] / len(values)


def bucket_error(real_v: np.ndarray, synth_v: np.ndarray) -> float:
    return plain_jsd(bucket_shares(real_v, real_v.min(), real_v.max(), BUCKETS),
                     bucket_shares(synth_v, real_v.min(), real_v.max(), BUCKETS))


def grid_cells(lat: np.ndarray, lon: np.ndarray, box, n: int) -> np.ndarray:
    """Cell of each point on the n x n grid over ``box`` (min lat, max lat, min lon, max lon); outside it (and
    more than 0.001 degree beyond its upper edges) cell 0, the reference's fallback (GridTrajectory.java)."""
    lat0, lat1, lon0, lon1 = box
    r = np.floor((lat - lat0) / max(lat1 - lat0, 1e-300) * n)
    c = np.floor((lon - lon0) / max(lon1 - lon0, 1e-300) * n)
    inside = (lat >= lat0) & (lat <= lat1 + SHIFT) & (lon >= lon0) & (lon <= lon1 + SHIFT)
    cell = np.clip(r, 0, n - 1) * n + np.clip(c, 0, n - 1)
    return np.where(inside, cell, 0).astype(np.int64)


def trip_distribution(side: Side, box, n: int) -> np.ndarray:
    """(first cell, last cell) counts on the n x n grid over the real data's bounds (TripDistribution.java)."""
    t = side.traj
    a, b = t.offsets[:-1], t.offsets[1:] - 1
    start = grid_cells(t.lat[a], t.lon[a], box, n)
    end = grid_cells(t.lat[b], t.lon[b], box, n)
    return np.bincount(start * n * n + end, minlength=n ** 4).astype(np.float64)


def query_answers(side: Side, qlat: np.ndarray, qlon: np.ndarray, radius: float) -> np.ndarray:
    """Trajectories answering each circular query (Query.java ``evaluateQueryOnTraj``): a segment between
    consecutive points within ``radius`` degrees of the centre, or two identical consecutive points (any
    query); one-point trajectories never answer. A point within the radius answers at once; the exact segment
    test runs only for the trajectories left whose bounding box comes within the radius. Memory: a chunk of
    queries x points at a time, about 4 million values (16 queries on the shipped sample, 1 from 4 million
    points)."""
    t = side.traj
    own = side.owner
    seg = np.flatnonzero(own[1:] == own[:-1])           # segment i: point i -> i + 1
    if len(seg) == 0:
        return np.zeros(len(qlat))
    seg_owner = own[seg]
    y1, x1, y2, x2 = t.lat[seg], t.lon[seg], t.lat[seg + 1], t.lon[seg + 1]
    dy, dx = y2 - y1, x2 - x1
    same = (dy == 0) & (dx == 0)
    moving = t.lengths > 1
    always = np.zeros(side.n, dtype=bool)
    always[seg_owner[same]] = True
    starts = t.offsets[:-1]
    box = [f.reduceat(v, starts) for f, v in ((np.minimum, t.lat), (np.maximum, t.lat),
                                             (np.minimum, t.lon), (np.maximum, t.lon))]
    out = np.zeros(len(qlat))
    chunk = int(np.clip(4_000_000 // max(len(t.lat), 1), 1, 16))
    for lo in range(0, len(qlat), chunk):   # a few queries at a time, vectorised over points and segments
        cy, cx = qlat[lo:lo + chunk, None], qlon[lo:lo + chunk, None]
        near = (t.lat - cy) ** 2 + (t.lon - cx) ** 2 <= radius * radius
        hit = np.maximum.reduceat(near, starts, axis=1) & moving
        hit |= always & moving
        gap = np.hypot(np.maximum(np.maximum(box[0] - cy, cy - box[1]), 0),
                       np.maximum(np.maximum(box[2] - cx, cx - box[3]), 0))
        left = ~hit & moving & (gap <= radius)
        qi, si = np.nonzero(left[:, seg_owner] & ~same)
        if len(si):
            py, px = cy[qi, 0], cx[qi, 0]
            u = np.clip(((py - y1[si]) * dy[si] + (px - x1[si]) * dx[si]) / (dy[si] ** 2 + dx[si] ** 2), 0, 1)
            ok = np.hypot(y1[si] + u * dy[si] - py, x1[si] + u * dx[si] - px) <= radius
            hit[qi[ok], seg_owner[si[ok]]] = True
        out[lo:lo + chunk] = hit.sum(axis=1)
    return out


def metrics(real: Side, synth: Side, opts: Options, generator) -> list[Metric]:
    out = [
        Metric("privtrace_paper_length_jsd", bucket_error(lengths_deg(real), lengths_deg(synth)), True, SOURCE,
               f"length error: JSD of travel distance in planar degrees, {BUCKETS} buckets of (max - min) / "
               f"{BUCKETS} from 0, shares of all trajectories, nats"),
        Metric("privtrace_paper_diameter_jsd", bucket_error(diameters_deg(real), diameters_deg(synth)), True,
               SOURCE, "diameter error: the same on the diameter in planar degrees, nats"),
    ]
    box = bounds(real)
    out.append(Metric("privtrace_paper_trip_jsd",
                      plain_jsd(*(trip_distribution(s, box, TRIP_GRID) / s.n for s in (real, synth))), True,
                      SOURCE, f"trip error: JSD of (first, last) cell on a {TRIP_GRID}x{TRIP_GRID} grid over the "
                              "real data's bounds, nats"))
    lat0, lat1, lon0, lon1 = box
    radius = max(lat1 - lat0, lon1 - lon0) / RADIUS_DIVISOR
    u = generator.random((2, QUERIES))
    qlat, qlon = lat0 + u[0] * (lat1 - lat0), lon0 + u[1] * (lon1 - lon0)
    actual, syn = query_answers(real, qlat, qlon, radius), query_answers(synth, qlat, qlon, radius)
    value = float(np.mean(np.abs(syn - actual) / np.maximum(actual, real.n * SANITY)))
    out.append(Metric("privtrace_paper_query_avre", value, True, SOURCE,
                      f"query AvRE: {QUERIES} circles of radius {radius:.4f} degrees (longer side / "
                      f"{RADIUS_DIVISOR}) over the real data's bounds; sanity bound {SANITY * real.n:g}"))
    return out
