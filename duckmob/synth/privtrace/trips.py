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
* Real trips are longer than shortest paths (detours, stops, GPS wander: on GeoLife the paper's constraint
  sum t = N cannot be met with shortest-path lengths). We model the harmonic-mean length of the trips from i
  to j as l_ij + c with ONE constant c >= 0 fitted so that sum_ij t_ij = N (the paper's total constraint);
  c = 0 is the paper's model. Meeting the total through the trip pattern instead (putting the trips on the
  farthest pairs) would distort the start distribution, which is all the generation uses.
* Among the many t satisfying the margins, we take the maximum-entropy one for u_ij = t_ij / (l_ij + c):
  u_ij = x_i y_j exp(-decay * l_ij / mean(l)) with margins b and q exactly. With decay = 0 (default; nothing in
  the released statistics identifies it) this is u = b q^T / sum(b) in closed form; with decay != 0 (a gravity
  model, a public choice) x, y come from iterative proportional fitting (Sinkhorn). Either way: O(|I| |J|)
  memory and time, where I, J are the states with positive b and q, no generic convex solver.
* N is a noisy trajectory count. Everything here is post-processing of DP outputs.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path


def hop_distances(offsets: np.ndarray, dst: np.ndarray, sources: np.ndarray) -> np.ndarray:
    """Unweighted shortest-path hop counts from each of ``sources`` to every state: ``(len(sources), m)``."""
    m = len(offsets) - 1
    graph = csr_matrix((np.ones(len(dst)), dst, offsets), shape=(m, m))
    return shortest_path(graph, method="D", directed=False, unweighted=True, indices=np.asarray(sources))


def _sinkhorn(G, b, q, x, y, iters: int, tol: float):
    for _ in range(iters):
        x = b / np.maximum(G @ y, 1e-300)
        y = q / np.maximum(G.T @ x, 1e-300)
        rows = x * (G @ y)
        if np.abs(rows - b).sum() <= tol * b.sum():
            break
    return x, y


def trip_distribution(b: np.ndarray, q: np.ndarray, n_trips: float, offsets: np.ndarray, dst: np.ndarray,
                      decay: float = 0.0, iters: int = 500, tol: float = 1e-6) -> tuple[np.ndarray, dict]:
    """Estimate the trip distribution (§4.4) and return the start-state distribution sum_j t_ij (normalised).

    ``b``, ``q``: non-negative (NormCut) noisy start and end counts per state; ``n_trips``: noisy number of
    trajectories; ``offsets``/``dst``: the state adjacency (CSR); ``decay``: the gravity exponent (0: maximum
    entropy). Returns ``(p_start (m,), info)`` with ``info``: ``detour`` (c), ``mean_shortest`` (u-weighted
    mean of l_ij) and ``target_length`` (n_trips / sum(b)). Falls back to b itself when q has no mass.
    """
    m = len(b)
    b = np.maximum(np.asarray(b, dtype=np.float64), 0.0)
    q = np.maximum(np.asarray(q, dtype=np.float64), 0.0)
    info = {"detour": float("nan"), "mean_shortest": float("nan"), "target_length": float("nan")}
    if b.sum() <= 0:
        return np.full(m, 1.0 / m), info
    if q.sum() <= 0:
        return b / b.sum(), info
    I, J = np.flatnonzero(b > 0), np.flatnonzero(q > 0)
    total = (b.sum() + q.sum()) / 2
    bI = b[I] / b.sum() * total
    qJ = q[J] / q.sum() * total
    hops = hop_distances(offsets, dst, I)[:, J]
    if not np.isfinite(hops).all():          # a disconnected grid cannot happen, but never multiply by inf
        hops = np.where(np.isfinite(hops), hops, hops[np.isfinite(hops)].max(initial=0.0) + 1)
    l = hops + 2.0
    if decay:
        G = np.exp(-float(decay) * (l / l.mean() - 1.0))
        x, y = _sinkhorn(G, bI, qJ, np.ones(len(I)), np.ones(len(J)), iters, tol)
        u = x[:, None] * G * y[None, :]
    else:
        u = np.outer(bI, qJ) / total
    mean_shortest = float((u * l).sum() / u.sum())
    target = max(float(n_trips), 0.0) / total
    detour = max(target - mean_shortest, 0.0)
    p = np.zeros(m)
    p[I] = (u * (l + detour)).sum(axis=1)
    info.update(detour=detour, mean_shortest=mean_shortest, target_length=target)
    return p / p.sum(), info
