"""Public road networks: a table of straight road segments, its graph, shortest paths, snapping and sampling.

A roads table is PUBLIC geography (OpenStreetMap, a city's GIS): it costs no privacy budget, and it must never be
derived from the sensitive table (docs/roads.md). Its rows are straight segments ``(lat1, lon1, lat2, lon2)`` in
WGS 84 degrees, with an optional ``highway`` class. Everything here is a pure function over NumPy/Arrow; the SQL
surface (``mob_sf_roads()``, ``mob_roads_from_osm(...)``) is in :mod:`duckmob.sql.roads`. Because roads are public,
errors here quote rows and values exactly. Functions that take points (:func:`snap`) may be handed private points
(map matching inside a release): their errors name no value of them.

Geometry, in one place:

- A segment is straight in (lat, lon): the point at fraction ``t`` is ``(lat1 + t (lat2 - lat1), lon1 + t (lon2 -
  lon1))`` (:func:`points_along`).
- Segment and path lengths are great-circle (haversine) distances between a segment's endpoints, in metres, on a
  sphere of radius :data:`duckmob.grid.EARTH_RADIUS_M`.
- Snapping projects in a local equirectangular plane (x = R cos(lat0) lon, y = R lat; lat0 the middle of the
  latitude range), linear in (lat, lon): the projected point lies exactly on the segment and the nearest segment
  in the plane is found exactly; its distances differ from great-circle ones by about tan(lat0) x half the
  latitude span (1 cm at 30 m downtown SF). The distance returned is haversine, point to snapped point.

A graph's nodes are the distinct segment endpoints rounded to :data:`NODE_DECIMALS` decimals (1e-7 degree, about
1 cm), so segments that share an endpoint share a node; its edges are the segments (undirected: the tables carry
no one-way flag), weighted by their length in metres.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa
from scipy import sparse
from scipy.sparse import csgraph

from duckmob.errors import DuckmobError
from duckmob.grid import EARTH_RADIUS_M, BBox, haversine_m
from duckmob.road_snap import SnapIndex

COLUMNS = ("lat1", "lon1", "lat2", "lon2")
NODE_DECIMALS = 7          # endpoints equal after rounding to 1e-7 degree (about 1 cm) are one graph node
SNAP_SPACING_M = 20.0      # the snapping index samples every segment at most this far apart (metres)
_DIGEST_VERSION = b"duckmob roads v1\n"
_M_PER_RAD = EARTH_RADIUS_M


# Placer: the reach of the weighted choice of a segment around a synthetic point (metres, public) and how many road
# samples it looks at (in a dense downtown the 96 samples reach about 100 m; where roads are sparse, further).
# Measured on simulated San Francisco trips (benchmarks/roads.py, docs/roads.md), with the density released per
# street piece: point / trajectory density JSD .183 / .135 at 120 m and 24 samples, .174 / .120 at 300 m and 96,
# .173 / .116 at 400 m and 128; tabulated per cell, the choice costs about 1 s per million points whatever k.
PLACE_RADIUS_M = 300.0
PLACE_SAMPLES = 96
# The Placer's table has at most this many cells (radius / 5 metres each, coarser over a network too wide for that):
# memory at most PLACE_CELLS x PLACE_SAMPLES x 8 bytes (50 MB), whatever the city.
PLACE_CELLS = 1 << 16


@dataclass(frozen=True, eq=False)
class Roads:
    """A validated public road network: segment endpoints (float64 degrees), an optional ``highway`` class per
    segment (an object array of str, '' where unknown; ``None`` when the table has no such column), and
    ``digest``: the SHA-256 (hex) of the rows in a canonical order, so the same rows give the same digest whatever
    their order. The digest keeps each segment's direction and covers ``highway`` when the column is present.
    Build one with :meth:`Roads.of` (or :meth:`Roads.from_arrays`)."""

    lat1: np.ndarray
    lon1: np.ndarray
    lat2: np.ndarray
    lon2: np.ndarray
    highway: np.ndarray | None
    digest: str

    @classmethod
    def of(cls, table: pa.Table | pa.RecordBatch, name: str = "roads") -> "Roads":
        """Validate a roads table: columns ``lat1, lon1, lat2, lon2`` (case-insensitive; numeric, no NULL, finite,
        latitudes in [-90, 90], longitudes in [-180, 180]) and an optional string column ``highway``; other columns
        are ignored. Segments of zero length (both endpoints equal) are dropped. ``name`` is used in errors."""
        if not isinstance(table, (pa.Table, pa.RecordBatch)):
            raise DuckmobError(f"{name}: expected an Arrow table of road segments, got {type(table).__name__}")
        by_lower = {c.lower(): c for c in table.column_names}
        missing = [c for c in COLUMNS if c not in by_lower]
        if missing:
            raise DuckmobError(f"{name}: a roads table needs columns lat1, lon1, lat2, lon2 (degrees); missing "
                               f"{', '.join(missing)} (it has {', '.join(table.column_names) or 'no column'})")
        values = []
        for c in COLUMNS:
            col = table.column(by_lower[c])
            if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_decimal(col.type)):
                raise DuckmobError(f"{name}: column {c} must be numeric degrees, got type {col.type}")
            if col.null_count:
                row = int(np.flatnonzero(_nulls(col))[0])
                raise DuckmobError(f"{name}: column {c} is NULL in row {row}; every segment needs both endpoints")
            values.append(np.asarray(col.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64))
        highway = None
        if "highway" in by_lower:
            col = table.column(by_lower["highway"])
            if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_null(col.type)
                    or pa.types.is_dictionary(col.type)):
                raise DuckmobError(f"{name}: column highway must be text (an OpenStreetMap class), got type {col.type}")
            hw = col.cast(pa.string()).to_numpy(zero_copy_only=False)
            highway = np.array(["" if v is None else v for v in hw], dtype=object)
        return cls.from_arrays(*values, highway=highway, name=name)

    @classmethod
    def from_arrays(cls, lat1, lon1, lat2, lon2, highway=None, name: str = "roads") -> "Roads":
        """Validate endpoint arrays (degrees) and an optional class per segment; zero-length segments are dropped."""
        arrays = [np.asarray(a, dtype=np.float64).ravel() + 0.0 for a in (lat1, lon1, lat2, lon2)]  # -0.0 -> 0.0
        n = len(arrays[0])
        if any(len(a) != n for a in arrays) or (highway is not None and len(highway) != n):
            raise DuckmobError(f"{name}: lat1, lon1, lat2, lon2 (and highway) must have one value per segment")
        for c, a, lim in zip(COLUMNS, arrays, (90, 180, 90, 180)):
            bad = np.flatnonzero(~np.isfinite(a) | (np.abs(a) > lim))
            if len(bad):
                raise DuckmobError(f"{name}: {c} = {a[bad[0]]!r} in row {int(bad[0])} is not a finite degree in "
                                   f"[-{lim}, {lim}]; fix or drop that segment")
        keep = (arrays[0] != arrays[2]) | (arrays[1] != arrays[3])
        arrays = [a[keep] for a in arrays]
        if highway is not None:
            highway = np.array(["" if v is None else str(v) for v in np.asarray(highway, dtype=object)[keep]],
                               dtype=object)
        if not len(arrays[0]):
            raise DuckmobError(f"{name}: the roads table has no segment of non-zero length; give at least one road")
        return cls(*arrays, highway=highway, digest=_digest(*arrays, highway))

    def __len__(self) -> int:
        return len(self.lat1)

    @cached_property
    def length_m(self) -> np.ndarray:
        """Each segment's great-circle length, in metres."""
        return haversine_m(self.lat1, self.lon1, self.lat2, self.lon2)

    def clip(self, bbox) -> "Roads":
        """The segments with at least one endpoint inside ``bbox`` ([min_lat, min_lon, max_lat, max_lon], edges
        included), whole (a segment crossing the edge keeps its outside end, so the streets at the edge join)."""
        box = BBox.of(bbox)
        keep = box.contains(self.lat1, self.lon1) | box.contains(self.lat2, self.lon2)
        if not keep.any():
            raise DuckmobError(f"roads: no segment has an endpoint inside bbox {box.as_list()}; give the roads of "
                               "that area or a bbox over the roads")
        return self.take(np.flatnonzero(keep))

    def cut(self, bbox) -> "Roads":
        """The same segments in the same order, each cut at ``bbox``'s edge (Liang-Barsky; under 1 cm inside: kept
        whole), so a point placed on any lies in the bbox. Kept per bbox with the network (its graph built once)."""
        box = BBox.of(bbox)
        kept, key = self.__dict__.setdefault("_cuts", {}), tuple(box.as_list())
        return kept[key] if key in kept else kept.setdefault(key, self._cut(box))

    def _cut(self, box: BBox) -> "Roads":
        lo = np.array([box.min_lat, box.min_lon])[:, None]
        hi = np.array([box.max_lat, box.max_lon])[:, None]
        p = np.stack([self.lat1, self.lon1])
        d = np.stack([self.lat2, self.lon2]) - p
        with np.errstate(divide="ignore", invalid="ignore"):
            t_lo, t_hi = (lo - p) / d, (hi - p) / d
        enter = np.where(d != 0, np.minimum(t_lo, t_hi), np.where((p >= lo) & (p <= hi), -np.inf, np.inf))
        leave = np.where(d != 0, np.maximum(t_lo, t_hi), np.where((p >= lo) & (p <= hi), np.inf, -np.inf))
        t0, t1 = np.clip(np.max(enter, axis=0), 0.0, 1.0), np.clip(np.min(leave, axis=0), 0.0, 1.0)
        a, b = np.clip(p + t0 * d, lo, hi), np.clip(p + np.maximum(t1, t0) * d, lo, hi)
        whole = np.hypot(*(b - a)) < 1e-7                # nothing (or under a centimetre) inside: kept whole
        a[:, whole], b[:, whole] = p[:, whole], p[:, whole] + d[:, whole]
        return Roads(a[0], a[1], b[0], b[1], highway=self.highway, digest=_digest(a[0], a[1], b[0], b[1], self.highway))

    def take(self, segments) -> "Roads":
        """The given segments (indices), in that order, as a network of their own (its own digest)."""
        idx = np.asarray(segments, dtype=np.int64)
        hw = None if self.highway is None else self.highway[idx]
        return Roads.from_arrays(self.lat1[idx], self.lon1[idx], self.lat2[idx], self.lon2[idx], highway=hw)

    def to_arrow(self) -> pa.Table:
        """The segments as a table ``lat1, lon1, lat2, lon2[, highway]``."""
        cols = {c: getattr(self, c) for c in COLUMNS}
        if self.highway is not None:
            cols["highway"] = pa.array(self.highway.tolist(), pa.string())
        return pa.table(cols)

    @cached_property
    def graph(self) -> "Graph":
        """The road graph (built once per network)."""
        return _build_graph(self)

    def pieces(self, piece_m: float = 400.0, min_cos: float = 0.85) -> np.ndarray:
        """The street piece of each segment (int64 ids 0..P-1): segments that continue one another (sharing an end,
        nearly straight on: |cos| of their angle at least ``min_cos``) form a street, cut by a grid of ``piece_m``
        metre cells (by each segment's midpoint). A function of the public network only."""
        key = (float(piece_m), float(min_cos))
        cache = self.__dict__.setdefault("_pieces", {})
        if key not in cache:
            cache[key] = _pieces(self, *key)
        return cache[key]

    def spread_over_pieces(self, mass, piece_m: float = 400.0) -> np.ndarray:
        """Each street piece's ``mass`` (one a piece of :meth:`pieces`) spread along its segments in proportion to
        their lengths: one weight per segment."""
        piece = self.pieces(piece_m)
        mass = np.asarray(mass, dtype=np.float64)
        piece_length = np.bincount(piece, weights=self.length_m, minlength=len(mass))
        return mass[piece] * self.length_m / np.maximum(piece_length[piece], 1e-9)

    def piece_links(self, piece_m: float = 400.0) -> np.ndarray:
        """The ordered pairs of street pieces (:meth:`pieces`) that share a graph node, each piece with itself too,
        as sorted keys ``p * P + q`` (P pieces): the support of the released piece-to-piece flows
        (:mod:`duckmob.road_flows`). A function of the public network only, built once per ``piece_m``."""
        cache = self.__dict__.setdefault("_piece_links", {})
        if float(piece_m) not in cache:
            piece = self.pieces(piece_m)
            n_pieces = int(piece.max()) + 1 if len(piece) else 0
            g = self.graph
            rows, cols = np.r_[piece, piece], np.r_[g.u, g.v]
            touch = sparse.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(n_pieces, g.n_nodes))
            pairs = (touch @ touch.T).tocoo()
            cache[float(piece_m)] = np.unique(pairs.row.astype(np.int64) * n_pieces + pairs.col)
        return cache[float(piece_m)]

    @cached_property
    def _snap_index(self) -> SnapIndex:
        return SnapIndex(self.lat1, self.lon1, self.lat2, self.lon2, SNAP_SPACING_M, _M_PER_RAD)


