"""The nearest road segment of each point, exactly and vectorised: the index :func:`duckmob.roads.snap` and
:class:`duckmob.roads.Placer` read (one per network, built on first use and kept with it).

Points and segments are in the local equirectangular plane of :mod:`duckmob.roads` (metres). Two ways to the
same answer, the exact nearest segment (ties: the lowest segment index), as a projection onto every segment
would give it:

- **Cells** (most points, no tree search). The plane is cut into square cells of :data:`CELL_M` metres. A
  cell's nearest road is at some distance d0 from its centre; a point of the cell lies within half the cell's
  diagonal of the centre, so its nearest segment lies within d0 + the diagonal of the centre. Those segments
  (exact distances from the centre, every (cell, segment) pair up to :data:`CELL_NEAR_M` + the diagonal apart
  enumerated once per network) are the cell's candidates, and a point is projected onto its cell's candidates
  only. A cell whose nearest road is farther than :data:`CELL_NEAR_M` (or :data:`CELL_NEAR_CELLS` sides of a
  coarser cell) keeps none, and one with over :data:`CELL_WIDTH` is not read.
- **Search** (the other points): the k-d tree's k nearest samples, k doubled until they reach past the nearest
  sample's distance + half a sample gap, projected onto exactly.

The cells cost about what searching 2 points per segment costs (downtown San Francisco, CPU: 0.3 s for 28,609
segments, against 1.1 s to search 217,913 taxi fixes and 0.2 s to look them up in the cells, 98.7% of them
found there), so an index searches until :data:`BUILD_AFTER` points per segment have been looked up through it,
then builds them (ski rental: never much more than twice the cheaper of the two).

Built from the public network only; queries may be private points (inside a release): errors name none.
"""

from __future__ import annotations

import math
from functools import cached_property

import numpy as np
from scipy.spatial import cKDTree

CELL_M = 10.0           # the cells' side (metres); coarser over a network wider than MAX_CELLS such cells
MAX_CELLS = 1 << 21     # at most this many cells (4 bytes each, plus 4 bytes per candidate)
CELL_NEAR_M = 15.0      # a cell keeps candidates when its nearest road is at most this far from its centre,
CELL_NEAR_CELLS = 1.2   # or this many sides of a coarser cell (pairs per segment: (near + diagonal) / side)
CELL_WIDTH = 64         # points of a cell with more candidates than this are searched instead
BUILD_AFTER = 2         # the cells are built once this many points per segment have been looked up


