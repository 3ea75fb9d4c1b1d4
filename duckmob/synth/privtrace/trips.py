"""PrivTrace's trip distribution estimation (§4.4, App. B.3), solved so that it scales.

Length normalisation under-counts the starts of long trajectories: from the noisy first-order model we only
know b_i = sum over trips from i of 1 / |T| (virtual start -> i) and q_j = sum over trips ending at j of
1 / |T| (j -> virtual end). With t_ij the number of trips from i to j and l_ij their (harmonic mean) length,
approximated by the shortest path between i and j, the paper asks for t >= 0 with
    sum_j t_ij / l_ij ~ b_i,   sum_i t_ij / l_ij ~ q_j,   sum_ij t_ij = N,
and solves a least-squares problem over all m^2 variables with a generic convex solver (the reference: 331,776
variables, plus all-pairs Dijkstra: minutes).

Choices made here:
* l_ij is a length in the units of the normalisation, the number of first-order transitions of the augmented
  trajectory: (hops on the state adjacency graph) + 2, where hops is an unweighted BFS distance (the paper
  weights edges by geographic distance, which is not the unit |T| is counted in). The graph is the public
  grid geometry; no count enters it (the reference took lengths from the non-noisy transition matrix).
* Among the many t satisfying the margins we take a maximum-entropy (gravity) one: u_ij = t_ij / l_ij =
  x_i y_j exp(-decay * l_ij / mean(l)), with margins b and q exactly (x, y by iterative proportional fitting,
  Sinkhorn; decay = 0 is u = b q^T / sum(b) in closed form). The paper's total constraint sum t = N then
  fixes the one free parameter: if independent trips (decay 0) would be longer than N / sum(b) allows, decay
  > 0 is found by bisection (trips are more local); if they would be shorter — real trips are longer than
  shortest paths (detours, stops, GPS wander) — the harmonic-mean length of the trips from i to j is taken as
  l_ij + c with one constant c >= 0 (the "detour") that meets the total. A fixed ``decay`` can be given
  instead. Cost: a few hundred matrix-vector products, where I, J are the states with positive b and q; no
  generic convex solver, no all-pairs Dijkstra (one BFS per state in I on the sparse neighbour graph).
* Memory: the one |I| x |J| table held is the hop counts, in the smallest unsigned integer type that holds a
  bound on them (uint8 on the 60,451-state model of docs/scale.md). As l_ij takes few values, the kernel is a
  short lookup table indexed by hops; the kernel, l and u exist only a block at a time (``block`` entries, 1 MB
  of float64 by default; blocks of columns, as the table is stored column by column) inside each Sinkhorn pass
  and each sum, and each BFS keeps one source's counts. When one block covers the table the arithmetic is the
  whole-table one, bit for bit.
* Kept because it is the paper's method and corrects b where long trips start in particular places (on GeoLife
  it is about as far from the true start distribution as b itself: docs/methods/privtrace.md).
* N is a noisy trajectory count. Everything here is post-processing of DP outputs.
"""

from __future__ import annotations

import itertools

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import breadth_first_order, connected_components, shortest_path

BLOCK = 1 << 17          # table entries in one block (1 MB of float64: a kernel block stays in cache)


def _graph(offsets: np.ndarray, dst: np.ndarray) -> csr_matrix:
    m = len(offsets) - 1
    return csr_matrix((np.ones(len(dst)), dst, offsets), shape=(m, m))


def hop_distances(offsets: np.ndarray, dst: np.ndarray, sources: np.ndarray) -> np.ndarray:
    """Unweighted shortest-path hop counts from each of ``sources`` to every state: ``(len(sources), m)`` float64
    (inf where unreachable). Dense: for many sources on a large model use :func:`hop_table`."""
    return shortest_path(_graph(offsets, dst), method="D", directed=False, unweighted=True,
                         indices=np.asarray(sources))


def bfs_hops(graph: csr_matrix, source: int) -> tuple[np.ndarray, np.ndarray]:
    """The states reachable from ``source`` on the symmetric ``graph`` and their hop counts, by one breadth-first
    search: ``(states, hops)``. The search's queue holds the states level by level, each state's parent earlier
    than it and the parents in queue order, so a level ends where the first state whose parent lies past the
    previous level's end begins (a binary search a level; no priority queue as in Dijkstra's)."""
    order, pred = breadth_first_order(graph, source, directed=True, return_predecessors=True)
    position = np.empty(graph.shape[0], np.int64)
    position[order] = np.arange(len(order))
    parent = position[pred[order[1:]]]                 # queue position of each later state's parent: sorted
    hops = np.empty(len(order), np.int64)
    start, end, level = 0, 1, 0
    while start < len(order):
        hops[start:end] = level
        start, end, level = end, 1 + int(np.searchsorted(parent, end)), level + 1
    return order, hops


