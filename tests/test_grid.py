import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duckmob import grid
from duckmob.errors import DuckmobError

BOX = [39.0, 115.0, 41.0, 117.0]  # 2 degrees each way: on w=4 a cell is 0.5 x 0.5 degrees


def test_cell_numbering_by_hand():
    # (lat, lon) -> row, col on the 4x4 grid: row = floor((lat-39)/0.5), col = floor((lon-115)/0.5)
    lat = [39.0, 39.49, 39.5, 40.9, 41.0, 41.0, 38.99]
    lon = [115.0, 116.2, 115.0, 116.6, 117.0, 115.0, 116.0]
    expect = [0, 0 * 4 + 2, 1 * 4 + 0, 3 * 4 + 3, 15, 12, -1]  # max edges fall in the last row/col; outside -1
    assert grid.cell_of(lat, lon, BOX, 4).tolist() == expect


def test_cell_matches_brute_force():
    rng = np.random.default_rng(1)
    lat = rng.uniform(39, 41, 2000)
    lon = rng.uniform(115, 117, 2000)
    w = 7
    got = grid.cell_of(lat, lon, BOX, w)
    edges_lat = np.linspace(39, 41, w + 1)
    edges_lon = np.linspace(115, 117, w + 1)
    for i in range(0, 2000, 37):
        r = max(k for k in range(w) if edges_lat[k] <= lat[i])
        c = max(k for k in range(w) if edges_lon[k] <= lon[i])
        assert got[i] == r * w + c


@settings(max_examples=200, deadline=None)
@given(d=st.integers(1, 8), data=st.data())
def test_parent_child_consistency(d, data):
    w = 1 << d
    cell = data.draw(st.integers(0, w * w - 1))
    level = data.draw(st.integers(0, d))
    p = int(grid.parent(cell, w, level))
    assert 0 <= p < 4 ** level
    # the parent at level d is the cell itself; at level 0 the root
    assert int(grid.parent(cell, w, d)) == cell
    assert int(grid.parent(cell, w, 0)) == 0
    if level < d:
        # the cell's parent at level+1 is one of the children of its parent at level
        assert int(grid.parent(cell, w, level + 1)) in grid.children(np.int64(p), level).tolist()
    # children's parent is the cell itself
    if d < 8:
        kids = grid.children(np.int64(cell), d)
        assert all(int(grid.parent(k, 2 * w, d)) == cell for k in kids)


@settings(max_examples=100, deadline=None)
@given(lat=st.floats(39, 41), lon=st.floats(115, 117), d=st.integers(1, 6))
def test_parent_covers_point(lat, lon, d):
    w = 1 << d
    leaf = grid.cell_of([lat], [lon], BOX, w)[0]
    for level in range(d + 1):
        assert grid.parent(leaf, w, level) == grid.cell_of([lat], [lon], BOX, 1 << level)[0]


def test_center_and_bounds():
    a, b, c, d = grid.cell_bounds(np.array([5]), BOX, 4)
    assert (a[0], b[0], c[0], d[0]) == (39.5, 115.5, 40.0, 116.0)
    lat, lon = grid.cell_center(np.array([5]), BOX, 4)
    assert (lat[0], lon[0]) == (39.75, 115.75)


def test_time_slot():
    us = lambda h, m=0: (h * 3600 + m * 60) * 1_000_000 + 10 * 86_400_000_000
    assert grid.time_slot([us(0), us(4, 47), us(4, 48), us(23, 59)], 5).tolist() == [0, 0, 1, 4]


def test_assign_pois_distinct_and_optimal():
    # three POIs all nearest to the same leaf must take three distinct leaves, total distance minimal
    lat = [39.26, 39.24, 39.25]
    lon = [115.25, 115.26, 115.24]
    leaves = grid.assign_pois(lat, lon, BOX, 4)
    assert len(set(leaves.tolist())) == 3
    assert 0 in leaves.tolist()
    # a POI inside its own leaf, alone, gets that leaf
    assert grid.assign_pois([40.8], [116.8], BOX, 4).tolist() == [15]
    with pytest.raises(DuckmobError, match="do not fit"):
        grid.assign_pois(np.full(5, 39.5), np.full(5, 115.5), BOX, 2)


@pytest.mark.parametrize("bbox", [None, [1, 2, 3], [41, 115, 39, 117], [0, 0, 91, 1], "abc"])
def test_bad_bbox(bbox):
    with pytest.raises(DuckmobError, match="bbox"):
        grid.BBox.of(bbox)


def test_bad_width():
    with pytest.raises(DuckmobError, match="w = 2"):
        grid.parent(3, 6, 1)
    with pytest.raises(DuckmobError, match="positive integer"):
        grid.cell_of([40], [116], BOX, 0)
