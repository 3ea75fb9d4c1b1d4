"""Sampling of the fine-placement stage (post-processing of its released :class:`~.releases.FineStats`): where
synthetic points go inside the method's coarse cells, the street-level route between consecutive coarse cells,
and the spacing of points along it.

1. *Anchors*: the ``anchors`` fine cells of highest released density inside each coarse cell (a coarse cell with
   no mass keeps its central fine cell). A trajectory starts at an anchor of its first coarse cell, drawn in
   proportion to the density.
2. *Routes*: from the current anchor in coarse cell A to the next coarse cell B, the most probable path over the
   fine cells of A and B: the shortest path where entering a fine cell costs ``-log p`` (``p`` its share of the
   released density, floored) times the step length, ending at whichever anchor of B is cheapest to reach (the
   clean-slate paper's idea; one multi-source Dijkstra in ``scipy.sparse.csgraph`` over a block-diagonal graph
   of every coarse move used at once). The last leg runs inside the last cell, from where the route arrived to
   an anchor drawn by density (one Dijkstra per anchor number), so trajectories end where trips end, not at the
   border nearest the previous cell; a one-cell trajectory is that leg between two anchors of its cell. Two
   consecutive coarse cells that are not neighbours (HRNet's stays) are first joined by the cells on the straight
   line between them (:meth:`Placement.bridge`), so the route follows the released streets the whole way.
3. *Spacing*: points are laid along the route (each route vertex jittered uniformly inside its fine cell) at
   distances drawn from the released step histogram (uniform in log inside a bin), so there are about as many
   points per trajectory, as far apart, as in the real sampling; a trajectory gets at least its two end points.
   A public ``step_m`` (metres) replaces the histogram: points every ``step_m`` along the route. A route longer
   than ``max_points`` draws cover has its steps stretched evenly.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import dijkstra

from duckmob.grid import BBox, cell_of
from duckmob.privacy.noise import public_generator
from duckmob.synth.cells import state_sequences, uniform_grid
from duckmob.synth.placement.releases import FineStats, local_xy
from duckmob.synth.placement.spacing import chord_stretch, drawn_steps, spaced
from duckmob.trajectories import ragged_gather

# Floor of a fine cell's probability in the route costs, relative to the mean cell (so routes may cross cells
# the release left empty, at a high cost: forbidding them, or keeping the draws below from making them cheaper,
# concentrated routes on fewer streets and raised the point and trajectory density JSD on GeoLife, issue 32 and
# docs/methods/privtrace.md).
FLOOR = 1e-3
# Spread of the per-cell cost factors of the extra route draws (Placement.route_tables): log-normal sigma.
ROUTE_SPREAD = 1.0
# Public seed of those factors: fixed, so a move's routes are the same in every block of an output, whichever
# block computes them first (the route cache, Placement._cached).
ROUTE_SEED = 32
# Moves from which route tables are computed in two halves on two threads (Placement._route_tables_split): a first
# block's thousands of moves, not the few new ones of a later block.
SPLIT_MOVES = 512

# The environment variable that turns the route cache off (Placement.keep_routes): every call then computes the
# route tables of its own moves afresh. The rows are the same either way (tests/synth/test_route_cache.py).
ROUTE_CACHE_VARIABLE = "DUCKMOB_ROUTE_CACHE"

_DELTAS = np.array([(-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1)], dtype=np.int64)
_STEP_LEN = np.hypot(_DELTAS[:, 0], _DELTAS[:, 1]).astype(np.float64)     # a step's length in fine cells


class Placement:
    """Routes and points for coarse cell sequences, from :class:`~.releases.FineStats` and the coarse partition.

    ``coarse_of_fine`` (w * w,) gives the coarse cell of each fine cell (by its centre), ``n_coarse`` their
    number. ``centres`` (lat, lon per coarse cell) places a coarse cell that holds no fine cell centre (one finer
    than the fine grid): it is routed as the coarse cell owning the fine cell at its centre (:attr:`proxy`).
    Everything here is post-processing of released statistics and public parameters."""

    def __init__(self, stats: FineStats, bbox, coarse_of_fine: np.ndarray, n_coarse: int, anchors: int = 8,
                 route_draws: int = 4, step_m: float | None = None, centres: tuple | None = None):
        self.stats, self.bbox, self.w = stats, BBox.of(bbox), stats.w
        self.coarse = np.asarray(coarse_of_fine, dtype=np.int64)
        self.n_coarse = int(n_coarse)
        self.route_draws = int(route_draws)
        self.step_m = None if step_m is None else float(step_m)   # public spacing (else the released steps)
        self._neighbour_keys = None          # lazily: the coarse neighbour pairs (_neighbours)
        w = self.w
        d = np.maximum(np.asarray(stats.density, dtype=np.float64), 0.0)
        total = d.sum()
        self.p = d / total if total > 0 else np.full(w * w, 1.0 / (w * w))
        floor = FLOOR / (w * w)
        # entering a fine cell costs -log p up to a constant: log(peak / p) >= 0 (csgraph needs non-negative
        # weights and drops zero ones: + 1e-3 per step)
        q = self.p + floor
        self.cost = np.log(q.max() / q) + 1e-3
        self._fields, self._cache = {}, {}
        self.keep_routes = route_cache_on()
        self._fill = threading.Lock()       # one fill of the route cache at a time (drawing-ahead threads)
        # fine cells grouped by coarse cell, densest first; ties (cells of one evenly spread block) in a fixed
        # scrambled order, so anchors do not crowd into a block's corner
        scramble = (np.arange(w * w, dtype=np.uint64) * np.uint64(2654435761)) % np.uint64(1 << 32)
        order = np.lexsort((scramble, -self.p, self.coarse))
        self.cell_order = order
        counts = np.bincount(self.coarse, minlength=self.n_coarse)
        self.proxy = proxy_cells(self.coarse, counts, self.bbox, w, centres)
        self.cell_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.rank = np.empty(w * w, dtype=np.int64)
        self.rank[order] = np.arange(w * w) - self.cell_offsets[self.coarse[order]]
        # anchors: the densest `anchors` fine cells of each coarse cell; probability in proportion to density
        h = int(anchors)
        n_anchor = np.minimum(counts, h)
        self.anchor_offsets = np.concatenate([[0], np.cumsum(n_anchor)]).astype(np.int64)
        owner = np.repeat(np.arange(self.n_coarse), n_anchor)
        pos = np.arange(len(owner)) - self.anchor_offsets[owner]
        self.anchor_cells = order[self.cell_offsets[owner] + pos]
        weight = self.p[self.anchor_cells]
        mass = np.bincount(owner, weights=weight, minlength=self.n_coarse)
        # a coarse cell without released mass: its anchors are equally likely
        self.anchor_weight = np.where(mass[owner] > 0, weight, 1.0)

    # -- anchors -----------------------------------------------------------------------------------------
    def draw_anchor(self, coarse: np.ndarray, rng: np.random.Generator, exclude: np.ndarray | None = None):
        """One anchor (global fine cell) per entry of ``coarse``, in proportion to its density; ``exclude`` (fine
        cells) is avoided where the coarse cell has another anchor."""
        coarse = np.asarray(coarse, dtype=np.int64)
        lo, hi = self.anchor_offsets[coarse], self.anchor_offsets[coarse + 1]
        wmax = int((hi - lo).max()) if len(coarse) else 0
        idx = lo[:, None] + np.arange(max(wmax, 1))[None, :]
        valid = idx < hi[:, None]
        wts = np.where(valid, self.anchor_weight[np.minimum(idx, len(self.anchor_cells) - 1)], 0.0)
        cells = self.anchor_cells[np.minimum(idx, len(self.anchor_cells) - 1)]
        if exclude is not None:
            other = valid & (cells != exclude[:, None])
            has_other = other.any(axis=1)
            wts = np.where(has_other[:, None] & ~other, 0.0, wts)
        cum = np.cumsum(wts, axis=1)
        u = rng.random(len(coarse)) * cum[:, -1]
        col = np.minimum((cum <= u[:, None]).sum(axis=1), np.maximum(hi - lo - 1, 0))
        return cells[np.arange(len(coarse)), col]

    def place(self, coarse: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One point per entry of ``coarse``: a fine cell inside that coarse cell drawn in proportion to the
        released density (uniformly among its fine cells where it has no mass), then a uniform position inside
        the fine cell. ``(lat, lon, placed)``, vectorised; ``placed`` is False where the coarse cell holds no fine
        cell centre (a fine grid coarser than the method's): the caller keeps its own point there."""
        coarse = np.asarray(coarse, dtype=np.int64)
        lo, hi = self.cell_offsets[coarse], self.cell_offsets[coarse + 1]
        cum = np.cumsum(self.p[self.cell_order])
        before = np.where(lo > 0, cum[np.maximum(lo - 1, 0)], 0.0)
        mass = np.where(hi > lo, cum[np.maximum(hi - 1, 0)] - before, 0.0)
        u = rng.random(len(coarse))
        by_mass = np.searchsorted(cum, before + u * mass, side="right")
        by_count = lo + np.floor(u * (hi - lo)).astype(np.int64)
        pos = np.clip(np.where(mass > 0, by_mass, by_count), lo, np.maximum(hi - 1, lo))
        fine = self.cell_order[np.minimum(pos, len(self.cell_order) - 1)]
        r, c = np.divmod(fine, self.w)
        v = rng.random((2, len(coarse)))
        box = self.bbox
        lat = box.min_lat + (r + v[0]) * (box.max_lat - box.min_lat) / self.w
        lon = box.min_lon + (c + v[1]) * (box.max_lon - box.min_lon) / self.w
        return lat, lon, hi > lo

    # -- routes ------------------------------------------------------------------------------------------
    def _fine_neighbours(self) -> tuple[np.ndarray, np.ndarray]:
        """Per direction of :data:`_DELTAS`, every fine cell's neighbour (-1 off the grid) and that neighbour's
        coarse cell (-1 off the grid): two (8, w * w) arrays, built once (public: the grids)."""
        if "neighbours" not in self._fields:
            w = self.w
            r, c = np.divmod(np.arange(w * w), w)
            nb = np.full((len(_DELTAS), w * w), -1, dtype=np.int64)
            for d, (dr, dc) in enumerate(_DELTAS):
                rr, cc = r + dr, c + dc
                ok = (rr >= 0) & (rr < w) & (cc >= 0) & (cc < w)
                nb[d, ok] = (rr * w + cc)[ok]
            self._fields["neighbours"] = nb, np.where(nb >= 0, self.coarse[np.maximum(nb, 0)], -1)
        return self._fields["neighbours"]

    def _move_graph(self, pairs: np.ndarray):
        """The graph of the coarse moves ``pairs`` (k, 2): the fine cells of A then B of each move, one block per
        move (A = B: a leg inside one coarse cell, its fine cells once). ``(base, off_b, fine, nbr)``: move m's nodes are
        ``base[m]:base[m + 1]``, B's start there at ``base[m] + off_b[m]``, node x is fine cell ``fine[x]``, and
        ``nbr[x, d]`` (nodes x 8) is x's neighbour in direction ``d`` when that fine cell is in the same move (else
        -1). The same for every cost field."""
        a, b = pairs[:, 0], pairs[:, 1]
        size_a = np.diff(self.cell_offsets)[a]
        off_b = np.where(a == b, 0, size_a)                 # where B's nodes start inside the move's block
        size = off_b + np.diff(self.cell_offsets)[b]
        base = np.concatenate([[0], np.cumsum(size)]).astype(np.int64)
        n_nodes = int(base[-1])
        move = np.repeat(np.arange(len(pairs)), size)
        base_m, off_m, a_m, b_m = base[move], off_b[move], a[move], b[move]
        local = np.arange(n_nodes) - base_m
        in_a = local < off_m
        fine = self.cell_order[self.cell_offsets[np.where(in_a, a_m, b_m)] + np.where(in_a, local, local - off_m)]
        nb_fine, nb_coarse = self._fine_neighbours()
        nbr = np.full((n_nodes, len(_DELTAS)), -1, dtype=np.int64)
        for d in range(len(_DELTAS)):
            f, cb = nb_fine[d][fine], nb_coarse[d][fine]
            to_a = cb == a_m
            u = np.flatnonzero(to_a | (cb == b_m))
            nbr[u, d] = base_m[u] + self.rank[f[u]] + np.where(to_a[u], 0, off_m[u])
        return base, off_b, fine, nbr

    def _route_tables(self, pairs: np.ndarray, costs: list, target: int | None = None,
                      which: list | None = None) -> list:
        """Routes of the coarse moves ``pairs`` (k, 2) from every anchor of A to the cheapest anchor of B (or to
        B's anchor number ``target``, where B has it) over the fine cells of A and B, under each per-cell cost
        of ``costs``: for each, one multi-source Dijkstra over the block-diagonal graph of all moves (built once
        for all costs, :meth:`_move_graph`). One table per cost in :meth:`route_table`'s layout, of the moves
        ``which[c]`` (sorted indices into ``pairs``; None: all): its Dijkstra starts from their anchors alone (a
        move's block is its own: the others are never reached), next hops only where its routes walk."""
        base, off_b, fine, nbr = self._move_graph(pairs)
        n_nodes = len(fine)
        n_anchor_b = np.diff(self.anchor_offsets)[pairs[:, 1]]
        b_start = base[:-1] + off_b
        # the reversed graph (searched from B's anchors back), row x listing x's neighbours u: edge x -> u carries
        # the cost of moving u -> x (entering x); its layout is the same under every cost
        valid = nbr >= 0
        itype = np.int32 if valid.sum() < np.iinfo(np.int32).max else np.int64   # SciPy's own: converted once
        indices = nbr[valid].astype(itype)
        indptr = np.concatenate([[0], np.cumsum(valid.sum(axis=1))]).astype(itype)
        nbr_fine = np.where(valid, fine[nbr], -1)
        tables = []
        for c, cost in enumerate(costs):
            sel = np.arange(len(pairs)) if which is None else np.asarray(which[c], dtype=np.int64)
            if target is None:      # sources: the anchors of B in every move (their local ranks are < anchors of B)
                src_nodes = ragged_gather(b_start[sel], n_anchor_b[sel])
            else:
                src_nodes = (b_start[sel] + target)[n_anchor_b[sel] > target]
            dist = None
            if n_nodes and len(src_nodes):
                data = (cost[fine][:, None] * _STEP_LEN)[valid]
                graph = sp.csr_matrix((data, indices, indptr), shape=(n_nodes, n_nodes))
                dist = dijkstra(graph, directed=True, indices=src_nodes, min_only=True)
            # next hops at the nodes asked (a step to no neighbour: index -1 reads the appended inf)
            hops = None if dist is None else (lambda nodes, cost=cost, dist=dist: _next_hops(
                nbr[nodes], nbr_fine[nodes], np.append(cost, np.inf)[nbr_fine[nodes]] * _STEP_LEN, dist, dist[nodes]))
            tables.append(self._walked(pairs[sel], base[sel], fine, hops, target))
        return tables

    def _route_tables_split(self, pairs: np.ndarray, costs: list, which: list | None = None) -> list:
        """:meth:`_route_tables` of many moves (a first block's thousands) in two halves on two threads: their
        NumPy work overlaps (the Dijkstra itself holds the GIL). The same tables: a move's routes depend on its
        own graph only, and the halves are joined per cost in move order."""
        if len(pairs) < SPLIT_MOVES:
            return self._route_tables(pairs, costs, which=which)
        cut = len(pairs) - len(pairs) // 2             # np.array_split's first half
        jobs = [(lo, hi, None if which is None else [w[(w >= lo) & (w < hi)] - lo for w in which])
                for lo, hi in ((0, cut), (cut, len(pairs)))]
        with ThreadPoolExecutor(2, thread_name_prefix="duckmob-routes") as pool:
            parts = list(pool.map(lambda j: self._route_tables(pairs[j[0]:j[1]], costs, which=j[2]), jobs))
        return [_joined([part[c] for part in parts]) for c in range(len(costs))]

    def route_table(self, moves: np.ndarray, cost: np.ndarray | None = None, target: int | None = None):
        """For the coarse moves ``moves`` (distinct, as ``a * n_coarse + b``): the route from every anchor of A,
        ``(first, offsets, cells, end)``: route ``first[i] + j`` starts at A's j-th anchor, its fine cells are
        ``cells[offsets[r]:offsets[r + 1]]`` (start included, ending at an anchor of B), and ``end[r]`` is that
        anchor's index in B. A move whose fine cells do not connect jumps to B's densest anchor. ``cost``: per
        fine cell (default: the released density's ``-log p`` costs). ``target``: end at B's anchor number
        ``target`` instead of the cheapest (every B must have it); with A = B, a leg inside A."""
        pairs = np.stack(np.divmod(np.asarray(moves, dtype=np.int64), self.n_coarse), axis=1)
        return self._route_tables(pairs, [self.cost if cost is None else cost], target)[0]

    def _walked(self, pairs, base, fine, hops, target):
        """:meth:`route_table`'s tables of the moves ``pairs`` (move m's nodes from ``base[m]``), walking from each
        anchor of A by the next hops ``hops(nodes)`` (None: no node has one)."""
        a, b = pairs[:, 0], pairs[:, 1]
        n_anchor_a = np.diff(self.anchor_offsets)[a]
        first = np.concatenate([[0], np.cumsum(n_anchor_a)]).astype(np.int64)
        r_move = np.repeat(np.arange(len(pairs)), n_anchor_a)
        j = np.arange(len(r_move)) - first[r_move]
        # an anchor of A is among A's densest cells: its local rank is j
        cur = base[r_move] + j
        n = len(r_move)
        paths, owners = [cur], [np.arange(n)]
        alive = np.arange(n)
        for _ in range(len(fine) + 1 if hops is not None else 0):
            nxt = hops(cur)
            go = nxt >= 0
            if not go.any():
                break
            alive, cur = alive[go], nxt[go]
            paths.append(cur)
            owners.append(alive)
        nodes, owner = np.concatenate(paths), np.concatenate(owners)
        order = np.argsort(owner, kind="stable")
        cells, owner = fine[nodes[order]], owner[order]
        lengths = np.bincount(owner, minlength=n)
        last = np.cumsum(lengths) - 1
        # where each route must end: inside B, or at B's target-th anchor; one that cannot (its fine cells do not
        # connect) jumps there (B's densest anchor without a target)
        want = self.anchor_cells[self.anchor_offsets[b[r_move]] + (0 if target is None else target)]
        stuck = (self.coarse[cells[last]] != b[r_move]) if target is None else (cells[last] != want)
        if stuck.any():
            cells = np.concatenate([cells, want[stuck]])
            owner = np.concatenate([owner, np.flatnonzero(stuck)])
            order = np.argsort(owner, kind="stable")
            cells, owner = cells[order], owner[order]
            lengths = np.bincount(owner, minlength=n)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        end_cell = cells[offsets[1:] - 1]
        return first, offsets, cells, self.rank[end_cell]

    def cost_field(self, draw: int) -> np.ndarray:
        """Per-fine-cell route costs of route draw ``draw``: the released costs (draw 0), else those times an
        independent log-normal factor per cell (sigma ``ROUTE_SPREAD``) from the public seed ``ROUTE_SEED``."""
        if draw not in self._fields:
            noise = public_generator(ROUTE_SEED, draw).standard_normal(len(self.cost))
            self._fields[draw] = self.cost if draw == 0 else self.cost * np.exp(ROUTE_SPREAD * noise)
        return self._fields[draw]

    def _cached(self, name, keys: np.ndarray, compute):
        """Route tables from the cache ``name``, filled key by key: the routes of ``keys`` (int64) as
        ``(first per key, offsets, cells, end)`` over the cache's arrays, computing only the keys not yet there
        with ``compute(sorted new keys) -> (first (k + 1), offsets, cells, end)`` (:meth:`route_table`'s
        layout). A key's routes do not depend on the other keys computed with it (one block of the Dijkstra
        graph each, ties broken by fine cell: :func:`_next_hops`), so the cache gives what a fresh computation
        would. Its size is bounded by the model (coarse moves x route draws), not by the output's n.

        Fills are merged by :func:`_merged` under a lock (drawing-ahead threads compute a key once and never drop
        each other's keys); a filled table is a new dict assigned whole, so a reader holds one consistent
        snapshot. ``keep_routes`` False (``DUCKMOB_ROUTE_CACHE=off``): the keys' tables are computed afresh."""
        keys = np.asarray(keys, dtype=np.int64)
        if not self.keep_routes:
            new = np.unique(keys)
            first, offsets, cells, end = _checked(new, compute(new))
            return first[:-1][np.searchsorted(new, keys)], offsets, cells, end
        c = self._cache.get(name)           # a snapshot: an entry is replaced whole, never changed in place
        if c is None or len(_missing(c["keys"], keys)):
            with self._fill:
                c = self._cache.get(name, _EMPTY)       # another thread may have filled it meanwhile
                new = _missing(c["keys"], keys)
                if len(new):
                    c = self._cache[name] = _merged(c, new, _checked(new, compute(new)))
        return c["first"][np.searchsorted(c["keys"], keys)], c["offsets"], c["cells"], c["end"]

    def route_tables(self, moves: np.ndarray):
        """:meth:`route_table` under ``self.route_draws`` cost fields (:meth:`cost_field`): the released costs
        and perturbed ones. Real trips between two areas use several streets; one most probable path per move
        sends every synthetic trip down the same one. Computed once per move and model (cached: the perturbations
        are public and fixed). Returns ``(first (draws, moves), offsets, cells, end)`` over all draws together."""
        moves = np.asarray(moves, dtype=np.int64)
        draws = np.repeat(np.arange(self.route_draws, dtype=np.int64), len(moves))
        first, offsets, cells, end = self.drawn_routes(draws, np.tile(moves, self.route_draws))
        return first.reshape(self.route_draws, len(moves)), offsets, cells, end

    def drawn_routes(self, draws: np.ndarray, moves: np.ndarray):
        """The routes of each move ``moves[i]`` (``a * n_coarse + b``) under route draw ``draws[i]`` alone:
        ``(first per entry, offsets, cells, end)``. A first block computes only the draws its trips picked (about
        70% of its moves' draws); a later block the others it picks (cached: the same routes either way)."""
        space = self.n_coarse * self.n_coarse

        def compute(new):
            # the new keys' moves, one graph for all draws; each draw's Dijkstra and walk over its own moves only
            draw, move = np.divmod(new, space)
            union = np.unique(move)
            pairs = np.stack(np.divmod(union, self.n_coarse), axis=1)
            drawn = np.unique(draw)
            which = [np.searchsorted(union, move[draw == d]) for d in drawn]   # keys sorted: by draw, then move
            return _joined(self._route_tables_split(pairs, [self.cost_field(int(d)) for d in drawn], which))

        keys = np.asarray(draws, dtype=np.int64) * space + np.asarray(moves, dtype=np.int64)
        return self._cached("moves", keys, compute)

    def leg_paths(self, coarse: np.ndarray, start: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Most probable fine paths inside one coarse cell each: from the anchor cell ``start[i]`` of
        ``coarse[i]`` to that cell's anchor number ``target[i]``; ``(offsets, cells)``, both ends included. One
        :meth:`route_table` (a Dijkstra over the cells used) per distinct target number."""
        coarse, start, target = (np.asarray(x, dtype=np.int64) for x in (coarse, start, target))
        pieces, owners = [], []
        for t in np.unique(target):
            sel = np.flatnonzero(target == t)
            first, r_off, r_cells, _ = self._cached(
                ("leg", int(t)), coarse[sel],
                lambda cells, t=int(t): self.route_table(cells * (self.n_coarse + 1), target=t))
            r = first + self.rank[start[sel]]
            n_r = np.diff(r_off)[r]
            pieces.append(r_cells[ragged_gather(r_off[r], n_r)])
            owners.append(np.repeat(sel, n_r))
        owner = np.concatenate(owners)
        order = np.argsort(owner, kind="stable")
        lengths = np.bincount(owner, minlength=len(coarse))
        return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), np.concatenate(pieces)[order]

    def _neighbours(self) -> np.ndarray:
        """Sorted keys ``a * n_coarse + b`` of the coarse cells a != b that hold 8-neighbouring fine cells (a route
        between them stays on their fine cells)."""
        if self._neighbour_keys is None:
            nb_fine, nb_coarse = self._fine_neighbours()
            a = np.broadcast_to(self.coarse, nb_coarse.shape)
            self._neighbour_keys = np.unique((a * self.n_coarse + nb_coarse)[(nb_fine >= 0) & (nb_coarse != a)])
        return self._neighbour_keys

    def bridge(self, offsets: np.ndarray, coarse: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Coarse sequences whose consecutive cells can all be routed: between two consecutive cells that are
        not neighbours (HRNet's stays are often far apart), the cells met by the straight line between their
        fine cells' centroids (the integer line walk on the fine grid, duckmob.synth.cells) are inserted, so the
        route follows the released streets the whole way instead of jumping. ``(offsets, coarse, into)``:
        ``into[j]`` is the index, in its original sequence, of the original cell that cell j leads to (itself,
        or the next original cell for an inserted one). Post-processing; vectorised over moves."""
        offsets = np.asarray(offsets, dtype=np.int64)
        coarse = np.asarray(coarse, dtype=np.int64)
        n, nc = len(offsets) - 1, self.n_coarse
        owner = np.repeat(np.arange(n), np.diff(offsets))
        local = np.arange(len(coarse)) - offsets[owner]
        i = np.flatnonzero(owner[1:] == owner[:-1]) if len(coarse) else np.zeros(0, np.int64)
        a, b = coarse[i], coarse[i + 1]
        size = np.diff(self.cell_offsets)
        keys = a * nc + b
        nb = self._neighbours()
        near = a == b
        if len(nb):
            pos = np.minimum(np.searchsorted(nb, keys), len(nb) - 1)
            near |= nb[pos] == keys
        far = ~near & (size[a] > 0) & (size[b] > 0)
        if not far.any():
            return offsets, coarse, local
        moves, move_of = np.unique(keys[far], return_inverse=True)
        ma, mb = np.divmod(moves, nc)
        # the centroid of each coarse cell's fine cells (degrees)
        r, c = np.divmod(np.arange(self.w * self.w), self.w)
        cnt = np.maximum(size, 1)
        box = self.bbox
        cent_lat = box.min_lat + (np.bincount(self.coarse, r + 0.5, nc) / cnt) * (box.max_lat - box.min_lat) / self.w
        cent_lon = box.min_lon + (np.bincount(self.coarse, c + 0.5, nc) / cnt) * (box.max_lon - box.min_lon) / self.w
        ends = np.stack([ma, mb], axis=1).reshape(-1)
        w_off, w_cells, w_owner = state_sequences(uniform_grid(box, self.w), np.arange(0, 2 * len(moves) + 1, 2),
                                                  cent_lat[ends], cent_lon[ends])
        chain = self.coarse[w_cells]
        keep = np.ones(len(chain), dtype=bool)
        keep[1:] = (chain[1:] != chain[:-1]) | (w_owner[1:] != w_owner[:-1])
        chain, w_owner = chain[keep], w_owner[keep]
        # the inner cells: the walk's coarse cells less A at its start and B at its end
        first = np.concatenate([[True], w_owner[1:] != w_owner[:-1]])
        last = np.concatenate([w_owner[1:] != w_owner[:-1], [True]])
        inner = ~((first & (chain == ma[w_owner])) | (last & (chain == mb[w_owner])))
        chain, w_owner = chain[inner], w_owner[inner]
        n_inner = np.bincount(w_owner, minlength=len(moves))
        inner_start = np.concatenate([[0], np.cumsum(n_inner)[:-1]]).astype(np.int64)
        # splice: original cell p is followed by the inner cells of its move when that move is far
        at = i[far]
        extra = n_inner[move_of]
        counts = np.ones(len(coarse), dtype=np.int64)
        counts[at] += extra
        csum = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        out = np.empty(int(csum[-1]), dtype=np.int64)
        into = np.empty(int(csum[-1]), dtype=np.int64)
        out[csum[:-1]] = coarse
        into[csum[:-1]] = local
        dest = ragged_gather(csum[at] + 1, extra)
        out[dest] = chain[ragged_gather(inner_start[move_of], extra)]
        into[dest] = np.repeat(local[at] + 1, extra)
        return csum[offsets], out, into

    def fine_paths(self, offsets: np.ndarray, coarse: np.ndarray, rng: np.random.Generator, with_pos: bool = False):
        """Fine-cell paths of coarse cell sequences ``(offsets, coarse)``: ``(offsets, cells)``.

        Every move's routes come from one :meth:`route_table`; then a loop over the position in the sequence
        (integer lookups vectorised over trajectories) chains them: each route starts at the anchor where the
        previous one ended; the last leg (:meth:`leg_paths`) ends at an anchor of the last cell drawn by
        density, another than the start for a one-cell sequence. Non-neighbouring consecutive cells are joined
        first (:meth:`bridge`). ``with_pos``: also each fine cell's piece, an int64 array: 0 the start, j the
        route into the sequence's j-th coarse cell (the bridge before it included), L the last leg."""
        n_orig = np.diff(np.asarray(offsets, dtype=np.int64))
        coarse = self.proxy[np.asarray(coarse, dtype=np.int64)]     # cells without fine cells: their proxy
        offsets, coarse, into = self.bridge(offsets, coarse)
        n = len(offsets) - 1
        L = np.diff(offsets)
        if n == 0:
            empty = np.zeros(0, dtype=np.int64)
            return (np.zeros(1, dtype=np.int64), empty) + ((empty,) if with_pos else ())
        start = self.draw_anchor(coarse[offsets[:-1]], rng)
        # every move of every sequence, in order
        owner_pt = np.repeat(np.arange(n), L)
        has_next = np.zeros(len(coarse), dtype=bool)
        has_next[:-1] = owner_pt[1:] == owner_pt[:-1]
        i = np.flatnonzero(has_next)
        keys = coarse[i] * self.n_coarse + coarse[i + 1]
        # which route draw each move takes (drawn before the tables: computing them draws nothing), then the
        # routes of the (draw, move) pairs taken
        table = rng.integers(0, self.route_draws, len(i)) if len(i) else np.zeros(0, np.int64)
        first, r_off, r_cells, r_end = self.drawn_routes(table, keys) if len(i) else (None,) * 4
        # chain: the route taken at each move (its anchor index in A follows from the previous route)
        route = np.empty(len(i), dtype=np.int64)
        step_pos = i - offsets[owner_pt[i]]                 # 0 for the first move of a sequence
        anchor = self.rank[start]                           # index among the first cell's anchors
        cur_anchor = anchor.copy()
        # the moves grouped by position (a stable sort), so step t touches only the sequences still moving
        by_pos = np.argsort(step_pos, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(np.bincount(step_pos))]) if len(i) else np.zeros(1, np.int64)
        base = first[by_pos] if len(i) else np.zeros(0, np.int64)
        who_all = owner_pt[i][by_pos]
        for t in range(len(bounds) - 1):
            lo, hi = bounds[t], bounds[t + 1]
            who = who_all[lo:hi]
            r = base[lo:hi] + cur_anchor[who]
            route[by_pos[lo:hi]] = r
            cur_anchor[who] = r_end[r]
        # each sequence's path: its start, its routes in order (start cells dropped: each ends the previous
        # piece), then its last leg; the pieces are laid out by owner directly (no sort)
        routes_n = np.zeros(n, dtype=np.int64)
        if len(i):
            r_len = np.diff(r_off)[route] - 1
            route_cells = r_cells[ragged_gather(r_off[route] + 1, r_len)]
            route_owner = np.repeat(owner_pt[i], r_len)
            route_pos = np.repeat(into[i + 1], r_len)
            routes_n = np.bincount(route_owner, minlength=n)
        # the last leg, inside the last cell: from where the chain arrived (L > 1; the start for L = 1) to an
        # anchor drawn by density (another one for L = 1), so a trajectory ends where trips end rather than at
        # the border of its last cell nearest the previous one
        last_coarse = coarse[offsets[1:] - 1]
        arrived = self.anchor_cells[self.anchor_offsets[last_coarse] + cur_anchor]
        end = self.draw_anchor(last_coarse, rng, exclude=np.where(L == 1, start, -1))
        leg = np.flatnonzero(end != arrived)
        legs_n = np.zeros(n, dtype=np.int64)
        if len(leg):
            l_off, l_cells = self.leg_paths(last_coarse[leg], arrived[leg], self.rank[end[leg]])
            legs_n[leg] = np.diff(l_off) - 1
            leg_cells = l_cells[ragged_gather(l_off[:-1] + 1, legs_n[leg])]
        out_off = np.concatenate([[0], np.cumsum(1 + routes_n + legs_n)]).astype(np.int64)
        cells = np.empty(int(out_off[-1]), dtype=np.int64)
        pos = np.empty(len(cells), dtype=np.int64)
        cells[out_off[:-1]], pos[out_off[:-1]] = start, 0
        if len(i):
            at = ragged_gather(out_off[:-1] + 1, routes_n)
            cells[at], pos[at] = route_cells, route_pos
        if len(leg):
            at = ragged_gather(out_off[leg] + 1 + routes_n[leg], legs_n[leg])
            cells[at], pos[at] = leg_cells, np.repeat(n_orig[leg], legs_n[leg])
        return (out_off, cells) + ((pos,) if with_pos else ())

    def cell_m(self) -> float:
        """The side of a fine cell in metres (the mean of its two sides): the spacing of points when the released
        step histogram was mostly noise (:func:`steps_mostly_noise`)."""
        box = self.bbox
        x, y = local_xy(box, np.array([box.min_lat, box.max_lat]), np.array([box.min_lon, box.max_lon]))
        return float((abs(x[1] - x[0]) + abs(y[1] - y[0])) / (2 * self.w))

    def points(self, offsets: np.ndarray, coarse: np.ndarray, rng: np.random.Generator,
               max_points: int = 5000, times: np.ndarray | None = None, chord: bool = False):
        """Synthetic points for coarse cell sequences: ``(lengths, lat, lon)`` (see the module docstring).

        ``times`` (int64 µs, non-decreasing within each sequence): the time at each coarse cell of every sequence
        (``max(L, 2)`` per sequence: a one-cell sequence gives the times of its first and last point); then
        ``(lengths, lat, lon, ts)``, each point timed by its distance along the route between the times of the two
        cells it runs between (constant speed on each route; the last leg ends at the last cell's time).

        ``chord``: steps stretched by how each route winds (:func:`.spacing.chord_stretch`: straight-line spacing,
        as the real fixes'; models fitted with roads use it, the others keep their seeded rows)."""
        f_off, f_cells, f_pos = self.fine_paths(offsets, coarse, rng, with_pos=True)
        n = len(f_off) - 1
        box, w = self.bbox, self.w
        # route vertices: each fine cell's position jittered uniformly inside it
        r, c = np.divmod(f_cells, w)
        u = rng.random((2, len(f_cells)))
        dlat, dlon = (box.max_lat - box.min_lat) / w, (box.max_lon - box.min_lon) / w
        vlat = box.min_lat + (r + u[0]) * dlat
        vlon = box.min_lon + (c + u[1]) * dlon
        x, y = local_xy(box, vlat, vlon)
        v_owner = np.repeat(np.arange(n), np.diff(f_off))
        seg = np.hypot(np.diff(x), np.diff(y))
        seg = np.where(v_owner[1:] == v_owner[:-1], seg, 0.0)
        along = np.concatenate([[0.0], np.cumsum(seg)])          # synthetic data only: no privacy concern
        route_start = along[f_off[:-1]]
        route_len = along[f_off[1:] - 1] - route_start
        # steps from the released histogram or the public step_m, enough to cover each route (spacing.py)
        step, want = drawn_steps(self.stats.steps, route_len, rng, max_points, self.step_m, self.cell_m())
        if chord and len(step):
            step *= chord_stretch(x, y, along, f_off, np.median(step), self.cell_m())[np.repeat(np.arange(n), want)]
        lengths, p_owner, p_dist, target, idx, nxt, frac = spaced(along, f_off, route_start, route_len, step, want)
        lat = vlat[idx] + (vlat[nxt] - vlat[idx]) * frac
        lon = vlon[idx] + (vlon[nxt] - vlon[idx]) * frac
        if times is None:
            return lengths, lat, lon
        return lengths, lat, lon, self._times(offsets, f_pos, v_owner, along, p_owner, nxt, target, times)

    @staticmethod
    def _times(offsets, f_pos, v_owner, along, p_owner, nxt, target, times) -> np.ndarray:
        """Each point's time (see :meth:`points`): piece q of a sequence (the route into its q-th cell; the last
        leg joins the last route, or is piece 1 of a one-cell sequence) runs from ``times[q - 1]`` to
        ``times[q]`` at constant speed along its vertices' (warped) distance."""
        L = np.diff(np.asarray(offsets, dtype=np.int64))
        n_piece = np.maximum(L - 1, 1)                      # pieces 1 .. n_piece; times has n_piece + 1 per sequence
        t = np.asarray(times, dtype=np.int64)
        if len(t) != int((n_piece + 1).sum()):
            raise ValueError("times must hold max(L, 2) entries per sequence")
        t_first = np.concatenate([[0], np.cumsum(n_piece + 1)[:-1]])
        q = np.minimum(f_pos, n_piece[v_owner])             # vertex -> piece (0: the start vertex)
        width = int(n_piece.max()) + 1 if len(n_piece) else 1
        key = v_owner * width + q                           # sorted: vertices are by (sequence, piece)
        pq = np.maximum(q[nxt], 1)                          # a point belongs to the piece of the vertex it runs to
        k = p_owner * width + pq
        # the distance where piece k - 1 ends and where piece k ends (its last vertex, or the one before it)
        d0 = along[np.searchsorted(key, k - 1, side="right") - 1]
        d1 = along[np.searchsorted(key, k, side="right") - 1]
        frac = np.where(d1 > d0, np.clip((target - d0) / np.where(d1 > d0, d1 - d0, 1.0), 0.0, 1.0), 1.0)
        a, b = t[t_first[p_owner] + pq - 1], t[t_first[p_owner] + pq]
        ts = a + np.round((b - a) * frac).astype(np.int64)
        # the first point is at the first cell's time and the last at the last's, whatever the route's length
        edge = np.concatenate([[True], p_owner[1:] != p_owner[:-1]]) if len(p_owner) else np.zeros(0, bool)
        ts[edge] = t[t_first[p_owner[edge]]]
        end = np.concatenate([edge[1:], [True]]) if len(p_owner) else edge
        ts[end] = t[t_first[p_owner[end]] + n_piece[p_owner[end]]]
        return ts