def _nulls(col) -> np.ndarray:
    return np.asarray(col.is_null().to_numpy(zero_copy_only=False), dtype=bool)


def _digest(lat1, lon1, lat2, lon2, highway) -> str:
    """SHA-256 of the rows sorted by (lat1, lon1, lat2, lon2, highway): the float64 values little-endian, then the
    classes as a JSON list (when the table has them)."""
    coords = np.stack([lat1, lon1, lat2, lon2], axis=1)
    keys = [coords[:, 3], coords[:, 2], coords[:, 1], coords[:, 0]]
    if highway is not None:
        _, codes = np.unique(highway.astype(str), return_inverse=True)
        keys.insert(0, codes)
    order = np.lexsort(keys)
    h = hashlib.sha256(_DIGEST_VERSION)
    h.update(np.int64(len(lat1)).tobytes())
    h.update(np.ascontiguousarray(coords[order]).astype("<f8").tobytes())
    if highway is not None:
        h.update(b"highway\n" + json.dumps(highway[order].tolist()).encode())
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------- the road graph

@dataclass(frozen=True, eq=False)
class Graph:
    """The road graph: ``node_lat``/``node_lon`` (degrees: the first endpoint met of each node), the nodes ``u``
    and ``v`` of each segment's (lat1, lon1) and (lat2, lon2) ends, each segment's ``length_m``, and ``matrix``:
    a symmetric n_nodes x n_nodes CSR matrix of edge lengths in metres (between two nodes joined by several
    segments, the shortest one; ``edge_segment`` says which)."""

    node_lat: np.ndarray
    node_lon: np.ndarray
    u: np.ndarray
    v: np.ndarray
    length_m: np.ndarray
    matrix: sparse.csr_matrix
    _edge_key: np.ndarray    # a * n_nodes + b for each edge (both directions), sorted
    _edge_seg: np.ndarray    # the segment of each key

    @property
    def n_nodes(self) -> int:
        return len(self.node_lat)

    def segment_between(self, a, b) -> np.ndarray:
        """The segment joining nodes ``a`` and ``b`` (element-wise; the shortest if several), -1 where none does."""
        a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
        key = a * self.n_nodes + b
        pos = np.minimum(np.searchsorted(self._edge_key, key), len(self._edge_key) - 1)
        return np.where(self._edge_key[pos] == key, self._edge_seg[pos], -1)

    def components(self) -> tuple[int, np.ndarray]:
        """(number of connected components, the component of each node)."""
        return csgraph.connected_components(self.matrix, directed=False)


