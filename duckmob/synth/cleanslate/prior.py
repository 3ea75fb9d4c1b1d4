"""The trajectory initialiser's DP prior: noisy histograms of where trips start and end, of their time slot, of
the distance between their two ends and of their detour; the public coarse grid the VAE works on; the sampling of
a destination given its source, and of a waypoint that gives a trip its detour.

Why: DP-SGD alone does not teach the VAE where trips start and end (Gaussian noise on every one of its w^2-way
head weights drowns the signal; the endpoints came out near uniform), nor how far apart they are. A few
histograms are cheap to release exactly as counts; the VAE then only has to learn what they miss, on a coarse
grid (``coarse`` x ``coarse`` fine cells per coarse cell, a public factor) whose heads have ``coarse^2`` times
fewer logits. A sampled coarse source becomes a fine cell drawn from the released fine histogram inside it; the
destination is drawn given the source from ``p(d | s, z) ~ p_VAE(coarse(d) | z) p(d | coarse(d)) g(d) f(D(s, d))``
with ``D`` the Chebyshev distance in fine cells and ``(g, f)`` fitted to the released endpoint and distance
histograms by iterative proportional fitting (:func:`gravity`; post-processing). Real trips are not shortest
paths: a trip of ``L`` cells between ends ``h = ceil(D / r)`` hops apart makes a detour of ``L - 1 - h >= 0`` hops;
each synthetic trip draws one given its ends' distance from the released (distance, detour) histogram
(:func:`draw_detours`) and, when it is positive, is routed through a waypoint that adds about that many hops
(:func:`waypoints`).

Release (:func:`release_prior`), ``eps_prior`` split in equal parts over the histograms:

- ``endpoints='shared'`` (default): ONE histogram of both ends over the w^2 cells: every trajectory adds 1/2 to
  the bin of its source and 1/2 to the bin of its destination (two windows of :func:`normalised_release`, mass 1
  in all), used for sources and destinations alike (it pools both ends' counts: twice the signal for the same
  noise, at the cost of assuming they are alike); ``'separate'``: a source histogram and a destination histogram,
  each trajectory adding 1 to one bin of each;
- the slot histogram (``n_time`` bins): 1 in the bin of the start slot;
- the distance histogram (w bins, 0 .. w - 1): 1 in the bin of ``D(source, destination)``;
- the (distance, detour) histogram: 1 in the bin of (the distance's bucket, the detour's bucket), with the
  detour clipped to ``max_path - 1`` (the public path cap) and public power-of-two buckets (0, 1, 2-3, 4-7, ...;
  :func:`bucket`): a short trip and a long one do not wander alike, and the buckets keep the bins few.

The end and distance histograms are released on blocks of ``block`` x ``block`` cells (``block`` distances), and
spread evenly over the block's cells (distances) afterwards: with many cells and few trips every bin of a fine
histogram is mostly noise. ``block`` (:func:`prior_block`) is public (``prior_cells``) or follows the noisy count
(post-processing of a released value): at most ``SIGNAL n~ eps_h / k`` bins, so that a bin's mean mass is at least
``1 / SIGNAL`` of the noise scale ``k / eps_h``.
With ``refine`` (a public choice; by default on grids wider than 64 cells, where blocks are likely) one more
histogram, of both ends pooled on the fine cells (each trajectory 1/2 to each end's cell), shares each block's
probability among its cells instead (:func:`within`); it is the fifth (sixth, with separate ends) histogram. With
1 x 1 blocks and shared ends the two are releases of one histogram, and their mean is used.

Sensitivity, by construction: adding or removing one trajectory moves each histogram by at most 1 in L1 (its
windows' masses are non-negative and sum to 1); a user of at most k trajectories by at most k. Each histogram gets
Laplace noise of scale ``k / eps_h`` on every bin (a data-independent support, zero bins included),
``eps_h = eps_prior / H`` for H histograms (4 shared, 5 separate): each is ``eps_h``-DP, accounted as H
``accounting.laplace(eps_h)`` events (:func:`prior_events`) composed by the PLD accountant with the rest of the
fit. NormCut (non-negative, total kept) and normalisation are post-processing.
"""

