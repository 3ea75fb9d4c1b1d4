"""The read and clean stage of a first release (issue 42, item 1): buckets of trajectories in pieces are sorted by
their runs, not row by row, with exactly np.lexsort's stable order; cleaning drops short trajectories before its
one gather and never joins a point to another trajectory; routing splits record batches on threads and writes them
in the reader's order, with the same hash sum."""

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import duckmob.trajectories as trajectories
from duckmob.source import table as stream
from duckmob.trajectories import _lex_order, from_points


def _pieces(rng, n_traj=300, cuts=40):
    """Rows of trajectories (ties in time inside some) cut into pieces, the pieces shuffled."""
    lens = rng.integers(2, 60, n_traj)
    traj = np.repeat(rng.permutation(n_traj) * 7 + 3, lens)
    ts = np.concatenate([np.sort(rng.integers(0, 40, n)) for n in lens])
    user = traj % 5
    pieces = np.array_split(np.arange(len(traj)), cuts)
    perm = np.concatenate([pieces[i] for i in rng.permutation(cuts)])
    return traj[perm], user[perm], ts[perm]


def test_rows_in_pieces_are_sorted_by_their_runs_with_the_stable_order(monkeypatch):
    rng = np.random.default_rng(11)
    sizes = []
    lexsort = np.lexsort
    monkeypatch.setattr(trajectories.np, "lexsort", lambda keys: sizes.append(len(keys[0])) or lexsort(keys))
    hits = 0
    for _ in range(20):
        keys = _pieces(rng)
        sizes.clear()
        order, out, _ = _lex_order(keys)
        assert np.array_equal(order, lexsort(keys[::-1]))              # stable: ties keep table order
        assert all(np.array_equal(o, k[order]) for o, k in zip(out, keys))
        hits += len(keys[0]) not in sizes                                # sorted by runs, not row by row
    assert hits == 20
    # a piece that starts on a tie with the end of another piece of its trajectory: the tied rows go back to table
    # order, still without a full sort
    keys = (np.ones(8, np.int64), np.zeros(8, np.int64), np.array([5, 7, 8, 9, 1, 2, 3, 5]))
    sizes.clear()
    order = _lex_order(keys)[0]
    assert order.tolist() == lexsort(keys[::-1]).tolist() == [4, 5, 6, 0, 7, 1, 2, 3] and 8 not in sizes
    # pieces of one trajectory that overlap in time: the full sort
    keys = (np.ones(8, np.int64), np.zeros(8, np.int64), np.array([1, 5, 6, 9, 2, 3, 4, 8]))
    sizes.clear()
    order, out, _ = _lex_order(keys)
    assert np.array_equal(order, lexsort(keys[::-1])) and sizes[-1] == 8 and (np.diff(out[2]) > 0).all()
    assert _lex_order(out)[0] is None


def _table(traj, user, ts, lat, lon):
    return pa.table({"traj_id": pa.array(traj, pa.int64()), "user_id": pa.array(user, pa.int64()),
                     "ts": pa.array(ts * 1_000_000, pa.int64()).cast(pa.timestamp("us")),
                     "lat": pa.array(lat), "lon": pa.array(lon)})