def hop_table(offsets: np.ndarray, dst: np.ndarray, rows: np.ndarray, cols: np.ndarray,
              block: int = BLOCK) -> np.ndarray:
    """Hop counts from each state of ``rows`` to each of ``cols``, ``(len(rows), len(cols))`` stored column by
    column (Fortran order, the layout ``hop_distances(...)[:, cols]`` has), in the smallest unsigned integer type
    that holds a bound on them: 2 x (eccentricity of the first row's state) + 1 on a connected graph, else the
    number of states m. A pair with no path (a disconnected graph) gets one more than the largest count of the
    table, as :func:`trip_distribution` has always read it. One breadth-first search a row (:func:`bfs_hops`),
    written ``block // len(cols)`` rows at a time."""
    graph = _graph(offsets, dst)
    graph = ((graph + graph.T) > 0).tocsr()           # undirected, as hop_distances reads the adjacency
    m, rows, cols = graph.shape[0], np.asarray(rows), np.asarray(cols)
    if not len(rows):
        return np.empty((0, len(cols)), np.uint8, order="F")
    searches = (bfs_hops(graph, int(r)) for r in rows)
    first = next(searches)
    connected = connected_components(graph, directed=False, return_labels=False) == 1
    bound = 2 * int(first[1].max()) + 1 if connected else m
    dtype = np.min_scalar_type(bound)
    out = np.empty((len(rows), len(cols)), dtype, order="F")
    step = max(1, block // max(len(cols), 1))
    buffer = np.empty((min(step, len(rows)), len(cols)), dtype)
    state = np.empty(m, dtype)
    top = 0
    for i, (order, hops) in enumerate(itertools.chain([first], searches)):
        state.fill(bound)                              # counts are < bound: bound marks "no path"
        state[order] = hops
        row = buffer[i % step]
        row[:] = state[cols]
        if not connected:
            top = max(top, int(row[row < bound].max(initial=0)))
        if i % step == step - 1 or i == len(rows) - 1:
            out[i - i % step:i + 1] = buffer[:i % step + 1]
    if not connected:
        for c in _col_blocks(len(rows), len(cols), block):
            part = out[:, c]
            part[part == bound] = top + 1
    return out


def _col_blocks(n_rows: int, n_cols: int, block: int) -> list[slice]:
    """Slices of columns of about ``block`` entries each: contiguous parts of a table stored column by column."""
    step = max(1, block // max(n_rows, 1))
    return [slice(a, min(a + step, n_cols)) for a in range(0, n_cols, step)]


def _add(total, part):
    """``total + part``, or ``part`` itself for the first part: with one block, the whole-table value unchanged."""
    if total is None:
        return part
    total += part
    return total


def _sinkhorn(table, hops, blocks, b, q, x, y, iters: int, tol: float):
    """Iterative proportional fitting of x, y so that u_ij = x_i table[hops_ij] y_j has row sums b and column sums
    q: x = b / (G y), y = q / (G^T x), stopping when the row sums x (G y) are within ``tol`` of b. One pass over
    the column blocks of G per iteration: a block's G^T x gives its part of y, then its part of G y (summed over
    the blocks), which is the check and the next x."""
    gy = None
    for c in blocks:
        gy = _add(gy, table[hops[:, c]] @ y[c])
    for _ in range(iters):
        x = b / np.maximum(gy, 1e-300)
        y = np.empty(len(q))
        gy = None
        for c in blocks:
            G = table[hops[:, c]]
            y[c] = q[c] / np.maximum(G.T @ x, 1e-300)
            gy = _add(gy, G @ y[c])
        if np.abs(x * gy - b).sum() <= tol * b.sum():
            break
    return x, y


def _u_blocks(fit, bI, qJ, total, hops, blocks):
    """Yield (u block, l block) over the column blocks of ``fit`` = (decay, kernel, x, y): u = b q^T / total at
    decay 0, else x_i kernel[hops_ij] y_j; l = hops + 2."""
    lam, kernel, x, y = fit
    for c in blocks:
        u = np.outer(bI, qJ[c]) / total if lam == 0 else x[:, None] * kernel[hops[:, c]] * y[None, c]
        yield u, hops[:, c] + 2.0


def _mean_length(parts) -> float:
    ul = uu = None
    for u, l in parts:
        ul = _add(ul, (u * l).sum())
        uu = _add(uu, u.sum())
    return float(ul / uu)


def trip_distribution(b: np.ndarray, q: np.ndarray, n_trips: float, offsets: np.ndarray, dst: np.ndarray,
                      decay: float | None = None, iters: int = 100, tol: float = 1e-4,
                      max_decay: float = 20.0, block: int = BLOCK) -> tuple[np.ndarray, dict]:
    """Estimate the trip distribution (§4.4) and return the start-state distribution sum_j t_ij (normalised).

    ``b``, ``q``: non-negative (NormCut) noisy start and end counts per state; ``n_trips``: noisy number of
    trajectories; ``offsets``/``dst``: the state adjacency (CSR); ``decay``: the gravity exponent, or None to
    fit it (see the module doc); ``block``: table entries computed at once (memory; the result changes only to
    rounding, and not at all while one block covers the table). Returns ``(p_start (m,), info)`` with ``info``:
    ``decay``, ``detour`` (c), ``mean_shortest`` (u-weighted mean of l_ij) and ``target_length``
    (n_trips / sum(b)). Falls back to b itself when q has no mass.
    """
    m = len(b)
    b = np.maximum(np.asarray(b, dtype=np.float64), 0.0)
    q = np.maximum(np.asarray(q, dtype=np.float64), 0.0)
    info = {"decay": float("nan"), "detour": float("nan"), "mean_shortest": float("nan"),
            "target_length": float("nan")}
    if b.sum() <= 0:
        return np.full(m, 1.0 / m), info
    if q.sum() <= 0:
        return b / b.sum(), info
    I, J = np.flatnonzero(b > 0), np.flatnonzero(q > 0)
    total = (b.sum() + q.sum()) / 2
    bI = b[I] / b.sum() * total
    qJ = q[J] / q.sum() * total
    hops = hop_table(offsets, dst, I, J, block)
    blocks = _col_blocks(len(I), len(J), block)
    # the mean of l = hops + 2 over the table: a sum of integers, exact in float64 whatever its order
    lbar = float(int(hops.sum(dtype=np.uint64)) + 2 * hops.size) / hops.size
    values = np.arange(int(hops.max()) + 1) + 2.0      # every l_ij the table holds, indexed by hops
    target = max(float(n_trips), 0.0) / total

    def gravity(lam, x, y):
        """u for decay ``lam`` as (lam, the kernel's lookup table indexed by hops, x, y)."""
        if lam == 0:
            return lam, None, x, y
        kernel = np.exp(-lam * (values / lbar - 1.0))
        return (lam, kernel, *_sinkhorn(kernel, hops, blocks, bI, qJ, x, y, iters, tol))

    def mean_length(fit):
        return _mean_length(_u_blocks(fit, bI, qJ, total, hops, blocks))

    x, y = np.ones(len(I)), np.ones(len(J))
    if decay is not None:
        lam = float(decay)
        fit = gravity(lam, x, y)
    else:
        # one parameter meets the total: trips more local than independence (lam > 0), or longer (detour)
        lam = 0.0
        fit = gravity(0.0, x, y)
        if mean_length(fit) > target > 0:
            lo, hi = 0.0, max_decay
            for _ in range(20):
                lam = (lo + hi) / 2
                fit = gravity(lam, fit[2], fit[3])
                f = mean_length(fit)
                if abs(f - target) <= 1e-2 * target:
                    break
                lo, hi = (lam, hi) if f > target else (lo, lam)
    mean_shortest = mean_length(fit)
    detour = max(target - mean_shortest, 0.0)
    p = np.zeros(m)
    rows = None
    for u, l in _u_blocks(fit, bI, qJ, total, hops, blocks):
        rows = _add(rows, (u * (l + detour)).sum(axis=1))
    p[I] = rows
    info.update(decay=lam, detour=detour, mean_shortest=mean_shortest, target_length=target)
    return p / p.sum(), info