def _build_graph(roads: Roads) -> Graph:
    scale = 10.0 ** NODE_DECIMALS
    lat = np.concatenate([roads.lat1, roads.lat2])
    lon = np.concatenate([roads.lon1, roads.lon2])
    # one int64 per rounded endpoint: lat in [-9e8, 9e8] and lon in [-1.8e9, 1.8e9] units of 1e-7 degree
    key = (np.rint(lat * scale).astype(np.int64) + 900_000_000) * 3_600_000_001 \
        + (np.rint(lon * scale).astype(np.int64) + 1_800_000_000)
    _, first, node = np.unique(key, return_index=True, return_inverse=True)
    n_seg, n_nodes = len(roads), len(first)
    u, v = node[:n_seg], node[n_seg:]
    length = roads.length_m
    real = u != v                       # a segment shorter than the rounding joins a node to itself: no edge
    seg = np.flatnonzero(real)
    a = np.concatenate([u[seg], v[seg]])
    b = np.concatenate([v[seg], u[seg]])
    s = np.concatenate([seg, seg])
    ek = a * n_nodes + b
    order = np.lexsort((s, length[s], ek))           # per node pair: shortest segment first (then lowest index)
    ek, a, b, s = ek[order], a[order], b[order], s[order]
    first_of_pair = np.concatenate([[True], ek[1:] != ek[:-1]]) if len(ek) else np.zeros(0, bool)
    ek, a, b, s = ek[first_of_pair], a[first_of_pair], b[first_of_pair], s[first_of_pair]
    # lengths are > 0 here (distinct rounded ends); the floor only keeps csgraph from reading an edge as absent
    weight = np.maximum(length[s], 1e-9)
    matrix = sparse.csr_matrix((weight, (a, b)), shape=(n_nodes, n_nodes))
    return Graph(node_lat=lat[first], node_lon=lon[first], u=u, v=v, length_m=length, matrix=matrix,
                 _edge_key=ek, _edge_seg=s)


