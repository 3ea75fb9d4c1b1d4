"""Public bounding boxes, uniform and quadtree grids, cell ids, parents, children, centres; time slots; POIs.

A bounding box is always declared by the user, ``[min_lat, min_lon, max_lat, max_lon]`` in WGS 84 degrees; it
is never computed from the data (that would release the data's extent without noise).

Cell numbering (HRNet §2.2.1): on a ``w`` x ``w`` grid, ``row = floor((lat - min_lat) / (max_lat - min_lat) * w)``,
``col = floor((lon - min_lon) / (max_lon - min_lon) * w)``, points on the max edge fall in the last row/column,
and ``id = row * w + col``. For ``w = 2**d`` the grids at levels ``0..d`` form a quadtree: the parent of a cell
at level ``level`` is ``(row >> (d - level)) * 2**level + (col >> (d - level))`` (HRNet's up_i).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from duckmob.errors import DuckmobError

EARTH_RADIUS_M = 6_371_008.8


@dataclass(frozen=True)
class BBox:
    """A public bounding box in degrees."""

    min_lat: float
    min_lon: float
    max_lat: float
    max_lon: float

    @classmethod
    def of(cls, bbox) -> "BBox":
        """Validate a user's ``[min_lat, min_lon, max_lat, max_lon]``."""
        if isinstance(bbox, BBox):
            return bbox
        if bbox is None:
            raise DuckmobError("a bounding box is required: pass bbox := [min_lat, min_lon, max_lat, max_lon] "
                               "(a public parameter; it is never computed from the data)")
        try:
            values = [float(v) for v in bbox]
        except (TypeError, ValueError):
            raise DuckmobError(f"bbox must be four numbers [min_lat, min_lon, max_lat, max_lon], got {bbox!r}")
        if len(values) != 4 or not all(np.isfinite(values)):
            raise DuckmobError(f"bbox must be four finite numbers [min_lat, min_lon, max_lat, max_lon], got {bbox!r}")
        a, b, c, d = values
        if not (-90 <= a < c <= 90 and -180 <= b < d <= 180):
            raise DuckmobError(f"bbox {values} is not [min_lat, min_lon, max_lat, max_lon] with min < max, "
                               "latitudes in [-90, 90] and longitudes in [-180, 180]")
        return cls(a, b, c, d)

    def as_list(self) -> list[float]:
        return [self.min_lat, self.min_lon, self.max_lat, self.max_lon]

    def contains(self, lat, lon) -> np.ndarray:
        lat, lon = np.asarray(lat), np.asarray(lon)
        return (lat >= self.min_lat) & (lat <= self.max_lat) & (lon >= self.min_lon) & (lon <= self.max_lon)


def check_width(w) -> int:
    try:
        w_int = int(w)
    except (TypeError, ValueError):
        raise DuckmobError(f"grid width w must be a positive integer, got {w!r}")
    if w_int != w or w_int < 1:
        raise DuckmobError(f"grid width w must be a positive integer, got {w!r}")
    return w_int


def quadtree_depth(w: int) -> int:
    """d with w = 2**d; refuses a width that is not a power of two."""
    w = check_width(w)
    d = w.bit_length() - 1
    if 1 << d != w:
        raise DuckmobError(f"quadtree functions need w = 2**d, got w = {w}: use 2, 4, 8, 16, 32, 64, ...")
    return d


def cell_of(lat, lon, bbox, w: int) -> np.ndarray:
    """Cell id (int64) of each point on the w x w grid over ``bbox``; -1 outside the box."""
    box, w = BBox.of(bbox), check_width(w)
    lat, lon = np.asarray(lat, dtype=np.float64), np.asarray(lon, dtype=np.float64)
    row = np.floor((lat - box.min_lat) / (box.max_lat - box.min_lat) * w)
    col = np.floor((lon - box.min_lon) / (box.max_lon - box.min_lon) * w)
    row = np.minimum(row, w - 1)
    col = np.minimum(col, w - 1)
    cell = (row * w + col)
    cell = np.where(box.contains(lat, lon), cell, -1)
    return cell.astype(np.int64)


