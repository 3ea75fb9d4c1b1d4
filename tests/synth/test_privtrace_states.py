"""PrivTrace state sequences (duckmob/synth/cells.py): the integer line walk between fixes, neighbouring states by construction, and each
trajectory's states depending on its own points only."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import duckmob.synth.cells as states_module
from duckmob.privacy.noise import NoiseSource
from duckmob.synth.base import fit_unrecorded
from duckmob.synth.cells import StateGrid, line_cells, state_sequences, uniform_grid
from duckmob.synth.privtrace import PrivTrace
from duckmob.synth.privtrace.markov import Support
from duckmob.trajectories import Trajectories

BOX = [0.0, 0.0, 1.0, 1.0]
BEIJING = [39.9, 116.2, 40.1, 116.4]


def _neighbour_keys(grid: StateGrid) -> np.ndarray:
    off, dst = grid.neighbours()
    return np.repeat(np.arange(grid.m, dtype=np.int64), np.diff(off)) * grid.m + dst


def _check_sequences(grid: StateGrid, offsets, lat, lon) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """state_sequences with every guarantee checked: consecutive states of a trajectory are neighbours in
    grid.neighbours() (never equal after collapsing), every trajectory has at least one state, and its first and
    last states are those of its first and last fix."""
    offsets = np.asarray(offsets, dtype=np.int64)
    off, st_, own = state_sequences(grid, offsets, lat, lon)
    n = len(offsets) - 1
    assert len(off) == n + 1 and off[0] == 0 and off[-1] == len(st_) == len(own)
    assert (np.diff(off) >= 1).all()
    assert np.array_equal(own, np.repeat(np.arange(n), np.diff(off)))
    inner = own[1:] == own[:-1]
    a, b = st_[:-1][inner], st_[1:][inner]
    assert np.isin(a * grid.m + b, _neighbour_keys(grid)).all()
    fix_states = grid.state_of(lat, lon)
    assert np.array_equal(st_[off[:-1]], fix_states[offsets[:-1]])
    assert np.array_equal(st_[off[1:] - 1], fix_states[offsets[1:] - 1])
    return off, st_, own


# ------------------------------------------------------------------------------------------ the line walk

def _check_walk(R0, C0, R1, C1):
    seg, R, C = line_cells(R0, C0, R1, C1)
    dR, dC = R1 - R0, C1 - C0
    n = np.maximum(np.maximum(np.abs(dR), np.abs(dC)), 1)
    assert np.array_equal(np.bincount(seg, minlength=len(n)), n)
    assert np.array_equal(seg, np.sort(seg))
    start = np.concatenate([[0], np.cumsum(n)[:-1]])
    assert np.array_equal(R[start], R0) and np.array_equal(C[start], C0)
    # each cell's successor (the next cell of the segment, or its end cell) is an 8-neighbour
    R_next = np.append(R[1:], 0)
    C_next = np.append(C[1:], 0)
    last = start + n - 1
    R_next[last], C_next[last] = R1, C1
    assert (np.abs(R_next - R) <= 1).all() and (np.abs(C_next - C) <= 1).all()
    # the cells are the line's nearest cells: within half a cell of (R0, C0) + k / n * (dR, dC)
    k = np.arange(len(seg)) - start[seg]
    assert (np.abs(2 * n[seg] * (R - R0[seg]) - 2 * k * dR[seg]) <= n[seg]).all()
    assert (np.abs(2 * n[seg] * (C - C0[seg]) - 2 * k * dC[seg]) <= n[seg]).all()
    # and each segment's cells are those of the segment alone
    for i in range(0, len(n), max(1, len(n) // 7)):
        s1, r1, c1 = line_cells(R0[i:i + 1], C0[i:i + 1], R1[i:i + 1], C1[i:i + 1])
        assert np.array_equal(r1, R[seg == i]) and np.array_equal(c1, C[seg == i])
    return seg, R, C


cell = st.integers(0, 4095)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(cell, cell, cell, cell), min_size=1, max_size=20))
def test_line_walk_steps_to_8_neighbours_and_ends_on_the_end_cell(segments):
    R0, C0, R1, C1 = np.array(segments, dtype=np.int64).T
    _check_walk(R0, C0, R1, C1)


def test_line_walk_on_many_random_segments():
    rng = np.random.default_rng(7)
    W = 1024
    R0, C0 = rng.integers(0, W, (2, 5000))
    far = rng.integers(0, W, (2, 5000))
    near = np.clip(np.stack([R0, C0]) + rng.integers(-3, 4, (2, 5000)), 0, W - 1)
    R1, C1 = np.where(rng.random(5000) < 0.5, far, near)
    seg, R, C = _check_walk(R0, C0, R1, C1)
    assert ((R >= 0) & (R < W) & (C >= 0) & (C < W)).all()


def test_line_walk_small_cases():
    seg, R, C = line_cells(np.array([0, 5, 3]), np.array([0, 5, 0]), np.array([3, 5, 0]), np.array([1, 5, 0]))
    assert seg.tolist() == [0, 0, 0, 1, 2, 2, 2]
    assert list(zip(R.tolist(), C.tolist())) == [(0, 0), (1, 0), (2, 1), (5, 5), (3, 0), (2, 0), (1, 0)]


# ------------------------------------------------------------------------- state sequences are neighbours

def test_north_to_south_jump_on_a_16_by_16_grid_is_a_chain_of_neighbours():
    # this 2-point trajectory used to jump from row 12 to row 10 (the float steps r + f * dr rounded below a
    # row boundary), which made PrivTrace(K=16, max_depth=0) fail after noise had been drawn
    g = uniform_grid(BOX, 16)
    lat, lon = np.array([0.9374999999999999, 0.25]), np.array([0.5, 0.5])
    off, st_, _ = _check_sequences(g, [0, 2], lat, lon)
    assert st_.tolist() == [14 * 16 + 8 - 16 * k for k in range(11)]
    Support.of(g.m, *g.neighbours()).edge_index(st_[:-1], st_[1:])

    rng = np.random.default_rng(0)
    paths = []
    for _ in range(300):
        a, b = rng.random(2) * 0.4 + 0.1, rng.random(2) * 0.4 + 0.5
        f = np.linspace(0, 1, rng.integers(2, 30))[:, None]
        paths.append(np.clip(a + f * (b - a) + rng.normal(0, 0.01, (len(f), 2)), 0, 1))
    paths.append(np.stack([lat, lon], axis=1))
    pts = np.concatenate(paths)
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in paths])]).astype(np.int64)
    n = len(paths)
    data = Trajectories(offsets, np.arange(n), np.full(n, -1), np.arange(len(pts)), pts[:, 0], pts[:, 1])
    model = fit_unrecorded(PrivTrace(BOX, K=16, max_depth=0), data, 1.0, 0.0, NoiseSource(0))
    assert model.grid.m == 256


def test_fixes_just_below_a_row_boundary_give_neighbouring_states():
    # segments whose length in base cells is (nearly) an integer: where float stepping skipped a row
    rng = np.random.default_rng(1)
    g = uniform_grid(BOX, 16)
    n = 20_000
    r0 = rng.integers(1, 16, n) + rng.choice([0.0, 1e-15, -1e-15, 0.5, 1e-9], n)
    r1 = r0 - rng.integers(1, 15, n) + rng.choice([0.0, 1.6e-15, -1.6e-15, 8e-16], n)
    ok = (r1 > 0) & (r0 < 16)
    lat = np.stack([r0[ok], r1[ok]], axis=1).reshape(-1) / 16
    lon = np.repeat(rng.random(ok.sum()), 2)
    _check_sequences(g, np.arange(0, len(lat) + 1, 2), lat, lon)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(1, 6), st.integers(0, 3), st.sampled_from(["none", "all", "random"]), st.integers(0, 2 ** 31))
def test_consecutive_states_are_neighbours_on_split_and_unsplit_grids(K, depth, how, seed):
    rng = np.random.default_rng(seed)
    split = {"none": np.zeros(K * K, dtype=np.int64), "all": np.full(K * K, depth),
             "random": rng.integers(0, depth + 1, K * K)}[how]
    g = StateGrid(BOX, K, depth, split)
    lengths = rng.integers(1, 12, 40)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    # points anywhere, on cell edges, and on the box's edges
    lat = np.where(rng.random(offsets[-1]) < 0.2, rng.integers(0, g.W + 1, offsets[-1]) / g.W,
                   rng.random(offsets[-1]))
    lon = np.where(rng.random(offsets[-1]) < 0.2, rng.integers(0, g.W + 1, offsets[-1]) / g.W,
                   rng.random(offsets[-1]))
    _check_sequences(g, offsets, lat, lon)


# ------------------------------------------------------ each trajectory's states depend on its own points only

def _walk(rng, n):
    """A trajectory around Beijing (lat ~ 40, lon ~ 116.3): small steps and a few long jumps."""
    step = np.where(rng.random((n, 2)) < 0.9, rng.normal(0, 3e-4, (n, 2)), rng.normal(0, 3e-2, (n, 2)))
    return (np.clip(40.0 + np.cumsum(step[:, 0]), 39.9, 40.1), np.clip(116.3 + np.cumsum(step[:, 1]), 116.2, 116.4))


@pytest.mark.parametrize("chunk", [None, 1000])
def test_a_trajectorys_states_do_not_depend_on_the_other_trajectories(monkeypatch, chunk):
    if chunk is not None:
        monkeypatch.setattr(states_module, "CHUNK_POINTS", chunk)
    rng = np.random.default_rng(3)
    g = StateGrid(BEIJING, 8, 3, rng.integers(0, 4, 64))
    mine = _walk(rng, 900)
    _, alone, _ = _check_sequences(g, [0, 900], *mine)
    assert len(alone) > 100
    for n_before, n_after in ((0, 5), (7, 0), (4, 3)):
        others = [_walk(rng, int(rng.integers(500, 4000))) for _ in range(n_before + n_after)]
        parts = others[:n_before] + [mine] + others[n_before:]
        offsets = np.concatenate([[0], np.cumsum([len(p[0]) for p in parts])])
        lat = np.concatenate([p[0] for p in parts])
        lon = np.concatenate([p[1] for p in parts])
        off, st_, _ = _check_sequences(g, offsets, lat, lon)
        assert np.array_equal(st_[off[n_before]:off[n_before + 1]], alone)


def test_a_pair_outside_the_support_is_an_internal_error_naming_no_state():
    g = uniform_grid(BOX, 4)
    sup = Support.of(g.m, *g.neighbours())
    with pytest.raises(RuntimeError) as info:
        sup.edge_index(np.array([0]), np.array([15]))
    assert not any(ch.isdigit() for ch in str(info.value))