from __future__ import annotations

import math

import numpy as np

from duckmob.privacy import accounting
from duckmob.privacy.counting import normalised_release, normalised_sums
from duckmob.privacy.noise import granularity
from duckmob.privacy.normcut import normcut

# Smallest probability a log-prior bias uses (a bin NormCut emptied is then drawn about never, and a training
# example in it has a finite loss).
FLOOR = 1e-6
ENDPOINTS = ("shared", "separate")
# iterations of the proportional fitting of :func:`gravity`
GRAVITY_ITERATIONS = 50
# The automatic block keeps the end histogram at most SIGNAL * n * eps_h / k bins (module docstring)
SIGNAL = 3.0
# (samples x cells) entries handled at once when sampling
_BLOCK = 1 << 22


def n_histograms(endpoints: str, refine: bool = False) -> int:
    """Histograms released: (endpoints, slot, distance, detour) or (source, destination, slot, distance, detour),
    and with ``refine`` the ends pooled on the fine cells too."""
    return (4 if endpoints == "shared" else 5) + int(refine)


def prior_events(eps_prior: float, endpoints: str = "shared", refine: bool = False) -> list:
    """The accounting events of :func:`release_prior`: one Laplace release of ``eps_prior / H`` per histogram (none
    when ``eps_prior`` is 0)."""
    h = n_histograms(endpoints, refine)
    return [accounting.laplace(eps_prior / h)] * h if eps_prior > 0 else []


def _windows(values) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(index, owner, n_windows) of :func:`normalised_release` for one bin per trajectory (an array) or J bins per
    trajectory (a tuple of J arrays, mass 1 / J each)."""
    parts = [np.asarray(v, dtype=np.int64) for v in (values if isinstance(values, tuple) else (values,))]
    n, j = len(parts[0]), len(parts)
    index = np.stack(parts, axis=1).reshape(-1) if n else np.zeros(0, dtype=np.int64)   # trajectory by trajectory
    return index, np.repeat(np.arange(n, dtype=np.int64), j), np.full(n, j, dtype=np.int64)


def exact_histogram(values, size: int, eps: float, k: int = 1) -> np.ndarray:
    """The histogram :func:`noisy_histogram` adds noise to, exactly (mass per bin on the noise grid). NEVER
    release it: for tests of the sensitivity."""
    scale = k / eps
    return normalised_sums(*_windows(values), int(size), scale) * granularity(scale)


def noisy_histogram(values, size: int, eps: float, noise, k: int = 1) -> np.ndarray:
    """An eps-DP histogram before NormCut. ``values`` is one array of bins in ``0 .. size - 1`` (one per
    trajectory) or a tuple of J such arrays (J bins per trajectory, each given mass 1 / J).

    Privacy map: each trajectory is J windows of total mass 1 (:func:`normalised_release`), so one trajectory moves
    the histogram by at most 1 in L1 and a user of at most k trajectories by at most k; Laplace(k / eps) on every
    one of the ``size`` bins: eps-DP, accounted as ``accounting.laplace(eps)``."""
    return normalised_release(*_windows(values), int(size), k / eps, noise)


def histogram(values, size: int, eps: float, noise, k: int = 1) -> np.ndarray:
    """:func:`noisy_histogram` after NormCut (non-negative, total kept; post-processing), float64."""
    return normcut(noisy_histogram(values, size, eps, noise, k))


def chebyshev(a: np.ndarray, b: np.ndarray, w: int) -> np.ndarray:
    """Chebyshev distance (cells) between cells ``a`` and ``b`` of the w x w grid (broadcast)."""
    ar, ac = np.divmod(np.asarray(a, dtype=np.int64), w)
    br, bc = np.divmod(np.asarray(b, dtype=np.int64), w)
    return np.maximum(np.abs(ar - br), np.abs(ac - bc))


def hops(a, b, w: int, r: int) -> np.ndarray:
    """Fewest hops of at most r cells from cell ``a`` to cell ``b``: ``ceil(D(a, b) / r)`` (broadcast)."""
    return -(-chebyshev(a, b, w) // r)


def detours(source, dest, lengths, w: int, r: int, max_path: int) -> np.ndarray:
    """Each trip's detour ``L - 1 - hops(s, d)`` (hops more than the fewest; >= 0 for gap-filled trips, whose hops
    are at most r cells), clipped to ``0 .. max_path - 1``. Per trajectory, no budget."""
    return np.clip(np.asarray(lengths, dtype=np.int64) - 1 - hops(source, dest, w, r), 0, max_path - 1)


def bucket(x) -> np.ndarray:
    """Power-of-two bucket of non-negative integers: 0 -> 0, 1 -> 1, 2-3 -> 2, 4-7 -> 3, ... (public)."""
    x = np.asarray(x, dtype=np.int64)
    return np.where(x > 0, np.floor(np.log2(np.maximum(x, 1))).astype(np.int64) + 1, 0)


def bucket_range(b: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray]:
    """Smallest and largest value of each bucket ``b`` (values up to ``top``)."""
    b = np.asarray(b, dtype=np.int64)
    lo = np.where(b > 0, np.left_shift(1, np.maximum(b - 1, 0)), 0)
    return lo, np.minimum(np.where(b > 0, 2 * lo - 1, 0), top)


def detour_shape(w: int, max_path: int) -> tuple[int, int]:
    """(distance buckets, detour buckets) of the (distance, detour) histogram."""
    return int(bucket(w - 1)) + 1, int(bucket(max_path - 1)) + 1


def detour_bins(source, dest, detour, w: int, max_path: int) -> np.ndarray:
    """Each trip's bin of the (distance, detour) histogram (row-major over :func:`detour_shape`)."""
    return bucket(chebyshev(source, dest, w)) * detour_shape(w, max_path)[1] + bucket(detour)