def _pieces(roads: "Roads", piece_m: float, min_cos: float) -> np.ndarray:
    g = roads.graph
    n = len(roads)
    inc = sparse.csr_matrix((np.ones(2 * n), (np.r_[np.arange(n), np.arange(n)], np.r_[g.u, g.v])),
                            shape=(n, g.n_nodes))
    pairs = (inc @ inc.T).tocoo()
    i, j = pairs.row, pairs.col
    mid_lat = (roads.lat1 + roads.lat2) / 2
    mid_lon = (roads.lon1 + roads.lon2) / 2
    c = math.cos(math.radians(float(np.mean(mid_lat)))) if n else 1.0
    dx, dy = (roads.lon2 - roads.lon1) * c, roads.lat2 - roads.lat1
    norm = np.maximum(np.hypot(dx, dy), 1e-15)
    straight = (i != j) & (np.abs(dx[i] * dx[j] + dy[i] * dy[j]) >= min_cos * norm[i] * norm[j])
    # the same piece only within one piece_m cell (by midpoint), so a long street is cut into pieces
    deg = piece_m / _M_PER_RAD * 180.0 / math.pi
    cell = np.floor(mid_lat / deg).astype(np.int64) * 4_000_003 + np.floor(mid_lon * c / deg).astype(np.int64)
    keep = straight & (cell[i] == cell[j])
    link = sparse.csr_matrix((np.ones(int(keep.sum())), (i[keep], j[keep])), shape=(n, n))
    return csgraph.connected_components(link, directed=False)[1].astype(np.int64)