class SnapIndex:
    """Points sampled along every segment at most ``spacing_m`` apart (both ends included), in the local plane
    (origin ``lat0``, ``lon0``), in a k-d tree; with each cell's candidate segments (:attr:`cells`)."""

    def __init__(self, lat1, lon1, lat2, lon2, spacing_m: float, m_per_rad: float):
        lats, lons = np.concatenate([lat1, lat2]), np.concatenate([lon1, lon2])
        self.lat0 = float((lats.min() + lats.max()) / 2)
        self.lon0 = float((lons.min() + lons.max()) / 2)      # an origin only: keeps the plane's numbers small
        self.kx = np.radians(1.0) * m_per_rad * np.cos(np.radians(self.lat0))
        self.ky = np.radians(1.0) * m_per_rad
        self.ax, self.ay = self.plane(lat1, lon1)
        self.bx, self.by = self.plane(lat2, lon2)
        self.dx, self.dy = self.bx - self.ax, self.by - self.ay          # each segment's vector, kept for
        self.den = self.dx * self.dx + self.dy * self.dy                 # the projections
        seg_len = np.hypot(self.bx - self.ax, self.by - self.ay)
        n = np.ceil(seg_len / spacing_m).astype(np.int64) + 1            # samples per segment, >= 2
        self.seg = np.repeat(np.arange(len(seg_len)), n)
        k = np.arange(len(self.seg)) - np.repeat(np.cumsum(n) - n, n)
        t = k / (n - 1)[self.seg]
        x = self.ax[self.seg] + t * (self.bx - self.ax)[self.seg]
        y = self.ay[self.seg] + t * (self.by - self.ay)[self.seg]
        self.half_gap = float((seg_len / (n - 1)).max()) / 2 + 1e-6  # any point of a segment is this near a sample
        self.tree = cKDTree(np.column_stack([x, y]))
        self.searched = 0        # points looked up so far (the cells are built once they would have paid)

    def plane(self, lat, lon) -> tuple[np.ndarray, np.ndarray]:
        return (np.asarray(lon) - self.lon0) * self.kx, (np.asarray(lat) - self.lat0) * self.ky

    def project(self, qx, qy, cand) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Exact projection of each query onto its candidate segments (m x K, -1 = none): the nearest one (the
        lowest index among equals, the candidates given in increasing order), its fraction t and the planar
        distance."""
        c = np.where(cand < 0, 0, cand)
        dx, dy = self.dx[c], self.dy[c]
        px, py = qx[:, None] - self.ax[c], qy[:, None] - self.ay[c]
        t = np.clip((px * dx + py * dy) / self.den[c], 0.0, 1.0)
        d = np.hypot(px - t * dx, py - t * dy)
        d[cand < 0] = np.inf
        best = np.argmin(d, axis=1)
        rows = np.arange(len(qx))
        return cand[rows, best], t[rows, best], d[rows, best]

    def fraction(self, qx, qy, seg) -> np.ndarray:
        """The fraction t of each query's projection onto its one segment ``seg`` (what :meth:`project` gives
        for that segment as the only candidate)."""
        px, py = qx - self.ax[seg], qy - self.ay[seg]
        return np.clip((px * self.dx[seg] + py * self.dy[seg]) / self.den[seg], 0.0, 1.0)

    def nearest(self, qx, qy) -> tuple[np.ndarray, np.ndarray]:
        """``(segment, t)`` of the nearest segment of each point (the module docstring: its cell's candidates, or
        a search)."""
        qx, qy = np.asarray(qx, dtype=np.float64), np.asarray(qy, dtype=np.float64)
        self.searched += len(qx)
        if "cells" not in self.__dict__ and self.searched <= BUILD_AFTER * len(self.ax):
            return self.search(qx, qy)
        first, count = self.cells.row(qx, qy)
        seg, t = np.empty(len(qx), np.int64), np.empty(len(qx))
        count = np.where(count <= CELL_WIDTH, count, 0).astype(np.uint8)
        order = np.argsort(count, kind="stable")            # the points by candidate count, each in index order
        widths, starts = np.unique(count[order], return_index=True)
        ends = np.r_[starts[1:], len(order)]
        for w, lo, hi in zip(widths, starts, ends):          # one projection per count (at most CELL_WIDTH)
            if w == 0:
                continue
            sel = order[lo:hi]
            cand = self.cells.cand[first[sel][:, None] + np.arange(w)]
            seg[sel], t[sel], _ = self.project(qx[sel], qy[sel], cand)
        rest = np.flatnonzero(count == 0)
        seg[rest], t[rest] = self.search(qx[rest], qy[rest])
        return seg, t

    def search(self, qx, qy) -> tuple[np.ndarray, np.ndarray]:
        """``(segment, t)`` of the nearest segment of each point by a k-d search (the module docstring)."""
        n_samples = self.tree.n
        seg, t = np.empty(len(qx), np.int64), np.empty(len(qx))
        todo = np.arange(len(qx))
        k = min(8, n_samples)
        while len(todo):
            d, i = self.tree.query(np.column_stack([qx[todo], qy[todo]]), k=k)
            d, i = d.reshape(len(todo), -1), i.reshape(len(todo), -1)
            radius = d[:, :1] + self.half_gap
            enough = (d[:, -1] > radius[:, 0]) | (k >= n_samples)   # every sample within the radius is among k
            cand = np.where((d <= radius) & (i < n_samples), self.seg[np.minimum(i, n_samples - 1)], -1)
            cand = np.sort(cand, axis=1)                             # argmin's first minimum: the lowest segment
            done = todo[enough]
            seg[done], t[done], _ = self.project(qx[done], qy[done], cand[enough])
            todo = todo[~enough]
            k = min(2 * k, n_samples)
        return seg, t

    @cached_property
    def cells(self) -> "Cells":
        """Each cell's candidate segments (:class:`Cells`), built on first use."""
        return Cells.build(self)


