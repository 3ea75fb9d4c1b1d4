"""Road distances between the junctions of a contracted road graph (:mod:`duckmob.road_paths`): Dijkstra on local
subgraphs, and the table of every distance up to a limit that a network keeps.

**Searches.** Shortest paths between junctions run with Dijkstra (scipy.sparse.csgraph) on the junction graph,
searched up to a public ``limit_m``. Each search runs on a local subgraph: the sources are grouped by square tiles
of ``limit_m / 2``, and a tile's searches run over the junctions within ``limit_m`` (straight line) of it, which
hold every path shorter than ``limit_m`` (a road is never shorter than the straight line), so the distances are
exact and a search costs what the network near it holds, not the city.

**The kept table**: every junction distance up to a limit, computed once per network (or per weighting) and looked
up after. :class:`TileTable` keeps the searches' rows as they come (a look-up: two reads; SF's lengths 51 MB, built
in 0.45 s); past its bound, :class:`NearTable` keeps only the pairs within the limit in a hash table
(:class:`HashTable`: open addressing, no sort, each distance packed beside its key so one read finds both).

Everything here is a function of the public road network only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.sparse import csgraph
from scipy.spatial import cKDTree

from duckmob.roads import ragged_paths, trace_back

SOURCES_PER_PASS = 256     # Dijkstra sources per pass: memory 8 bytes x this x the junctions of one tile's subgraph


def _tiles(x, y, sources, limit_m: float):
    """The tiles of ``limit_m / 2`` holding some of ``sources`` (node ids; nodes at plane coordinates ``x``, ``y``):
    each one's sources (positions in ``sources``), its centre, the radius around a centre that holds every node
    within ``limit_m`` of the tile, and a k-d tree of all the nodes."""
    tile_m = max(float(limit_m) / 2.0, 1.0)
    tx = np.floor(x[sources] / tile_m).astype(np.int64)
    ty = np.floor(y[sources] / tile_m).astype(np.int64)
    tile_key = (tx - tx.min()) * (int(ty.max() - ty.min()) + 1) + (ty - ty.min())
    by_tile = np.argsort(tile_key, kind="stable")        # sources in tile order
    starts = np.flatnonzero(np.r_[True, tile_key[by_tile][1:] != tile_key[by_tile][:-1]])
    groups = np.split(by_tile, starts[1:])
    centres = np.column_stack([tx[by_tile[starts]] + 0.5, ty[by_tile[starts]] + 0.5]) * tile_m
    return groups, centres, tile_m * math.sqrt(0.5) + float(limit_m), cKDTree(np.column_stack([x, y]))


def tile_subgraphs(matrix, x, y, sources, limit_m: float, tiles=None):
    """The local subgraphs of the module docstring: per tile of ``limit_m / 2`` holding some of ``sources``
    (distinct node ids of the symmetric ``matrix``, nodes at plane coordinates ``x``, ``y``), yields ``(which,
    local, sub)``: the positions in ``sources`` of the tile's sources, the nodes within ``limit_m`` (straight line)
    of the tile (sorted) and the subgraph they induce. ``tiles``: :func:`_tiles` of the same, when known."""
    groups, centres, reach, tree = _tiles(x, y, sources, limit_m) if tiles is None else tiles
    for which, centre in zip(groups, centres):         # one subgraph per tile (a loop over tiles, not points)
        local = np.sort(np.asarray(tree.query_ball_point(centre, reach), dtype=np.int64))
        yield which, local, matrix[local][:, local]


def tile_passes(matrix, x, y, sources, limit_m: float, paths: bool, sources_per_pass: int = SOURCES_PER_PASS):
    """Dijkstra from each of ``sources`` (distinct node ids) on local subgraphs of the symmetric ``matrix`` (nodes
    at plane coordinates ``x``, ``y``; :func:`tile_subgraphs`), yielding per pass ``(which, local, dist, pred)``:
    the positions in ``sources`` searched, the subgraph's nodes (sorted), the distances to them (inf beyond
    ``limit_m``) and, with ``paths``, the predecessors (local indices). The matrix is symmetric, so the searches
    run on it as directed (scipy would symmetrise it again on every call otherwise)."""
    for in_tile, local, sub in tile_subgraphs(matrix, x, y, sources, limit_m):
        for c0 in range(0, len(in_tile), sources_per_pass):
            which = in_tile[c0:c0 + sources_per_pass]
            got = csgraph.dijkstra(sub, directed=True, indices=np.searchsorted(local, sources[which]),
                                   limit=float(limit_m), return_predecessors=paths)
            dist, pred = got if paths else (got, None)
            yield which, local, np.atleast_2d(dist), (np.atleast_2d(pred) if paths else None)


def _searches(matrix, x, y, a, b, limit_m: float, paths: bool):
    """Dijkstra from each distinct node of ``a`` to ``b`` (element-wise; :func:`tile_passes`), yielding per pass
    ``(pick, dist, walk)``: the pairs it answers, their distances (inf beyond ``limit_m``) and, with ``paths``,
    ``(pred, local, rows, at)`` to walk each path back."""
    a = np.asarray(a, dtype=np.int64).ravel()
    b = np.asarray(b, dtype=np.int64).ravel()
    if not len(a):
        return
    sources, row = np.unique(a, return_inverse=True)
    pair_order = np.argsort(row, kind="stable")
    sorted_row = row[pair_order]
    for which, local, dist, pred in tile_passes(matrix, x, y, sources, limit_m, paths):
        rank = np.full(len(sources), -1, np.int64)
        rank[which] = np.arange(len(which))
        lo, hi = np.searchsorted(sorted_row, which), np.searchsorted(sorted_row, which, side="right")
        pick = pair_order[_ranges(lo, hi)]
        at = np.minimum(np.searchsorted(local, b[pick]), len(local) - 1)
        found = local[at] == b[pick]
        rows = rank[row[pick]]
        d = np.where(found, dist[rows, at], np.inf)
        yield pick, d, ((pred, local, rows, at) if paths else None)


def _ranges(lo, hi) -> np.ndarray:
    """The concatenation of ``arange(lo[i], hi[i])``, vectorised."""
    n = np.maximum(np.asarray(hi) - np.asarray(lo), 0)
    total = int(n.sum())
    if not total:
        return np.zeros(0, np.int64)
    return np.repeat(np.asarray(lo) - np.cumsum(n) + n, n) + np.arange(total)


def node_distances(matrix, x, y, a, b, limit_m: float) -> np.ndarray:
    """Shortest distance from node ``a[i]`` to node ``b[i]`` of the symmetric ``matrix`` (element-wise), inf where
    it is over ``limit_m`` or there is no path (:func:`_searches`)."""
    out = np.full(len(np.asarray(a).ravel()), np.inf)
    for pick, d, _ in _searches(matrix, x, y, a, b, limit_m, paths=False):
        out[pick] = d
    return out


def node_paths(matrix, x, y, a, b, limit_m: float):
    """The shortest path from node ``a[i]`` to node ``b[i]`` (element-wise) as ragged arrays ``(offsets, nodes)``:
    path i is ``nodes[offsets[i]:offsets[i + 1]]``, ``a[i]`` first and ``b[i]`` last (one node when they are equal,
    none when b is over ``limit_m`` away or unreachable); and the distances. Vectorised over the pairs: one NumPy
    step per node of the longest path of a pass."""
    a = np.asarray(a, dtype=np.int64).ravel()
    dist = np.full(len(a), np.inf)
    found = [[], [], []]
    for pick, d, (pred, local, rows, at) in _searches(matrix, x, y, a, b, limit_m, paths=True):
        dist[pick] = d
        trace_back(pick, at, np.isfinite(d), lambda idx, cur: pred[rows[idx], cur], names=local, found=found)
    return ragged_paths(len(a), found) + (dist,)


def near_pairs_estimate(matrix, x, y, limit_m: float, probes: int = 32) -> float:
    """The number of node pairs of the symmetric ``matrix`` within ``limit_m`` of each other, estimated from the
    searches of ``probes`` nodes spread evenly over the node numbering (a function of the public network only)."""
    n = matrix.shape[0]
    if n == 0:
        return 0.0
    sources = np.unique(np.linspace(0, n - 1, min(probes, n)).astype(np.int64))
    reached = sum(int(np.isfinite(dist).sum()) for _, _, dist, _ in
                  tile_passes(matrix, x, y, sources, limit_m, False))
    return reached / len(sources) * n


@dataclass(frozen=True, eq=False)
class NearTable:
    """Every junction-to-junction road distance up to ``limit_m``, with the junction before b on that path
    (``pred``, -1 at a itself), kept in the slots of a hash table of the pairs' keys ``a * n + b``
    (:func:`hash_table`): below 2^32 keys, each distance (float32) packed beside its key in the slot's word
    (:meth:`HashTable.pack`; one read finds both), else in ``dist``. Memory: 12 bytes per slot, 2 to 4 slots per
    pair (downtown San Francisco: 2.97 million pairs within 1 km in 8.4 million slots, 101 MB)."""

    limit_m: float
    n: int
    table: "HashTable"
    dist: np.ndarray | None
    pred: np.ndarray
    longest: float          # the longest distance kept

    @classmethod
    def build(cls, matrix, x, y, limit_m: float) -> "NearTable":
        """The table of the symmetric junction graph ``matrix`` (junctions at plane coordinates ``x``, ``y``)."""
        n = matrix.shape[0]
        keys, dists, preds = [], [], []
        if n:
            for which, local, dist, pred in tile_passes(matrix, x, y, np.arange(n), limit_m, True):
                r, col = np.nonzero(np.isfinite(dist))
                keys.append(which[r] * n + local[col])
                dists.append(dist[r, col].astype(np.float32))
                p = pred[r, col]
                preds.append(np.where(p >= 0, local[np.maximum(p, 0)], -1).astype(np.int32))
        key = np.concatenate(keys) if keys else np.zeros(0, np.int64)
        table, slot = hash_table(key, n * n)
        dist = np.full(len(table.slots), np.inf, np.float32)
        pred = np.full(len(table.slots), -1, np.int32)
        if keys:
            dist[slot], pred[slot] = np.concatenate(dists), np.concatenate(preds)
        longest = float(dist[slot].max()) if len(slot) else 0.0
        if table.slots.dtype == np.uint32:
            return cls(float(limit_m), n, table.pack(dist), None, pred, longest)
        return cls(float(limit_m), n, table, dist, pred, longest)

    def _find(self, a, b):
        return self.table.find(np.asarray(a, dtype=np.int64) * self.n + np.asarray(b, dtype=np.int64))

    def distances(self, a, b, limit_m: float) -> np.ndarray:
        """Road distance from junction ``a`` to ``b`` (arrays broadcast against each other; float32, inf beyond
        ``limit_m``); junction indices, not checked (the callers read them from the chains' ends)."""
        key = np.asarray(a, dtype=np.int64) * self.n + np.asarray(b, dtype=np.int64)
        if self.dist is None:      # packed: the distance's bits in each word's high half (inf where absent)
            d = (self.table.words(key.view(np.uint64).ravel())[1] >> np.uint64(32)).astype(np.uint32)
            d = d.view(np.float32).reshape(key.shape)
        else:
            pos, found = self.table.find(key)
            d = np.where(found, self.dist[pos] if len(self.dist) else np.inf, np.inf).astype(np.float32)
            d = d.reshape(key.shape)
        return d if limit_m >= self.longest else np.where(d <= np.float64(limit_m), d, np.float32(np.inf))

    def paths(self, a, b, limit_m: float):
        a, b = np.asarray(a, dtype=np.int64).ravel(), np.asarray(b, dtype=np.int64).ravel()
        dist = self.distances(a, b, limit_m).astype(np.float64)
        if self.dist is None:      # packed: every key sought is there (its distance is finite)
            an = a * self.n
            prev_of = lambda idx, cur: self.pred[self.table.words((an[idx] + cur).view(np.uint64))[0]]  # noqa
        else:
            prev_of = lambda idx, cur: self.pred[self._find(a[idx], cur)[0]]  # noqa: E731
        found = trace_back(np.arange(len(a)), b, np.isfinite(dist), prev_of)
        return ragged_paths(len(a), found) + (dist,)


@dataclass(frozen=True, eq=False)
class TileTable:
    """Every junction-to-junction distance up to ``limit_m`` as the tile searches (:func:`tile_subgraphs`) return
    them: each source's row of distances (float32, inf beyond ``limit_m``) and predecessors (indices in its tile's
    subgraph, negative at the source and where unreached) over its tile's subgraph and one entry more (inf, -1),
    the rows one after another in ``dist`` / ``pred`` from ``row_start``; ``col[tile * n + j]`` is junction j's
    index in a tile's subgraph, or the size of the subgraph (the row's last entry: inf) where j is not in it, so
    farther than ``limit_m`` from every source of the tile. Nothing is sorted or hashed per pair: it is built in
    about the searches' time, and a look-up is two direct reads. The same searches as :class:`NearTable`'s, so the
    same distances and paths. Memory: 4 + 2 bytes (4 + 4 past 32,766 nodes in a subgraph) per source and node of
    its subgraph, and 2 (4) per tile and junction."""

    limit_m: float
    n: int
    tile_n: np.ndarray        # each junction's tile (as a source) times n
    row_start: np.ndarray     # where its row starts in dist and pred
    local_start: np.ndarray   # where each tile's nodes start in ``local`` (n_tiles + 1)
    local: np.ndarray         # the tiles' subgraph nodes, one tile after another
    col: np.ndarray
    dist: np.ndarray
    pred: np.ndarray

    @classmethod
    def build(cls, matrix, x, y, limit_m: float, max_entries: int) -> "TileTable | None":
        """The table of the symmetric junction graph ``matrix`` (junctions at plane coordinates ``x``, ``y``), or
        None when its rows, or its ``col``, would hold more than ``max_entries`` entries (then nothing is
        searched: the subgraphs' sizes are counted first)."""
        n = matrix.shape[0]
        if not n:
            return None
        tiles = _tiles(x, y, np.arange(n), limit_m)
        groups, centres, reach, tree = tiles
        sizes = np.asarray(tree.query_ball_point(centres, reach, return_length=True), np.int64)
        counts = np.array([len(which) for which in groups], np.int64)
        if int(sizes @ counts) > max_entries or len(groups) * n > max_entries:
            return None
        kind = np.int16 if sizes.max() < (1 << 15) - 1 else np.int32
        dist, pred = np.empty(int((sizes + 1) @ counts), np.float32), np.empty(int((sizes + 1) @ counts), kind)
        tile, row_start = np.empty(n, np.int64), np.empty(n, np.int64)
        col = np.repeat(sizes.astype(kind), n)          # not in the tile's subgraph: the row's last entry
        at, locals_ = 0, []
        for t, (in_tile, local, sub) in enumerate(tile_subgraphs(matrix, x, y, np.arange(n), limit_m, tiles)):
            locals_.append(local)
            col[t * n + local] = np.arange(len(local))
            for c0 in range(0, len(in_tile), SOURCES_PER_PASS):
                which = in_tile[c0:c0 + SOURCES_PER_PASS]
                d, p = csgraph.dijkstra(sub, directed=True, indices=np.searchsorted(local, which),
                                        limit=float(limit_m), return_predecessors=True)
                size = d.size + len(which)
                rows_d, rows_p = dist[at:at + size].reshape(len(which), -1), pred[at:at + size].reshape(len(which), -1)
                rows_d[:, :-1], rows_d[:, -1], rows_p[:, :-1], rows_p[:, -1] = d, np.inf, p, -1
                tile[which], row_start[which] = t, at + np.arange(len(which)) * (len(local) + 1)
                at += size
        local_start = np.concatenate([[0], np.cumsum([len(local) for local in locals_])]).astype(np.int64)
        return cls(float(limit_m), n, tile * n, row_start, local_start, np.concatenate(locals_), col, dist, pred)

    def distances(self, a, b, limit_m: float) -> np.ndarray:
        """Road distance from junction ``a`` to ``b`` (arrays broadcast against each other; float32, inf beyond
        ``limit_m``); junction indices, not checked (the callers read them from the chains' ends)."""
        a = np.asarray(a, dtype=np.int64)
        d = self.dist[self.row_start[a] + self.col[self.tile_n[a] + b]]
        return d if limit_m >= self.limit_m else np.where(d <= np.float64(limit_m), d, np.float32(np.inf))

    def paths(self, a, b, limit_m: float):
        """The path from junction ``a[i]`` to ``b[i]`` as :func:`node_paths` gives it (the same searches' paths)."""
        a, b = np.asarray(a, dtype=np.int64).ravel(), np.asarray(b, dtype=np.int64).ravel()
        dist = self.distances(a, b, limit_m).astype(np.float64)
        first = self.local_start[self.tile_n[a] // self.n]   # each path's tile's nodes start here in ``local``
        row = self.row_start[a] - first                       # row + a node's place there: its entry

        def prev_of(idx, cur):
            p = self.pred[row[idx] + cur].astype(np.int64)
            return np.where(p >= 0, p + first[idx], -1)

        found = trace_back(np.arange(len(a)), first + self.col[self.tile_n[a] + b], np.isfinite(dist), prev_of,
                           names=self.local)
        return ragged_paths(len(a), found) + (dist,)


_HASH_MUL = np.uint64(0x9E3779B97F4A7C15)      # Fibonacci hashing: 2^64 over the golden ratio, odd
_LOW = np.uint64(0xFFFFFFFF)                     # a packed word's key half


@dataclass(frozen=True, eq=False)
class HashTable:
    """Distinct non-negative integer keys below ``bound``, found without a sort: open addressing with linear
    probing in ``2^bits`` slots (at least twice the keys), key k first tried at slot ``(k * 0x9E3779B97F4A7C15 mod
    2^64) >> (64 - bits)`` (Fibonacci hashing), then the next slots until it or an empty one (``-1``; uint32
    slots when ``bound`` allows, with 2^32 - 1 as empty). A caller keeps its values in slot order, or, below
    2^32, packs a 32-bit value beside each key (:meth:`pack`: uint64 words, the key in the low half). A look-up
    reads about one slot (a third of the slots filled: 1.3 probes on average), vectorised one probe per round."""

    slots: np.ndarray
    bits: int
    bound: int

    @property
    def empty(self):
        return self.slots.dtype.type(-1) if self.slots.dtype == np.int64 else self.slots.dtype.type(0xFFFFFFFF)

    def first_slot(self, key) -> np.ndarray:
        with np.errstate(over="ignore"):
            return ((np.asarray(key).astype(np.uint64) * _HASH_MUL) >> np.uint64(64 - self.bits)).astype(np.int64)

    def _keys(self, got):
        return got & _LOW if self.slots.dtype == np.uint64 else got

    def find(self, key) -> tuple[np.ndarray, np.ndarray]:
        """``(slot, found)`` of each key: its slot (meaningless where not found) and whether it is there."""
        key = np.asarray(key, dtype=np.int64).ravel()
        valid = (key >= 0) & (key < self.bound)
        want = key.astype(self.slots.dtype)
        if not valid.all():
            want[~valid] = self.empty            # sought as the empty mark: never found
        slot = self.first_slot(want)
        got = self._keys(self.slots[slot])       # the first probe, over every key at once
        found = (got == want) & valid
        todo = np.flatnonzero(~found & (got != self.empty) & valid)
        mask = (1 << self.bits) - 1
        while len(todo):
            slot[todo] = (slot[todo] + 1) & mask
            got = self._keys(self.slots[slot[todo]])
            hit = got == want[todo]
            found[todo[hit]] = True
            todo = todo[~hit & (got != self.empty)]
        return slot, found

    def pack(self, values) -> "HashTable":
        """This table (uint32 slots) with ``values`` (32 bits each, in slot order) packed beside the keys: uint64
        words, the value's bits in the high half (an empty slot keeps its value too)."""
        words = np.ascontiguousarray(values).view(np.uint32).astype(np.uint64)
        words <<= np.uint64(32)                   # in place: the table's size in words, no more
        words |= self.slots
        return HashTable(words, self.bits, self.bound)

    def words(self, key) -> tuple[np.ndarray, np.ndarray]:
        """``(slot, word)`` of each key in a packed table (:meth:`pack`): its slot and word, or the empty slot's
        that ends its search where it is absent; one read per probe. ``key``: uint64, each below ``bound`` (not
        checked)."""
        with np.errstate(over="ignore"):
            slot = ((key * _HASH_MUL) >> np.uint64(64 - self.bits)).astype(np.intp)
        got = self.slots[slot]
        k = got & _LOW
        todo = np.flatnonzero((k != key) & (k != _LOW))
        mask = (1 << self.bits) - 1
        while len(todo):
            slot[todo] = (slot[todo] + 1) & mask
            g = self.slots[slot[todo]]
            got[todo] = g
            k = g & _LOW
            todo = todo[(k != key[todo]) & (k != _LOW)]
        return slot, got


def hash_table(key, bound: int) -> tuple[HashTable, np.ndarray]:
    """The :class:`HashTable` of distinct keys in ``[0, bound)``, and each key's slot (its value goes there)."""
    key = np.asarray(key, dtype=np.int64).ravel()
    bits = max(int(2 * len(key)).bit_length(), 1)
    dtype = np.uint32 if bound < 1 << 32 else np.int64
    table = HashTable(np.full(1 << bits, -1, np.int64).astype(dtype), bits, int(bound))
    want = key.astype(dtype)
    slot = table.first_slot(want)
    todo = np.arange(len(key))
    mask = (1 << bits) - 1
    while len(todo):              # each round: every key still out tries its slot; one of the keys on a free slot
        s = slot[todo]            # gets it, the others try the next slot
        free = table.slots[s] == table.empty
        table.slots[s[free]] = want[todo[free]]
        placed = free & (table.slots[s] == want[todo])
        todo = todo[~placed]
        slot[todo] = (slot[todo] + 1) & mask
    return table, slot


__all__ = ["HashTable", "NearTable", "SOURCES_PER_PASS", "TileTable", "hash_table", "near_pairs_estimate",
           "node_distances", "node_paths", "tile_passes", "tile_subgraphs"]
