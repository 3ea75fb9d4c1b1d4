"""A first block computes only the routes its trajectories take (issue 42 item 1, a fast first call): each move
under the route draws its trips picked, not under every draw, and next hops only where routes walk. The routes
are the same whichever keys are computed together, so the rows are too (tests/test_seeded_outputs.py pins them)."""

from __future__ import annotations

import numpy as np
import pytest

from duckmob.synth.placement import STEP_EDGES_M, FineStats, Placement
from duckmob.synth.placement import routes as routes_module

BOX = [40.0, 116.0, 40.05, 116.06]


def _placement(draws: int = 4) -> Placement:
    """32 x 32 fine cells in 4 x 4 coarse cells, a skewed density (uneven routes)."""
    w = 32
    density = (np.random.default_rng(5).random(w * w) ** 3).astype(np.float32)
    coarse = (np.arange(w * w) // w // 8) * 4 + (np.arange(w * w) % w // 8)
    return Placement(FineStats(w, density, np.ones(len(STEP_EDGES_M) - 1)), BOX, coarse, 16, anchors=4,
                     route_draws=draws)


def _sequences(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` walks of 2-5 coarse cells between 8-neighbours on the 4 x 4 grid."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, 6, n)
    cells = []
    for L in lengths:
        r, c = rng.integers(0, 4, 2)
        walk = [r * 4 + c]
        for _ in range(L - 1):
            r, c = np.clip(r + rng.integers(-1, 2), 0, 3), np.clip(c + rng.integers(-1, 2), 0, 3)
            walk.append(r * 4 + c)
        cells += walk
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), np.asarray(cells, dtype=np.int64)


def _routes(table, keys) -> list:
    first, off, cells, end = table
    return [[cells[off[r]:off[r + 1]].tolist() for r in range(f, f + 4)] + [end[f:f + 4].tolist()]
            for f in first[keys]]


def test_a_block_computes_its_moves_under_the_draws_it_picked_only():
    pl = _placement()
    offsets, cells = _sequences(6, 1)
    pl.fine_paths(offsets, cells, np.random.default_rng(2))
    keys = pl._cache["moves"]["keys"]
    space = pl.n_coarse * pl.n_coarse
    draws, moves = np.divmod(keys, space)
    i = np.flatnonzero(np.diff(np.repeat(np.arange(6), np.diff(offsets))) == 0)
    taken = np.unique(cells[i] * pl.n_coarse + cells[i + 1])
    # every move taken is kept under at least one draw, and fewer keys than every draw of every move
    assert np.array_equal(np.unique(moves), taken)
    assert len(keys) < pl.route_draws * len(taken) and set(draws.tolist()) <= set(range(pl.route_draws))


def test_fine_paths_are_the_same_with_the_cache_off_and_with_every_draw_computed_first():
    offsets, cells = _sequences(40, 3)
    off_pl = _placement()
    off_pl.keep_routes = False
    want = off_pl.fine_paths(offsets, cells, np.random.default_rng(7), with_pos=True)
    lazy = _placement()
    got = lazy.fine_paths(offsets, cells, np.random.default_rng(7), with_pos=True)
    eager = _placement()
    eager.route_tables(np.arange(16 * 16)[np.arange(16 * 16) // 16 != np.arange(16 * 16) % 16])
    eager.route_tables(np.arange(16) * 17)                     # and the moves within one cell
    full = eager.fine_paths(offsets, cells, np.random.default_rng(7), with_pos=True)
    for a, b, c in zip(want, got, full):
        assert np.array_equal(a, b) and np.array_equal(a, c)


@pytest.mark.parametrize("split", [False, True])
def test_a_draws_routes_do_not_depend_on_the_other_draws_or_moves_asked_with_it(monkeypatch, split):
    """drawn_routes of some (draw, move) pairs = the same pairs read from route_tables (every draw of every
    move), on one thread and split over two (SPLIT_MOVES lowered)."""
    if split:
        monkeypatch.setattr(routes_module, "SPLIT_MOVES", 2)
    moves = np.array([0 * 16 + 1, 0 * 16 + 5, 5 * 16 + 6, 6 * 16 + 2, 10 * 16 + 15, 15 * 16 + 10])
    every = _placement()
    every.keep_routes = False
    whole = every.route_tables(moves)
    draws = np.array([3, 0, 3, 1, 2, 0])
    some = _placement()
    some.keep_routes = False
    got = some.drawn_routes(draws, moves)
    first, off, cells, end = whole
    flat = (first.reshape(4, -1)[draws, np.arange(len(moves))], off, cells, end)
    assert _routes(got, np.arange(len(moves))) == _routes(flat, np.arange(len(moves)))


def test_next_hops_row_by_row_equal_the_whole_graphs():
    """_next_hops of some nodes = those nodes' rows of the computation over every node (the walk asks only the
    nodes its routes pass through)."""
    rng = np.random.default_rng(4)
    n = 50
    nbr = np.where(rng.random((n, 8)) < 0.7, rng.integers(0, n, (n, 8)), -1)
    nbr_fine = np.where(nbr >= 0, nbr * 3 % n, -1)
    step = np.where(nbr >= 0, rng.choice([1.0, 2.0], (n, 8)), np.inf)
    dist = np.append(rng.choice([0.0, 1.0, 2.0, 3.0, np.inf], n - 1), 0.0)
    whole = routes_module._next_hops(nbr, nbr_fine, step, dist, dist)
    part = np.array([3, 17, 17, 0, 49, 22])
    assert np.array_equal(routes_module._next_hops(nbr[part], nbr_fine[part], step[part], dist, dist[part]),
                          whole[part])
    assert (whole[dist == 0] == -9999).all()                   # sources keep no next hop
