"""state_sequences (duckmob/synth/cells.py) computes, integer for integer, what its plain formula computes: every
fix's base cell, the line walk between consecutive fixes (line_cells), each cell's state, and runs of one state
collapsed within a trajectory. Checked on uniform and split grids, with empty trajectories, on each of its paths
(base cells coded as int32 or int64, states read from a table of the base cells or computed from them)."""

import numpy as np
import pytest

import duckmob.synth.cells as cells
from duckmob.synth.cells import StateGrid, line_cells, state_sequences, uniform_grid

BOX = [39.8477, 116.1956, 40.1133, 116.4880]


def _reference(grid: StateGrid, offsets, lat, lon):
    """The plain formula: every fix's base cell, the walk from each fix to the next (a trajectory's last fix:
    its own cell), the state of every cell, runs of one state within a trajectory collapsed."""
    r, c = grid.base_coords(lat, lon)
    R, C = np.floor(r).astype(np.int64), np.floor(c).astype(np.int64)
    n = len(offsets) - 1
    owner = np.repeat(np.arange(n), np.diff(offsets))
    nxt = np.arange(len(R)) + 1
    nxt[offsets[1:][np.diff(offsets) > 0] - 1] -= 1
    seg, RR, CC = line_cells(R, C, R[nxt], C[nxt])
    states, own = grid.state_of_base(RR, CC), owner[seg]
    keep = np.ones(len(states), dtype=bool)
    keep[1:] = (own[1:] != own[:-1]) | (states[1:] != states[:-1])
    states, own = states[keep], own[keep]
    return np.concatenate([[0], np.cumsum(np.bincount(own, minlength=n))]), states, own


def _trajectories(rng, n):
    """n trajectories around Beijing, some empty, some of one fix, with repeated fixes, small steps and jumps
    (some far outside the box: clipped to its edge)."""
    lengths = rng.choice([0, 1, 2, 5, 40, 300], n, p=[0.1, 0.1, 0.1, 0.2, 0.3, 0.2])
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    m = int(offsets[-1])
    step = np.where(rng.random((m, 2)) < 0.85, rng.normal(0, 4e-4, (m, 2)), rng.normal(0, 4e-2, (m, 2)))
    step[rng.random(m) < 0.3] = 0.0
    walk = np.cumsum(step, axis=0)
    walk -= np.repeat(walk[np.minimum(offsets[:-1], m - 1)], lengths, axis=0)   # each trajectory from the centre
    return offsets, 39.98 + walk[:, 0], 116.34 + walk[:, 1]


@pytest.mark.parametrize("path", ["int32, table", "int64, formula"])
@pytest.mark.parametrize("grid", ["uniform 7", "uniform 256", "split", "split all"])
def test_state_sequences_equal_the_plain_formula(monkeypatch, grid, path):
    if path == "int64, formula":
        monkeypatch.setattr(cells, "INT32_CELLS", 0)
        monkeypatch.setattr(cells, "LUT_CELLS", 0)
    rng = np.random.default_rng(11)
    g = {"uniform 7": uniform_grid(BOX, 7), "uniform 256": uniform_grid(BOX, 256),
         "split": StateGrid(BOX, 9, 3, rng.integers(0, 4, 81)), "split all": StateGrid(BOX, 4, 2, np.full(16, 2))}[grid]
    for n in (1, 3, 400):
        offsets, lat, lon = _trajectories(rng, n)
        got, want = state_sequences(g, offsets, lat, lon), _reference(g, offsets, lat, lon)
        for a, b in zip(got, want):
            assert a.dtype == np.int64
            np.testing.assert_array_equal(a, b)
    fix_states = g.state_of(lat, lon)
    starts = np.zeros(len(lat), dtype=bool)
    starts[offsets[:-1][np.diff(offsets) > 0]] = True
    runs = np.count_nonzero(starts[1:] | (fix_states[1:] != fix_states[:-1])) + 1
    assert len(got[1]) > runs   # the walk fills gaps: more states than the fixes' own (runs collapsed)


def test_state_sequences_of_trajectories_without_points():
    g = StateGrid(BOX, 3, 1, np.array([0, 1, 0, 1, 0, 1, 0, 1, 1]))
    off, states, own = state_sequences(g, np.array([0, 0, 0]), np.zeros(0), np.zeros(0))
    assert off.tolist() == [0, 0, 0] and len(states) == 0 and len(own) == 0
    # one fix in the north-east corner's split cell (its north-east quarter: state 3 of the cell), after an empty one
    off, states, own = state_sequences(g, np.array([0, 0, 1]), np.array([40.11]), np.array([116.48]))
    assert off.tolist() == [0, 0, 1] and states.tolist() == [g.first[8] + 3] and own.tolist() == [1]


def test_the_state_table_is_the_state_of_every_base_cell():
    g = StateGrid(BOX, 5, 2, np.random.default_rng(2).integers(0, 3, 25))
    R, C = np.divmod(np.arange(g.W * g.W), g.W)
    np.testing.assert_array_equal(g.state_table(), g.state_of_base(R, C))
    assert g.state_table() is g.state_table()
