"""Most probable paths between sampled endpoints (Lestyan et al. §7.3.3): Dijkstra on -log p.

For a destination d and slot t the routing graph has an edge c -> c' for every next hop c' within r cells of
c, weighted ``-log p(c' | c, d, t)``; the shortest path from s to d is the most probable one (a product of
probabilities is maximal where the sum of their negative logs is minimal). All samples sharing (d, t) share
one graph, and one search on the REVERSED graph from d gives every cell's next hop towards d at once.
Groups are searched together: their reversed graphs are the blocks of one block-diagonal sparse matrix and one
multi-source call of ``scipy.sparse.csgraph.dijkstra`` (``indices`` = each block's d, ``min_only``) solves them
all, since no block reaches another. Post-processing of the released model: no budget.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import dijkstra

from duckmob.synth.cleanslate.trips import neighbour_offsets, valid_moves

# Smallest edge weight: csgraph drops explicit zeros, so a hop of probability 1 keeps a tiny positive cost.
MIN_WEIGHT = 1e-12


def next_hops(log_p: np.ndarray, dest: np.ndarray, w: int, r: int) -> np.ndarray:
    """(G, w^2) next cell from every cell towards ``dest[g]`` on its most probable path under ``log_p[g]``
    ((G, w^2, (2r+1)^2) log next-hop probabilities); ``dest[g]`` maps to itself, an unreachable cell to -1."""
    n_groups, n_cells = len(dest), w * w
    valid = valid_moves(w, r)
    dr, dc = neighbour_offsets(r)
    c, k = np.nonzero(valid)                                   # public edge list of one block
    target = c + dr[k] * w + dc[k]
    block = np.arange(n_groups, dtype=np.int64)[:, None] * n_cells
    weight = np.maximum(-np.asarray(log_p, dtype=np.float64)[:, c, k], MIN_WEIGHT)   # (G, E)
    # reversed graph: an edge target -> c for every forward edge c -> target
    rows = (block + target[None]).ravel()
    cols = (block + c[None]).ravel()
    size = n_groups * n_cells
    graph = sp.csr_matrix((weight.ravel(), (rows, cols)), shape=(size, size))
    sources = block[:, 0] + np.asarray(dest, dtype=np.int64)
    _, pred, _ = dijkstra(graph, directed=True, indices=sources, min_only=True, return_predecessors=True)
    pred = pred.astype(np.int64)
    hop = np.where(pred >= 0, pred - np.repeat(block[:, 0], n_cells), -1)
    hop[sources] = np.asarray(dest, dtype=np.int64)
    return hop.reshape(n_groups, n_cells)


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


def most_probable_paths(log_probs: Callable[[np.ndarray, np.ndarray], np.ndarray], source: np.ndarray,
                        dest: np.ndarray, slot: np.ndarray, w: int, r: int, max_len: int,
                        groups_per_search: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """The most probable path of every sample (source[i] -> dest[i] in slot[i]).

    ``log_probs(dest_g, slot_g)`` returns (G, w^2, (2r+1)^2) log next-hop probabilities for G groups. Samples
    are grouped by (dest, slot); groups are searched ``groups_per_search`` at a time. Returns (lengths, cells)."""
    source, dest, slot = (np.asarray(a, dtype=np.int64) for a in (source, dest, slot))
    n = len(source)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    keys, group = np.unique(dest * (int(slot.max()) + 1) + slot, return_inverse=True)
    g_dest, g_slot = np.divmod(keys, int(slot.max()) + 1)
    hops = np.empty((len(keys), w * w), dtype=np.int64)
    for lo in range(0, len(keys), groups_per_search):   # a loop over chunks of groups, not samples
        hi = min(lo + groups_per_search, len(keys))
        hops[lo:hi] = next_hops(log_probs(g_dest[lo:hi], g_slot[lo:hi]), g_dest[lo:hi], w, r)
    return follow(hops, group, source, dest, max_len)