@dataclass(frozen=True, eq=False)
class ShortestPaths:
    """Shortest paths from a few source nodes: ``dist[k, j]`` metres from ``sources[k]`` to node ``j`` (inf when
    unreachable) and ``pred[k, j]`` the node before ``j`` on that path (negative at the source and when
    unreachable). Memory: 16 bytes x len(sources) x n_nodes."""

    sources: np.ndarray
    dist: np.ndarray
    pred: np.ndarray

    def paths(self, rows, targets) -> tuple[np.ndarray, np.ndarray]:
        """The node paths from ``sources[rows[i]]`` to ``targets[i]``, source first, as ragged arrays
        ``(offsets, nodes)``: path i is ``nodes[offsets[i]:offsets[i + 1]]`` (one node when target == source,
        empty when unreachable). Vectorised over the pairs: one NumPy step per node of the longest path."""
        rows = np.asarray(rows, dtype=np.int64).ravel()
        targets = np.asarray(targets, dtype=np.int64).ravel()
        m = len(rows)
        alive = np.isfinite(self.dist[rows, targets]) if m else np.zeros(0, bool)
        found = trace_back(np.arange(m), targets, alive, lambda idx, cur: self.pred[rows[idx], cur])
        return ragged_paths(m, found)


def trace_back(labels, targets, alive, prev_of, names=None, found=None) -> list:
    """Walk predecessor links back from ``targets`` (where ``alive``) to their sources, vectorised over them (one
    NumPy step per node of the longest path): ``prev_of(idx, nodes)`` gives each node's predecessor (negative at
    the source). Appends to ``found`` (new when None) the ``(labels, nodes, steps)`` met, nodes through ``names``
    when given; :func:`ragged_paths` assembles them."""
    found = [[], [], []] if found is None else found
    idx = np.flatnonzero(np.asarray(alive, dtype=bool))      # the paths still being walked, and where they are
    cur = np.asarray(targets, dtype=np.int64)[idx]
    step = 0
    while len(idx):
        found[0].append(labels[idx])
        found[1].append(cur if names is None else names[cur])
        found[2].append(np.full(len(idx), step))
        prev = np.asarray(prev_of(idx, cur), dtype=np.int64)
        on = prev >= 0
        idx, cur = idx[on], prev[on]
        step += 1
    return found


