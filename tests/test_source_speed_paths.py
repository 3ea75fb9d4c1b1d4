"""The faster paths of the statistics stage compute what the plain formulas compute, integer for integer: the scan's
point filter keeps exactly the points from_points(private=True) keeps, the line walk, the grid steps and the support
positions equal their reference formulas."""

import duckdb
import numpy as np
import pyarrow as pa

from duckmob.privacy.steps import grid_steps, positions
from duckmob.source.table import point_filter
from duckmob.synth.cells import line_cells, uniform_grid
from duckmob.trajectories import from_points

BBOX = [39.8477, 116.1956, 40.1133, 116.4880]


def _points():
    lat = [39.8477, 40.1133, 39.8476999999, 40.11330001, 40.0, float("nan"), None, 95.0, 40.0, 40.0, 40.0, 40.0]
    lon = [116.1956, 116.4880, 116.3, 116.3, 116.4880000001, 116.3, 116.3, 116.3, None, float("inf"), 116.3, 116.2]
    n = len(lat)
    return pa.table({"traj_id": pa.array([1] * (n - 2) + [None, 2], pa.int64()),
                     "user_id": pa.array([7] * n, pa.int64()),
                     "ts": pa.array([None if i == 3 else i * 1_000_000 for i in range(n)], pa.timestamp("us")),
                     "lat": pa.array(lat, pa.float64()), "lon": pa.array(lon, pa.float64())})


def test_point_filter_keeps_what_cleaning_keeps():
    points = _points()
    con = duckdb.connect()
    for bbox in (BBOX, None):
        for time_required in (True, False):
            kept = con.sql(f"SELECT * FROM points WHERE {point_filter(bbox, time_required)}").to_arrow_table()
            args = dict(bbox=bbox, outside="drop", time_required=time_required, private=True, min_points=1)
            a, b = from_points(points, **args)[0], from_points(kept, **args)[0]
            for name in ("offsets", "traj_id", "user_id", "ts", "lat", "lon"):
                np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
            if time_required:   # nothing left for the cleaning's first two steps (else a stray NULL ts goes later)
                assert b.n_points == kept.num_rows


def _line_cells_reference(R0, C0, R1, C1):
    dR, dC = R1 - R0, C1 - C0
    n = np.maximum(np.maximum(np.abs(dR), np.abs(dC)), 1)
    seg = np.repeat(np.arange(len(n)), n)
    k = np.arange(len(seg)) - np.repeat(np.cumsum(n) - n, n)
    return (seg, R0[seg] + np.floor_divide(2 * k * dR[seg] + n[seg], 2 * n[seg]),
            C0[seg] + np.floor_divide(2 * k * dC[seg] + n[seg], 2 * n[seg]))


def test_line_walk_equals_its_formula():
    rng = np.random.default_rng(3)
    for size, span in ((0, 2), (1, 0), (500, 0), (20_000, 1), (20_000, 30)):
        R0, C0 = rng.integers(0, 100, (2, size))
        R1, C1 = R0 + rng.integers(-span, span + 1, size), C0 + rng.integers(-span, span + 1, size)
        for got, want in zip(line_cells(R0, C0, R1, C1), _line_cells_reference(R0, C0, R1, C1)):
            np.testing.assert_array_equal(got, want)
    grid = uniform_grid(BBOX, 7)
    R, C = rng.integers(0, 7, (2, 1000))
    np.testing.assert_array_equal(grid.state_of_base(R, C), R * 7 + C)


def test_grid_steps_and_positions_equal_their_formulas():
    rng = np.random.default_rng(4)
    lengths = rng.integers(1, 40, 300)
    owner = np.repeat(np.arange(300), lengths)
    n_windows = lengths + rng.integers(0, 3, 300)
    steps, g = grid_steps(owner, n_windows, 3.0)
    total = int(round(1 / g))
    w = n_windows[owner]
    position = np.arange(len(owner)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    np.testing.assert_array_equal(steps, total // w + (position < total % w))
    assert len(grid_steps(np.zeros(0, np.int64), np.zeros(0, np.int64), 3.0)[0]) == 0
    for entries in (np.sort(rng.choice(5000, 700, replace=False)), np.array([3, 10 ** 12]), np.zeros(0, np.int64)):
        index = np.concatenate([rng.integers(-5, 5100, 2000), entries[:50]])
        pos = np.searchsorted(entries, index)
        hit = (pos < len(entries)) & (entries[np.minimum(pos, max(len(entries) - 1, 0))] == index) \
            if len(entries) else np.zeros(len(index), bool)
        np.testing.assert_array_equal(positions(entries, index), np.where(hit, pos, -1))
