import math
import re
import warnings

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duckmob.errors import DuckmobError
from duckmob.trajectories import NO_TIME, NOT_PRIVATE, Trajectories, from_points, inspect, to_arrow

T0 = 1_600_000_000_000_000
BOX = [39, 115, 41, 117]


def pts(traj, ts, lat, lon, user=None, seq=None):
    cols = {"traj_id": pa.array(traj, pa.int64()),
            "ts": pa.array([None if t is None else T0 + t * 1_000_000 for t in ts], pa.int64()).cast(pa.timestamp("us")),
            "lat": pa.array(lat, pa.float64()), "lon": pa.array(lon, pa.float64())}
    if user is not None:
        cols["user_id"] = pa.array(user, pa.int64())
    if seq is not None:
        cols["seq"] = pa.array(seq, pa.int64())
    return pa.table(cols)


def private(table, **kw):
    """from_points(private=True), failing the test on any warning (a warning is an output too)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return from_points(table, private=True, **kw)[0]


def same(a: Trajectories, b: Trajectories) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f)) and getattr(a, f).dtype == getattr(b, f).dtype
               for f in ("offsets", "traj_id", "user_id", "ts", "lat", "lon"))


def without(traj: Trajectories, traj_id, user_id) -> Trajectories:
    return traj.take((traj.traj_id != traj_id) | (traj.user_id != user_id))


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
    # private: dropped whatever `outside` says; the public arguments are still checked
    assert same(private(t, bbox=BOX, outside="fail"), traj)
    assert same(private(t, bbox=BOX, outside="drop"), traj)
    with pytest.raises(DuckmobError, match="outside := 'sideways' is not an option"):
        from_points(t, bbox=BOX, outside="sideways", private=True)
    with pytest.raises(DuckmobError, match="bbox"):
        from_points(t, bbox=[41, 115, 39, 117], private=True)


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
    # private: the bad point is dropped, its trajectory is then too short, and nothing is left: no error
    good = pts([2, 2], [0, 1], [40, 40.5], [116, 116.5])
    t = pa.concat_tables([pts([1, 1], [0, 1], lat, lon), good])
    assert same(private(t), private(good))
    assert private(pts([1, 1], [0, 1], lat, lon)).n_trajectories == 0


def test_refusals_quote_no_value_from_the_table():
    t = pts([17, 17, 17], [0, 1, 2], [40, 116.318417, 40.5], [116, 116, 181.25])
    for kw in ({}, {"outside": "fail", "bbox": BOX}):
        with pytest.raises(DuckmobError) as exc:
            from_points(t, **kw)
        assert str(exc.value) == ("1 points have a latitude outside [-90, 90]: lat and lon must be WGS 84 degrees; "
                                  "filter them out (WHERE lat BETWEEN -90 AND 90) or pass outside := 'drop' to "
                                  "drop them")
    with pytest.raises(DuckmobError) as exc:
        from_points(pts([17, 17], [0, 1], [40, 40.5], [116, 181.25]))
    assert "116.318417" not in str(exc.value) and "181.25" not in str(exc.value) and "17" not in str(exc.value)


@pytest.mark.parametrize("bad_lat,bad_lon", [(95.0, 116.2), (-90.5, 116.2), (40.2, 181.0), (40.2, -200.0),
                                             (float("nan"), 116.2), (40.2, float("nan")), (None, 116.2)])
def test_invalid_coordinates_are_dropped_like_outside_points_with_outside_drop(bad_lat, bad_lon):
    # trajectory 1: the bad point in the middle of three; trajectory 2 untouched; trajectory 3 only bad + one good
    t = pts([1, 1, 1, 2, 2, 3, 3], [0, 1, 2, 0, 1, 0, 1], [40.0, bad_lat, 40.4, 39.5, 39.6, bad_lat, 40.1],
            [116.0, bad_lon, 116.4, 115.5, 115.6, bad_lon, 116.1])
    got, report = from_points(t, bbox=BOX, outside="drop")
    assert got.traj_id.tolist() == [1, 2] and got.lengths.tolist() == [2, 2]   # the rest of trajectory 1 is kept
    assert got.lat.tolist() == [40.0, 40.4, 39.5, 39.6]
    assert report.invalid_coordinates == 2 and report.outside_bbox == 0 and report.short_trajectories == 1
    assert report.messages()[0] == "dropped 2 points with a NULL, NaN or out-of-range lat or lon"
    # exactly what a private release keeps, and what the same table without those points gives
    assert same(got, private(t, bbox=BOX))
    assert same(got, from_points(t.filter(pa.array([True, False, True, True, True, False, True])), bbox=BOX,
                                 outside="drop")[0])
    with pytest.raises(DuckmobError, match="or pass outside := 'drop' to drop them"):
        from_points(t, bbox=BOX, outside="fail")


def test_invalid_coordinates_in_sql(con):
    con.execute("CREATE TABLE taxi AS SELECT * FROM (VALUES (1, 0, 39.90, 116.30), (1, 60, 95.0, 116.31), "
                "(1, 120, 39.91, 116.32), (2, 0, 39.95, 116.35), (2, 60, 39.96, 'nan'::DOUBLE), "
                "(2, 120, 39.97, 116.37)) t(traj_id, s, lat, lon)")
    src = "'(SELECT traj_id, to_timestamp(1.2e9 + s)::TIMESTAMP AS ts, lat, lon FROM taxi)'"
    bbox = "[39.8477, 116.1956, 40.1133, 116.4880]"
    rows = con.execute(f"SELECT traj_id, len(cells) FROM mob_cell_sequences({src}, bbox := {bbox}, w := 32, "
                       "stay_points := false, outside := 'drop') ORDER BY traj_id").fetchall()
    assert [r[0] for r in rows] == [1, 2]
    with pytest.raises(Exception) as err:
        con.execute(f"FROM mob_cell_sequences({src}, bbox := {bbox}, w := 32, outside := 'fail')").fetchall()
    assert "1 points have a NULL or NaN lon" in str(err.value) and "95" not in str(err.value)
    metrics = dict(con.execute(f"SELECT metric, value FROM mob_evaluate({src}, {src}, bbox := {bbox}, "
                               "families := ['privtrace'])").fetchall())
    assert metrics["real_trajectories"] == 2   # the evaluation drops them too (it always used outside := 'drop')


def test_null_time_and_id():
    with pytest.raises(DuckmobError, match="NULL ts"):
        from_points(pts([1, 1], [0, None], [40, 40], [116, 116]))
    t = pts([1, 1], [0, 1], [40, 40], [116, 116]).set_column(0, "traj_id", pa.array([1, None], pa.int64()))
    with pytest.raises(DuckmobError, match="NULL traj_id"):
        from_points(t)
    # private: the points are dropped, one by one
    t = pts([1, 1, 1, 2, 2, 2], [0, None, 2, 0, 1, 2], [40, 40.1, 40.2, 40.3, 40.4, 40.5], [116] * 6)
    t = t.set_column(0, "traj_id", pa.array([1, 1, 1, 2, None, 2], pa.int64()))
    traj = private(t)
    assert traj.offsets.tolist() == [0, 2, 4] and traj.lat.tolist() == [40, 40.2, 40.3, 40.5]


def test_empty_and_nothing_left():
    with pytest.raises(DuckmobError, match="empty"):
        from_points(pts([], [], [], []))
    with pytest.raises(DuckmobError, match="no trajectory is left"):
        from_points(pts([1, 2], [0, 0], [40, 40], [116, 116]))
    # private: an empty Trajectories, not an error
    for table in (pts([], [], [], []), pts([1, 2], [0, 0], [40, 40], [116, 116]), None):
        traj, report = from_points(table, bbox=BOX, private=True)
        assert traj.offsets.tolist() == [0] and traj.n_points == 0 and traj.n_trajectories == 0
        assert traj.ts.dtype == np.int64 and traj.lat.dtype == np.float64 and len(traj.user_id) == 0
        assert report.points_in == 0 and report.messages() == []  # nothing about the table comes back


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
    t = pts([1, 1, 1, 1, 2, 3, 3, 4, 4, 5, 5], [5, 0, -1, 0, 0, 0, None, 0, 1, 0, 1],
            [40, 40, 95, 40, 40, 40, 40, 40, 45, 40, 40], [116, 116, 116, 116, 116, 116, 116, 116, 116, 181, 116],
            user=[1, 1, 1, 1, 2, 3, 3, 4, 4, 5, None])
    rows = inspect(t, bbox=BOX)
    assert rows[0]["check"] == NOT_PRIVATE and "do not share" in rows[0]["action"] and rows[0]["count"] is None
    got = {r["check"]: r["count"] for r in rows}
    assert got["points"] == 11 and got["trajectories"] == 6  # (user, traj) pairs: traj 5 has two
    assert got["traj_id shared by several users"] == 1 and got["points with a NULL user_id"] == 1
    assert got["duplicate timestamps"] == 1
    assert got["lat outside [-90, 90]"] == 1 and got["lon outside [-180, 180]"] == 1
    assert got["NULL ts"] == 1 and got["NULL traj_id"] == 0 and got["NULL or NaN lat/lon"] == 0
    assert got["points outside bbox"] == 1  # the valid point at lat 45
    assert got["trajectories out of time order"] == 1
    # traj 2 (one point), 3 (NULL ts dropped), 4 (one point outside), 5 without user (user 5's point is gone)
    assert got["trajectories with fewer than 2 points"] == 4
    assert got["trajectories left"] == 1 and got["points left"] == 2
    # exactly what the private cleaning keeps
    kept = private(t, bbox=BOX)
    assert (kept.n_trajectories, kept.n_points) == (1, 2)
    assert {r["check"]: r["action"] for r in rows}["NULL ts"].startswith("dropped by private releases")
    assert inspect(pts([], [], [], []))[0]["check"] == NOT_PRIVATE


def test_timeless_points_without_seq_are_refused_or_dropped():
    # no order of their own: refused by the exact tools, dropped (each on its own) by private releases
    t = pts([1, 1, 1, 2, 2], [None] * 5, [3, 1, 2, 5, 6], [3, 1, 2, 5, 6]).append_column(
        "seq", pa.array([None, None, None, 1, 0], pa.int64()))
    with pytest.raises(DuckmobError, match="3 points have neither a ts nor a seq"):
        from_points(t, time_required=False)
    traj = private(t, time_required=False)
    assert traj.traj_id.tolist() == [2] and traj.lat.tolist() == [6, 5]
    # a table without any seq column: every timeless trajectory is dropped
    assert private(t.drop_columns(["seq"]), time_required=False).n_trajectories == 0


def test_timeless_duplicate_seq_is_not_a_duplicate_point():
    t = pts([1, 1, 1], [None, None, None], [3, 1, 2], [3, 1, 2]).append_column("seq", pa.array([1, 0, 1]))
    traj, report = from_points(t, time_required=False)
    assert traj.lat.tolist() == [1, 2, 3] and report.duplicate_timestamps == 0   # equal seqs by (lat, lon)


def test_ties_are_broken_by_the_points_own_values_not_the_row_order():
    # a repeated timestamp keeps the point with the smallest (lat, lon), whatever the row order
    rows = pts([1, 1, 1, 1], [0, 1, 1, 2], [40.1, 40.5, 40.2, 40.3], [116.1, 116.5, 116.2, 116.3])
    for perm in ([0, 1, 2, 3], [3, 2, 1, 0], [1, 0, 3, 2]):
        traj = private(rows.take(pa.array(perm)))
        assert traj.lat.tolist() == [40.1, 40.2, 40.3]


# -- private cleaning: per point, per trajectory, never raising ---------------------------------------------

def test_a_traj_id_shared_by_two_users_is_two_trajectories():
    # users 7 and 8 both number a trip 5; user 8's points come first in the table and interleave with 7's
    both = pts([5, 5, 5, 5, 5, 6, 6], [1, 0, 0, 2, 1, 0, 1], [40.1, 40.2, 40.3, 40.4, 40.5, 40.6, 40.7],
               [116.1, 116.2, 116.3, 116.4, 116.5, 116.6, 116.7], user=[8, 7, 8, 7, 7, 8, 8])
    for flag in (False, True):
        traj, _ = from_points(both, bbox=BOX, private=flag)
        assert traj.traj_id.tolist() == [5, 5, 6] and traj.user_id.tolist() == [7, 8, 8]
        assert traj.lat.tolist() == [40.2, 40.5, 40.4, 40.3, 40.1, 40.6, 40.7]
        only_7 = both.filter(pa.compute.equal(both.column("user_id"), 7))
        alone, _ = from_points(only_7, bbox=BOX, private=flag)
        assert same(alone, without(without(traj, 5, 8), 6, 8))  # user 8 removed: user 7's trip bit-identical
    # a NULL user is "no user": its points form (no user, traj_id)
    t = pts([5, 5, 5, 5], [0, 1, 0, 1], [40, 40.1, 40.2, 40.3], [116] * 4).append_column(
        "user_id", pa.array([3, 3, None, None], pa.int64()))
    traj = private(t)
    assert traj.user_id.tolist() == [-1, 3] and traj.lat.tolist() == [40.2, 40.3, 40, 40.1]


def test_timeless_trajectories_per_trajectory_when_private():
    # traj 1 has no time at all (timeless, ordered by seq); traj 2 has time but one NULL ts (that point dropped)
    t = pts([1, 1, 1, 2, 2, 2], [None, None, None, 2, None, 1], [3, 1, 2, 9, 8, 7], [3, 1, 2, 9, 8, 7],
            seq=[2, 0, 1, 0, 1, 2])
    with pytest.raises(DuckmobError, match="NULL ts in trajectories that have timestamps"):
        from_points(t, time_required=False)
    traj = private(t, time_required=False)
    assert traj.offsets.tolist() == [0, 3, 5] and traj.lat.tolist() == [1, 2, 3, 7, 9]
    assert traj.ts[:3].tolist() == [NO_TIME] * 3 and (traj.ts[3:] > 0).all() and not traj.has_time
    # each trajectory as it would be alone
    alone = private(t.slice(0, 3), time_required=False)
    assert same(alone, traj.take(np.array([0])))
    assert same(private(t.slice(3), time_required=False), traj.take(np.array([1])))


def test_private_messages_quote_nothing_from_the_table():
    # distinctive values: none of their digits may appear in a message raised on the private path
    t = pts([987654321] * 3, [111, 222, 333], [12.3456789, 12.3456789, 95.4321], [-33.98765, 181.2468, 0.5],
            user=[55501, 55501, 55501])
    for bad in (dict(outside="sideways"), dict(bbox=[41, 115, 39, 117]), dict(bbox=[1, 2, 3])):
        with pytest.raises(DuckmobError) as exc:
            from_points(t, private=True, **bad)
        assert not re.search(r"987654|12\.345|95\.43|33\.98|181\.2|55501|\b3 points", str(exc.value))
    assert private(t).n_trajectories == 0 and private(t, bbox=BOX).n_trajectories == 0


_VALID_LAT, _VALID_LON = st.floats(39.0, 41.0), st.floats(115.0, 117.0)
# mostly valid values (so that trajectories survive), with every kind of invalid one
_LATS = st.one_of(_VALID_LAT, _VALID_LAT, _VALID_LAT, st.none(),
                  st.sampled_from([math.nan, math.inf, -math.inf, 95.0, -90.5, 38.0, 42.0, 90.0]))
_LONS = st.one_of(_VALID_LON, _VALID_LON, _VALID_LON, st.none(),
                  st.sampled_from([math.nan, -math.inf, 181.0, -180.5, 114.0, 180.0]))
_MAYBE = lambda values: st.one_of(values, values, values, st.none())  # noqa: E731
_ROW = st.tuples(_MAYBE(st.integers(0, 3)),     # traj_id
                 _MAYBE(st.integers(-2, 2)),    # user_id (negative = no user)
                 _MAYBE(st.integers(0, 4)),     # ts (s): repeats are duplicates
                 _LATS, _LONS,
                 _MAYBE(st.integers(0, 3)))     # seq
_CLEAN_ROW = st.tuples(st.integers(0, 3), st.integers(-1, 2), st.integers(0, 4), _VALID_LAT, _VALID_LON,
                       st.none())


@st.composite
def _rows(draw, max_size=40):
    """Table rows: clean ones (so that trajectories survive) and messy ones, shuffled."""
    clean = draw(st.lists(_CLEAN_ROW, max_size=max_size // 2))
    messy = draw(st.lists(_ROW, max_size=max_size // 2))
    return draw(st.permutations(clean + messy))


def _table(rows) -> pa.Table:
    traj, user, ts, lat, lon, seq = (list(c) for c in zip(*rows)) if rows else ([],) * 6
    return pts(traj, ts, lat, lon, user=user, seq=seq)


def _reference(rows, bbox, min_points, time_required):
    """The stated semantics, written the slow way: a dict of (traj_id, user) -> [(ts, lat, lon), ...]."""
    groups = {}
    for i, (traj, user, ts, lat, lon, seq) in enumerate(rows):
        if traj is None or lat is None or lon is None or math.isnan(lat) or math.isnan(lon):
            continue
        if abs(lat) > 90 or abs(lon) > 180 or (ts is None and time_required):
            continue
        if bbox is not None and not (bbox[0] <= lat <= bbox[2] and bbox[1] <= lon <= bbox[3]):
            continue
        key = (traj, -1 if user is None or user < 0 else user)
        groups.setdefault(key, []).append((ts, seq, i, lat, lon))
    out = {}
    for key, points in groups.items():
        if all(p[0] is None for p in points):  # timeless: by seq, ties by (lat, lon); no seq: dropped
            points = sorted((p for p in points if p[1] is not None), key=lambda p: (p[1], p[3], p[4]))
            kept = [(NO_TIME, p[3], p[4]) for p in points]
        else:
            kept, seen = [], set()
            for p in sorted((p for p in points if p[0] is not None), key=lambda p: (p[0], p[3], p[4])):
                if p[0] not in seen:
                    seen.add(p[0])
                    kept.append((T0 + p[0] * 1_000_000, p[3], p[4]))
        if len(kept) >= min_points:
            out[key] = kept
    return out


def _as_dict(traj: Trajectories) -> dict:
    return {(int(traj.traj_id[i]), int(traj.user_id[i])):
            list(zip(traj.ts[a:b].tolist(), traj.lat[a:b].tolist(), traj.lon[a:b].tolist()))
            for i, (a, b) in enumerate(zip(traj.offsets[:-1], traj.offsets[1:]))}


@settings(max_examples=300, deadline=None, derandomize=True)
@given(rows=_rows(), bbox=st.sampled_from([None, BOX]), min_points=st.integers(1, 3),
       time_required=st.booleans(), outside=st.sampled_from(["fail", "drop"]))
def test_private_cleaning_never_raises_and_follows_the_stated_rules(rows, bbox, min_points, time_required, outside):
    traj = private(_table(rows), bbox=bbox, outside=outside, min_points=min_points, time_required=time_required)
    expected = _reference(rows, bbox, min_points, time_required)
    assert _as_dict(traj) == expected
    keys = list(zip(traj.traj_id.tolist(), traj.user_id.tolist()))
    assert keys == sorted(expected)  # ordered by (traj_id, user_id)
    assert traj.offsets[0] == 0 and traj.offsets[-1] == len(traj.lat) == len(traj.ts)
    assert traj.offsets.dtype == traj.traj_id.dtype == traj.user_id.dtype == traj.ts.dtype == np.int64
    # the same table as one StructArray (what the SQL layer passes) gives the same trajectories
    struct = _table(rows).to_struct_array().combine_chunks()
    assert same(private(struct, bbox=bbox, outside=outside, min_points=min_points, time_required=time_required),
                traj)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(rows=_rows(30), extra=_rows(10),
       user=st.integers(10, 11), traj_id=st.integers(0, 4), positions=st.randoms(use_true_random=False),
       time_required=st.booleans())
def test_neighbouring_tables_change_only_the_added_trajectory(rows, extra, user, traj_id, positions,
                                                              time_required):
    # add one trajectory (a fresh user with a traj_id that others may use), its rows scattered through the table
    added = [(traj_id, user, *r[2:]) for r in extra]
    merged = list(rows)
    for r in added:
        merged.insert(positions.randint(0, len(merged)), r)
    kw = dict(bbox=BOX, time_required=time_required)
    base, plus = private(_table(rows), **kw), private(_table(merged), **kw)
    assert same(without(plus, traj_id, user), base)


@pytest.mark.parametrize("garbage", [
    dict(lat=[math.nan] * 3, lon=[116.0] * 3),       # all NaN
    dict(lat=[45.0, 46.0, 47.0], lon=[116.0] * 3),   # all outside the bbox
    dict(lat=[40.0, 95.0, 40.5], lon=[116.0, 116.0, 200.0]),  # out of range: one valid point left, too short
    dict(lat=[40.0] * 3, lon=[116.0] * 3, ts=[1, 1, 1]),      # one timestamp: duplicates leave one point
])
def test_a_garbage_trajectory_leaves_the_others_identical(garbage):
    rng = np.random.default_rng(0)
    n = 60
    base = pts(np.repeat(np.arange(12), 5).tolist(), np.tile(np.arange(5), 12).tolist(),
               rng.uniform(39.5, 40.5, n).tolist(), rng.uniform(115.5, 116.5, n).tolist(),
               user=np.repeat(np.arange(12) % 4, 5).tolist())
    bad = pts([3] * 3, garbage.get("ts", [0, 1, 2]), garbage["lat"], garbage["lon"], user=[99] * 3)
    with_bad = pa.concat_tables([bad.slice(0, 2), base, bad.slice(2)])
    assert same(private(with_bad, bbox=BOX), private(base, bbox=BOX))


def test_mob_check_says_it_is_not_private(con):
    con.execute("""CREATE TABLE trips AS SELECT * FROM (VALUES
        (1, 10, TIMESTAMP '2020-01-01 08:00', 40.0, 116.0),
        (1, 10, TIMESTAMP '2020-01-01 08:10', 40.1, 116.0),
        (1, 11, TIMESTAMP '2020-01-01 08:00', 40.2, 116.0),
        (1, 11, NULL, 40.3, 116.0),
        (2, 11, TIMESTAMP '2020-01-01 09:00', 95.0, 115.2)) t(traj_id, user_id, ts, lat, lon)""")
    rows = con.execute(f"FROM mob_check('trips', bbox := {BOX})").fetchall()
    assert rows[0][1] == NOT_PRIVATE and rows[0][2] is None and "do not share" in rows[0][3]
    # every row says it in its first column, exact_not_private, whatever the order
    assert con.execute(f"SELECT DISTINCT exact_not_private FROM mob_check('trips', bbox := {BOX}) "
                       "ORDER BY count DESC").fetchall() == [(True,)]
    assert [c[0] for c in con.execute(f"FROM mob_check('trips', bbox := {BOX})").description][0] == "exact_not_private"
    got = {r[1]: r[2] for r in rows}
    assert got["trajectories"] == 3 and got["traj_id shared by several users"] == 1
    assert got["NULL ts"] == 1 and got["lat outside [-90, 90]"] == 1
    assert got["trajectories with fewer than 2 points"] == 1 and got["trajectories left"] == 1


def test_mob_check_counts_out_of_order_in_the_tables_own_order_whatever_the_threads(con):
    """mob_check's 'trajectories out of time order' once followed the order a parallel scan read the rows in (it
    failed in CI); it now reads the table's own row order: a table stored in time order has none, on any number of
    threads, and one stored backwards has every trajectory out of order."""
    con.execute("""CREATE TABLE trips AS SELECT i // 50 AS traj_id, i // 500 AS user_id,
                   TIMESTAMP '2020-01-01' + to_seconds(i % 50) AS ts, 40.0 + (i % 50) * 1e-4 AS lat, 116.0 AS lon
                   FROM range(400000) r(i) ORDER BY i""")
    con.execute("CREATE TABLE backwards AS FROM trips ORDER BY traj_id, ts DESC")
    query = f"SELECT count FROM mob_check('{{}}', bbox := {BOX}) WHERE \"check\" = 'trajectories out of time order'"
    for threads in (1, 4):
        con.execute(f"SET threads = {threads}")
        assert con.execute(query.format("trips")).fetchone()[0] == 0
        assert con.execute(query.format("backwards")).fetchone()[0] == 8000


@pytest.mark.parametrize("capacity", [1 << 32, 1000, 64])
def test_distinct_pairs_are_np_unique_of_the_pairs_whatever_the_slicing(capacity):
    from duckmob.trajectories import distinct_pairs

    rng = np.random.default_rng(3)
    owner = np.sort(rng.integers(5, 400, 20_000))
    values = rng.integers(0, 37, len(owner))
    o, v = distinct_pairs(owner, values, 37, capacity=capacity)
    want = np.unique(owner * 37 + values)
    assert np.array_equal(o * 37 + v, want) and o.dtype == np.int64 and v.dtype == np.int64
    empty = distinct_pairs(np.zeros(0, np.int64), np.zeros(0, np.int64), 37)
    assert len(empty[0]) == len(empty[1]) == 0


def test_rows_in_runs_get_the_stable_lexicographic_order():
    """_lex_order's shortcut (a stable sort on the first key when rows come in a few sorted runs) gives exactly
    np.lexsort's order, ties included; and the full sort where the shortcut is not the answer."""
    from duckmob.trajectories import _lex_order

    rng = np.random.default_rng(4)
    lens = rng.integers(1, 30, 400)
    traj = np.repeat(np.arange(400), lens)
    ts = np.concatenate([np.sort(rng.integers(0, 50, n)) for n in lens])     # ties inside trajectories
    user = traj % 7
    runs = np.array_split(np.arange(len(traj)), 9)
    whole = np.concatenate([runs[i] for i in rng.permutation(9)])            # runs cut inside trajectories too
    by_traj = np.argsort(np.repeat(rng.permutation(400), lens), kind="stable")   # whole trajectories shuffled
    for perm in (whole, by_traj, rng.permutation(len(traj))):
        keys = (traj[perm], user[perm], ts[perm])
        assert np.array_equal(_lex_order(keys)[0], np.lexsort(keys[::-1]))
    assert _lex_order((traj, user, ts))[0] is None