@pytest.mark.parametrize("min_points", [1, 2, 6])
def test_cleaning_pieces_equals_cleaning_the_sorted_table(min_points):
    """Repeated timestamps (the smallest (lat, lon) kept) and trajectories too short after them (dropped before
    the gather now): the same trajectories, points and report as the rows sorted beforehand."""
    rng = np.random.default_rng(5)
    traj, user, ts = _pieces(rng)
    lat = rng.uniform(39.9, 40.0, len(traj)).round(3)
    lon = rng.uniform(116.3, 116.4, len(traj)).round(3)
    first = np.lexsort((lon, lat, ts, user, traj))
    sorted_table = _table(traj[first], user[first], ts[first], lat[first], lon[first])
    a, ra = from_points(_table(traj, user, ts, lat, lon), min_points=min_points)
    b, rb = from_points(sorted_table, min_points=min_points)
    for name in ("offsets", "traj_id", "user_id", "ts", "lat", "lon"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    assert ra.duplicate_timestamps == rb.duplicate_timestamps > 0 and ra.unsorted_trajectories > 0
    assert ra.short_trajectories == rb.short_trajectories and (ra.short_trajectories > 0) == (min_points == 6)
    assert ra.trajectories_in == rb.trajectories_in == len(np.unique(traj))
    assert ra.trajectories_out == a.n_trajectories == ra.trajectories_in - ra.short_trajectories
    pairs = np.unique(traj * 1000 + ts)                     # the points left: one per (trajectory, ts)
    per = np.unique(pairs // 1000, return_counts=True)[1]
    assert ra.points_out == a.n_points == per[per >= min_points].sum() and ra.short_trajectories == (
        per < min_points).sum()
    private, blank = from_points(_table(traj, user, ts, lat, lon), min_points=min_points, private=True)
    assert np.array_equal(private.lat, a.lat) and blank.unsorted_trajectories == 0


def test_a_dropped_first_point_never_joins_its_trajectory_to_the_one_before():
    """A timeless trajectory whose first point (by its own seq and (lat, lon)) has no seq loses that point; its
    other point stays its own trajectory (it was appended to the trajectory before it)."""
    big = np.iinfo(np.int64).max
    t = pa.table({"traj_id": pa.array([1, 1, 2, 2], pa.int64()), "user_id": pa.array([5, 5, 5, 5], pa.int64()),
                  "ts": pa.array([None] * 4, pa.timestamp("us")), "seq": pa.array([0, 1, big, None], pa.int64()),
                  "lat": [40.0, 40.1, 40.2, 39.0], "lon": [116.0] * 4})
    out, _ = from_points(t, time_required=False, min_points=1, private=True)
    assert out.offsets.tolist() == [0, 2, 3] and out.traj_id.tolist() == [1, 2]
    assert out.lat.tolist() == [40.0, 40.1, 40.2]
    out, _ = from_points(t, time_required=False, min_points=2, private=True)
    assert out.offsets.tolist() == [0, 2] and out.traj_id.tolist() == [1]


def test_routing_on_threads_writes_the_buckets_in_table_order(monkeypatch, tmp_path):
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT (i // 37)::BIGINT AS traj_id, (i % 5)::BIGINT AS user_id, "
                "TIMESTAMP '2008-01-01' + to_seconds(i) AS ts, 39.9 + (i % 91) * 1e-3 AS lat, "
                "116.3 + (i % 83) * 1e-3 AS lon FROM range(50000) r(i)")
    query = "SELECT traj_id, user_id, ts, lat, lon, NULL::BIGINT AS seq FROM t"
    monkeypatch.setattr(stream, "READ_ROWS", 2048)
    got = {}
    for threads in (1, 2, 4):
        monkeypatch.setattr(stream, "ROUTE_THREADS", threads)
        folder = tmp_path / str(threads)
        folder.mkdir()
        versions = []
        got[threads] = (list(stream.read_points(con, query, bucket_points=9000, folder=str(folder),
                                                on_version=versions.append)), versions)
    one, version = got[1]
    assert len(one) == stream.n_buckets(50000, 9000) and version == [stream.content_version(con, query)]
    for threads in (2, 4):
        assert got[threads][1] == version
        assert all(x.equals(y) for x, y in zip(got[threads][0], one))
    rows = pa.concat_tables(one).sort_by([("traj_id", "ascending"), ("ts", "ascending")])
    want = con.sql("SELECT traj_id, user_id, ts, lat, lon FROM t ORDER BY traj_id, ts").to_arrow_table()
    assert rows.num_rows == 50000 and rows.combine_chunks().equals(want.combine_chunks())
    for bucket in one:   # table order inside each bucket: the rows' ts increase
        ts = bucket.column("ts").to_numpy()
        assert (ts[1:] > ts[:-1]).all()


def test_the_hash_sum_is_exact():
    h = np.array([2**64 - 1, 2**63, 1, 0, 2**32 - 1, 2**32], dtype=np.uint64)
    h = np.concatenate([h] * 1000)
    assert stream._hash_sum(pa.array(h)) == (len(h), sum(int(x) for x in h))
    assert stream._hash_sum(pa.array(np.zeros(0, np.uint64))) == (0, 0)


def test_step_bin_is_the_clipped_searchsorted_at_and_beside_every_edge():
    from duckmob.synth.placement.releases import STEP_EDGES_M, step_bin

    rng = np.random.default_rng(2)
    edges = STEP_EDGES_M
    d = np.concatenate([rng.exponential(300, 100_000), rng.uniform(0, 5, 10_000), edges, np.nextafter(edges, 0),
                        np.nextafter(edges, np.inf), [0.0, 1e-300, 1e300, np.inf]])
    want = np.clip(np.searchsorted(edges, d, side="right") - 1, 0, len(edges) - 2)
    got = step_bin(d)
    assert got.dtype == np.int64 and np.array_equal(got, want)


def test_step_bins_leave_out_the_steps_between_trajectories_and_count_none_for_empty_ones():
    from duckmob.synth.placement.releases import local_xy, step_bin, step_bins
    from duckmob.grid import BBox

    rng = np.random.default_rng(8)
    lengths = np.array([3, 0, 1, 5, 0, 2, 4])
    m = int(lengths.sum())
    lat, lon = 40.0 + rng.uniform(0, 0.05, m), 116.3 + rng.uniform(0, 0.05, m)
    data = trajectories.Trajectories(np.concatenate([[0], np.cumsum(lengths)]), np.arange(7), np.zeros(7, np.int64),
                                     np.arange(m), lat, lon)
    box = [39.9, 116.2, 40.1, 116.5]
    b, owner, n_steps = step_bins(data, box)
    x, y = local_xy(BBox.of(box), lat, lon)
    want_owner, want_d = [], []
    for t, (a, n) in enumerate(zip(data.offsets[:-1], lengths)):
        for i in range(a, a + n - 1):
            want_owner.append(t)
            want_d.append(np.hypot(x[i + 1] - x[i], y[i + 1] - y[i]))
    assert owner.tolist() == want_owner and n_steps.tolist() == [2, 0, 0, 4, 0, 1, 3]
    assert np.array_equal(b, step_bin(np.array(want_d)))


def test_ragged_gather_is_the_ranges_concatenated():
    from duckmob.trajectories import ragged_gather

    rng = np.random.default_rng(6)
    starts, lengths = rng.integers(0, 1000, 300), rng.integers(0, 6, 300)
    want = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lengths)])
    got = ragged_gather(starts, lengths)
    assert got.dtype == np.int64 and np.array_equal(got, want)
    assert ragged_gather(starts[:3], np.zeros(3, np.int64)).tolist() == []
    assert ragged_gather(np.array([5, 2]), np.array([0, 2])).tolist() == [2, 3]


