"""Points along a clean-slate path, spaced like real fixes: a private histogram of the distance between
consecutive fixes, and the placement of points along each generated path at distances drawn from it.

The paper outputs one location per path cell; consecutive points are then about one cell apart whatever the data's
sampling (a taxi's 300 m steps on a grid of 800 m cells come out 800 m and more). Here each path is a polyline
through one point uniform in each of its cells (the paper's points), and the output's points are placed along it,
from its first vertex to its last, at steps drawn from the released step histogram: the path, the cells and the
trip are the method's; only the spacing of the points along it is learned from the data's steps. The same
statistic and mechanism as the shared fine placement's step histogram (:mod:`duckmob.synth.placement.releases`).

Privacy map of :func:`release_steps` (the step histogram, the shared placement's public bins ``STEP_EDGES_M``):
a trajectory with S steps between consecutive fixes adds 1 / S to the bin of each (mass 1; a one-point trajectory
adds nothing), so one trajectory moves the table by at most 1 in L1 and a unit of k trajectories by at most k
(``counting.normalised_sums``); Laplace of scale ``k / eps_steps`` on EVERY bin (``counting.release_sums``) is
eps_steps-DP (one ``accounting.laplace(eps_steps)`` event). The head and tail cut to where the histogram stands
above the noise, the blocks of bins and NormCut are post-processing (as placement's, the same public constants).
:func:`space` is post-processing of the released histogram and the sampled paths.
"""

from __future__ import annotations

import math

import numpy as np

from duckmob.grid import BBox
from duckmob.privacy.counting import normalised_sums, release_sums
from duckmob.privacy.normcut import normcut
from duckmob.source.batches import as_batches
from duckmob.synth.cells import truncate_tail
from duckmob.synth.placement import (STEP_EDGES_M, STEP_TAU, local_xy, spaced, step_bins, step_block,
                                      steps_mostly_noise)

N_BINS = len(STEP_EDGES_M) - 1


def release_steps(source, bbox, eps_steps: float, noise, k: int, n_noisy: float) -> np.ndarray:
    """The released step histogram (module docstring), normalised to sum 1 over the public bins, or all zeros when
    it is mostly noise (:func:`duckmob.synth.placement.steps_mostly_noise`; then :func:`space` keeps one point per
    cell). ``source``: trajectories or batches of them (integer sums, added over batches)."""
    scale = k / eps_steps
    sums = as_batches(source).reduce(lambda d: {"steps": normalised_sums(*step_bins(d, bbox), N_BINS, scale)})
    noisy = release_sums(sums["steps"], scale, noise)
    # post-processing, as placement.release_statistics: blocks of public bins, head and tail cut where the blocks
    # fall to the noise, NormCut, each block's mass spread evenly over its bins
    m = step_block(float(n_noisy), scale)
    padded = np.zeros(-(-N_BINS // m) * m)
    padded[:N_BINS] = noisy
    blocks, block_scale = padded.reshape(-1, m).sum(axis=1), scale * math.sqrt(m)
    if steps_mostly_noise(blocks, n_noisy, block_scale):
        return np.zeros(N_BINS)
    tau = STEP_TAU if m > 1 else 1.0
    kept = truncate_tail(truncate_tail(blocks, block_scale, tau)[::-1], block_scale, tau)[::-1]
    if not (kept > 0).any():
        kept = (np.arange(len(blocks)) == np.argmax(blocks)).astype(np.float64)
    blocks = normcut(kept[None, :], axis=-1)[0]
    steps = np.repeat(blocks / m, m)[:N_BINS]
    return steps / max(steps.sum(), 1e-300)


def draw_steps(probs: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` step lengths (metres) from the histogram ``probs`` over the public bins: a bin, then uniform in log
    inside it (uniform on the first bin, [0, 1) m)."""
    cdf = np.cumsum(probs) / probs.sum()
    lo, hi = STEP_EDGES_M[:-1], STEP_EDGES_M[1:]
    b = np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), N_BINS - 1)
    t = rng.random(n)
    lo_b = np.maximum(lo[b], 1e-12)
    return np.where(lo[b] > 0, np.exp(np.log(lo_b) + t * np.log(hi[b] / lo_b)), hi[b] * t)


def corner_vertices(lengths: np.ndarray, cells: np.ndarray, lat: np.ndarray, lon: np.ndarray, bbox, w: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The polyline's vertices: ``lat``, ``lon`` (one point in each path cell), plus, between two diagonal
    neighbours, the corner they share, so that every segment stays inside its two cells (a straight segment
    between points of diagonal neighbours crosses a third cell half of the time, and points spaced on it would
    visit a cell the path does not). Returns ``(lengths, lat, lon)``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    owner = np.repeat(np.arange(len(lengths)), lengths)
    r, c = np.divmod(np.asarray(cells, dtype=np.int64), w)
    diag = (owner[1:] == owner[:-1]) & (np.abs(np.diff(r)) == 1) & (np.abs(np.diff(c)) == 1)
    at = np.flatnonzero(diag)
    box = BBox.of(bbox)
    clat = box.min_lat + np.maximum(r[at], r[at + 1]) * (box.max_lat - box.min_lat) / w
    clon = box.min_lon + np.maximum(c[at], c[at + 1]) * (box.max_lon - box.min_lon) / w
    return (lengths + np.bincount(owner[at], minlength=len(lengths)), np.insert(lat, at + 1, clat),
            np.insert(lon, at + 1, clon))


def space(lengths: np.ndarray, lat: np.ndarray, lon: np.ndarray, probs: np.ndarray, bbox, max_points: int,
          rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Points along each path's polyline (vertices ``lat``, ``lon``: ``lengths[i]`` of them for path i): its first
    vertex, then one point at each cumulative step drawn from ``probs`` while inside the path, then its last vertex;
    at most ``max_points`` per path (a path whose draws would need more has its steps stretched evenly to reach its
    end). A one-vertex path gives two points there. Returns ``(lengths, lat, lon, along_m)``: ``along_m`` is each
    point's distance along its path (metres, for the times). Post-processing, vectorised over paths."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    box = BBox.of(bbox)
    off = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    x, y = local_xy(box, lat, lon)
    owner = np.repeat(np.arange(n), lengths)
    seg = np.where(owner[1:] == owner[:-1], np.hypot(np.diff(x), np.diff(y)), 0.0)
    along = np.concatenate([[0.0], np.cumsum(seg)])
    start = along[off[:-1]]
    route = along[off[1:] - 1] - start
    lo, hi = STEP_EDGES_M[:-1], STEP_EDGES_M[1:]
    mid = np.where(lo > 0, np.sqrt(lo * hi), hi / 2)
    mean_step = max(float(probs @ mid / probs.sum()), 1e-3)
    expect = route / mean_step
    cap = max(int(max_points), 2)
    want = np.minimum(np.ceil(expect * 1.2 + 3 * np.sqrt(expect)).astype(np.int64) + 4, cap - 2)
    step = draw_steps(probs, int(want.sum()), rng)
    out_len, _, p_dist, _, idx, nxt, frac = spaced(along, off, start, route, step, want)
    return (out_len, lat[idx] + (lat[nxt] - lat[idx]) * frac, lon[idx] + (lon[nxt] - lon[idx]) * frac, p_dist)
