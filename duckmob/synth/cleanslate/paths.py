"""Most probable paths between sampled endpoints (Lestyan et al. §7.3.3): Dijkstra on -log p.

For a destination d and slot t the routing graph has an edge c -> c' for every next hop c' within r cells of
c, weighted ``-log p(c' | c, d, t)``; the shortest path from s to d is the most probable one (a product of
probabilities is maximal where the sum of their negative logs is minimal). All samples sharing (d, t) share
one graph, and one search on the REVERSED graph from d (``scipy.sparse.csgraph.dijkstra`` with ``indices=d``) gives every
cell's next hop towards d at once. The graphs of all groups share one public sparsity pattern, built once; only
the weights change (one search per group: why not one block-diagonal search, docs/methods/cleanslate.md).
Post-processing of the released model: no budget.
"""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import dijkstra

from duckmob.synth.cleanslate.trips import neighbour_offsets, valid_moves

# Smallest edge weight: csgraph drops explicit zeros, so a hop of probability 1 keeps a tiny positive cost.
MIN_WEIGHT = 1e-12


def reversed_pattern(w: int, r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The public sparsity pattern of the reversed routing graph, shared by every (d, t):
    (cell c, class k) of each forward edge c -> c + offset_k in CSR order of the reversed graph, and its
    (indices, indptr). Row = the edge's target, column = c."""
    valid = valid_moves(w, r)
    dr, dc = neighbour_offsets(r)
    c, k = np.nonzero(valid)
    target = c + dr[k] * w + dc[k]
    order = np.lexsort((c, target))                       # CSR order: by row (target), then column (c)
    c, k, target = c[order], k[order], target[order]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(target, minlength=w * w))]).astype(np.int32)
    return c, k, target, c.astype(np.int32), indptr


def next_hops(log_p: np.ndarray, dest: np.ndarray, w: int, r: int, hop_cost: float = 0.0,
              pattern: tuple | None = None) -> np.ndarray:
    """(G, w^2) next cell from every cell towards ``dest[g]`` on its most probable path under ``log_p[g]``
    ((G, w^2, (2r+1)^2) log next-hop probabilities); ``dest[g]`` maps to itself, an unreachable cell to -1.

    One single-source Dijkstra per group on its reversed graph (same public pattern, weights -log p plus the
    public ``hop_cost`` per hop, 0 for the most probable path): the predecessor of c in the search from d is c's
    next hop towards d. ``pattern``: :func:`reversed_pattern` of (w, r) when the caller keeps it."""
    c, k, _, indices, indptr = reversed_pattern(w, r) if pattern is None else pattern
    log_p = np.asarray(log_p)
    flat = c * log_p.shape[2] + k
    weight = np.maximum(hop_cost - log_p.reshape(len(log_p), -1)[:, flat].astype(np.float64), MIN_WEIGHT)  # (G, E)
    hops = np.empty((len(dest), w * w), dtype=np.int64)
    graph = sp.csr_matrix((weight[0], indices, indptr), shape=(w * w, w * w)) if len(dest) else None
    for g, d in enumerate(np.asarray(dest, dtype=np.int64)):   # one search per (d, t) group, not per sample
        graph.data = weight[g]                                 # the same public pattern, this group's weights
        _, pred = dijkstra(graph, directed=True, indices=int(d), return_predecessors=True)
        hops[g] = pred
    hops[hops < 0] = -1
    hops[np.arange(len(dest)), dest] = dest
    return hops