def draw_detours(source, dest, joint: np.ndarray, w: int, max_path: int, rng: np.random.Generator) -> np.ndarray:
    """A detour per sample: its bucket from the released (distance, detour) histogram ``joint`` given the bucket
    of its ends' distance (from the whole histogram where that row is empty), then uniform in the bucket.
    Vectorised; post-processing of released values."""
    n_dist, n_detour = detour_shape(w, max_path)
    joint = np.asarray(joint, dtype=np.float64).reshape(n_dist, n_detour)
    rows = np.where(joint.sum(1, keepdims=True) > 0, joint, joint.sum(0, keepdims=True) + (joint.sum() == 0))
    cdf = np.cumsum(rows, axis=1)
    row = bucket(chebyshev(source, dest, w))
    u = rng.random(len(row)) * cdf[row, -1]
    b = np.minimum((cdf[row] < u[:, None]).sum(1), n_detour - 1)
    lo, hi = bucket_range(b, max_path - 1)
    return lo + np.floor(rng.random(len(b)) * (hi - lo + 1)).astype(np.int64)


def prior_block(w: int, n_noisy: float, eps_prior: float, k: int = 1, endpoints: str = "shared",
                cells: int | None = None, refine: bool = False) -> int:
    """Fine cells per side of a block of the end and distance histograms: ``ceil(w / side)`` with ``side`` the
    public ``cells`` or, when it is None, ``floor(sqrt(SIGNAL n~ eps_h / k))`` (module docstring; ``n~`` the noisy
    trajectory count, so this is post-processing), ``side`` between 1 and w."""
    if cells is None:
        eps_h = eps_prior / n_histograms(endpoints, refine)
        cells = int(math.floor(math.sqrt(max(SIGNAL * float(n_noisy) * eps_h / k, 1.0))))
    side = min(max(int(cells), 1), w)
    return -(-w // side)


def spread(p_blocks: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """Each item's share of its block's probability: ``p_blocks[owner] / size(owner)`` (post-processing)."""
    sizes = np.bincount(owner, minlength=len(p_blocks))
    return np.asarray(p_blocks, dtype=np.float64)[owner] / sizes[owner]


def within(p_blocks: np.ndarray, p_fine: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """Each block's probability shared among its cells in proportion to ``p_fine`` (evenly where ``p_fine`` is 0
    over the whole block). Post-processing."""
    mass = np.bincount(owner, weights=p_fine, minlength=len(p_blocks))
    share = np.divide(p_fine, mass[owner], out=np.zeros_like(p_fine), where=mass[owner] > 0)
    even = spread(np.ones(len(p_blocks)), owner)
    share = np.where(mass[owner] > 0, share, even)
    return np.asarray(p_blocks, dtype=np.float64)[owner] * share


def release_prior(source, dest, slot, w: int, n_time: int, eps_prior: float, noise, k: int = 1,
                  endpoints: str = "shared", detour=None, max_path: int = 1, block: int = 1,
                  refine: bool = False) -> dict:
    """The noisy histograms (module docstring; ``eps_prior`` in all, in equal parts), as probabilities (uniform
    where NormCut left nothing): ``{"source": (w^2,), "dest": (w^2,), "slot": (n_time,), "distance": (w,),
    "detour": (distance buckets x detour buckets,)}`` (source and dest the same array with shared endpoints);
    ``detour`` from :func:`detours`; the end and distance histograms released on ``block``-wide blocks and
    spread over them: evenly, or with ``refine`` as one more histogram, of both ends pooled on the fine cells,
    spreads them inside each block (:func:`within`)."""
    eps_h = eps_prior / n_histograms(endpoints, refine)
    cells = np.arange(w * w)
    of_cell, n_blocks = coarse_of(cells, w, block), coarse_width(w, block) ** 2
    fine = probabilities(histogram((source, dest), w * w, eps_h, noise, k)) if refine else None

    def ends(*values):
        blocks = tuple(coarse_of(v, w, block) for v in values)
        p = probabilities(histogram(blocks if len(blocks) > 1 else blocks[0], n_blocks, eps_h, noise, k))
        if fine is not None and block == 1 and len(values) == 2:
            return (p + fine) / 2    # two independent releases of one pooled histogram: their mean (post-processing)
        return spread(p, of_cell) if fine is None else within(p, fine, of_cell)

    out = {}
    if endpoints == "shared":
        out["source"] = out["dest"] = ends(source, dest)
    else:
        out["source"], out["dest"] = ends(source), ends(dest)
    out["slot"] = probabilities(histogram(slot, n_time, eps_h, noise, k))
    distance = chebyshev(source, dest, w) // block
    out["distance"] = spread(probabilities(histogram(distance, -(-w // block), eps_h, noise, k)),
                             np.arange(w) // block)
    out["detour"] = probabilities(histogram(detour_bins(source, dest, detour, w, max_path),
                                            int(np.prod(detour_shape(w, max_path))), eps_h, noise, k))
    return out


def gravity(p_source: np.ndarray, p_dest: np.ndarray, p_distance: np.ndarray, w: int,
            iterations: int = GRAVITY_ITERATIONS) -> tuple[np.ndarray, np.ndarray]:
    """Factors ``(g, f)`` of ``p(s, d) = p_source(s) p_dest(d) g(d) f(D(s, d)) / Z(s)`` whose distance
    distribution is ``p_distance`` and destination marginal ``p_dest`` (as near as alternating proportional
    fitting gets in ``iterations`` rounds; the source marginal is ``p_source`` by construction). Post-processing
    of released histograms.

    The kernel ``f(D(s, d))`` depends on the displacement ``d - s`` only, so every sum over sources or destinations
    is a 2-d convolution with the (2w-1) x (2w-1) image ``F[delta] = f(D(delta))`` (FFT: O(w^2 log w) per round
    instead of O(w^4)): ``Z = B * F`` with ``B = p_dest g``; the destination marginal is ``B (A * F)`` with
    ``A = p_source / Z``; the distance histogram is ``f(k)`` times the sum, over displacements at distance k, of
    the cross-correlation of A and B."""
    from scipy.signal import fftconvolve

    p_source = np.asarray(p_source, dtype=np.float64).reshape(w, w)
    p_dest = np.asarray(p_dest, dtype=np.float64).reshape(w, w)
    g, f = np.ones((w, w)), np.ones(w)
    delta = np.arange(-(w - 1), w)
    ring = np.maximum(np.abs(delta)[:, None], np.abs(delta)[None, :])        # D of each displacement

    def conv(x, kernel, mode="same"):
        return np.maximum(fftconvolve(x, kernel, mode=mode), 0.0)            # FFT round-off below 0 removed

    def factors(g, f):
        b = p_dest * g
        z = conv(b, f[ring])
        a = np.divide(p_source, z, out=np.zeros_like(z), where=(z > 1e-300) & (p_source > 0))
        return a, b

    for _ in range(iterations):
        a, b = factors(g, f)
        corr = conv(b, a[::-1, ::-1], mode="full")                          # sum_s a(s) b(s + delta)
        by_distance = f * np.bincount(ring.reshape(-1), weights=corr.reshape(-1), minlength=w)
        f = f * np.divide(p_distance, by_distance, out=np.zeros(w), where=by_distance > 1e-300)
        a, b = factors(g, f)
        by_dest = b * conv(a, f[ring])
        g = g * np.divide(p_dest, by_dest, out=np.ones((w, w)), where=(by_dest > 1e-300) & (p_dest > 0))
    return g.reshape(-1), f


def probabilities(counts: np.ndarray) -> np.ndarray:
    """Non-negative counts scaled to sum 1 (uniform when they sum to 0)."""
    counts = np.maximum(np.asarray(counts, dtype=np.float64), 0.0)
    total = counts.sum()
    return counts / total if total > 0 else np.full(len(counts), 1.0 / max(len(counts), 1))


# -- the public coarse grid ------------------------------------------------------------------------------------

def coarse_width(w: int, coarse: int) -> int:
    """Coarse cells per side: ``ceil(w / coarse)`` (the last row and column of blocks may be narrower)."""
    return -(-w // coarse)


def coarse_of(cells: np.ndarray, w: int, coarse: int) -> np.ndarray:
    """The coarse cell (row-major on the ``coarse_width`` grid) of each fine cell of the w x w grid."""
    row, col = np.divmod(np.asarray(cells, dtype=np.int64), w)
    return (row // coarse) * coarse_width(w, coarse) + col // coarse


def log_bias(p: np.ndarray) -> np.ndarray:
    """``log max(p, FLOOR)`` (float32): a head's fixed bias from released probabilities."""
    return np.log(np.maximum(np.asarray(p, dtype=np.float64), FLOOR)).astype(np.float32)


def coarse_probabilities(p_fine: np.ndarray, w: int, coarse: int) -> np.ndarray:
    """The released fine probabilities summed over each coarse cell (post-processing)."""
    cw = coarse_width(w, coarse)
    return np.bincount(coarse_of(np.arange(w * w), w, coarse), weights=p_fine, minlength=cw * cw)


def refine(coarse_cells: np.ndarray, p_fine: np.ndarray | None, w: int, coarse: int,
           rng: np.random.Generator) -> np.ndarray:
    """A fine cell inside each coarse cell, drawn from ``p_fine`` restricted to it (uniform inside it where that is
    0 or ``p_fine`` is None). Vectorised: one (coarse cells, coarse^2) table of conditional CDFs, one uniform per
    draw. Post-processing of released values."""
    coarse_cells = np.asarray(coarse_cells, dtype=np.int64)
    if coarse == 1:
        return coarse_cells
    cw = coarse_width(w, coarse)
    fine = np.arange(w * w)
    owner = coarse_of(fine, w, coarse)
    order = np.argsort(owner, kind="stable")
    sizes = np.bincount(owner, minlength=cw * cw)
    slot = np.arange(w * w) - np.repeat(np.cumsum(sizes) - sizes, sizes)       # position inside its block
    ids = np.full((cw * cw, coarse * coarse), -1, dtype=np.int64)
    ids[owner[order], slot] = fine[order]
    weight = np.zeros(ids.shape)
    p = np.ones(w * w) if p_fine is None else np.maximum(np.asarray(p_fine, dtype=np.float64), 0.0)
    weight[owner[order], slot] = p[order]
    empty = weight.sum(1) <= 0
    weight[empty] = ids[empty] >= 0                                             # uniform over its own cells
    cdf = np.cumsum(weight, axis=1)
    cdf /= cdf[:, -1:]
    u = rng.random(len(coarse_cells))
    pick = (cdf[coarse_cells] < u[:, None]).sum(1)
    pick = np.minimum(pick, sizes[coarse_cells] - 1)
    return ids[coarse_cells, pick]


def destinations(source: np.ndarray, log_coarse: np.ndarray, p_dest: np.ndarray, g: np.ndarray, f: np.ndarray,
                 w: int, coarse: int, rng: np.random.Generator) -> np.ndarray:
    """One fine destination per sample given its fine ``source`` and its TI destination log-probabilities over
    the coarse cells ``log_coarse`` (n, coarse cells): ``p(d) ~ p_TI(coarse(d)) p_dest(d | coarse(d)) g(d)
    f(D(s, d))`` over the cells where ``p_dest > 0`` (module docstring); a sample whose weights are all 0 (f empty
    at every distance it can reach) draws from ``p_dest g`` alone. Vectorised over blocks of samples, one uniform
    per sample. Post-processing of released values."""
    source = np.asarray(source, dtype=np.int64)
    dst = np.flatnonzero(p_dest > 0)
    of = coarse_of(dst, w, coarse)
    base = p_dest[dst] / coarse_probabilities(p_dest, w, coarse)[of] * g[dst]
    out = np.empty(len(source), dtype=np.int64)
    block = max(1, _BLOCK // max(len(dst), 1))
    for lo in range(0, len(source), block):
        s = source[lo:lo + block]
        weight = np.exp(np.asarray(log_coarse[lo:lo + block], dtype=np.float64))[:, of] * base[None, :] \
            * f[chebyshev(s[:, None], dst[None, :], w)]
        empty = ~(weight.sum(1) > 0)
        weight[empty] = base[None, :]
        cdf = np.cumsum(weight, axis=1)
        pick = (cdf < (rng.random(len(s)) * cdf[:, -1])[:, None]).sum(1)
        out[lo:lo + block] = dst[np.minimum(pick, len(dst) - 1)]
    return out


def waypoints(source: np.ndarray, dest: np.ndarray, detour: np.ndarray, p_mid: np.ndarray, w: int, r: int,
              rng: np.random.Generator) -> np.ndarray:
    """A waypoint for each sample with a positive ``detour``, -1 for the others: a cell ``m`` whose extra hops
    ``hops(s, m) + hops(m, d) - hops(s, d)`` are nearest to the detour, drawn among those with probability
    proportional to ``p_mid`` (the released endpoint histogram: trips turn where trips go; uniform among them
    where it is 0). Vectorised over blocks of samples. Post-processing of released values."""
    source, dest, detour = (np.asarray(a, dtype=np.int64) for a in (source, dest, detour))
    out = np.full(len(source), -1, dtype=np.int64)
    todo = np.flatnonzero(detour > 0)
    cells = np.arange(w * w)
    weight_of = np.asarray(p_mid, dtype=np.float64) + 1e-12
    block = max(1, _BLOCK // (w * w))
    for lo in range(0, len(todo), block):
        i = todo[lo:lo + block]
        s, d = source[i, None], dest[i, None]
        extra = hops(s, cells[None], w, r) + hops(cells[None], d, w, r) - hops(s, d, w, r)
        gap = np.abs(extra - detour[i, None])
        weight = np.where(gap == gap.min(1, keepdims=True), weight_of[None], 0.0)
        cdf = np.cumsum(weight, axis=1)
        pick = (cdf < (rng.random(len(i)) * cdf[:, -1])[:, None]).sum(1)
        out[i] = np.minimum(pick, w * w - 1)
    return out


__all__ = ["FLOOR", "ENDPOINTS", "n_histograms", "prior_events", "exact_histogram", "noisy_histogram", "histogram",
           "chebyshev", "gravity", "release_prior", "prior_block", "spread", "SIGNAL", "destinations", "hops",
           "detours", "waypoints", "bucket",
           "bucket_range", "detour_shape", "detour_bins", "draw_detours", "probabilities",
           "coarse_width", "coarse_of", "log_bias", "coarse_probabilities", "refine"]
