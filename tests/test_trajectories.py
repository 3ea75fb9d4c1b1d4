import numpy as np
import pyarrow as pa
import pytest

from duckmob.errors import DuckmobError
from duckmob.trajectories import NO_TIME, from_points, inspect, to_arrow

T0 = 1_600_000_000_000_000


def pts(traj, ts, lat, lon, user=None):
    cols = {"traj_id": pa.array(traj, pa.int64()),
            "ts": pa.array([None if t is None else T0 + t * 1_000_000 for t in ts], pa.int64()).cast(pa.timestamp("us")),
            "lat": pa.array(lat, pa.float64()), "lon": pa.array(lon, pa.float64())}
    if user is not None:
        cols["user_id"] = pa.array(user, pa.int64())
    return pa.table(cols)


def test_ragged_arrays_sorted_and_deduplicated():
    t = pts([2, 1, 2, 1, 1, 2], [5, 3, 1, 1, 3, 3], [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6], user=[7, 8, 7, 8, 8, 7])
    traj, report = from_points(t)
    assert traj.offsets.tolist() == [0, 2, 5]
    assert traj.traj_id.tolist() == [1, 2]
    assert traj.user_id.tolist() == [8, 7]
    assert traj.lat.tolist() == [4, 2, 3, 6, 1]  # sorted by time, duplicate ts=3 in traj 1: first kept
    assert report.duplicate_timestamps == 1
    assert report.unsorted_trajectories == 2
    assert t.column("lat").to_pylist() == [1, 2, 3, 4, 5, 6]  # input untouched


def test_short_trajectories_dropped_and_reported():
    traj, report = from_points(pts([1, 1, 2], [0, 1, 0], [1, 1, 1], [1, 1, 1]))
    assert traj.n_trajectories == 1 and report.short_trajectories == 1
    assert "fewer than 2 points" in " ".join(report.messages())


def test_outside_bbox_drop_or_fail():
    t = pts([1, 1, 1], [0, 1, 2], [40, 40.5, 45], [116, 116, 116])
    with pytest.raises(DuckmobError, match="1 points lie outside the bounding box.*outside := 'drop'"):
        from_points(t, bbox=[39, 115, 41, 117])
    traj, report = from_points(t, bbox=[39, 115, 41, 117], outside="drop")
    assert traj.n_points == 2 and report.outside_bbox == 1
    with pytest.raises(DuckmobError, match="outside := 'sideways' is not an option"):
        from_points(t, bbox=[39, 115, 41, 117], outside="sideways")


@pytest.mark.parametrize("lat,lon,match", [
    ([40, float("nan")], [116, 116], "NULL or NaN lat"),
    ([40, None], [116, 116], "NULL or NaN lat"),
    ([40, 95], [116, 116], r"latitude outside \[-90, 90\]"),
    ([40, 40], [116, 181], r"longitude outside \[-180, 180\]"),
    ([116, 116], [40, 40], "lat and lon swapped"),
])
def test_bad_coordinates(lat, lon, match):
    with pytest.raises(DuckmobError, match=match):
        from_points(pts([1, 1], [0, 1], lat, lon))


def test_null_time_and_id():
    with pytest.raises(DuckmobError, match="NULL ts"):
        from_points(pts([1, 1], [0, None], [40, 40], [116, 116]))
    t = pts([1, 1], [0, 1], [40, 40], [116, 116]).set_column(0, "traj_id", pa.array([1, None], pa.int64()))
    with pytest.raises(DuckmobError, match="NULL traj_id"):
        from_points(t)


def test_empty_and_nothing_left():
    with pytest.raises(DuckmobError, match="empty"):
        from_points(pts([], [], [], []))
    with pytest.raises(DuckmobError, match="no trajectory is left"):
        from_points(pts([1, 2], [0, 0], [40, 40], [116, 116]))


def test_timeless_table_ordered_by_seq():
    t = pts([1, 1, 1], [None, None, None], [1, 2, 3], [1, 2, 3]).append_column("seq", pa.array([2, 0, 1]))
    with pytest.raises(DuckmobError, match="NULL ts"):
        from_points(t)
    traj, _ = from_points(t, time_required=False)
    assert traj.lat.tolist() == [2, 3, 1] and not traj.has_time
    out = to_arrow(traj)
    assert out.column("ts").null_count == 3 and out.column("seq").to_pylist() == [0, 1, 2]


def test_take_and_roundtrip():
    traj, _ = from_points(pts([1, 1, 2, 2, 2], [0, 1, 0, 1, 2], [1, 2, 3, 4, 5], [1, 2, 3, 4, 5]))
    sub = traj.take(np.array([1]))
    assert sub.lat.tolist() == [3, 4, 5] and sub.offsets.tolist() == [0, 3]
    assert to_arrow(traj).column("traj_id").to_pylist() == [1, 1, 2, 2, 2]


def test_inspect_counts_without_raising():
    t = pts([1, 1, 1, 2], [0, 0, -1, 0], [40, 40, 95, 40], [116, 116, 116, 116])
    rows = {r["check"]: r["count"] for r in inspect(t, bbox=[39, 115, 41, 117])}
    assert rows["duplicate timestamps"] == 1
    assert rows["lat outside [-90, 90]"] == 1
    assert rows["points outside bbox"] == 1
    assert rows["points out of time order"] == 1
    assert rows["trajectories with fewer than 2 points"] == 1


def test_timeless_table_with_all_null_seq_keeps_table_order():
    t = pts([1, 1, 1], [None, None, None], [3, 1, 2], [3, 1, 2]).append_column("seq", pa.array([None] * 3, pa.int64()))
    traj, report = from_points(t, time_required=False)
    assert traj.lat.tolist() == [3, 1, 2] and report.duplicate_timestamps == 0


def test_timeless_duplicate_seq_is_not_a_duplicate_point():
    t = pts([1, 1, 1], [None, None, None], [3, 1, 2], [3, 1, 2]).append_column("seq", pa.array([1, 0, 1]))
    traj, report = from_points(t, time_required=False)
    assert traj.lat.tolist() == [1, 3, 2] and report.duplicate_timestamps == 0
