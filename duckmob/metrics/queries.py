"""Range queries of the evaluation: how many trajectories of each side pass each query (HRNet's trajectory density,
PrivTrace's and AdaTrace's circle queries), and the relative error between the sides' counts."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from duckmob.grid import EARTH_RADIUS_M, BBox, cell_center
from duckmob.metrics.common import unit_vectors


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


def circle_cells(bbox, w: int, circles, chunk: int = 64) -> np.ndarray:
    """(w*w x n_queries) boolean: whether the centre of each cell of the w x w grid lies inside each circle
    (great-circle metres). Distance <= r  <=>  (unit vector of the cell) . (unit vector of the centre) >= cos(r / R):
    the same sphere and radius as haversine_m, as a matrix product instead of n_queries x n_cells haversines,
    ``chunk`` queries at a time. Public: it depends on the bbox, the grid and the seeded circles only, so it is
    computed once per evaluation (:class:`duckmob.metrics.summary.Plan`), whatever the tables."""
    qlat, qlon, qr = circles
    cells = unit_vectors(*cell_center(np.arange(w * w), bbox, w))
    centres, bound = unit_vectors(qlat, qlon), np.cos(qr / EARTH_RADIUS_M)
    inside = np.concatenate([centres[i:i + chunk] @ cells.T >= bound[i:i + chunk, None]
                             for i in range(0, len(qr), chunk)] or [np.zeros((0, w * w), bool)])
    return np.ascontiguousarray(inside.T)


def circle_counts(routes: sp.csr_matrix, inside: np.ndarray) -> np.ndarray:
    """Number of trajectories passing through each circle: trajectories whose route (:meth:`Side.routes`, w x w)
    touches a cell whose centre is inside it (``inside``: :func:`circle_cells`). Positions are snapped to the
    centre of their cell, an error of at most half a cell diagonal, the same for both tables. Only the cells some
    trajectory touches are looked at."""
    n_queries = inside.shape[1]
    if routes.shape[0] == 0 or n_queries == 0:
        return np.zeros(n_queries)
    used = np.flatnonzero(np.bincount(routes.indices, minlength=routes.shape[1]))
    position = np.zeros(routes.shape[1], dtype=np.int64)
    position[used] = np.arange(len(used))
    compact = sp.csr_matrix((routes.data, position[routes.indices], routes.indptr), shape=(routes.shape[0], len(used)))
    hits = compact @ inside[used].astype(np.float32)
    return (np.asarray(hits) > 0).sum(axis=0).astype(np.float64)


__all__ = ["random_cell_sets", "query_counts", "circle_queries", "circle_cells", "circle_counts"]