class Cells:
    """The candidate segments of the cells of a square grid (the module docstring), ragged: cell i's are
    ``cand[start[i]:start[i + 1]]``, in increasing order (none: the cell is searched instead)."""

    def __init__(self, x0, y0, cell_m, nx, ny, start, cand):
        self.x0, self.y0, self.cell_m, self.nx, self.ny = x0, y0, cell_m, nx, ny
        self.start, self.cand = start, cand

    @classmethod
    def build(cls, index: SnapIndex, chunk: int = 1 << 22) -> "Cells":
        """Every (cell, segment) pair up to ``reach`` = :data:`CELL_NEAR_M` (at least :data:`CELL_NEAR_CELLS` sides)
        + the cell's diagonal apart (exact distances from the cell's centre, enumerated over each segment's box of
        cells, ``chunk`` pairs at a time); a cell keeps the segments within its nearest one's distance + its
        diagonal, when that is within ``reach``. A function of the public network only."""
        xs, ys = np.concatenate([index.ax, index.bx]), np.concatenate([index.ay, index.by])
        x0, y0 = float(xs.min()), float(ys.min())
        area = (float(xs.max()) - x0 + 1.0) * (float(ys.max()) - y0 + 1.0)
        cell_m = max(CELL_M, math.sqrt(area / MAX_CELLS) * 1.01)
        nx, ny = int((xs.max() - x0) // cell_m) + 1, int((ys.max() - y0) // cell_m) + 1
        diag = cell_m * math.sqrt(2.0)
        # on a wide network's coarser cells, candidates for points farther from the roads (dense traces that walk
        # off them) at about the same build cost per segment: GeoLife Beijing's 1.58 M fixes on 26 m cells, 57% of
        # them in the cells at 15 m and 72% at 1.2 sides, snapped in 2.6 s against 4.1 s
        reach = max(CELL_NEAR_M, CELL_NEAR_CELLS * cell_m) + diag
        span = lambda lo, hi, n: (np.clip(np.ceil((lo - reach) / cell_m - 0.5), 0, n - 1).astype(np.int64),  # noqa
                                  np.clip(np.floor((hi + reach) / cell_m - 0.5), -1, n - 1).astype(np.int64))
        ix0, ix1 = span(np.minimum(index.ax, index.bx) - x0, np.maximum(index.ax, index.bx) - x0, nx)
        iy0, iy1 = span(np.minimum(index.ay, index.by) - y0, np.maximum(index.ay, index.by) - y0, ny)
        wx, wy = np.maximum(ix1 - ix0 + 1, 0), np.maximum(iy1 - iy0 + 1, 0)
        per_seg = wx * wy
        cells, segs, dists = [], [], []
        ends = np.cumsum(per_seg)
        cuts = np.searchsorted(ends, np.arange(chunk, int(ends[-1]) + chunk, chunk), side="right")
        edges = np.unique(np.r_[0, cuts, len(per_seg)])
        for s0, s1 in zip(edges[:-1], edges[1:]):                    # a loop over chunks of segments
            seg = np.repeat(np.arange(s0, s1), per_seg[s0:s1])
            k = np.arange(len(seg)) - np.repeat(np.cumsum(per_seg[s0:s1]) - per_seg[s0:s1], per_seg[s0:s1])
            cx, cy = ix0[seg] + k % wx[seg], iy0[seg] + k // wx[seg]
            d = _distance(index, x0 + (cx + 0.5) * cell_m, y0 + (cy + 0.5) * cell_m, seg)
            near = d <= reach
            cells.append((cy * nx + cx)[near])
            segs.append(seg[near])
            dists.append(d[near])
        cell, seg, d = np.concatenate(cells), np.concatenate(segs), np.concatenate(dists)
        order = np.argsort(cell, kind="stable")      # the pairs come by segment: each cell's stay in its order
        cell, seg, d = cell[order], seg[order], d[order]
        first = np.flatnonzero(np.r_[True, cell[1:] != cell[:-1]]) if len(cell) else np.zeros(0, np.int64)
        d0 = np.repeat(np.minimum.reduceat(d, first) if len(d) else d, np.diff(np.r_[first, len(cell)]))
        keep = (d <= d0 + diag + 1e-3) & (d0 + diag + 1e-3 <= reach)
        start = np.concatenate([[0], np.cumsum(np.bincount(cell[keep], minlength=nx * ny))])
        return cls(x0, y0, cell_m, nx, ny, start.astype(np.int32 if len(cell) < 1 << 31 else np.int64),
                   seg[keep].astype(np.int32))

    def row(self, qx, qy) -> tuple[np.ndarray, np.ndarray]:
        """Each point's cell's ``(first, count)`` in ``cand`` (count 0: none kept, or outside the grid)."""
        cx = np.floor((qx - self.x0) / self.cell_m)
        cy = np.floor((qy - self.y0) / self.cell_m)
        inside = (cx >= 0) & (cx < self.nx) & (cy >= 0) & (cy < self.ny)
        cell = np.where(inside, cy * self.nx + cx, 0).astype(np.int64)
        first = self.start[cell]
        return first, np.where(inside, self.start[cell + 1] - first, 0)


def _distance(index: SnapIndex, px, py, seg) -> np.ndarray:
    """The planar distance from each point to its segment ``seg`` (element-wise)."""
    dx, dy = index.bx[seg] - index.ax[seg], index.by[seg] - index.ay[seg]
    ux, uy = px - index.ax[seg], py - index.ay[seg]
    t = np.clip((ux * dx + uy * dy) / np.maximum(dx * dx + dy * dy, 1e-300), 0.0, 1.0)
    return np.hypot(ux - t * dx, uy - t * dy)


__all__ = ["SnapIndex", "Cells", "CELL_M", "MAX_CELLS", "CELL_NEAR_M", "CELL_NEAR_CELLS", "CELL_WIDTH"]
