"""Stay points (Li et al. 2008, as used by HRNet §5.1.2) and the cell sequences every synthesizer takes.

Definition used here (Li et al.'s greedy scan, made precise at the thresholds): scanning a trajectory from its
first point, an *anchor* point i starts a stay when every following point up to some j - 1 lies within
``radius_m`` metres of p_i (distance <= radius, the threshold counts as inside) and the time from p_i to
p_{j-1} is at least ``min_minutes`` (>= counts). j is the first later point farther than ``radius_m`` from p_i, or
the end of the trajectory (unlike the original pseudo-code, a stay that lasts until the last fix is kept).
The stay point is the mean position of p_i .. p_{j-1}, arriving at t_i and leaving at t_{j-1}; the scan goes
on from p_j. Otherwise the scan moves to p_{i+1}.

Vectorised without Python loops over points: (1) for every point at once, the end j(i) of its radius window is
found by stepping a shrinking set of still-inside points forward one offset at a time (a point leaves the set
as soon as one follower is out of range, so the work is the total size of the windows); (2) the greedy scan is
a walk next(i) = j(i) if i is a stay anchor else i + 1, and the set of points it visits from each trajectory's
first point is found by pointer doubling (log2(longest trajectory) rounds over all points).
Distances use the equirectangular approximation, which at a few hundred metres differs from the great-circle
distance by far less than GPS error.

Each trajectory's output depends on its own points only: every quantity is either an element-wise function of
a point (or of two points of the same trajectory), an integer computation confined to the trajectory, or a sum
over one stay's own points that is exact in integers (:func:`stay_means`), so no cumulative sum, shared state or
floating-point rounding crosses from one trajectory to another, and a trajectory's stays (positions, times,
indices relative to its first point) and cells are bit-identical wherever it lies in the arrays and whatever other
trajectories are there.
"""

from __future__ import annotations

import numpy as np

from duckmob.errors import DuckmobError
from duckmob.grid import EARTH_RADIUS_M, cell_of
from duckmob.trajectories import CellSequences, Trajectories, US_PER_S, ragged_gather


def _check(radius_m, min_minutes) -> tuple[float, int]:
    try:
        radius_m, min_minutes = float(radius_m), float(min_minutes)
    except (TypeError, ValueError):
        raise DuckmobError("radius_m and min_minutes must be numbers (metres, minutes)")
    if not (np.isfinite(radius_m) and radius_m > 0):
        raise DuckmobError(f"radius_m must be a positive number of metres, got {radius_m}")
    if not (np.isfinite(min_minutes) and min_minutes >= 0):
        raise DuckmobError(f"min_minutes must be a non-negative number of minutes, got {min_minutes}")
    return radius_m, int(round(min_minutes * 60 * US_PER_S))


def window_ends(traj: Trajectories, radius_m: float) -> np.ndarray:
    """For each point i, the index of the first later point of its trajectory farther than ``radius_m``
    from it (or the trajectory's end offset)."""
    m = traj.n_points
    owner_end = np.repeat(traj.offsets[1:], traj.lengths)
    y = np.radians(traj.lat) * EARTH_RADIUS_M
    # the east-west distance between two points uses the mean of their cos(lat)
    lon_r = np.radians(traj.lon)
    coslat = np.cos(np.radians(traj.lat))
    r2 = radius_m * radius_m
    end = owner_end.copy()
    active = np.arange(m, dtype=np.int64)
    k = 1
    while active.size:
        nxt = active + k
        inside_traj = nxt < owner_end[active]
        active, nxt = active[inside_traj], nxt[inside_traj]
        if not active.size:
            break
        dy = y[nxt] - y[active]
        dx = (lon_r[nxt] - lon_r[active]) * EARTH_RADIUS_M * 0.5 * (coslat[nxt] + coslat[active])
        out = dx * dx + dy * dy > r2
        end[active[out]] = nxt[out]
        active = active[~out]
        k += 1
    return end


def visited_by_scan(traj: Trajectories, nxt: np.ndarray) -> np.ndarray:
    """Boolean mask of points visited by the walk i -> nxt[i] started at each trajectory's first point.

    nxt[i] > i always, and a value >= the trajectory's end means the walk stops. Pointer doubling: after round
    r, ``reach`` holds every point reachable in fewer than 2**r steps, and ``jump`` the 2**r-step successor.
    """
    m = traj.n_points
    jump = np.minimum(nxt, m).astype(np.int64)
    jump_ext = np.append(jump, m)  # index m is the sink
    reach = np.zeros(m + 1, dtype=bool)
    reach[traj.offsets[:-1]] = True
    longest = int(traj.lengths.max()) if traj.n_trajectories else 0
    steps = 1
    while steps < longest:
        reach[jump_ext[np.flatnonzero(reach)]] = True
        jump_ext = jump_ext[jump_ext]
        steps *= 2
    reach[jump_ext[np.flatnonzero(reach)]] = True
    return reach[:m]