def _joined(tables: list) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Route tables in :meth:`Placement.route_table`'s layout ``(first (k + 1), offsets, cells, end)``, one after
    the other as one table of that layout (the keys of each in turn)."""
    firsts, offs, cells, ends = [np.zeros(0, np.int64)], [np.zeros(1, np.int64)], [], []
    n_routes = n_cells = 0
    for first, off, cell, end in tables:
        firsts.append(first[:-1] + n_routes)
        offs.append(off[1:] + n_cells)
        cells.append(cell)
        ends.append(end)
        n_routes, n_cells = n_routes + len(end), n_cells + len(cell)
    return (np.concatenate(firsts + [[n_routes]]).astype(np.int64), np.concatenate(offs).astype(np.int64),
            np.concatenate(cells), np.concatenate(ends))


def route_cache_on() -> bool:
    """Whether a :class:`Placement` keeps its route tables across calls (output blocks): on unless the environment
    variable ``DUCKMOB_ROUTE_CACHE`` is ``off`` (or 0, false, no). Speed only: the rows are the same."""
    return os.environ.get(ROUTE_CACHE_VARIABLE, "on").strip().lower() not in ("off", "0", "false", "no")


_EMPTY = dict(keys=np.zeros(0, np.int64), first=np.zeros(0, np.int64), offsets=np.zeros(1, np.int64),
              cells=np.zeros(0, np.int64), end=np.zeros(0, np.int64))


def _missing(known: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The distinct ``keys`` not in the sorted, distinct ``known``, sorted."""
    if not len(known):
        return np.unique(keys)
    pos = np.minimum(np.searchsorted(known, keys), len(known) - 1)
    return np.unique(keys[known[pos] != keys])


