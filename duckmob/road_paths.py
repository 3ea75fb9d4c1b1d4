"""Road distances and road paths between points on a public road network, and trajectories walked along them.

A position on the network is ``(segment, t)``: the fraction t in [0, 1] along the segment from its (lat1, lon1)
end, as :func:`duckmob.roads.snap` and :meth:`duckmob.roads.Placer.draw` give it.

**Chains.** Most nodes of a road graph only join two segments (the shape points of a curve: 76% of downtown San
Francisco's 26,082 nodes). The graph is contracted onto its *junctions* (nodes of any other degree, plus one node
of each loop): a *chain* is a run of segments between two junctions with only degree-2 nodes inside, and every
position lies on one chain at an offset (metres from its first end). Shortest paths between junctions run on the
junction graph (one edge per chain, 4.3 times fewer nodes there), so a road distance is

    along the chain             |o_p - o_q|                              (p and q on one chain)
    out by its ends             min over the ends x, y:  d(p, x) + D(x, y) + d(y, q)

D by Dijkstra (scipy.sparse.csgraph) on the junction graph, searched up to a public ``limit_m`` on local subgraphs
(:mod:`duckmob.road_search`: exact, and a search costs what the network near it holds, not the city). Every
junction distance up to :data:`NEAR_M` is computed once per network (:class:`duckmob.road_search.TileTable`: the
searches' own rows) and looked up after (two reads, no search), which is what a release's output uses. Each
segment's chain and the offsets of its nodes are kept too, so a position's chain and offset are a look-up.

**Trajectories on roads.** :func:`route` picks, for each synthetic point, one of a few candidate positions drawn
by a released road density so that consecutive points are a short drive apart; :func:`walk` then moves the points
to equal steps along the road path through those positions (:mod:`duckmob.synth.onroads` does both): the
shortest, or on chains weighted by a released density (:mod:`duckmob.road_costs`, a ``costs`` argument) the
cheapest.

The road network is public (a declared input, never derived from the sensitive table): everything here is
post-processing of released outputs, or an evaluation tool.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from scipy import sparse
from scipy.sparse import csgraph

from duckmob.errors import DuckmobError
from duckmob.grid import EARTH_RADIUS_M, haversine_m
from duckmob.road_search import (HashTable, NearTable, TileTable, hash_table, near_pairs_estimate, node_distances,
                                  node_paths)
from duckmob.roads import points_along, snap

NEAR_M = 1_000.0           # junction distances kept per network up to this far (metres; the routes' search limit)
NEAR_MAX_ENTRIES = 24_000_000  # a TileTable of at most this many entries (6 bytes each; 8 past 32,767 nodes)
NEAR_MAX_PAIRS = 8_000_000    # else a NearTable of at most this many pairs (2^24 slots of 12 bytes: 201 MB); more:
#                               searched at each look-up


@dataclass(frozen=True, eq=False)
class Chains:
    """A road graph contracted onto its junctions (the module docstring).

    ``junction``: the graph node of each junction; ``x``, ``y``: their plane coordinates in metres; ``matrix``:
    the symmetric junction graph (the shortest chain between two junctions); ``ends``: (n_chains, 2) junction
    indices of each chain's first and second end; ``length``: each chain's length; ``node_chain`` and
    ``node_offset``: each graph node's chain and offset on it (a junction: one of the chains it ends, and
    offset -1, its mark); ``order_nodes`` / ``order_offset`` / ``order_start``: each chain's nodes in order of
    offset, first end to second (ragged, ``order_start`` the n_chains + 1 bounds); ``edge_chain``: the chain of
    each junction-graph edge in CSR order of ``matrix``."""

    junction: np.ndarray
    x: np.ndarray
    y: np.ndarray
    matrix: sparse.csr_matrix
    ends: np.ndarray
    length: np.ndarray
    node_chain: np.ndarray
    node_offset: np.ndarray
    order_nodes: np.ndarray
    order_offset: np.ndarray
    order_start: np.ndarray
    edge_chain: np.ndarray
    edge_key: np.ndarray        # min(u, v) * n_nodes + max(u, v) of each graph edge, sorted
    chain_of_edge: np.ndarray   # the chain of each of those edges
    seg_chain: np.ndarray       # each segment's chain and its two nodes' offsets on it (:meth:`position`)
    seg_from: np.ndarray
    seg_to: np.ndarray
    cost: np.ndarray | None = None   # each chain's cost per metre (None: 1, distances; duckmob.road_costs)

    def position(self, graph, segment, t) -> tuple[np.ndarray, np.ndarray]:
        """``(chain, offset)`` of positions ``(segment, t)`` on ``graph`` (the graph these chains contract): the
        chain of the segment's edge, the offset interpolated between its two nodes' (a segment whose ends are one
        node: that node's chain and offset), from the per-segment table :func:`build_chains` keeps."""
        seg = np.asarray(segment, dtype=np.int64)
        t = np.asarray(t, dtype=np.float64)
        ou, ov = self.seg_from[seg], self.seg_to[seg]
        return self.seg_chain[seg], ou + t * (ov - ou)

    def segment_ends(self, graph, seg) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each segment's chain and the offsets of its two nodes on it (the table :meth:`position` reads): the
        chain of the segment's edge, found among the sorted edge keys."""
        u, v = graph.u[seg], graph.v[seg]
        key = np.minimum(u, v) * graph.n_nodes + np.maximum(u, v)
        at = np.minimum(np.searchsorted(self.edge_key, key), max(len(self.edge_key) - 1, 0))
        on_edge = (u != v) & (self.edge_key[at] == key) if len(self.edge_key) else np.zeros(len(u), bool)
        chain = np.where(on_edge, self.chain_of_edge[at] if len(self.edge_key) else -1, self.node_chain[u])
        return chain, self._offset_on(u, chain), self._offset_on(v, chain)

    def _is_junction(self, node):
        return self.node_offset[node] < 0

    def _offset_on(self, node, chain):
        """The offset of ``node`` on ``chain`` (a node on it or one of its ends)."""
        inner = ~self._is_junction(node)
        c = np.maximum(chain, 0)
        second = self.junction[self.ends[c, 1]] == node
        end_offset = np.where(second & (self.junction[self.ends[c, 0]] != node), self.length[c], 0.0)
        return np.where(chain < 0, 0.0, np.where(inner, self.node_offset[node], end_offset))

    def _node_before(self, chain, offset) -> tuple[np.ndarray, np.ndarray]:
        """``(pos, offset)``: the position in the chains' node order of the node at or before ``offset`` metres along
        each ``chain`` (never its last node), and the offset clipped to the chain."""
        chain = np.asarray(chain, dtype=np.int64)
        offset = np.clip(np.asarray(offset, dtype=np.float64), 0.0, self.length[chain])
        scale, key = self.order_key
        pos = np.searchsorted(key, chain * scale + offset, side="right") - 1
        return np.clip(pos, self.order_start[chain], self.order_start[chain + 1] - 2), offset

    def segment_at(self, graph, chain, offset) -> np.ndarray:
        """The segment at ``offset`` metres along each ``chain`` (the edge between its two nodes around it)."""
        pos, _ = self._node_before(chain, offset)
        return graph.segment_between(self.order_nodes[pos], self.order_nodes[pos + 1])

    def point_at(self, graph, chain, offset) -> tuple[np.ndarray, np.ndarray]:
        """(lat, lon) at ``offset`` metres along each ``chain`` (linear between its nodes)."""
        pos, offset = self._node_before(chain, offset)
        o0, o1 = self.order_offset[pos], self.order_offset[pos + 1]
        f = np.where(o1 > o0, (offset - o0) / np.maximum(o1 - o0, 1e-12), 0.0)
        a, b = self.order_nodes[pos], self.order_nodes[pos + 1]
        return (graph.node_lat[a] + f * (graph.node_lat[b] - graph.node_lat[a]),
                graph.node_lon[a] + f * (graph.node_lon[b] - graph.node_lon[a]))

    @cached_property
    def near(self) -> "TileTable | NearTable | None":
        """Every road distance between junctions up to :data:`NEAR_M` (built once per network, or per weighting):
        the tile searches' own rows (:class:`duckmob.road_search.TileTable`) when they hold at most
        :data:`NEAR_MAX_ENTRIES` entries, else a hash table of the pairs (:class:`duckmob.road_search.NearTable`)
        when it holds at most :data:`NEAR_MAX_PAIRS`, else None (a dense network over a wide area): then every
        look-up searches (:func:`node_distances`), slower, in memory bounded by a tile's subgraph. The three give
        the same distances and paths."""
        tiles = TileTable.build(self.matrix, self.x, self.y, NEAR_M, NEAR_MAX_ENTRIES)
        if tiles is not None:
            return tiles
        if near_pairs_estimate(self.matrix, self.x, self.y, NEAR_M) > NEAR_MAX_PAIRS:
            return None
        return NearTable.build(self.matrix, self.x, self.y, NEAR_M)

    def distances(self, a, b, limit_m: float) -> np.ndarray:
        """Road distance from junction ``a`` to ``b`` (arrays broadcast against each other; inf beyond
        ``limit_m``): float32 from the kept table, float64 when searched."""
        if self.near is not None and limit_m <= self.near.limit_m:
            return self.near.distances(a, b, limit_m)
        a, b = np.broadcast_arrays(a, b)
        return node_distances(self.matrix, self.x, self.y, a.ravel(), b.ravel(), limit_m).reshape(a.shape)

    def paths(self, a, b, limit_m: float):
        """Junction paths from ``a[i]`` to ``b[i]``, as :func:`node_paths` gives them."""
        if self.near is not None and limit_m <= self.near.limit_m:
            return self.near.paths(a, b, limit_m)
        return node_paths(self.matrix, self.x, self.y, a, b, limit_m)

    @cached_property
    def order_key(self) -> tuple[float, np.ndarray]:
        """``(scale, chain * scale + offset)`` of each chain's nodes in order (sorted; scale over every length)."""
        scale = float(self.length.max(initial=0.0)) + 1.0
        counts = np.diff(self.order_start)
        return scale, np.repeat(np.arange(len(counts)), counts) * scale + self.order_offset

    @cached_property
    def csr_key(self) -> np.ndarray:
        """``row * n_junctions + column`` of each junction-graph edge in CSR order of ``matrix`` (sorted)."""
        nj = len(self.junction)
        return np.repeat(np.arange(nj), np.diff(self.matrix.indptr)) * nj + self.matrix.indices

    @cached_property
    def hop_table(self) -> HashTable | None:
        """The junction-graph edges' keys (:attr:`csr_key`) with each edge's chain packed beside it (None over
        2^32 keys: :meth:`hop_chain` searches the sorted keys then)."""
        nj = len(self.junction)
        if nj * nj >= 1 << 32:
            return None
        table, slot = hash_table(self.csr_key, nj * nj)
        chain = np.full(len(table.slots), -1, np.int32)
        chain[slot] = self.edge_chain
        return table.pack(chain)

    def hop_chain(self, j0, j1) -> np.ndarray:
        """The chain of each junction-graph edge ``j0[i] -> j1[i]`` (edges that exist)."""
        key = np.asarray(j0, dtype=np.int64) * len(self.junction) + np.asarray(j1, dtype=np.int64)
        if self.hop_table is None:
            return self.edge_chain[np.searchsorted(self.csr_key, key)]
        word = self.hop_table.words(key.view(np.uint64))[1]
        return (word >> np.uint64(32)).astype(np.uint32).view(np.int32).astype(np.int64)


def chains_of(roads) -> Chains:
    """The :class:`Chains` of a :class:`duckmob.roads.Roads` (built on first use, then kept with the network)."""
    got = roads.__dict__.get("_chains")
    if got is None:
        got = roads.__dict__["_chains"] = build_chains(roads.graph)
    return got


def build_chains(graph) -> Chains:
    """The graph's :class:`Chains` (a function of the public network only; built once per network)."""
    n = graph.n_nodes
    m = graph.matrix.tocsr()
    deg = np.diff(m.indptr)
    upper = sparse.triu(m, k=1).tocoo()
    ea, eb, el = upper.row.astype(np.int64), upper.col.astype(np.int64), upper.data.astype(np.float64)
    by_key = np.argsort(ea * n + eb)
    ea, eb, el = ea[by_key], eb[by_key], el[by_key]
    junction = deg != 2
    for _ in range(3):      # loops: a chain must have two distinct ends; make one more node of a loop a junction
        chain, ends_ok, first_inner = _chains_of(n, ea, eb, junction)
        if ends_ok.all():
            break
        junction = junction.copy()
        junction[first_inner[~ends_ok]] = True
    else:
        raise DuckmobError("roads: could not contract the road graph (a loop without ends)")
    n_chains = int(chain.max()) + 1 if len(chain) else 0
    length = np.bincount(chain, weights=el, minlength=n_chains)
    # each chain's two ends: the junction endpoints of its edges, in edge order
    side_chain = np.concatenate([chain, chain])
    side_node = np.concatenate([ea, eb])
    at_end = junction[side_node]
    order = np.lexsort((np.arange(len(side_chain))[at_end], side_chain[at_end]))
    end_nodes = side_node[at_end][order].reshape(n_chains, 2)
    jid = np.full(n, -1, np.int64)
    jnodes = np.flatnonzero(junction)
    jid[jnodes] = np.arange(len(jnodes))
    ends = jid[end_nodes]
    # offsets of the inner nodes: Dijkstra from every junction on a graph that cannot enter a junction, so each
    # inner node is reached along its own chain only, from its nearer end
    keep = ~junction[m.indices]
    rows = np.repeat(np.arange(n), deg)
    inward = sparse.csr_matrix((m.data[keep], (rows[keep], m.indices[keep])), shape=(n, n))
    node_chain = np.full(n, -1, np.int64)
    node_chain[ea] = chain
    node_chain[eb] = chain
    node_offset = np.full(n, -1.0)
    inner = np.flatnonzero(~junction)
    if len(jnodes) and len(inner):
        dist, _, src = csgraph.dijkstra(inward, directed=True, indices=jnodes, min_only=True,
                                        return_predecessors=True)
        c = node_chain[inner]
        from_first = src[inner] == end_nodes[c, 0]
        node_offset[inner] = np.where(from_first, dist[inner], length[c] - dist[inner])
    # a junction's chain: any chain it ends (node_chain above holds one of them already)
    # each chain's nodes in order of offset: its first end, its inner nodes, its second end
    cn = np.concatenate([end_nodes[:, 0], inner, end_nodes[:, 1]])
    cc = np.concatenate([np.arange(n_chains), node_chain[inner], np.arange(n_chains)])
    co = np.concatenate([np.zeros(n_chains), node_offset[inner], length])
    o = np.lexsort((co, cc))
    order_start = np.concatenate([[0], np.cumsum(np.bincount(cc, minlength=n_chains))]).astype(np.int64)
    matrix, edge_chain = junction_graph(ends, length, len(jnodes))
    x, y = _plane(graph.node_lat[jnodes], graph.node_lon[jnodes], graph)
    none = np.zeros(0)
    ch = Chains(junction=jnodes, x=x, y=y, matrix=matrix, ends=ends, length=length, node_chain=node_chain,
                node_offset=node_offset, order_nodes=cn[o], order_offset=co[o], order_start=order_start,
                edge_chain=edge_chain, edge_key=ea * n + eb, chain_of_edge=chain, seg_chain=none, seg_from=none,
                seg_to=none)
    seg_chain, seg_from, seg_to = ch.segment_ends(graph, np.arange(len(graph.u)))
    return dataclasses.replace(ch, seg_chain=seg_chain, seg_from=seg_from, seg_to=seg_to)


def junction_graph(ends, weight, nj: int) -> tuple[sparse.csr_matrix, np.ndarray]:
    """The symmetric junction graph of chains with ``ends`` ((n_chains, 2) junction indices) and ``weight`` (their
    lengths, or costs): per pair of ends, the chain of least weight (the lowest index among equals); and each
    edge's chain in CSR order (by row, then column)."""
    n_chains = len(ends)
    a, b = ends[:, 0], ends[:, 1]
    pa_, pb_ = np.concatenate([a, b]), np.concatenate([b, a])
    pc = np.concatenate([np.arange(n_chains), np.arange(n_chains)])
    pl = np.concatenate([weight, weight])
    srt = np.lexsort((pc, pl, pb_, pa_))
    pa_, pb_, pc, pl = pa_[srt], pb_[srt], pc[srt], pl[srt]
    first = np.r_[True, (pa_[1:] != pa_[:-1]) | (pb_[1:] != pb_[:-1])] if len(pa_) else np.zeros(0, bool)
    pa_, pb_, pc, pl = pa_[first], pb_[first], pc[first], pl[first]
    matrix = sparse.csr_matrix((np.maximum(pl, 1e-9), (pa_, pb_)), shape=(nj, nj))
    matrix.sort_indices()
    return matrix, pc[np.lexsort((pb_, pa_))]


def _chains_of(n, ea, eb, junction):
    """The chain of each edge (connected through degree-2 nodes), whether each chain has two distinct junction
    ends, and for each chain its lowest inner node (-1 when none)."""
    e = len(ea)
    r = np.concatenate([np.arange(e), np.arange(e)])
    c = np.concatenate([ea, eb])
    keep = ~junction[c]
    inc = sparse.csr_matrix((np.ones(int(keep.sum())), (r[keep], c[keep])), shape=(e, n))
    _, chain = csgraph.connected_components(inc @ inc.T, directed=False)
    n_chains = int(chain.max()) + 1 if e else 0
    side_chain = np.concatenate([chain, chain])
    at_end = junction[c]
    n_ends = np.bincount(side_chain[at_end], minlength=n_chains)
    lo = np.full(n_chains, np.iinfo(np.int64).max)
    hi = np.full(n_chains, -1)
    np.minimum.at(lo, side_chain[at_end], c[at_end])
    np.maximum.at(hi, side_chain[at_end], c[at_end])
    first_inner = np.full(n_chains, np.iinfo(np.int64).max)
    np.minimum.at(first_inner, side_chain[keep], c[keep])
    first_inner[first_inner == np.iinfo(np.int64).max] = -1
    ok = (n_ends == 2) & (lo != hi)
    ok |= first_inner < 0                     # a single edge between two junctions always has its ends
    return chain, ok, first_inner


def _plane(lat, lon, graph) -> tuple[np.ndarray, np.ndarray]:
    """A local equirectangular plane in metres (one per graph: its mean latitude)."""
    lat0 = float(np.mean(graph.node_lat)) if graph.n_nodes else 0.0
    ky = math.radians(1.0) * EARTH_RADIUS_M
    return np.asarray(lon) * ky * math.cos(math.radians(lat0)), np.asarray(lat) * ky


# ---------------------------------------------------------------------------------------------- road distances

def network_distance(roads, seg_a, t_a, seg_b, t_b, limit_m: float = 2_000.0, costs: Chains | None = None
                     ) -> np.ndarray:
    """The road distance in metres between positions ``(seg_a, t_a)`` and ``(seg_b, t_b)`` (element-wise; the
    module docstring), inf where it is over ``limit_m`` or the two are not connected; with ``costs``
    (:func:`duckmob.road_costs.weighted_chains` of these roads), the cost of the cheapest path instead."""
    return _Legs.between(roads, seg_a, t_a, seg_b, t_b, limit_m, costs).dist


@dataclass(frozen=True, eq=False)
class _Legs:
    """How each pair of positions is joined: its distance, the ends (0/1) it leaves and enters its chains by,
    whether it runs along one chain, the chains and offsets."""

    dist: np.ndarray
    exit_end: np.ndarray
    entry_end: np.ndarray
    along: np.ndarray
    chain_a: np.ndarray
    off_a: np.ndarray
    chain_b: np.ndarray
    off_b: np.ndarray

    @classmethod
    def between(cls, roads, seg_a, t_a, seg_b, t_b, limit_m: float, costs: Chains | None = None) -> "_Legs":
        graph, ch = roads.graph, (chains_of(roads) if costs is None else costs)
        seg_a, seg_b = np.asarray(seg_a, dtype=np.int64).ravel(), np.asarray(seg_b, dtype=np.int64).ravel()
        t_a, t_b = np.asarray(t_a, dtype=np.float64).ravel(), np.asarray(t_b, dtype=np.float64).ravel()
        if not (len(seg_a) == len(t_a) == len(seg_b) == len(t_b)):
            raise DuckmobError("network_distance: the four arrays must have the same length")
        return cls.of(ch, *ch.position(graph, seg_a, t_a), *ch.position(graph, seg_b, t_b), limit_m)

    @classmethod
    def of(cls, ch: Chains, ca, oa, cb, ob, limit_m: float) -> "_Legs":
        """The legs between positions given as (chain, offset) (:meth:`Chains.position`)."""
        valid = (ca >= 0) & (cb >= 0)
        along = valid & (ca == cb)
        total = _via(ch, ca, oa, cb, ob, limit_m).reshape(4, -1)    # the four ways: (exit end, entry end)
        total[:, ~valid] = np.inf
        best = np.argmin(total, axis=0)
        via = np.take_along_axis(total, best[None], axis=0)[0]
        direct = np.where(along, np.abs(oa - ob), np.inf)
        if ch.cost is not None:
            direct = direct * ch.cost[np.maximum(ca, 0)]
        dist = np.minimum(direct, via)
        dist = np.where(dist <= limit_m, dist, np.inf)
        return cls(dist=dist, exit_end=best >> 1, entry_end=best & 1, along=along & (direct <= via),
                   chain_a=ca, off_a=oa, chain_b=cb, off_b=ob)

    def take(self, which) -> "_Legs":
        """The legs ``which`` (a mask or indices)."""
        return _Legs(**{f.name: getattr(self, f.name)[which] for f in dataclasses.fields(self)})


def _via(ch: Chains, ca, oa, cb, ob, limit_m: float) -> np.ndarray:
    """The length of each way from positions a to positions b (chains and offsets, broadcast against each other)
    out by an end of a's chain and in by an end of b's: to that end of a's chain, the road distance between the
    two ends (inf beyond ``limit_m``), from that end of b's chain; shape ``(2, 2) + broadcast``, [exit end, entry
    end] (end 0: the chain's first). A chain -1 reads as chain 0 (the caller masks it)."""
    ca0, cb0 = np.maximum(ca, 0), np.maximum(cb, 0)
    ea, eb = ch.ends[ca0], ch.ends[cb0]
    ja, jb = np.moveaxis(ea, -1, 0)[:, None], np.moveaxis(eb, -1, 0)[None, :]      # (2, 1, ...), (1, 2, ...)
    d = ch.distances(ja, jb, limit_m)
    da = np.stack([oa, ch.length[ca0] - oa])[:, None]      # to the first and the second end of a's chain
    db = np.stack([ob, ch.length[cb0] - ob])[None, :]
    if ch.cost is not None:                                 # costs: each chain's metres at its cost per metre
        da, db = da * ch.cost[ca0], db * ch.cost[cb0]
    return d + da + db


# ---------------------------------------------------------------------------------------------- trajectories on roads

# Routed placement, public knobs: each point picks among ROUTE_CANDIDATES positions drawn by the released density
# near it, with weight exp(-detour / ROUTE_DETOUR_M) (its detour: the road distance to its neighbours less the
# straight one), in ROUTE_SWEEPS sweeps (odd points, then even ones, ...); road distances searched up to
# ROUTE_LIMIT_M (farther: no preference, and the walk joins the two points straight).
ROUTE_CANDIDATES = 4
ROUTE_SWEEPS = 2
ROUTE_DETOUR_M = 30.0
ROUTE_LIMIT_M = 1_000.0


def route(placer, offsets, lat, lon, rng: np.random.Generator, candidates: int = ROUTE_CANDIDATES,
          sweeps: int = ROUTE_SWEEPS, detour_m: float = ROUTE_DETOUR_M, limit_m: float = ROUTE_LIMIT_M, link=None):
    """Positions ``(segment, t)`` on the placer's roads for the points of trajectories ``offsets`` (ragged), so
    that consecutive points are joined by short road paths.

    Each point gets ``candidates`` positions drawn independently by ``placer`` (:meth:`duckmob.roads.Placer.draw`:
    the released road density near it) and starts with the first. Then, in ``sweeps`` sweeps over the points at
    odd positions of their trajectory, then the even ones, and so on (a point's neighbours keep their choice while
    it chooses, so a sweep is vectorised over all its points), each point takes one of its candidates with
    probability proportional to ``exp(-detour / detour_m)``: the road distance to its neighbours' positions
    (:func:`network_distance`, searched up to ``limit_m``; beyond, ``limit_m``) less the straight one, summed over
    both neighbours. ``link`` (optional; :class:`duckmob.road_flows.FlowLink`): a log-weight of each move from one
    segment to the next, added to each candidate's (times ``exp``) for the move from the point before and the
    move to the point after. Post-processing of the released model and the public roads; the draws use ``rng``
    (under a seed, the same positions)."""
    lat = np.asarray(lat, dtype=np.float64).ravel()
    lon = np.asarray(lon, dtype=np.float64).ravel()
    offsets = np.asarray(offsets, dtype=np.int64)
    n, c = len(lat), int(candidates)
    cand_seg, cand_t = placer.draw(np.repeat(lat, c), np.repeat(lon, c), rng)
    cand_seg, cand_t = cand_seg.reshape(n, c), cand_t.reshape(n, c)
    choice = np.zeros(n, np.int64)
    if c > 1 and n > 1:
        roads = placer.roads
        ch = chains_of(roads)
        cx, cy = placer.index.plane(*points_along(roads, cand_seg, cand_t))
        cc, co = (a.reshape(n, c) for a in ch.position(roads.graph, cand_seg.ravel(), cand_t.ravel()))
        counts = np.diff(offsets)
        k = np.arange(n) - np.repeat(offsets[:-1], counts)          # position within its trajectory
        size = np.repeat(counts, counts)
        for sweep in range(int(sweeps)):
            sel = np.flatnonzero((k % 2 == (sweep + 1) % 2) & (size > 1))
            cost = np.zeros((len(sel), c))
            for step, has in ((-1, k[sel] > 0), (1, k[sel] < size[sel] - 1)):
                mine = sel[has]
                nb = mine + step
                pick = choice[nb]
                road = _leg_dist(ch, cc[nb, pick], co[nb, pick], cc[mine], co[mine], limit_m)
                straight = np.hypot(cx[mine] - cx[nb, pick][:, None], cy[mine] - cy[nb, pick][:, None])
                cost[has] += np.minimum(road - straight, limit_m)
                if link is not None:
                    theirs = np.broadcast_to(cand_seg[nb, pick][:, None], (len(mine), c))
                    moves = link(theirs, cand_seg[mine]) if step < 0 else link(cand_seg[mine], theirs)
                    cost[has] -= float(detour_m) * moves
            w = np.exp(-(cost - cost.min(axis=1, keepdims=True)) / float(detour_m))
            cum = np.cumsum(w, axis=1)
            u = rng.random(len(sel)) * cum[:, -1]
            choice[sel] = np.minimum((cum < u[:, None]).sum(axis=1), c - 1)
    rows = np.arange(n)
    return cand_seg[rows, choice], cand_t[rows, choice]


def _leg_dist(ch: Chains, ca, oa, cb, ob, limit_m: float) -> np.ndarray:
    """``_Legs.of(...).dist`` from each position a (chain and offset, shape (m,)) to each of its row of positions b
    (shape (m, c)): the same sums in the same order, without the ends each leg takes."""
    valid = (ca >= 0)[:, None] & (cb >= 0)
    along = valid & (ca[:, None] == cb)
    via = np.minimum.reduce(_via(ch, ca[:, None], oa[:, None], cb, ob, limit_m).reshape((4,) + cb.shape))
    via[~valid] = np.inf
    direct = np.where(along, np.abs(oa[:, None] - ob), np.inf)
    if ch.cost is not None:
        direct = direct * ch.cost[np.maximum(ca, 0)][:, None]
    dist = np.minimum(direct, via)
    return np.where(dist <= limit_m, dist, np.inf)


def walk(roads, offsets, seg, t, limit_m: float = ROUTE_LIMIT_M, costs: Chains | None = None
         ) -> tuple[np.ndarray, np.ndarray]:
    """(lat, lon) of each trajectory's points (ragged ``offsets``) moved to equal steps along the road path through
    its positions ``(seg, t)``: consecutive positions joined by their shortest road path (searched up to
    ``limit_m``); two farther apart, or not connected, are joined straight and the points that fall on that
    stretch go to their nearest road. The same number of points, the first and last where they were: every point
    on a road, and consecutive points joined by a road, as a vehicle's fixes are. With ``costs`` (these roads'
    chains weighted by :func:`duckmob.road_costs.weighted_chains`), a leg whose cheapest path costs at most
    ``limit_m`` takes that path instead (the others their shortest); the points are still spaced by length along
    it. A function of the positions, the public roads and ``costs`` only (post-processing), each trajectory's of its
    own positions only, bit for bit."""
    offsets = np.asarray(offsets, dtype=np.int64)
    seg, t = np.asarray(seg, dtype=np.int64), np.asarray(t, dtype=np.float64)
    lat, lon = points_along(roads, seg, t)
    counts = np.diff(offsets)
    traj = np.repeat(np.arange(len(counts)), counts)
    # consecutive points of one trajectory at two positions (a leg between equal positions is a piece of length 0:
    # points between two anchors share the earlier one's position, 80% of the legs of dense traces)
    a = np.flatnonzero((traj[:-1] == traj[1:]) & ((seg[:-1] != seg[1:]) | (t[:-1] != t[1:])))
    if not len(a):
        return lat, lon
    pa, chain, o0, o1 = _legs(roads, seg, t, a, limit_m, costs)
    pb = pa + 1
    plen = np.abs(o1 - o0)
    jump = np.flatnonzero(chain < 0)                          # straight: the great-circle length
    plen[jump] = haversine_m(lat[pa[jump]], lon[pa[jump]], lat[pb[jump]], lon[pb[jump]])
    # arc length along each trajectory's pieces, in whole micrometres: the running sum over the block is exact
    # integers, so each trajectory's share of it (less its start's) carries nothing of the trajectories before it;
    # its points at equal steps of it
    piece_traj = traj[pa]
    first = np.searchsorted(piece_traj, np.arange(len(counts)))
    last = np.searchsorted(piece_traj, np.arange(len(counts)), side="right") - 1
    um = np.round(plen * 1e6).astype(np.int64)
    cum = np.cumsum(um)
    start = cum - um
    has = first <= last
    base = np.where(has, start[np.minimum(first, len(start) - 1)], 0)
    total = np.where(has, cum[np.minimum(last, len(cum) - 1)], 0) - base
    moved = np.flatnonzero(has[traj])
    mt = traj[moved]
    k = moved - offsets[:-1][mt]
    target = base[mt] + np.floor(k / np.maximum(counts[mt] - 1, 1) * total[mt]).astype(np.int64)   # its own
    at = np.clip(np.searchsorted(cum, target, side="left"), first[mt], last[mt])
    f = np.clip((target - start[at]) / np.maximum(um[at], 1), 0.0, 1.0)
    c = chain[at]
    on_lat, on_lon = chains_of(roads).point_at(roads.graph, np.maximum(c, 0), o0[at] + f * (o1[at] - o0[at]))
    straight_lat = lat[pa[at]] + f * (lat[pb[at]] - lat[pa[at]])
    straight_lon = lon[pa[at]] + f * (lon[pb[at]] - lon[pa[at]])
    out_lat, out_lon = lat.copy(), lon.copy()
    out_lat[moved] = np.where(c >= 0, on_lat, straight_lat)
    out_lon[moved] = np.where(c >= 0, on_lon, straight_lon)
    jumped = moved[(c < 0) & (f > 0) & (f < 1)]
    if len(jumped):                                          # off a road on a straight stretch: to the nearest
        _, _, out_lat[jumped], out_lon[jumped], _ = snap(roads, out_lat[jumped], out_lon[jumped])
    return out_lat, out_lon


def leg_chains(roads, offsets, seg, t, limit_m: float = ROUTE_LIMIT_M, costs: Chains | None = None):
    """The road path between each trajectory's consecutive positions ``(seg, t)`` (ragged ``offsets``), as the
    stretches of chain it runs along in order: ``(point, chain, from, to)``, ``point`` the index of the leg's first
    position, ``from`` / ``to`` offsets on ``chain`` (chain -1: no road path within ``limit_m``, a straight jump).
    The paths of :func:`walk` (the shortest, or with ``costs`` the cheapest); a function of the positions, the
    public roads and ``costs`` only."""
    offsets = np.asarray(offsets, dtype=np.int64)
    seg, t = np.asarray(seg, dtype=np.int64), np.asarray(t, dtype=np.float64)
    counts = np.diff(offsets)
    traj = np.repeat(np.arange(len(counts)), counts)
    return _legs(roads, seg, t, np.flatnonzero(traj[:-1] == traj[1:]), limit_m, costs)


def _legs(roads, seg, t, a, limit_m: float, costs: Chains | None):
    """The pieces of the legs from position ``a[i]`` to position ``a[i] + 1`` (:func:`leg_chains`' four arrays):
    the one place both it and :func:`walk` find them."""
    ch = chains_of(roads)
    pc, po = ch.position(roads.graph, seg, t)                   # each position's once, for both of its legs
    pair, chain, o0, o1 = _leg_pieces(ch, costs, pc[a], po[a], pc[a + 1], po[a + 1], limit_m)
    return a[pair], chain, o0, o1


def _leg_pieces(ch: Chains, costs: Chains | None, ca, oa, cb, ob, limit_m: float):
    """:func:`_pieces_of` the legs from positions a to positions b (chains and offsets): each leg's shortest road
    path, or with ``costs``, its cheapest where that costs at most ``limit_m`` (the others: their shortest)."""
    if costs is None:
        return _pieces_of(ch, _Legs.of(ch, ca, oa, cb, ob, limit_m), limit_m)
    cheap = _Legs.of(costs, ca, oa, cb, ob, limit_m)
    on = np.isfinite(cheap.dist)
    got = [(np.flatnonzero(on), costs, cheap.take(on)), (np.flatnonzero(~on), ch, None)]
    parts = []
    for idx, chains, legs in got:
        if legs is None:
            legs = _Legs.of(ch, ca[idx], oa[idx], cb[idx], ob[idx], limit_m)
        pair, chain, o0, o1 = _pieces_of(chains, legs, limit_m)
        parts.append((idx[pair], chain, o0, o1))
    pair, chain, o0, o1 = (np.concatenate(x) for x in zip(*parts))
    order = np.argsort(pair, kind="stable")                   # each leg's pieces come from one of the two, in order
    return pair[order], chain[order], o0[order], o1[order]


def _pieces_of(ch: Chains, legs: _Legs, limit_m: float):
    """The pieces of chain each pair's road path runs along, in order: ``(pair, chain, from, to)`` offsets on the
    chain (chain -1: a straight jump, for a pair with no road path within ``limit_m``)."""
    m = len(legs.dist)
    routed = np.isfinite(legs.dist) & ~legs.along
    # the junction path of each routed pair, from its exit end to its entry end
    ja = ch.ends[np.maximum(legs.chain_a, 0), legs.exit_end]
    jb = ch.ends[np.maximum(legs.chain_b, 0), legs.entry_end]
    r = np.flatnonzero(routed)
    poff, pnodes, _ = ch.paths(ja[r], jb[r], limit_m)
    hops = np.maximum(np.diff(poff) - 1, 0)                   # junction hops of each routed pair
    has_hop = np.ones(len(pnodes), bool)
    has_hop[poff[1:][np.diff(poff) > 0] - 1] = False
    h = np.flatnonzero(has_hop)
    j0, j1 = pnodes[h], pnodes[h + 1]
    hop_chain = ch.hop_chain(j0, j1)
    forward = ch.ends[hop_chain, 0] == j0
    hop_from = np.where(forward, 0.0, ch.length[hop_chain])
    hop_to = np.where(forward, ch.length[hop_chain], 0.0)
    # each pair's pieces in order, written where they go: along its chain (a pair whose road path runs along one
    # chain) and a straight jump (no road path within limit_m; after the first when a pair has both), or the
    # stretch out of a's chain, its hops, the stretch into b's
    far = ~np.isfinite(legs.dist)
    count = legs.along.astype(np.int64) + far
    count[r] += 2 + hops
    start = np.cumsum(count) - count
    pair = np.repeat(np.arange(m), count)
    chain = np.empty(len(pair), np.int64)
    o0, o1 = np.empty(len(pair)), np.empty(len(pair))
    at = start[legs.along]
    chain[at], o0[at], o1[at] = legs.chain_a[legs.along], legs.off_a[legs.along], legs.off_b[legs.along]
    at = start[far] + legs.along[far]
    chain[at], o0[at], o1[at] = -1, 0.0, 0.0
    end_off = lambda c, e: np.where(e == 0, 0.0, ch.length[np.maximum(c, 0)])   # noqa: E731
    at = start[r]
    chain[at], o0[at], o1[at] = legs.chain_a[r], legs.off_a[r], end_off(legs.chain_a[r], legs.exit_end[r])
    at = np.repeat(start[r] + 1 - (np.cumsum(hops) - hops), hops) + np.arange(len(h))
    chain[at], o0[at], o1[at] = hop_chain, hop_from, hop_to
    at = start[r] + 1 + hops
    chain[at], o0[at], o1[at] = legs.chain_b[r], end_off(legs.chain_b[r], legs.entry_end[r]), legs.off_b[r]
    return pair, chain, o0, o1


__all__ = ["Chains", "build_chains", "chains_of", "leg_chains", "network_distance", "node_distances", "node_paths",
           "route", "walk"]