def detect(traj: Trajectories, radius_m: float = 200.0, min_minutes: float = 30.0) -> dict[str, np.ndarray]:
    """Stay points of every trajectory (Li et al. 2008; see the module docstring for the exact rule).

    Returns arrays, one entry per stay point, ordered by trajectory and time: ``traj`` (index 0..n-1 into
    ``traj``), ``first`` and ``last`` (point indices of the stay's first and last fix), ``lat``, ``lon`` (mean
    position, degrees), ``arrive_ts``, ``leave_ts`` (µs).
    """
    radius_m, min_us = _check(radius_m, min_minutes)
    end = window_ends(traj, radius_m)
    idx = np.arange(traj.n_points, dtype=np.int64)
    is_stay = (traj.ts[end - 1] - traj.ts) >= min_us
    is_stay &= end - 1 > idx  # a stay needs at least two fixes
    nxt = np.where(is_stay, end, idx + 1)
    owner_end = np.repeat(traj.offsets[1:], traj.lengths)
    nxt = np.where(nxt >= owner_end, traj.n_points, nxt)
    visited = visited_by_scan(traj, nxt)
    anchors = np.flatnonzero(visited & is_stay)
    last = end[anchors] - 1
    return {
        "traj": traj.point_traj()[anchors],
        "first": anchors,
        "last": last,
        "lat": stay_means(traj.lat, anchors, last),
        "lon": stay_means(traj.lon, anchors, last),
        "arrive_ts": traj.ts[anchors],
        "leave_ts": traj.ts[last],
    }


def stay_means(values: np.ndarray, first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Mean of ``values[first[i] .. last[i]]`` (both ends included) for each i, from those values only.

    Why not a difference of cumulative sums, or a float sum: either one rounds in a way that depends on the
    values before the segment or on how numpy blocks the reduction, so a stay's mean (and the cell it falls in)
    could change with the other trajectories. Here each value is taken relative to the segment's first value,
    d = v - v_first, and rounded to an integer multiple of 2**-s, s = 62 - e - ceil(log2(count)) with
    max |d| < 2**e, so |sum| <= 2**62 cannot overflow int64; the integer sum is exact in any order, and the mean
    is v_first + sum / count * 2**-s. Every step is a function of the segment's own values, so the result is
    bit-identical wherever the segment lies and whatever else ``values`` holds. The rounding error is at most
    2**-(s+1), i.e. max |d| * 2**-(62 - ceil(log2(count))): below float64 resolution for any realistic stay.
    Segments must be non-empty (first <= last); they may overlap and come in any order.
    """
    first = np.asarray(first, dtype=np.int64)
    last = np.asarray(last, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    if not len(first):
        return np.zeros(0, dtype=np.float64)
    counts = last - first + 1
    seg = np.repeat(np.arange(len(first), dtype=np.int64), counts)
    seg_start = np.concatenate([[0], np.cumsum(counts)[:-1]])   # integer bookkeeping of the gathered array
    base = values[first]
    d = values[ragged_gather(first, counts)] - base[seg]
    e = np.frexp(np.maximum.reduceat(np.abs(d), seg_start))[1]
    s = 62 - e - np.frexp((counts - 1).astype(np.float64))[1]   # frexp(count - 1)[1] = ceil(log2(count))
    q = np.rint(np.ldexp(d, s[seg])).astype(np.int64)
    total = np.add.reduceat(q, seg_start)
    return base + np.ldexp(total / counts, -s)


def stay_trajectories(traj: Trajectories, radius_m: float = 200.0, min_minutes: float = 30.0) -> Trajectories:
    """HRNet's preprocessing: each trajectory becomes [its first fix, its stay points, its last fix]."""
    stays = detect(traj, radius_m, min_minutes)
    n = traj.n_trajectories
    first, last = traj.offsets[:-1], traj.offsets[1:] - 1
    n_stay = np.bincount(stays["traj"], minlength=n)
    # order key: (trajectory, slot) with slot 0 = first fix, 1 = stays, 2 = last fix
    key_traj = np.concatenate([np.arange(n), stays["traj"], np.arange(n)])
    key_slot = np.concatenate([np.zeros(n), np.ones(len(stays["traj"])), np.full(n, 2)])
    order = np.lexsort((np.arange(len(key_traj)), key_slot, key_traj))
    lat = np.concatenate([traj.lat[first], stays["lat"], traj.lat[last]])[order]
    lon = np.concatenate([traj.lon[first], stays["lon"], traj.lon[last]])[order]
    ts = np.concatenate([traj.ts[first], stays["arrive_ts"], traj.ts[last]])[order]
    lengths = n_stay + 2
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return Trajectories(offsets, traj.traj_id, traj.user_id, ts, lat, lon)


def collapse_repeats(offsets: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Mask keeping the first of each run of equal consecutive values within each ragged row."""
    keep = np.ones(len(values), dtype=bool)
    keep[1:] = values[1:] != values[:-1]
    keep[offsets[:-1][offsets[:-1] < len(values)]] = True
    return keep


def cell_sequences(traj: Trajectories, bbox, w: int, stay_points: bool = True,
                   radius_m: float = 200.0, min_minutes: float = 30.0) -> CellSequences:
    """Cell sequences on a w x w grid over ``bbox`` (HRNet's form when ``stay_points``: first fix, stay
    points, last fix), consecutive duplicate cells collapsed; ``ts`` is when each cell was entered (µs).
    Points must lie inside ``bbox`` (clean with trajectories.from_points first)."""
    if stay_points:
        traj = stay_trajectories(traj, radius_m, min_minutes)
    cells = cell_of(traj.lat, traj.lon, bbox, w)
    if (cells < 0).any():
        raise DuckmobError("some points lie outside the bbox: load the trajectories with outside := 'drop' "
                           "or declare a larger bbox")
    keep = collapse_repeats(traj.offsets, cells)
    owner = traj.point_traj()[keep]
    counts = np.bincount(owner, minlength=traj.n_trajectories)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return CellSequences(offsets, traj.traj_id, traj.user_id, cells[keep], traj.ts[keep])