def row_col(cell, w: int) -> tuple[np.ndarray, np.ndarray]:
    cell = np.asarray(cell, dtype=np.int64)
    return cell // w, cell % w


def parent(cell, w: int, level: int) -> np.ndarray:
    """Id of the cell covering ``cell`` (on the w x w grid) in the 2**level x 2**level grid (HRNet's up_i)."""
    d = quadtree_depth(w)
    if not 0 <= level <= d:
        raise DuckmobError(f"level must be in 0..{d} for w = {w}, got {level}")
    row, col = row_col(cell, w)
    shift = d - level
    return (row >> shift) * (1 << level) + (col >> shift)


def children(cell, level: int) -> np.ndarray:
    """The four children (at level + 1) of a cell at ``level``, as an (..., 4) array, in id order."""
    side = 1 << level
    row, col = row_col(cell, side)
    rows = (2 * row)[..., None] + np.array([0, 0, 1, 1])
    cols = (2 * col)[..., None] + np.array([0, 1, 0, 1])
    return rows * (2 * side) + cols


def cell_bounds(cell, bbox, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(min_lat, min_lon, max_lat, max_lon) of each cell, in degrees."""
    box, w = BBox.of(bbox), check_width(w)
    row, col = row_col(cell, w)
    dlat = (box.max_lat - box.min_lat) / w
    dlon = (box.max_lon - box.min_lon) / w
    return (box.min_lat + row * dlat, box.min_lon + col * dlon,
            box.min_lat + (row + 1) * dlat, box.min_lon + (col + 1) * dlon)


def cell_center(cell, bbox, w: int) -> tuple[np.ndarray, np.ndarray]:
    """(lat, lon) of each cell's centre, in degrees."""
    a, b, c, d = cell_bounds(cell, bbox, w)
    return (a + c) / 2, (b + d) / 2


def haversine_m(lat1, lon1, lat2, lon2) -> np.ndarray:
    """Great-circle distance in metres."""
    p1, p2 = np.radians(lat1), np.radians(lat2)
    dphi = p2 - p1
    dl = np.radians(np.asarray(lon2) - np.asarray(lon1))
    a = np.sin(dphi / 2) ** 2 + np.cos(p1) * np.cos(p2) * np.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_M * np.arcsin(np.sqrt(np.clip(a, 0.0, 1.0)))


def time_slot(ts_us, n_slots: int) -> np.ndarray:
    """Slot 0..n_slots-1 of the time of day (HRNet's n_time): floor(seconds since midnight / 86400 * n_slots)."""
    if int(n_slots) != n_slots or n_slots < 1:
        raise DuckmobError(f"n_slots must be a positive integer, got {n_slots!r}")
    us_of_day = np.mod(np.asarray(ts_us, dtype=np.int64), 86_400_000_000)
    return (us_of_day * int(n_slots) // 86_400_000_000).astype(np.int64)


def assign_pois(lat, lon, bbox, w: int) -> np.ndarray:
    """Assign scattered points of interest to distinct quadtree leaves, minimising the total distance.

    HRNet §3.2.2: with up to 4**d = w*w POIs, each POI gets its own leaf cell of the w x w grid; the assignment
    minimises the sum of distances (metres) from each POI to its leaf's centre
    (``scipy.optimize.linear_sum_assignment``). Returns the leaf id of each POI.
    """
    from scipy.optimize import linear_sum_assignment

    box, w = BBox.of(bbox), check_width(w)
    quadtree_depth(w)
    lat, lon = np.asarray(lat, dtype=np.float64), np.asarray(lon, dtype=np.float64)
    if len(lat) > w * w:
        raise DuckmobError(f"{len(lat)} POIs do not fit on a {w}x{w} grid ({w * w} leaves): use a larger w")
    if len(lat) and not box.contains(lat, lon).all():
        raise DuckmobError("some POIs lie outside the bbox: declare a bbox that covers every POI")
    leaves = np.arange(w * w)
    clat, clon = cell_center(leaves, box, w)
    cost = haversine_m(lat[:, None], lon[:, None], clat[None, :], clon[None, :])
    rows, cols = linear_sum_assignment(cost)
    out = np.empty(len(lat), dtype=np.int64)
    out[rows] = leaves[cols]
    return out
