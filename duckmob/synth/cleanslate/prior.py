"""The trajectory initialiser's DP prior: noisy histograms of the source cell, the destination cell and the time
slot, and the public coarse grid the VAE works on.

Why: DP-SGD alone does not teach the VAE where trips start and end (Gaussian noise on every one of its w^2-way
head weights drowns the signal; the endpoints came out near uniform). The three marginals are cheap to release
exactly as counts, and the VAE only has to learn what they miss (the correlation of source, destination and
slot), on a coarse grid (``coarse`` x ``coarse`` fine cells per coarse cell, a public factor) whose heads have
``coarse^2`` times fewer logits; each coarse cell is refined to a fine cell by the released fine histogram.

Release (:func:`release_prior`). Every trajectory adds exactly 1 to the bin of its source cell in the source
histogram (w^2 bins), 1 to the bin of its destination cell in the destination histogram (w^2 bins) and 1 to the
bin of its start slot in the slot histogram (``n_time`` bins): one window of mass 1 per histogram in
:func:`duckmob.privacy.counting.normalised_release`. Sensitivity, by construction: adding or removing one
trajectory moves each histogram by exactly 1 in L1 (a user of at most k trajectories: by at most k). Each gets
Laplace noise of scale ``k / eps_h`` on every bin (a data-independent support, zero bins included) with
``eps_h = eps_prior / 3``: each is ``eps_h``-DP, accounted as three ``accounting.laplace(eps_h)`` events
(:func:`prior_events`), composed by the PLD accountant with the rest of the fit. NormCut (non-negative, total
kept) and normalisation are post-processing.
"""

from __future__ import annotations

import numpy as np

from duckmob.privacy import accounting
from duckmob.privacy.counting import normalised_release
from duckmob.privacy.normcut import normcut

# Smallest probability a log-prior bias uses (a bin NormCut emptied is then drawn about never, and a training
# example in it has a finite loss).
FLOOR = 1e-6
HISTOGRAMS = 3   # source, destination, slot


def prior_events(eps_prior: float) -> list:
    """The accounting events of :func:`release_prior`: three Laplace releases of ``eps_prior / 3`` each (none when
    ``eps_prior`` is 0)."""
    return [accounting.laplace(eps_prior / HISTOGRAMS)] * HISTOGRAMS if eps_prior > 0 else []


def histogram(values: np.ndarray, size: int, eps: float, noise, k: int = 1) -> np.ndarray:
    """An eps-DP histogram of ``values`` (one value in ``0 .. size - 1`` per trajectory), NormCut, float64 counts.

    Privacy map: each trajectory is one window of mass 1 in the bin of its value, so one trajectory moves the
    histogram by exactly 1 in L1 and a user of at most k trajectories by at most k; ``normalised_release`` adds
    Laplace(k / eps) to every one of the ``size`` bins: eps-DP, accounted as ``accounting.laplace(eps)``."""
    values = np.asarray(values, dtype=np.int64)
    n = len(values)
    noisy = normalised_release(values, np.arange(n, dtype=np.int64), np.ones(n, dtype=np.int64), int(size),
                               k / eps, noise)
    return normcut(noisy)


def release_prior(source, dest, slot, w: int, n_time: int, eps_prior: float, noise, k: int = 1) -> dict:
    """The three noisy histograms (module docstring; ``eps_prior`` in all, split in thirds), as probabilities
    (uniform where NormCut left nothing): ``{"source": (w^2,), "dest": (w^2,), "slot": (n_time,)}``."""
    eps_h = eps_prior / HISTOGRAMS
    out = {}
    for name, values, size in (("source", source, w * w), ("dest", dest, w * w), ("slot", slot, n_time)):
        out[name] = probabilities(histogram(values, size, eps_h, noise, k))
    return out


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


def eps_split(eps: float, count_share: float, prior_share: float) -> tuple[float, float]:
    """``(eps_count, eps_prior)``: the count's share of eps, and the prior's share of what is left."""
    eps_count = count_share * eps
    return eps_count, prior_share * (eps - eps_count)


__all__ = ["FLOOR", "prior_events", "histogram", "release_prior", "probabilities", "coarse_width", "coarse_of",
           "log_bias", "coarse_probabilities", "refine", "eps_split"]