def test_a_thread_free_before_the_oldest_item_ends_starts_the_next(monkeypatch):
    """in_threads(ahead=1): item 0 waits until item 2 has started (it would wait for ever were item 2 queued
    only once item 0 ended); results come in the items' order, never more than REDUCE_THREADS at once."""
    import threading

    from duckmob.source import batches

    monkeypatch.setattr(batches, "REDUCE_THREADS", 2)
    third = threading.Event()
    running, most, lock = [0], [0], threading.Lock()

    def fn(i):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        if i == 2:
            third.set()
        seen = third.wait(timeout=30) if i == 0 else True
        with lock:
            running[0] -= 1
        return i, seen

    assert list(batches.in_threads(fn, range(6), ahead=1)) == [(i, True) for i in range(6)]
    assert most[0] == 2


@pytest.mark.parametrize("time_required", [True, False])
def test_the_private_mask_in_one_pass_drops_what_the_counted_checks_drop(time_required):
    """from_points(private=True) with a bbox finds the points to drop with one mask (nothing is counted); the
    same trajectories as the checks that count each reason (NULL traj_id or ts, NaN, out of range, outside)."""
    rng = np.random.default_rng(9)
    m = 5000
    traj = rng.integers(0, 300, m).astype(float)
    lat, lon = rng.uniform(39.8, 40.2, m), rng.uniform(116.1, 116.6, m)
    lat[rng.integers(0, m, 50)] = np.nan
    lat[rng.integers(0, m, 50)] = 95.0
    lon[rng.integers(0, m, 50)] = -200.0
    lon[rng.integers(0, m, 50)] = np.nan
    traj[rng.integers(0, m, 50)] = np.nan
    ts = rng.integers(0, 400, m).astype(float)
    ts[rng.integers(0, m, 50)] = np.nan
    t = pa.table({"traj_id": pa.array(traj, from_pandas=True).cast(pa.int64()),
                  "user_id": pa.array(rng.integers(-3, 4, m), pa.int64()),
                  "ts": pa.array(ts * 1e6, from_pandas=True).cast(pa.int64()).cast(pa.timestamp("us")),
                  "lat": lat, "lon": lon})
    box = [39.9, 116.2, 40.1, 116.5]
    fast, _ = from_points(t, bbox=box, time_required=time_required, private=True)
    slow, report = trajectories._clean(t, box, "drop", 2, time_required, private=True)
    for name in ("offsets", "traj_id", "user_id", "ts", "lat", "lon"):
        assert np.array_equal(getattr(fast, name), getattr(slow, name))
    assert report.outside_bbox > 0 and report.invalid_coordinates > 0 and report.null_traj_id > 0
    assert fast.n_points > 500 and (fast.user_id >= -1).all() and (fast.user_id == -1).any()
