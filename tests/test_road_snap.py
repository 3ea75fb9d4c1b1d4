"""The nearest-segment index (duckmob.road_snap) and the placer's per-row binary search (duckmob.roads.count_below):
the fast ways give exactly what the slow ones give (issue 39, item 7)."""

import numpy as np
import pytest

from duckmob import road_snap
from duckmob.roads import Roads, count_below, points_along, snap
from grid_roads import grid_roads


def spread_points(roads, rng, m):
    """Points in the box, around it (the Bay), far away, on the roads, near the roads and on cell edges."""
    seg = rng.integers(0, len(roads), m)
    on_lat, on_lon = points_along(roads, seg, rng.random(m))
    lat = np.concatenate([rng.uniform(37.76, 37.80, m), rng.uniform(37.74, 37.82, m), rng.uniform(37.5, 38.1, 50),
                          on_lat, on_lat + rng.normal(0, 6e-5, m), on_lat + rng.normal(0, 2e-4, m)])
    lon = np.concatenate([rng.uniform(-122.45, -122.38, m), rng.uniform(-122.47, -122.36, m),
                          rng.uniform(-122.8, -122.0, 50), on_lon, on_lon + rng.normal(0, 8e-5, m),
                          on_lon + rng.normal(0, 2.5e-4, m)])
    return lat, lon


def test_the_cells_give_the_searched_nearest_segment(sf_downtown):
    """Every point's segment and t from its cell's candidates equal the k-d search's (itself equal to a projection
    onto every segment: tests/test_roads.py), ties included, on downtown San Francisco and on the cells' edges."""
    index = sf_downtown._snap_index
    cells = index.cells
    rng = np.random.default_rng(7)
    lat, lon = spread_points(sf_downtown, rng, 20_000)
    qx, qy = index.plane(lat, lon)
    # points exactly on cell edges and corners
    ex = cells.x0 + cells.cell_m * rng.integers(0, cells.nx, 2000)
    ey = cells.y0 + cells.cell_m * rng.integers(0, cells.ny, 2000)
    qx, qy = np.r_[qx, ex, ex + rng.random(2000) * cells.cell_m], np.r_[qy, ey + rng.random(2000) * cells.cell_m, ey]
    first, count = cells.row(qx, qy)
    assert 0.55 < (count > 0).mean() < 0.95                   # most in a kept cell, the far ones not
    seg, t = index.nearest(qx, qy)
    want_seg, want_t = index.search(qx, qy)
    assert np.array_equal(seg, want_seg) and np.array_equal(t, want_t)


def test_cells_on_a_grid_hold_only_the_nearby_streets():
    roads = Roads.of(grid_roads([37.70, -122.50, 37.72, -122.48], streets=6))
    index = roads._snap_index
    cells = index.cells
    width = np.diff(cells.start)
    assert width.max() <= 8 and (width == 0).any()            # block interiors farther than 15 m keep none
    rng = np.random.default_rng(1)
    lat, lon = rng.uniform(37.699, 37.721, 5000), rng.uniform(-122.501, -122.479, 5000)
    qx, qy = index.plane(lat, lon)
    assert all(np.array_equal(a, b) for a, b in zip(index.nearest(qx, qy), index.search(qx, qy)))


def test_coarser_cells_keep_candidates_farther_from_the_roads(sf_downtown, monkeypatch):
    """On a network too wide for 10 m cells (here: the cells capped at 65,536), a cell keeps candidates while its
    nearest road is within CELL_NEAR_CELLS of its sides, not 15 m, and still gives the searched answer."""
    monkeypatch.setattr(road_snap, "MAX_CELLS", 1 << 16)
    roads = Roads.of(sf_downtown.to_arrow())                     # a fresh index, its cells built under the cap
    index = roads._snap_index
    cells = index.cells
    assert 20 < cells.cell_m < 40
    rng = np.random.default_rng(3)
    lat, lon = spread_points(roads, rng, 5_000)
    qx, qy = index.plane(lat, lon)
    first, count = cells.row(qx, qy)
    near = snap(roads, lat, lon)[4]
    kept = (count > 0) & (count <= road_snap.CELL_WIDTH)
    assert kept[(near > 15) & (near < 25)].mean() > 0.8           # beyond 15 m, in the cells
    assert not kept[near > road_snap.CELL_NEAR_CELLS * cells.cell_m + cells.cell_m].any()
    seg, t = index.nearest(qx, qy)
    want_seg, want_t = index.search(qx, qy)
    assert np.array_equal(seg, want_seg) and np.array_equal(t, want_t)


def test_an_index_searches_until_the_cells_would_have_paid():
    roads = Roads.of(grid_roads([37.70, -122.50, 37.72, -122.48], streets=6))
    index = roads._snap_index
    lat, lon = np.full(10, 37.705), np.full(10, -122.495)
    budget = road_snap.BUILD_AFTER * len(roads)
    for _ in range(budget // 10):
        snap(roads, lat, lon)
    assert "cells" not in index.__dict__ and index.searched == budget // 10 * 10
    snap(roads, lat, lon)
    assert "cells" in index.__dict__


@pytest.mark.parametrize("k", [1, 2, 3, 7, 96, 100])
def test_count_below_equals_comparing_every_entry(k):
    rng = np.random.default_rng(k)
    w = rng.random((300, k)).astype(np.float32)
    w[rng.random((300, k)) < 0.3] = 0                          # flat stretches: ties
    cum = np.cumsum(w, axis=1).astype(np.float32)
    rows = rng.integers(0, 300, 5000)
    u = rng.random(5000) * cum[rows, -1] * 1.1
    u[:500] = cum[rows[:500], rng.integers(0, k, 500)]          # exactly on an entry
    got = count_below(cum, rows, u)
    assert np.array_equal(got, (cum[rows] < u[:, None]).sum(axis=1))
    assert got.max() == k and got.min() == 0