def follow(hops: np.ndarray, group: np.ndarray, source: np.ndarray, dest: np.ndarray,
           max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Paths source -> dest along ``hops[group]``, at most ``max_len`` cells each (a public cap: longer paths are
    cut). Returns (lengths, cells) as ragged arrays; vectorised over samples, one loop step per hop."""
    n = len(source)
    path = np.full((n, max_len), -1, dtype=np.int64)
    cur = np.asarray(source, dtype=np.int64).copy()
    alive = np.ones(n, dtype=bool)
    length = np.zeros(n, dtype=np.int64)
    for step in range(max_len):
        path[alive, step] = cur[alive]
        length[alive] += 1
        alive &= cur != dest
        if not alive.any():
            break
        nxt = hops[group[alive], cur[alive]]
        stuck = nxt < 0
        idx = np.flatnonzero(alive)
        alive[idx[stuck]] = False
        cur[idx[~stuck]] = nxt[~stuck]
    keep = np.arange(max_len)[None] < length[:, None]
    return length, path[keep]


class Router:
    """Most probable paths under one model, with every (destination, slot) search kept for the next call: the
    next-hop table of each searched group (:func:`next_hops`), searched ``groups_per_search`` at a time.

    ``log_probs(dest_g, slot_g)`` returns (G, w^2, (2r+1)^2) log next-hop probabilities for G groups; a positive
    ``hop_cost`` (nats) is added to every hop's weight (paths with fewer hops).

    A model keeps one router per ``hop_cost`` across its sampling calls (an output's blocks search each group once,
    not once per block: 2.7x fewer searches on 20,000 trips). A group's table is a pure function of the released
    weights and (d, t), so what is kept changes no row; it is held in the smallest integer type that names every
    cell, and dropped whole (searched again when needed) once it would pass ``max_bytes``. Thread-safe: the tables
    grow under a lock and each call reads the ones it was handed."""

    def __init__(self, log_probs: Callable[[np.ndarray, np.ndarray], np.ndarray], w: int, r: int,
                 groups_per_search: int = 64, hop_cost: float = 0.0, max_bytes: int = 64 << 20):
        self.log_probs, self.w, self.r, self.chunk, self.hop_cost = log_probs, w, r, groups_per_search, hop_cost
        self.max_bytes = max_bytes
        self.dtype = np.int16 if w * w <= np.iinfo(np.int16).max else np.int32
        self.keys = np.zeros(0, dtype=np.int64)                 # sorted group keys dest * KEY + slot
        self.hops = np.zeros((0, w * w), dtype=self.dtype)
        self._pattern = reversed_pattern(w, r)
        self._lock = threading.Lock()

    KEY = 1 << 20   # above every slot (n_time <= 1440)

    def groups(self, dest: np.ndarray, slot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(next-hop tables, the row of every sample's (dest, slot) in them), searching the groups not searched
        yet."""
        keys = dest * self.KEY + slot
        with self._lock:
            new = np.setdiff1d(keys, self.keys)
            if len(new):
                if (len(self.keys) + len(new)) * self.w * self.w * self.hops.itemsize > self.max_bytes:
                    old = np.isin(self.keys, keys)       # over the cap: keep only what this call needs
                    self.keys, self.hops = self.keys[old], self.hops[old]
                g_dest, g_slot = np.divmod(new, self.KEY)
                found = np.empty((len(new), self.w * self.w), dtype=self.dtype)
                for lo in range(0, len(new), self.chunk):   # a loop over chunks of groups, not samples
                    hi = min(lo + self.chunk, len(new))
                    found[lo:hi] = next_hops(self.log_probs(g_dest[lo:hi], g_slot[lo:hi]), g_dest[lo:hi], self.w,
                                             self.r, self.hop_cost, self._pattern)
                order = np.argsort(np.concatenate([self.keys, new]), kind="stable")
                self.keys = np.concatenate([self.keys, new])[order]
                self.hops = np.concatenate([self.hops, found])[order]
            return self.hops, np.searchsorted(self.keys, keys)

    def paths(self, source, dest, slot, max_len: int) -> tuple[np.ndarray, np.ndarray]:
        """The most probable path of every sample (source[i] -> dest[i] in slot[i]), at most ``max_len`` cells.
        Returns (lengths, cells)."""
        source, dest, slot = (np.asarray(a, dtype=np.int64) for a in (source, dest, slot))
        if len(source) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        table, group = self.groups(dest, slot)
        return follow(table, group, source, dest, max_len)


def most_probable_paths(log_probs: Callable[[np.ndarray, np.ndarray], np.ndarray], source: np.ndarray,
                        dest: np.ndarray, slot: np.ndarray, w: int, r: int, max_len: int,
                        groups_per_search: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """The most probable path of every sample (source[i] -> dest[i] in slot[i]); samples are grouped by
    (dest, slot), one search per group (:class:`Router`). Returns (lengths, cells)."""
    return Router(log_probs, w, r, groups_per_search).paths(source, dest, slot, max_len)


def replace(lengths: np.ndarray, cells: np.ndarray, which: np.ndarray, new_lengths: np.ndarray,
            new_cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ragged paths with the rows ``which`` (bool) replaced by the rows of (new_lengths, new_cells), in order."""
    lengths = np.asarray(lengths, dtype=np.int64).copy()
    rows = np.flatnonzero(which)
    owner = np.concatenate([np.repeat(np.arange(len(lengths)), lengths)[~np.repeat(which, lengths)],
                            np.repeat(rows, new_lengths)])
    merged = np.concatenate([np.asarray(cells)[~np.repeat(which, lengths)], new_cells]).astype(np.int64)
    lengths[rows] = new_lengths
    return lengths, merged[np.argsort(owner, kind="stable")]


def through(lengths1: np.ndarray, cells1: np.ndarray, lengths2: np.ndarray, cells2: np.ndarray, via: np.ndarray,
            max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Ragged paths made of two legs: every sample's first leg (``lengths1``, ``cells1``: one per sample), then,
    for the samples where ``via`` is True (their second legs, in order, in ``lengths2``, ``cells2``) and whose
    first leg reached the waypoint the second leg starts at, the second leg without that repeated first cell; cut
    at the public ``max_len`` cells. Vectorised (one sort of all cells). Returns (lengths, cells)."""
    lengths1, lengths2 = np.asarray(lengths1, dtype=np.int64), np.asarray(lengths2, dtype=np.int64)
    n = len(lengths1)
    ends1 = np.cumsum(lengths1)
    owner1 = np.repeat(np.arange(n), lengths1)
    pos1 = np.arange(len(cells1)) - np.repeat(ends1 - lengths1, lengths1)
    idx = np.flatnonzero(via)
    starts2 = np.cumsum(lengths2) - lengths2
    reached = (lengths1[idx] > 0) & (lengths2 > 0)
    reached &= cells1[np.maximum(ends1[idx] - 1, 0)] == cells2[np.minimum(starts2, max(len(cells2) - 1, 0))] \
        if len(cells2) else reached
    owner2 = np.repeat(idx, lengths2)
    pos2 = np.arange(len(cells2)) - np.repeat(starts2, lengths2)
    keep2 = (pos2 >= 1) & np.repeat(reached, lengths2)
    owner = np.concatenate([owner1, owner2[keep2]])
    pos = np.concatenate([pos1, lengths1[owner2[keep2]] + pos2[keep2] - 1])
    cells = np.concatenate([cells1, np.asarray(cells2)[keep2]]).astype(np.int64)
    inside = pos < max_len
    owner, pos, cells = owner[inside], pos[inside], cells[inside]
    order = np.lexsort((pos, owner))
    return np.bincount(owner, minlength=n).astype(np.int64), cells[order]