def _checked(new: np.ndarray, table: tuple) -> tuple:
    """``table`` (:meth:`Placement.route_table`'s layout, one entry per key of ``new``) after checking that every
    key has routes. A key without any (a move from a coarse cell without anchors) has its ``first`` equal to the
    next key's, so a chain would read that key's routes, or past the last route when its key was laid out last,
    as a newly filled key is: the IndexError at 300 M fixes (block 60 of a default-n output). Public: the grids."""
    first = table[0]
    if len(first) != len(new) + 1 or (np.diff(first) <= 0).any():
        raise ValueError("a route table has a move without routes (a coarse cell without anchors); route such "
                         "cells as their proxy (Placement.proxy)")
    return table


def _merged(held: dict, new: np.ndarray, table: tuple) -> dict:
    """The route cache ``held`` (``keys`` sorted and distinct; ``first[i]`` the first route of ``keys[i]`` in
    ``offsets``, ``cells``, ``end``) with the table of the new keys ``new`` (sorted, none in ``held``) laid after
    its routes: a new dict, ``held`` is not changed. A held key keeps its routes' numbers, so an index taken from
    ``held`` reads the same routes in the result."""
    first, offsets, cells, end = _joined([(np.append(held["first"], len(held["end"])), held["offsets"],
                                           held["cells"], held["end"]), table])
    keys = np.concatenate([held["keys"], new])
    order = np.argsort(keys, kind="stable")
    return dict(keys=keys[order], first=first[:-1][order], offsets=offsets, cells=cells, end=end)


