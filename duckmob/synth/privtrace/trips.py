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
  instead. Cost: O(|I| |J|) memory, a few hundred matrix-vector products, where I, J are the states with
  positive b and q; no generic convex solver, no all-pairs Dijkstra (one BFS per state in I on the sparse
  neighbour graph).
* Kept because it is the paper's method and corrects b where long trips start in particular places (on GeoLife
  it is about as far from the true start distribution as b itself: docs/methods/privtrace.md).
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
                      decay: float | None = None, iters: int = 100, tol: float = 1e-4,
                      max_decay: float = 20.0) -> tuple[np.ndarray, dict]:
    """Estimate the trip distribution (§4.4) and return the start-state distribution sum_j t_ij (normalised).

    ``b``, ``q``: non-negative (NormCut) noisy start and end counts per state; ``n_trips``: noisy number of
    trajectories; ``offsets``/``dst``: the state adjacency (CSR); ``decay``: the gravity exponent, or None to
    fit it (see the module doc). Returns ``(p_start (m,), info)`` with ``info``: ``decay``, ``detour`` (c),
    ``mean_shortest`` (u-weighted mean of l_ij) and ``target_length`` (n_trips / sum(b)). Falls back to b
    itself when q has no mass.
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
    hops = hop_distances(offsets, dst, I)[:, J]
    if not np.isfinite(hops).all():          # a disconnected grid cannot happen, but never multiply by inf
        hops = np.where(np.isfinite(hops), hops, hops[np.isfinite(hops)].max(initial=0.0) + 1)
    l = hops + 2.0
    lbar = l.mean()
    target = max(float(n_trips), 0.0) / total

    def gravity(lam, x, y):
        if lam == 0:
            return np.outer(bI, qJ) / total, x, y
        G = np.exp(-lam * (l / lbar - 1.0))
        x, y = _sinkhorn(G, bI, qJ, x, y, iters, tol)
        return x[:, None] * G * y[None, :], x, y

    def mean_length(u):
        return float((u * l).sum() / u.sum())

    x, y = np.ones(len(I)), np.ones(len(J))
    if decay is not None:
        lam = float(decay)
        u, x, y = gravity(lam, x, y)
    else:
        # one parameter meets the total: trips more local than independence (lam > 0), or longer (detour)
        lam = 0.0
        u, x, y = gravity(0.0, x, y)
        if mean_length(u) > target > 0:
            lo, hi = 0.0, max_decay
            for _ in range(20):
                lam = (lo + hi) / 2
                u, x, y = gravity(lam, x, y)
                f = mean_length(u)
                if abs(f - target) <= 1e-2 * target:
                    break
                lo, hi = (lam, hi) if f > target else (lo, lam)
    mean_shortest = mean_length(u)
    detour = max(target - mean_shortest, 0.0)
    p = np.zeros(m)
    p[I] = (u * (l + detour)).sum(axis=1)
    info.update(decay=lam, detour=detour, mean_shortest=mean_shortest, target_length=target)
    return p / p.sum(), info
