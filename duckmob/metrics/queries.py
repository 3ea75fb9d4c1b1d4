"""Range queries of the evaluation: how many trajectories of each side pass each query (HRNet's trajectory density,
PrivTrace's and AdaTrace's circle queries), and the relative error between the sides' counts."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from duckmob.grid import EARTH_RADIUS_M, BBox, cell_center
from duckmob.metrics.common import Side, are, unit_vectors


def random_cell_sets(n_cells: int, n_queries: int, max_fraction: float, generator) -> np.ndarray:
    """(n_queries x n_cells) boolean: each row a set of 1 .. max(1, max_fraction * n_cells) cells drawn
    uniformly without replacement (HRNet App. A.3: "500 random sets of POIs", a random number of POIs each)."""
    top = max(1, int(round(max_fraction * n_cells)))
    sizes = generator.integers(1, top + 1, size=n_queries)
    rank = np.argsort(np.argsort(generator.random((n_queries, n_cells)), axis=1), axis=1)
    return rank < sizes[:, None]


def query_counts(trajectory_cells: sp.csr_matrix, query_cells: np.ndarray) -> np.ndarray:
    """For each query (a boolean row over cells), the number of trajectories with at least one cell in it:
    ``count(q, D) = sum_v 1[exists cell of v in q]`` (HRNet App. A.3 "trajectory density").

    ``trajectory_cells`` is the binary (n x cells) matrix of :meth:`Side.visits` / :meth:`Side.routes`;
    ``query_cells`` is (n_queries x cells)."""
    if trajectory_cells.shape[0] == 0 or len(query_cells) == 0:
        return np.zeros(len(query_cells))
    hits = trajectory_cells @ np.asarray(query_cells, dtype=np.float32).T
    return (np.asarray(hits) > 0).sum(axis=0).astype(np.float64)


def circle_queries(bbox, n_queries: int, radius_m, generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n_queries`` circles, centres uniform over the bbox (in degrees), radii uniform in ``radius_m``
    (a (low, high) pair of metres, or one number for a constant radius): (lat, lon, radius)."""
    box = BBox.of(bbox)
    lo, hi = (radius_m, radius_m) if np.isscalar(radius_m) else radius_m
    u = generator.random((3, n_queries))
    lat = box.min_lat + u[0] * (box.max_lat - box.min_lat)
    lon = box.min_lon + u[1] * (box.max_lon - box.min_lon)
    return lat, lon, lo + u[2] * (hi - lo)


def circle_counts(mats: list[sp.csr_matrix], bbox, w: int, circles) -> list[np.ndarray]:
    """Number of trajectories of each side passing through each circle.

    A trajectory passes through a circle when one of the w x w cells its route touches (:meth:`Side.routes`)
    has its centre inside the circle (great-circle metres): positions are snapped to the centre of their cell,
    an error of at most half a cell diagonal, the same for both sides. Only cells some trajectory touches are
    tested against the circles."""
    used = np.flatnonzero(np.asarray(sum(m.getnnz(axis=0) for m in mats)) > 0)
    clat, clon = cell_center(used, bbox, w)
    qlat, qlon, qr = circles
    # Great-circle distance <= r  <=>  (unit vector of the cell) . (unit vector of the centre) >= cos(r / R):
    # the same sphere and radius as haversine_m, as one matrix product instead of n_queries x n_cells haversines.
    inside = unit_vectors(qlat, qlon) @ unit_vectors(clat, clon).T >= np.cos(qr / EARTH_RADIUS_M)[:, None]
    return [query_counts(m[:, used], inside) for m in mats]


def circle_query_are(real: Side, synth: Side, circles, w: int, phi: float) -> float:
    """ARE (:func:`are`, sanity bound ``phi``) of the trajectories passing each circle (:func:`circle_counts` on
    the sides' w x w routes), the synthetic counts scaled to the real table's size: the range-query error of
    PrivTrace (§5.1) and AdaTrace."""
    co, cs = circle_counts([real.routes(w), synth.routes(w)], real.bbox, w, circles)
    return are(co, real.n / synth.n * cs, phi)


__all__ = ["random_cell_sets", "query_counts", "circle_queries", "circle_counts", "circle_query_are"]
