"""PrivTrace's large tables built a block of rows at a time equal the whole-table forms, bit for bit (issue 42,
item 4: a fine model's second-order table no longer holds several float64 copies at once)."""

from __future__ import annotations

import numpy as np

from duckmob.synth.privtrace.markov import Support, normcut_rows, scattered_normcut
from duckmob.synth.privtrace.walk import cumulative_rows, stacked_cumulative, stacked_rows


def _ragged_mask(rng, rows: int, width: int) -> np.ndarray:
    deg = rng.integers(0, width, rows)
    mask = np.arange(width)[None, :] < deg[:, None]
    mask[:, -1] = True                       # the end column, as Support.mask1 / mask2
    return mask


def test_scattered_normcut_equals_the_dense_table_for_every_block_size():
    rng = np.random.default_rng(3)
    mask = _ragged_mask(rng, 997, 13)
    values = rng.laplace(0.2, 1.0, int(mask.sum()))     # noisy counts: many negative, some rows all negative
    dense = np.zeros(mask.shape)
    dense[mask] = values
    want = normcut_rows(dense, mask)
    assert (want[~mask] == 0).all() and (want >= 0).all() and (want.sum(axis=1) > 0).any()
    for block in (1, 13, 50, 1 << 20):
        got = scattered_normcut(values, mask, np.float64, block_entries=block)
        assert np.array_equal(got, want)
        got32 = scattered_normcut(values, mask, np.float32, block_entries=block)
        assert got32.dtype == np.float32 and np.array_equal(got32, want.astype(np.float32))


def test_support_entries_are_the_masks_flat_true_entries():
    # a path of 4 states: 0-1-2-3 (degrees 1, 2, 2, 1)
    offsets = np.array([0, 1, 3, 5, 6])
    dst = np.array([1, 0, 2, 1, 3, 2])
    s = Support.of(4, offsets, dst)
    assert np.array_equal(s.entries1, np.concatenate([np.arange(4), 4 + np.flatnonzero(s.mask1().reshape(-1))]))
    assert np.array_equal(s.entries2, np.flatnonzero(s.mask2().reshape(-1)))
    assert len(s.entries2) == int(s.mask2().sum()) == (4 + 6) * 3 - int((~s.mask2()).sum())
    assert s.entries2 is s.entries2            # computed once per support


def test_stacked_cumulative_equals_stacked_rows_of_cumulative_rows():
    rng = np.random.default_rng(4)
    weights = rng.random((301, 9)).astype(np.float32) * (rng.random((301, 9)) < 0.6)
    weights[::17] = 0.0                                    # rows without mass
    below = cumulative_rows(rng.random((40, 9)))[0]
    cum2, ok2 = cumulative_rows(weights)
    for block in (1, 9, 100, 1 << 20):
        cum, ok = stacked_cumulative(lambda a, b: weights[a:b], len(weights), 9, below, block_entries=block)
        assert np.array_equal(cum, stacked_rows(below, cum2)) and np.array_equal(ok, ok2)
    assert not ok2[0] and ok2.sum() < len(ok2)
