"""PrivTrace's trip distribution in bounded memory (issue 42, item 4): the hop table as small integers and the
kernel a block at a time give the whole-table result, bit for bit when one block covers the table and to
rounding otherwise."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from duckmob.synth.privtrace.trips import hop_distances, hop_table, trip_distribution

WHOLE = 1 << 40      # a block larger than any table here: the single-block path


def _grid(rows: int, cols: int, cut: int | None = None):
    """A rows x cols grid of states with 4-neighbour adjacency (CSR); ``cut``: no edge between columns cut-1 and
    cut (two components)."""
    offsets, dst = [0], []
    for r in range(rows):
        for c in range(cols):
            for rr, cc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
                crosses = cut is not None and min(c, cc) == cut - 1 and max(c, cc) == cut
                if 0 <= rr < rows and 0 <= cc < cols and not crosses:
                    dst.append(rr * cols + cc)
            offsets.append(len(dst))
    return np.array(offsets), np.array(dst)


def _released(m: int, seed: int):
    """Start and end counts as PrivTrace passes them: noisy, NormCut to >= 0 (about half the states zero)."""
    rng = np.random.default_rng(seed)
    signal = rng.gamma(0.5, 20.0, (2, m))
    b, q = np.maximum(signal + rng.laplace(0.0, 8.0, (2, m)) - 6.0, 0.0)
    return b, q


def _whole_table(b, q, n_trips, offsets, dst, decay):
    """The dense float64 arithmetic of the trip distribution at a fixed decay, every |I| x |J| table at once."""
    I, J = np.flatnonzero(b > 0), np.flatnonzero(q > 0)
    total = (b.sum() + q.sum()) / 2
    bI, qJ = b[I] / b.sum() * total, q[J] / q.sum() * total
    l = hop_distances(offsets, dst, I)[:, J] + 2.0
    G = np.exp(-decay * (l / l.mean() - 1.0))
    x, y = np.ones(len(I)), np.ones(len(J))
    for _ in range(100):
        x = bI / np.maximum(G @ y, 1e-300)
        y = qJ / np.maximum(G.T @ x, 1e-300)
        if np.abs(x * (G @ y) - bI).sum() <= 1e-4 * bI.sum():
            break
    u = x[:, None] * G * y[None, :]
    detour = max(n_trips / total - float((u * l).sum() / u.sum()), 0.0)
    p = np.zeros(len(b))
    p[I] = (u * (l + detour)).sum(axis=1)
    return p / p.sum()


@pytest.fixture(scope="module")
def model():
    offsets, dst = _grid(24, 30)
    b, q = _released(24 * 30, seed=7)
    return b, q, offsets, dst


def test_one_block_is_the_whole_table_arithmetic_bit_for_bit(model):
    b, q, offsets, dst = model
    for decay, n_trips in ((1.5, 900.0), (0.7, 20_000.0)):
        p, info = trip_distribution(b, q, n_trips, offsets, dst, decay=decay, block=WHOLE)
        assert np.array_equal(p, _whole_table(b, q, n_trips, offsets, dst, decay))
        assert info["decay"] == decay


@pytest.mark.parametrize("n_trips, decay", [(40_000.0, None), (200_000.0, None), (900.0, 1.5)])
def test_small_blocks_give_the_single_block_result(model, n_trips, decay):
    b, q, offsets, dst = model
    p1, info1 = trip_distribution(b, q, n_trips, offsets, dst, decay=decay, block=WHOLE)
    assert (p1 > 0).sum() == (b > 0).sum() and np.isclose(p1.sum(), 1.0)
    # the regimes of the module doc: a decay fitted by bisection, a detour at decay 0, a given decay
    regime = {40_000.0: 0 < info1["decay"] < 20 and info1["detour"] == 0,
              200_000.0: info1["decay"] == 0 and info1["detour"] > 10, 900.0: info1["decay"] == 1.5}
    assert regime[n_trips]
    for block in (1, 97, 5_000):
        p, info = trip_distribution(b, q, n_trips, offsets, dst, decay=decay, block=block)
        assert np.allclose(p, p1, rtol=1e-10, atol=0.0)
        assert info["decay"] == info1["decay"]
        assert info["detour"] == pytest.approx(info1["detour"], rel=1e-10, abs=1e-12)
        assert info["mean_shortest"] == pytest.approx(info1["mean_shortest"], rel=1e-12)


def test_hop_table_is_the_bfs_distances_as_small_integers():
    offsets, dst = _grid(24, 30)
    I, J = np.arange(0, 720, 3), np.arange(5, 720, 2)
    want = hop_distances(offsets, dst, I)[:, J]
    for block in (1, 700, 1 << 22):            # one source per BFS, several, all of them
        got = hop_table(offsets, dst, I, J, block=block)
        assert got.dtype == np.uint8 and got.flags.f_contiguous and np.array_equal(got, want)
    # a disconnected grid: no path reads as one more than the table's longest, as the trip distribution reads it
    offsets, dst = _grid(4, 6, cut=3)
    got = hop_table(offsets, dst, np.arange(24), np.arange(24), block=7)
    d = hop_distances(offsets, dst, np.arange(24))
    assert np.array_equal(got, np.where(np.isfinite(d), d, d[np.isfinite(d)].max() + 1))
    assert got[0, 5] == 6 and got.max() == 6


def test_breadth_first_levels_are_the_shortest_paths_on_an_irregular_graph():
    rng = np.random.default_rng(5)
    m = 400
    src, dst = rng.integers(0, m, 700), rng.integers(0, m, 700)      # one-way edges, several components
    order = np.argsort(src, kind="stable")
    offsets = np.searchsorted(src[order], np.arange(m + 1))
    want = hop_distances(offsets, dst[order], np.arange(m))
    assert np.isinf(want).any() and np.nanmax(np.where(np.isinf(want), np.nan, want)) > 10
    got = hop_table(offsets, dst[order], np.arange(m), np.arange(m), block=1000)
    longest = want[np.isfinite(want)].max()
    assert np.array_equal(got, np.where(np.isfinite(want), want, longest + 1))


def test_hop_type_widens_with_the_bound():
    offsets, dst = _grid(2, 200)             # a path-like grid: eccentricity of state 0 is 200, bound 401
    got = hop_table(offsets, dst, np.array([0, 399]), np.array([0, 199, 399]))
    assert got.dtype == np.uint16 and got.tolist() == [[0, 199, 200], [200, 1, 0]]


def test_small_blocks_hold_no_float64_table():
    offsets, dst = _grid(40, 50)
    b, q = _released(2000, seed=7)
    n_entries = int((b > 0).sum() * (q > 0).sum())

    def run():
        return trip_distribution(b, q, 20_000.0, offsets, dst, decay=1.5, block=1 << 12)

    run()                                    # imports and caches warmed
    tracemalloc.start()
    try:
        run()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # the hop table (uint8 here: one byte an entry) and blocks, under a third of one dense float64 table
    assert n_entries > 900_000 and peak < 8 * n_entries / 3