def _next_hops(nbr: np.ndarray, nbr_fine: np.ndarray, step: np.ndarray, dist: np.ndarray,
               own: np.ndarray) -> np.ndarray:
    """The next node of the shortest route of each of some nodes, from the distances ``dist`` (to the sources,
    over every node): over a node's neighbours ``nbr`` (its row: 8; -1 none, fine cells ``nbr_fine``) at costs
    ``step`` (its row; inf none), the one minimising ``step + dist[neighbour]``, ties (equal up to 1e-9, as
    equal-cost staircases on evenly costed cells are) broken by the lowest fine cell. So a route depends on its
    own move's graph only, not on the heap order of the moves computed with it, and the route cache gives
    exactly what a fresh computation would, in any block order. ``own``: the nodes' own distances; a source or
    a node that reaches none gets -9999. Row by row: the same for a node whichever others are asked with it."""
    via = step + dist[nbr]                          # inf where there is no neighbour (step is)
    best = via.min(axis=1)
    low = np.where(via <= (best * (1 + 1e-9))[:, None], nbr_fine, np.iinfo(np.int64).max)
    pick = low.argmin(axis=1)                       # a node's neighbours are distinct fine cells
    hop = np.full(len(own), -9999, dtype=np.int64)
    inner = np.flatnonzero(np.isfinite(best) & (own > 0))      # not a source, and reaches one
    hop[inner] = nbr[inner, pick[inner]]
    return hop


