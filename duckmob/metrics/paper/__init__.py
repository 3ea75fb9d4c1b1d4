"""The papers' metrics as their published reference code computes them: one family per paper, never a default.

duckmob's own families (``hrnet``, ``pategail``, ``privtrace``, ``adatrace``, ``lestyan``, ``fine``) define each
metric once, carefully: great-circle metres, one set of bins for both tables, one JSD in nats. The published
reference code computes several of them differently (squared degrees, fixed bin ranges far wider than a city,
histograms whose edges differ between the two tables, smoothing constants), so a number from a paper's table
and a number from our default family measure different things. These families reproduce the reference
definitions, quirks included, so that a paper's table can be compared like with like:

* ``pategail_paper`` (:mod:`.pategail`): tsinghua-fib-lab/PateGail ``utils/evaluations.py``;
* ``hrnet_paper`` (:mod:`.hrnet`): Emory-AIMS/priv_traj_gen ``evaluation.py``;
* ``privtrace_paper`` (:mod:`.privtrace`): git-disl/AdaTrace ``src/Evaluation.java`` (PrivTrace §5.1 compares
  with AdaTrace's metrics; PrivTrace's own repository publishes no evaluation code);
* ``cleanslate_paper`` (:mod:`.cleanslate`): Lestyan et al. §8.4 (no reference code published; the paper's text).

Ask for them by name: ``mob_evaluate(..., families := ['pategail_paper'])``; families not asked for are not
computed. docs/metrics_papers.md holds one table per paper: the paper's definition, ours, why ours differs and
where the paper's is degenerate. Every docstring cites the reference file and line it follows.

NOT differentially private, like every evaluation: the real table is read exactly.
"""

from __future__ import annotations

import numpy as np

def histogram_arange(values, lo: float, hi: float, bins: int) -> np.ndarray:
    """Counts of ``values`` on the edges ``np.arange(lo, hi, (hi - lo) / bins)``, as PateGail's
    ``EvalUtils.arr_to_distribution`` builds them (utils/evaluations.py:41-54): the edges stop BEFORE ``hi``, so
    there are ``bins - 1`` bins (or ``bins`` when floating point adds an edge), the last one closed, and values
    outside ``[lo, last edge]`` are not counted at all."""
    edges = np.arange(lo, hi, float(hi - lo) / bins)
    return np.histogram(np.asarray(values, dtype=np.float64), edges)[0].astype(np.float64)


def smoothed_jsd(p, q) -> float:
    """PateGail's JSD (utils/evaluations.py:90-104), natural log: each side normalised with 1e-10 added to its
    sum, then 1e-10 added to every entry (so a distribution's empty bins are not empty); ``m = (p + q) / 2``;
    ``0.5 KL(p || m) + 0.5 KL(q || m)`` with ``scipy.stats.entropy``, which renormalises ``p``, ``q`` and ``m``
    to sum 1. Two all-zero vectors score 0; an all-zero side is the uniform distribution. A rounding residue
    below 0 is returned as 0."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    p = p / (p.sum() + 1e-10) + 1e-10
    q = q / (q.sum() + 1e-10) + 1e-10
    m = (p + q) / 2
    return max(0.0, float(0.5 * _kl(p, m) + 0.5 * _kl(q, m)))   # rounding can leave -1e-23


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    """``scipy.stats.entropy(p, q)``: both renormalised to sum 1, natural log, ``0 log 0 = 0``."""
    p = p / p.sum()
    q = q / q.sum()
    nz = p > 0
    return float(np.sum(p[nz] * np.log(p[nz] / q[nz])))


def scipy_js2(p, q) -> float:
    """``scipy.spatial.distance.jensenshannon(p, q) ** 2`` (natural log), as HRNet's reference evaluation
    reports every JSD (evaluation.py:484-489): both count vectors normalised to sum 1, no smoothing. In
    ``[0, ln 2]``."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    p = p / p.sum()
    q = q / q.sum()
    m = (p + q) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        left = np.where(p > 0, p * np.log(p / m), 0.0)
        right = np.where(q > 0, q * np.log(q / m), 0.0)
    return float(0.5 * (left.sum() + right.sum()))


def plain_jsd(p, q) -> float:
    """AdaTrace's ``calcJSD`` (src/Evaluation.java:502-522): ``0.5 KL(P || M) + 0.5 KL(Q || M)``, ``M`` the
    mean, natural log, terms with ``P_i = 0`` skipped, and NO normalisation: ``P`` and ``Q`` are used as given
    (AdaTrace's length and diameter errors pass shares of all trajectories, some of which fall in no bucket)."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    m = (p + q) / 2

    def kl(a):
        nz = a > 0
        return float(np.sum(a[nz] * np.log(a[nz] / m[nz])))

    return 0.5 * kl(p) + 0.5 * kl(q)


__all__ = ["histogram_arange", "smoothed_jsd", "scipy_js2", "plain_jsd"]
