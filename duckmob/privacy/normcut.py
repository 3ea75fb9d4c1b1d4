"""NormCut: make a noisy count vector non-negative without changing its total (PrivTrace App. B.6, Algorithm 2).

Post-processing only (no privacy cost). Algorithm 2 of PrivTrace (Wang et al., CCS 2023; after Wang et al.,
"Locally Differentially Private Frequency Estimation with Consistency", NDSS 2020, and PrivSyn, USENIX Security
2022): with ``D`` the total of the negative entries (as a positive amount),
repeatedly take the smallest positive entry ``p`` and remove ``min(p, D)`` from it and from ``D``; stop when
``D = 0`` or no positive entry is left; finally set the negative entries to 0. So the mass of the negatives is
taken from the smallest positive values first, the row total is preserved when the positives can cover it, and
a row whose positive mass cannot cover it becomes all zeros. The paper's example: (-5, 1, 7) -> (0, 0, 3).

Vectorised form (the loop's closed form): sort the positive entries of a row ascending, ``p_1 <= ... <= p_n``,
with prefix sums ``c_k = p_1 + ... + p_k``; Algorithm 2 turns ``p_k`` into ``min(p_k, max(c_k - D, 0))``
(entries whose prefix sum is at most ``D`` are emptied, the first one past it keeps ``c_k - D``, the rest stay).
Ties are taken in index order (a stable sort), as a left-to-right scan for "the smallest" would.
"""

from __future__ import annotations

import numpy as np

from duckmob.errors import DuckmobError

# Rows are processed in blocks of about this many entries (temporaries stay in cache).
_BLOCK = 1 << 18


def normcut(x: np.ndarray, axis: int = -1, inplace: bool = False) -> np.ndarray:
    """PrivTrace's NormCut (App. B.6, Algorithm 2) applied to every 1-d slice of ``x`` along ``axis``.

    Negative entries become 0 and their total is subtracted from the smallest positive entries first, so each
    slice keeps its sum when its positive entries cover the negative mass; otherwise the slice becomes zeros.
    Returns a new array (float32 in -> float32 out, anything else -> float64); units are those of ``x``.
    ``inplace=True`` overwrites ``x`` instead when it is a C-contiguous float array cut along its last axis
    (saves a copy of a large table).
    """
    x = np.asarray(x)
    if x.ndim == 0:
        raise DuckmobError("normcut needs an array with at least one dimension; got a scalar")
    dtype = x.dtype if x.dtype in (np.float32, np.float64) else np.float64
    moved = np.moveaxis(x, axis, -1)
    if moved.size == 0:
        return np.zeros(x.shape, dtype=dtype)
    rows = moved.reshape(-1, moved.shape[-1])
    own = inplace and x.dtype == dtype and x.flags.c_contiguous and axis in (-1, x.ndim - 1)
    out = rows if own else np.empty(rows.shape, dtype=dtype)
    step = max(1, _BLOCK // max(1, rows.shape[1]))
    for start in range(0, rows.shape[0], step):
        block = rows[start:start + step]
        if not np.isfinite(block).all():
            raise DuckmobError("normcut got NaN or infinite values: noisy counts must be finite numbers")
        out[start:start + step] = _normcut_rows(block)
    return x if own else np.moveaxis(out.reshape(moved.shape), -1, axis)


def _normcut_rows(rows: np.ndarray) -> np.ndarray:
    # The closed form through a per-row threshold, so only a value sort is needed (an index-stable argsort is
    # ~20x slower): the cut entry is the k-th smallest positive with k the first index whose prefix sum reaches
    # the deficit; larger entries stay, smaller ones go, ties with it are resolved in index order.
    rows = rows.astype(np.float64, copy=False)
    positive = np.maximum(rows, 0.0)
    deficit = -np.minimum(rows, 0.0).sum(axis=1)
    out = positive.copy()
    cut = np.flatnonzero(deficit > 0)
    if cut.size == 0:
        return out
    pos, need = positive[cut], deficit[cut][:, None]
    ascending = np.sort(pos, axis=1)
    prefix = np.cumsum(ascending, axis=1)
    k = (prefix < need).sum(axis=1)  # prefix is non-decreasing; k == n: the positives cannot cover the deficit
    covered = k < pos.shape[1]
    kk = np.minimum(k, pos.shape[1] - 1)[:, None]
    prefix_k = np.take_along_axis(prefix, kk, axis=1)
    threshold = np.take_along_axis(ascending, kk, axis=1)  # the value of the entry that is cut
    residual = prefix_k - need
    tie = pos == threshold
    new = np.where(pos > threshold, pos, 0.0)
    new[tie] = np.broadcast_to(residual, pos.shape)[tie]
    multi = np.flatnonzero(tie.sum(axis=1) > 1)
    if multi.size:  # several entries equal the cut value: the first ones (index order) go, the last ones stay
        t_tie = tie[multi]
        rank = np.cumsum(t_tie, axis=1) - 1
        m = k[multi, None] - (pos[multi] < threshold[multi]).sum(axis=1, keepdims=True)
        sub = new[multi]
        sub[t_tie & (rank < m)] = 0.0
        sub[t_tie & (rank > m)] = np.broadcast_to(threshold[multi], sub.shape)[t_tie & (rank > m)]
        new[multi] = sub
    new[~covered] = 0.0
    out[cut] = new
    return out


__all__ = ["normcut"]