def cell_centres(w: int, bbox) -> tuple[np.ndarray, np.ndarray]:
    """(lat, lon) of the centre of every cell of the w x w grid over ``bbox``, in cell-id order (row * w + col)."""
    b = BBox.of(bbox)
    r, c = np.divmod(np.arange(w * w), w)
    return (b.min_lat + (r + 0.5) * (b.max_lat - b.min_lat) / w, b.min_lon + (c + 0.5) * (b.max_lon - b.min_lon) / w)


def coarse_of_fine(w: int, bbox, locate) -> np.ndarray:
    """The coarse cell of every fine cell's centre, by ``locate(lat, lon)`` (the method's own cell function)."""
    return np.asarray(locate(*cell_centres(w, bbox)), dtype=np.int64)


def proxy_cells(coarse_of_fine: np.ndarray, counts: np.ndarray, bbox, w: int, centres: tuple | None) -> np.ndarray:
    """For every coarse cell, the coarse cell it is routed as: itself where it holds fine cells; else (a coarse cell
    smaller than a fine cell, as a deep PrivTrace split gives under the 512-cell cap) the owner of the fine cell
    at its centre, which holds that fine cell. Without it such a cell had no anchors, and a route through it read
    another cell's routes (an IndexError at 300 M fixes). Public: the grids only."""
    proxy = np.arange(len(counts), dtype=np.int64)
    empty = np.flatnonzero(counts == 0)
    if len(empty):
        if centres is None:
            raise ValueError("coarse cells without a fine cell need their centres to be placed")
        lat, lon = (np.asarray(x, dtype=np.float64)[empty] for x in centres)
        proxy[empty] = coarse_of_fine[np.maximum(cell_of(lat, lon, bbox, w), 0)]
    return proxy