def ragged_paths(m: int, found) -> tuple[np.ndarray, np.ndarray]:
    """The paths :func:`trace_back` met, for labels 0 .. m - 1, as ragged ``(offsets, nodes)``, source first (one
    node when target == source, none when unreachable)."""
    if not found[0]:
        return np.zeros(m + 1, np.int64), np.zeros(0, np.int64)
    pair, node, st = (np.concatenate(x) for x in found)
    count = np.bincount(pair, minlength=m)
    offsets = np.concatenate([[0], np.cumsum(count)]).astype(np.int64)
    nodes = np.empty(len(node), np.int64)
    nodes[offsets[pair] + count[pair] - 1 - st] = node    # per pair, the source (last step) first
    return offsets, nodes


def shortest_paths(graph: Graph, sources, limit: float = np.inf) -> ShortestPaths:
    """Dijkstra (scipy.sparse.csgraph) from each of ``sources`` (node ids) over the undirected road graph;
    ``limit`` (metres) stops the search there (nodes farther are unreachable), bounding the time."""
    sources = np.asarray(sources, dtype=np.int64).ravel()
    if len(sources) and (sources.min() < 0 or sources.max() >= graph.n_nodes):
        raise DuckmobError(f"shortest_paths: source nodes must be in 0 .. {graph.n_nodes - 1}")
    if not len(sources):
        return ShortestPaths(sources, np.zeros((0, graph.n_nodes)), np.zeros((0, graph.n_nodes), np.int32))
    dist, pred = csgraph.dijkstra(graph.matrix, directed=False, indices=sources, return_predecessors=True,
                                  limit=limit)
    return ShortestPaths(sources, np.atleast_2d(dist), np.atleast_2d(pred))


def path_segments(graph: Graph, offsets, nodes) -> tuple[np.ndarray, np.ndarray]:
    """The segments along node paths ``(offsets, nodes)`` (as :meth:`ShortestPaths.paths` gives them), as ragged
    arrays ``(offsets, segments)``: one segment per consecutive pair of nodes."""
    offsets, nodes = np.asarray(offsets, dtype=np.int64), np.asarray(nodes, dtype=np.int64)
    counts = np.diff(offsets)
    has_next = np.ones(len(nodes), bool)
    ends = offsets[1:][counts > 0] - 1
    has_next[ends] = False
    i = np.flatnonzero(has_next)
    segs = graph.segment_between(nodes[i], nodes[i + 1])
    seg_counts = np.maximum(counts - 1, 0)
    return np.concatenate([[0], np.cumsum(seg_counts)]).astype(np.int64), segs


# ---------------------------------------------------------------------------------------------- snapping

def snap(roads: Roads, lat, lon, chunk: int = 1 << 17):
    """Snap points to their nearest road segment, exactly (in the local plane of the module docstring).

    Returns ``(segment, t, lat, lon, distance_m)``: the index of the nearest segment, the fraction t in [0, 1]
    along it from (lat1, lon1), the snapped point (:func:`points_along` of them) and the great-circle distance
    to it in metres. Exactness (:mod:`duckmob.road_snap`): each point is projected onto every segment that can be
    its nearest (its cell's candidates, kept per network; or the segments of the road samples a k-d search finds
    near it), so the result equals a brute-force projection onto every segment (ties: the lowest segment index).
    Vectorised, in chunks of ``chunk`` points (memory bounded by the chunk). The points may be private: errors
    name none."""
    lat = np.asarray(lat, dtype=np.float64).ravel()
    lon = np.asarray(lon, dtype=np.float64).ravel()
    if lat.shape != lon.shape:
        raise DuckmobError("snap: lat and lon must have the same length")
    if not (np.isfinite(lat).all() and np.isfinite(lon).all()):
        raise DuckmobError("snap: every point needs a finite lat and lon; drop the others first")
    index = roads._snap_index
    seg = np.empty(len(lat), np.int64)
    t = np.empty(len(lat))
    for start in range(0, len(lat), chunk):
        part = slice(start, start + chunk)
        qx, qy = index.plane(lat[part], lon[part])
        seg[part], t[part] = index.nearest(qx, qy)
    slat, slon = points_along(roads, seg, t)
    return seg, t, slat, slon, haversine_m(lat, lon, slat, slon)


# ---------------------------------------------------------------------------------------------- points on roads

def place(roads: Roads, lat, lon, weights, rng: np.random.Generator, radius_m: float = PLACE_RADIUS_M,
          k: int = PLACE_SAMPLES):
    """Move each point onto a road segment near it, drawn by the released ``weights`` (:class:`Placer`; built
    for this one call). Returns ``(lat, lon)``."""
    return Placer(roads, weights, radius_m, k).place(lat, lon, rng)


