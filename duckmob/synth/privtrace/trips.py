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
* Among the many t satisfying the margins, we take the maximum-entropy one: u_ij = t_ij / l_ij =
  x_i y_j exp(-lam * l_ij / mean(l)) (a gravity model), with x, y found by iterative proportional fitting
  (Sinkhorn) so that the margins of u are b and q exactly, and lam found by bisection so that
  sum_ij u_ij l_ij = N. Cost: O(|I| |J|) memory and a few hundred matrix-vector products, where I, J are the
  states with positive b and q. If no lam in the search range reaches N, the closest end is used.
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
                      lam_range: tuple[float, float] = (-4.0, 12.0), iters: int = 200,
                      tol: float = 1e-4) -> tuple[np.ndarray, dict]:
    """Estimate the trip distribution (§4.4) and return the start-state distribution sum_j t_ij (normalised).

    ``b``, ``q``: non-negative (NormCut) noisy start and end counts per state; ``n_trips``: noisy number of
    trajectories; ``offsets``/``dst``: the state adjacency (CSR). Returns ``(p_start (m,), info)`` where
    ``info`` has ``lam`` and ``mean_length`` (the u-weighted mean of l_ij, which the solve matches to
    n_trips / sum(b) when it can). Falls back to b itself when b or q has no mass.
    """
    m = len(b)
    b = np.maximum(np.asarray(b, dtype=np.float64), 0.0)
    q = np.maximum(np.asarray(q, dtype=np.float64), 0.0)
    info = {"lam": float("nan"), "mean_length": float("nan"), "target_length": float("nan")}
    if b.sum() <= 0:
        return np.full(m, 1.0 / m), info
    if q.sum() <= 0:
        return b / b.sum(), info
    I, J = np.flatnonzero(b > 0), np.flatnonzero(q > 0)
    total = (b.sum() + q.sum()) / 2
    bI = b[I] / b.sum() * total
    qJ = q[J] / q.sum() * total
    hops = hop_distances(offsets, dst, I)[:, J]
    if not np.isfinite(hops).all():          # a disconnected grid cannot happen, but never divide by inf
        hops = np.where(np.isfinite(hops), hops, np.nanmax(np.where(np.isfinite(hops), hops, np.nan)) + 1)
    l = hops + 2.0
    lbar = l.mean()
    target = max(float(n_trips), 0.0) / total
    info["target_length"] = target

    def solve(lam, x, y):
        G = np.exp(-lam * (l / lbar - 1.0))
        x, y = _sinkhorn(G, bI, qJ, x, y, iters, tol)
        u = x[:, None] * G * y[None, :]
        return u, x, y, float((u * l).sum() / max(u.sum(), 1e-300))

    lo, hi = lam_range
    x, y = np.ones(len(I)), np.ones(len(J))
    u, x, y, f0 = solve(0.0, x, y)
    lam = 0.0
    if target > 0 and abs(f0 - target) > 1e-3 * target:
        # the mean length decreases with lam: bisect on the side of 0 that holds the target (or its end)
        a, c = (0.0, hi) if f0 > target else (lo, 0.0)
        for _ in range(40):
            lam = (a + c) / 2
            u, x, y, f = solve(lam, x, y)
            if abs(f - target) <= 1e-3 * target or c - a < 1e-3:
                break
            if f > target:
                a = lam
            else:
                c = lam
    t = u * l
    p = np.zeros(m)
    p[I] = t.sum(axis=1)
    info.update(lam=float(lam), mean_length=float((u * l).sum() / max(u.sum(), 1e-300)))
    return p / p.sum(), info
