"""Whole steps of the noise grid: the exact integer arithmetic under ``duckmob.privacy.counting``'s length-normalised
release (its module docstring has the mechanism and its sensitivity).

Each trajectory's mass 1 is split into ``G = 1/g`` steps of the noise grid ``g`` (:func:`grid_steps`), so a table
of its windows is a sum of integers: exact, and the same whatever order or batches the trajectories come in.
:func:`positions` finds each window's entry in a data-independent support. Nothing here draws noise or sees
anything but arrays of windows.
"""

from __future__ import annotations

import numpy as np

from duckmob.errors import DuckmobError
from duckmob.privacy.noise import granularity


def grid_steps(owner: np.ndarray, n_windows: np.ndarray, scale: float) -> tuple[np.ndarray, float]:
    """Each window's weight in steps of the noise grid g, and g.

    A trajectory with W windows holds exactly ``G = 1/g`` steps (its mass 1): ``G // W`` on every window and one
    more on its first ``G % W`` windows (``owner`` must list windows trajectory by trajectory, in order). A
    trajectory whose windows are a subset (HRNet's distinct pairs, at most W of them) holds at most G steps.
    """
    g = granularity(scale)
    if g > 1:
        raise DuckmobError(f"eps is too small for this sensitivity (noise scale {scale:.3g} > 2^20): the release "
                           "would carry no information; use a larger eps")
    total = int(round(1.0 / g))  # g is a power of two <= 1: exact
    if not len(owner):
        return np.zeros(0, dtype=np.int64), g
    # per run of one owner: G // W on every window, one more on the windows before first + G % W
    first = np.concatenate([[0], np.flatnonzero(owner[1:] != owner[:-1]) + 1])
    count = np.diff(np.append(first, len(owner)))
    w = np.maximum(n_windows, 1)[owner[first]]
    extra = np.arange(len(owner), dtype=np.int64) < np.repeat(first + total % w, count)
    return np.repeat(total // w, count) + extra, g


def positions(entries: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Position of each ``index`` in the sorted distinct ``entries``, -1 where it is not one of them: a lookup table
    over 0 .. entries[-1] when that is small next to the windows (a gather, not a binary search each), else
    searchsorted."""
    size = len(entries)
    if not size:
        return np.full(len(index), -1, dtype=np.int64)
    top = int(entries[-1]) + 1
    if entries[0] >= 0 and top <= 4 * len(index) + (1 << 16):
        table = np.full(top, -1, dtype=np.int64)
        table[entries] = np.arange(size, dtype=np.int64)
        ok = (index >= 0) & (index < top)
        return np.where(ok, table[np.where(ok, index, 0)], -1)
    pos = np.searchsorted(entries, index)
    return np.where((pos < size) & (entries[np.minimum(pos, size - 1)] == index), pos, -1)


__all__ = ["grid_steps", "positions"]
