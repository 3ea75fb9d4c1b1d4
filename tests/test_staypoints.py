from fractions import Fraction

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


# ------------------------------------------- each trajectory's output depends on its own points only

BBOX = [39.9, 116.2, 40.1, 116.4]


def _from_columns(parts):
    """Trajectories from a list of (lat, lon, ts) arrays."""
    n = len(parts)
    offsets = np.concatenate([[0], np.cumsum([len(p[0]) for p in parts])]).astype(np.int64)
    return Trajectories(offsets, np.arange(n), np.full(n, -1), np.concatenate([p[2] for p in parts]).astype(np.int64),
                        np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def _random_trajectory(rng, n):
    """A walk around Beijing (lat ~ 40, lon ~ 116.3): many small steps (stays) and a few jumps."""
    step = np.where(rng.random((n, 2)) < 0.9, rng.normal(0, 2e-4, (n, 2)), rng.normal(0, 1e-2, (n, 2)))
    lat = np.clip(40.0 + np.cumsum(step[:, 0]), 39.91, 40.09)
    lon = np.clip(116.3 + np.cumsum(step[:, 1]), 116.21, 116.39)
    ts = np.cumsum(rng.integers(30, 600, n)) * 1_000_000
    return lat, lon, ts


def _stays_of(stays, k, offset):
    """Trajectory k's stay points, point indices made relative to its first point."""
    m = stays["traj"] == k
    return {key: (v[m] - offset if key in ("first", "last") else v[m]) for key, v in stays.items() if key != "traj"}


def test_a_trajectorys_stays_and_cells_do_not_depend_on_the_other_trajectories():
    rng = np.random.default_rng(11)
    mine = _random_trajectory(rng, 700)
    alone = _from_columns([mine])
    stays_alone = staypoints.detect(alone)
    cells_alone = staypoints.cell_sequences(alone, BBOX, 64)
    assert len(stays_alone["first"]) >= 3            # the comparison covers several stays
    for n_before, n_after in ((0, 6), (9, 0), (5, 4), (1, 1)):
        others = [_random_trajectory(rng, int(rng.integers(1, 4000))) for _ in range(n_before + n_after)]
        table = _from_columns(others[:n_before] + [mine] + others[n_before:])
        lo, hi = table.offsets[n_before], table.offsets[n_before + 1]
        # the radius windows of its points
        assert np.array_equal(staypoints.window_ends(table, 200.0)[lo:hi] - lo,
                              staypoints.window_ends(alone, 200.0))
        # its stays, bit for bit (positions included)
        got = _stays_of(staypoints.detect(table), n_before, lo)
        want = _stays_of(stays_alone, 0, 0)
        assert got.keys() == want.keys()
        assert all(np.array_equal(got[key], want[key]) for key in want)
        # its cell sequence, with and without stay points
        for stay_points in (True, False):
            seqs = staypoints.cell_sequences(table, BBOX, 64, stay_points=stay_points)
            ref = cells_alone if stay_points else staypoints.cell_sequences(alone, BBOX, 64, stay_points=False)
            a, b = seqs.offsets[n_before], seqs.offsets[n_before + 1]
            assert np.array_equal(seqs.cells[a:b], ref.cells) and np.array_equal(seqs.ts[a:b], ref.ts)


def test_a_stay_on_a_cell_boundary_keeps_its_cell_whatever_comes_before():
    from duckmob.grid import cell_of

    w = 64
    # b: the smallest latitude in grid row 33 (the boundary between rows 32 and 33)
    b = 39.9 + 0.2 * 33 / w
    while cell_of([b], [116.3], BBOX, w)[0] // w >= 33:
        b = np.nextafter(b, 0.0)
    while cell_of([b], [116.3], BBOX, w)[0] // w < 33:
        b = np.nextafter(b, 90.0)
    # a stay of four fixes whose exact mean lies 5e-13 degrees north of b: row 33
    c = b + 5e-13
    stay = np.array([c - 1e-4, c + 1e-4, c - 2e-4, c + 2e-4])
    exact = sum(Fraction(float(x)) for x in stay) / 4
    assert 0 < exact - Fraction(b) < Fraction(1, 10 ** 12)
    lat = np.concatenate([[b - 3000 / M_PER_DEG_LAT], stay, [b + 3000 / M_PER_DEG_LAT]])
    mine = (lat, np.full(6, 116.3), np.array([0, 10, 20, 30, 50, 60]) * 60_000_000)

    rng = np.random.default_rng(1)
    before = [_random_trajectory(rng, int(rng.integers(50, 3000))) for _ in range(8)]
    after = [_random_trajectory(rng, int(rng.integers(50, 3000))) for _ in range(3)]
    table = _from_columns(before + [mine] + after)
    lo = table.offsets[8]
    alone = _from_columns([mine])

    s_alone, s_table = staypoints.detect(alone), staypoints.detect(table)
    assert s_alone["first"].tolist() == [1] and s_alone["last"].tolist() == [4]
    assert s_alone["lat"][0] == float(exact)              # the correctly rounded mean
    in_table = s_table["traj"] == 8
    assert np.array_equal(s_table["lat"][in_table], s_alone["lat"])
    # the former mean, a difference of cumulative sums over the whole table, fell on the other side here
    csum = np.concatenate([[0.0], np.cumsum(table.lat)])
    former = (csum[lo + 5] - csum[lo + 1]) / 4
    assert cell_of([former], [116.3], BBOX, w)[0] // w == 32

    cells_alone = staypoints.cell_sequences(alone, BBOX, w).cells
    seqs = staypoints.cell_sequences(table, BBOX, w)
    assert (cells_alone // w).tolist()[1] == 33
    assert np.array_equal(seqs.cells[seqs.offsets[8]:seqs.offsets[9]], cells_alone)


def test_stay_means_are_exact_to_float_precision_and_local():
    rng = np.random.default_rng(5)
    values = np.concatenate([40.0 + rng.normal(0, 1e-3, 5000), 116.3 + rng.normal(0, 1e-3, 5000),
                             rng.normal(0, 1e-300, 100), np.zeros(50), rng.uniform(-180, 180, 200_000)])
    first = np.array([0, 17, 5000, 9000, 10_000, 10_100, 10_150, 10_150, 3])
    last = np.array([16, 4999, 5001, 9999, 10_099, 10_149, 210_149, 10_150, 3])
    got = staypoints.stay_means(values, first, last)
    for i, (g, a, b) in enumerate(zip(got, first, last)):
        seg = values[a:b + 1]
        error = abs(Fraction(float(g)) - sum(map(Fraction, seg.tolist())) / len(seg))
        # differences to the first value round at most half an ulp of the largest value; nothing else counts
        assert error <= 2 * Fraction(float(np.spacing(np.abs(seg).max())))
        if i in (0, 1, 3):   # positions around Beijing: within one ulp of the exact mean
            assert error <= Fraction(float(np.spacing(abs(g))))
    # the same segments moved elsewhere, among other values, give the same bits
    shifted = np.concatenate([rng.uniform(-1e6, 1e6, 333), values, rng.uniform(0, 1, 7)])
    assert np.array_equal(staypoints.stay_means(shifted, first + 333, last + 333), got)
    # a non-contiguous view of the same values, segments in reverse order
    assert np.array_equal(staypoints.stay_means(values[::-1].copy()[::-1], first[::-1], last[::-1]), got[::-1])
