import numpy as np
import pytest

from duckmob import staypoints
from duckmob.errors import DuckmobError
from duckmob.grid import EARTH_RADIUS_M
from duckmob.trajectories import Trajectories

LAT0, LON0 = 40.0, 116.3
M_PER_DEG_LAT = np.radians(1) * EARTH_RADIUS_M


def trace(north_m, minutes, traj_id=1):
    """One trajectory moving north by ``north_m`` metres at the given minutes."""
    lat = LAT0 + np.asarray(north_m, dtype=float) / M_PER_DEG_LAT
    ts = (np.asarray(minutes, dtype=float) * 60e6).astype(np.int64)
    return Trajectories(np.array([0, len(lat)]), np.array([traj_id]), np.array([-1]), ts, lat,
                        np.full(len(lat), LON0))


def concat(*trajs):
    offsets = np.concatenate([[0], np.cumsum([t.n_points for t in trajs])])
    cat = lambda k: np.concatenate([getattr(t, k) for t in trajs])
    return Trajectories(offsets, cat("traj_id"), cat("user_id"), cat("ts"), cat("lat"), cat("lon"))


def test_never_stays():
    t = trace(np.arange(10) * 300.0, np.arange(10) * 10.0)  # 300 m every 10 minutes
    assert len(staypoints.detect(t)["first"]) == 0


def test_single_stay():
    # move, then 4 fixes within 50 m over 40 minutes, then leave
    north = [0, 1000, 2000, 2010, 2030, 2050, 3000]
    minutes = [0, 5, 10, 20, 35, 50, 55]
    s = staypoints.detect(trace(north, minutes))
    assert s["first"].tolist() == [2] and s["last"].tolist() == [5]
    assert s["arrive_ts"][0] == 10 * 60_000_000 and s["leave_ts"][0] == 50 * 60_000_000
    assert s["lat"][0] == pytest.approx(LAT0 + 2022.5 / M_PER_DEG_LAT)


def test_exactly_at_the_thresholds():
    # 199.9 m after exactly 30 minutes: inside and long enough (both thresholds inclusive)
    s = staypoints.detect(trace([0, 199.9, 1000], [0, 30, 40]), radius_m=200, min_minutes=30)
    assert s["first"].tolist() == [0] and s["last"].tolist() == [1]
    # one second short of 30 minutes: no stay
    s = staypoints.detect(trace([0, 199.9, 1000], [0, 30 - 1 / 60, 40]), radius_m=200, min_minutes=30)
    assert len(s["first"]) == 0
    # 200.1 m away: outside, no stay
    s = staypoints.detect(trace([0, 200.1, 1000], [0, 30, 40]), radius_m=200, min_minutes=30)
    assert len(s["first"]) == 0


def test_stay_until_the_end_is_kept():
    s = staypoints.detect(trace([0, 1000, 1010, 1020], [0, 5, 30, 60]))
    assert s["first"].tolist() == [1] and s["last"].tolist() == [3]


def test_scan_skips_points_inside_a_stay_and_separates_trajectories():
    a = trace([0, 10, 20, 30, 40, 1000], [0, 10, 20, 30, 40, 50], traj_id=1)
    b = trace([0, 10, 5000], [0, 31, 40], traj_id=2)
    s = staypoints.detect(concat(a, b))
    # in a, the stay anchored at 0 covers points 0..4; anchors 1..4 would also be stays but are skipped
    assert s["first"].tolist() == [0, 6] and s["last"].tolist() == [4, 7]
    assert s["traj"].tolist() == [0, 1]


def test_matches_a_plain_loop_on_random_walks():
    rng = np.random.default_rng(3)
    trajs = []
    for k in range(30):
        n = rng.integers(2, 60)
        step = rng.choice([5.0, 300.0], size=n, p=[0.7, 0.3])
        trajs.append(trace(np.cumsum(step) - step[0], np.cumsum(rng.uniform(1, 12, n)), traj_id=k))
    t = concat(*trajs)
    got = staypoints.detect(t)
    expect = []
    for k in range(t.n_trajectories):
        a, b = t.offsets[k], t.offsets[k + 1]
        i = a
        while i < b:
            j = i + 1
            while j < b and abs(t.lat[j] - t.lat[i]) * M_PER_DEG_LAT <= 200:
                j += 1
            if j - 1 > i and t.ts[j - 1] - t.ts[i] >= 30 * 60e6:
                expect.append((i, j - 1))
                i = j
            else:
                i += 1
    assert list(zip(got["first"].tolist(), got["last"].tolist())) == expect
    assert len(expect) > 5


def test_cell_sequences_hrnet_form():
    # first fix, one stay, last fix; first fix and stay in the same cell collapse into one
    t = trace([0, 10, 20, 30, 10000], [0, 10, 20, 40, 50])
    seqs = staypoints.cell_sequences(t, [39.9, 116.2, 40.1, 116.4], 4)
    assert seqs.offsets.tolist() == [0, 2]
    assert seqs.ts.tolist() == [0, 50 * 60_000_000]


def test_bad_thresholds():
    with pytest.raises(DuckmobError, match="radius_m"):
        staypoints.detect(trace([0, 1], [0, 1]), radius_m=-1)
    with pytest.raises(DuckmobError, match="min_minutes"):
        staypoints.detect(trace([0, 1], [0, 1]), min_minutes="soon")