class Placer:
    """Draws, for each point, a road segment near it with probability proportional to
    ``weights[segment] * exp(-(d / radius_m)^2)`` over the ``k`` road samples (every <= 20 m along every segment)
    nearest it, d each sample's distance, and moves the point to its projection on that segment.

    The candidates and their weights are tabulated once per cell of a public grid of ``radius_m / 5`` metre cells
    over the network's extent (d measured from the cell's centre, which moves a weight by at most
    exp(0.3) - 1 within a cell; over a network wider than :data:`PLACE_CELLS` such cells, square cells as small as
    that many allow), so placing n points costs a table look-up and one draw each. A point whose cell
    has no weighted candidate, or that lies beyond the network's extent, goes to its nearest segment
    (:func:`snap`). ``weights`` is a released (public) per-segment density: building and using this reads no
    private data (post-processing)."""

    def __init__(self, roads: Roads, weights, radius_m: float = PLACE_RADIUS_M, k: int = PLACE_SAMPLES):
        weights = np.asarray(weights, dtype=np.float64)
        if len(weights) != len(roads):
            raise DuckmobError(f"place: {len(weights)} weights for {len(roads)} segments")
        self.roads, self.index = roads, roads._snap_index
        grid = _place_grid(roads, float(radius_m), int(k))
        self.x0, self.y0, self.cell_m, self.nx, self.ny, self.segs = grid[:6]
        w = weights[self.segs] * grid[6]
        self.cum = np.cumsum(w, axis=1).astype(np.float32)
        self.total = self.cum[:, -1]
        # how far each cell's candidates reach: its k-th nearest road sample's distance (from the kernel)
        self.reach_m = float(radius_m) * np.sqrt(-np.log(np.maximum(grid[6][:, -1], 1e-300)))

    def reach(self, lat, lon) -> np.ndarray:
        """How far from each point its candidates lie at most (metres: the distance of its cell's k-th nearest
        road sample; a point beyond the network's extent reads the nearest edge cell). Public roads only."""
        qx, qy = self.index.plane(np.asarray(lat, dtype=np.float64), np.asarray(lon, dtype=np.float64))
        cx, cy = self._cell(qx, qy)
        return self.reach_m[np.clip(cy, 0, self.ny - 1) * self.nx + np.clip(cx, 0, self.nx - 1)]

    def _cell(self, qx, qy) -> tuple[np.ndarray, np.ndarray]:
        """Column and row of each plane point's cell of the table (outside it: < 0 or past the last)."""
        return np.floor((qx - self.x0) / self.cell_m).astype(int), np.floor((qy - self.y0) / self.cell_m).astype(int)

    def place(self, lat, lon, rng: np.random.Generator, chunk: int = 1 << 17):
        """Each point moved onto a drawn segment near it (the class docstring); ``rng`` the caller's generator.
        Returns ``(lat, lon)``; vectorised in chunks of ``chunk`` points."""
        return points_along(self.roads, *self.draw(lat, lon, rng, chunk))

    def draw(self, lat, lon, rng: np.random.Generator, chunk: int = 1 << 17):
        """The positions :meth:`place` moves the points to, as ``(segment, t)`` (:func:`points_along`)."""
        if not isinstance(rng, np.random.Generator):
            raise TypeError("place needs the caller's numpy Generator (rng)")
        lat = np.asarray(lat, dtype=np.float64).ravel()
        lon = np.asarray(lon, dtype=np.float64).ravel()
        out_seg, out_t = np.empty(len(lat), np.int64), np.empty(len(lat))
        for start in range(0, len(lat), chunk):
            part = slice(start, start + chunk)
            qx, qy = self.index.plane(lat[part], lon[part])
            cx, cy = self._cell(qx, qy)
            inside = (cx >= 0) & (cx < self.nx) & (cy >= 0) & (cy < self.ny)
            cell = np.where(inside, cy * self.nx + cx, 0)
            u = rng.random(len(qx)) * self.total[cell]
            pick = np.minimum(count_below(self.cum, cell, u), self.segs.shape[1] - 1)
            chosen = self.segs[cell, pick]
            drawn = inside & (self.total[cell] > 0)
            seg, t = chosen.astype(np.int64), self.index.fraction(qx, qy, chosen)
            if not drawn.all():
                rest = ~drawn
                seg[rest], t[rest] = self.index.nearest(qx[rest], qy[rest])
            out_seg[part], out_t[part] = seg, t
        return out_seg, out_t


def _place_grid(roads: Roads, radius_m: float, k: int) -> tuple:
    """What a :class:`Placer` tabulates that its weights do not change, kept with the network per radius and k:
    the cells' origin, side and counts ``(x0, y0, cell_m, nx, ny)``, each cell's k nearest road samples' segments
    and their kernel ``exp(-(d / radius_m)^2)``. A function of the public network only."""
    kept = roads.__dict__.setdefault("_place_grids", {})
    if (radius_m, k) in kept:
        return kept[(radius_m, k)]
    index = roads._snap_index
    k = int(min(k, index.tree.n))
    xs = np.concatenate([index.ax, index.bx])
    ys = np.concatenate([index.ay, index.by])
    x0, y0 = float(xs.min()), float(ys.min())
    area = (float(xs.max()) - x0 + 1.0) * (float(ys.max()) - y0 + 1.0)
    cell_m = max(radius_m / 5.0, math.sqrt(area / PLACE_CELLS) * 1.01)
    nx = int((xs.max() - x0) // cell_m) + 1
    ny = int((ys.max() - y0) // cell_m) + 1
    gx, gy = np.meshgrid(x0 + (np.arange(nx) + 0.5) * cell_m, y0 + (np.arange(ny) + 0.5) * cell_m)
    d, j = index.tree.query(np.column_stack([gx.ravel(), gy.ravel()]), k=k)
    d, j = d.reshape(-1, k), j.reshape(-1, k)
    grid = (x0, y0, cell_m, nx, ny, index.seg[j].astype(np.int32), np.exp(-(d / radius_m) ** 2))
    return kept.setdefault((radius_m, k), grid)


def count_below(cum, rows, u) -> np.ndarray:
    """``(cum[rows] < u[:, None]).sum(axis=1)`` for rows of ``cum`` that do not decrease, by a binary search per
    row (vectorised: one step per bit of the row length, each reading one entry per row): the count grows by
    each power of two, largest first, while the entry it would pass is below u."""
    k = cum.shape[1]
    flat, base = cum.ravel(), np.asarray(rows, dtype=np.int64) * k - 1
    count = np.zeros(len(base), np.int64)
    step = 1 << (int(k).bit_length() - 1)
    while step:
        grown = np.minimum(count + step, k)
        count = np.where(flat.take(base + grown) < u, grown, count)
        step >>= 1
    return count


def points_along(roads: Roads, segment, t) -> tuple[np.ndarray, np.ndarray]:
    """(lat, lon) at fraction ``t`` (0: the (lat1, lon1) end, 1: the other) along each given segment."""
    seg = np.asarray(segment, dtype=np.int64)
    t = np.asarray(t, dtype=np.float64)
    return (roads.lat1[seg] + t * (roads.lat2[seg] - roads.lat1[seg]),
            roads.lon1[seg] + t * (roads.lon2[seg] - roads.lon1[seg]))


def sample_along(roads: Roads, n: int, rng: np.random.Generator, weights=None, segments=None):
    """Draw ``n`` points: a segment with probability proportional to its weight, then a point uniform along it.

    ``segments``: the candidate segment indices (default: all); ``weights``: one non-negative weight per
    candidate (default: its length, i.e. points uniform along the network). For a density per metre pass
    density x :attr:`Roads.length_m`. ``rng`` comes from the caller (this is post-processing of released data;
    duckmob never makes a generator here): it draws n uniforms for the segments, then n for the fractions.
    Returns ``(segment, t, lat, lon)``."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError("sample_along needs an np.random.Generator from the caller")
    segs = np.arange(len(roads)) if segments is None else np.asarray(segments, dtype=np.int64).ravel()
    w = roads.length_m[segs] if weights is None else np.asarray(weights, dtype=np.float64).ravel()
    if len(w) != len(segs):
        raise DuckmobError("sample_along: give one weight per segment")
    if not (np.isfinite(w).all() and (w >= 0).all() and w.sum() > 0):
        raise DuckmobError("sample_along: weights must be finite, non-negative and not all zero")
    cum = np.cumsum(w)
    pick = np.minimum(np.searchsorted(cum, rng.random(int(n)) * cum[-1], side="right"), len(segs) - 1)
    seg = segs[pick]
    t = rng.random(int(n))
    lat, lon = points_along(roads, seg, t)
    return seg, t, lat, lon
