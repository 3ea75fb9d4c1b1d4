"""Helpers of tests/privacy/test_neighbours.py: random small point and cell-sequence tables, their neighbours, and
a recorder that replaces the noise of :class:`duckmob.privacy.noise.NoiseSource`.

The recorder. Every private noise of duckmob is drawn by ``NoiseSource.laplace(scale, size)`` and added by its
caller to an exact array: ``counting.release_sums`` (``min(sums, MAX_UNITS) * g``), ``counting.noisy_count``
(``clamped``), ``counting.noisy_transition_counts_batches`` (``block[mask]``) and ``NoiseSource.add_laplace``
(``units * g``). The recorder reads that exact array from the caller's frame (a call from any other place fails
the test: a new place where noise meets data must be taught here) and records ``(site, scale, exact)``.

Coupling. On D it adds the source's own seeded noise and records the released values ``exact + noise``. On D' it
*replays*: it returns ``released_D - exact_D'``, so every release on D' equals the one on D and every later step
(post-processing of earlier releases: grids, supports, sizes) takes the same public path. This is the coupling of
the adaptive-composition proof: with the outputs so far equal, call i is ``(||exact_D - exact_D'||_1 / scale_i)``-
DP, and that must be at most the epsilon the ledger charged for it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa

from duckmob.privacy import accounting
from duckmob.privacy.counting import MAX_UNITS
from duckmob.privacy.noise import NoiseSource, granularity

BBOX = [39.90, 116.30, 40.00, 116.42]
T0 = datetime(2024, 3, 1, 8, 0, 0)
POINTS = pa.schema([("user_id", pa.int64()), ("traj_id", pa.int64()), ("ts", pa.timestamp("us")),
                    ("seq", pa.int64()), ("lat", pa.float64()), ("lon", pa.float64())])
CELLS = pa.schema([("user_id", pa.int64()), ("traj_id", pa.int64()), ("cells", pa.list_(pa.int64()))])


# -- the recorder -----------------------------------------------------------------------------------------------

def _exact(frame) -> tuple[str, np.ndarray]:
    """The exact array the caller of ``laplace`` is about to add the noise to (see the module docstring)."""
    name, loc = frame.f_code.co_name, frame.f_locals
    if name == "release_sums":
        return name, np.minimum(np.asarray(loc["sums"], dtype=np.int64), MAX_UNITS).astype(np.float64) * loc["g"]
    if name == "noisy_count":
        return name, np.array([float(loc["clamped"])])
    if name == "noisy_transition_counts_batches":
        return name, np.array(loc["block"][loc["mask"]], dtype=np.float64)
    if name == "add_laplace":
        return name, np.array(loc["units"] * loc["g"], dtype=np.float64).reshape(-1)
    raise AssertionError(f"noise drawn from {frame.f_code.co_filename}:{frame.f_lineno} ({name}), a place the "
                         "recorder does not know: teach tests/privacy/neighbours.py where its exact array is")


@dataclass
class Call:
    site: str
    scale: float
    exact: np.ndarray
    released: np.ndarray | None = None
    note: str = ""


@dataclass
class Recorder:
    """Replaces ``NoiseSource.laplace`` (install with a pytest monkeypatch); ``calls`` of the current run."""
    calls: list[Call] = field(default_factory=list)
    replay: list[Call] | None = None

    def install(self, monkeypatch) -> None:
        original = NoiseSource.laplace
        recorder = self

        def laplace(source, scale, size):
            site, exact = _exact(sys._getframe(1))
            noise_shape = (size,) if isinstance(size, (int, np.integer)) else tuple(size)
            i = len(recorder.calls)
            call = Call(site, float(scale), exact.copy())
            recorder.calls.append(call)
            if recorder.replay is None:
                noise = original(source, scale, size)
                call.released = exact + noise.reshape(-1)
                return noise
            if i < len(recorder.replay) and recorder.replay[i].exact.shape == exact.shape:
                return (recorder.replay[i].released - exact).reshape(noise_shape)
            call.note = "no call of this shape on D to replay"
            return original(source, scale, size)

        monkeypatch.setattr(NoiseSource, "laplace", laplace)

    def start(self, replay: list[Call] | None = None) -> None:
        self.calls, self.replay = [], replay


def laplace_leaves(event_json: str) -> list[float]:
    """The eps of every Laplace leaf of a ledger event (JSON)."""
    return [leaf.param("eps") for leaf in accounting.Event.from_json(event_json).leaves() if leaf.kind == "laplace"]


def violations(calls_d: list[Call], calls_dp: list[Call], leaves: list[float]) -> list[str]:
    """What breaks "every released array moves by at most the sensitivity the ledger charged" (empty: nothing).

    Calls are matched to the ledger's Laplace leaves as a multiset: call i needs a leaf of eps at least
    ``r_i = ||exact_D - exact_D'||_1 / scale_i``, each leaf serving one call; such a matching exists iff the t-th
    largest ``r`` is at most the t-th largest leaf for every t (and there are as many calls as leaves). Tolerated:
    the documented grid rounding of ``add_laplace``, up to one grid step ``g`` per coordinate that differs."""
    problems = []
    if len(calls_d) != len(calls_dp):
        problems.append(f"{len(calls_d)} noise calls on D, {len(calls_dp)} on D'")
    if len(calls_d) != len(leaves):
        problems.append(f"{len(calls_d)} noise calls on D but {len(leaves)} Laplace leaves in the ledger event")
    needs = []
    for i, (a, b) in enumerate(zip(calls_d, calls_dp)):
        if (a.site, a.scale, a.exact.shape) != (b.site, b.scale, b.exact.shape):
            problems.append(f"call {i}: {a.site} scale {a.scale:g} shape {a.exact.shape} on D, {b.site} scale "
                            f"{b.scale:g} shape {b.exact.shape} on D' {b.note}")
            continue
        diff = np.abs(a.exact - b.exact)
        l1 = float(diff.sum()) - int((diff > 0).sum()) * granularity(a.scale)
        needs.append((max(l1, 0.0) / a.scale, i, float(diff.sum()), a))
    if problems:
        return problems
    needs.sort(key=lambda t: -t[0])
    for (need, i, l1, call), leaf in zip(needs, sorted(leaves, reverse=True)):
        if need > leaf * (1 + 1e-9):
            problems.append(f"call {i} ({call.site}, {call.exact.size} entries, scale {call.scale:.6g}): L1 move "
                            f"{l1:.6g} > charged sensitivity {call.scale * leaf:.6g} (scale x leaf eps {leaf:.6g}; "
                            f"needs eps {need:.6g})")
    return problems


def moves(calls_d: list[Call], calls_dp: list[Call]) -> list[tuple[str, float, float]]:
    """(site, scale, L1 move) of every call, for messages."""
    return [(a.site, a.scale, float(np.abs(a.exact - b.exact).sum())) for a, b in zip(calls_d, calls_dp)
            if a.exact.shape == b.exact.shape]


# -- random tables -------------------------------------------------------------------------------------------------

def _walk(rng, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A random walk of n fixes inside BBOX, steps of about 400 m (so consecutive fixes change cells)."""
    lat = np.clip(rng.uniform(39.92, 39.98) + np.cumsum(rng.normal(0, 0.004, n)), BBOX[0] + 1e-4, BBOX[2] - 1e-4)
    lon = np.clip(rng.uniform(116.32, 116.40) + np.cumsum(rng.normal(0, 0.005, n)), BBOX[1] + 1e-4, BBOX[3] - 1e-4)
    return lat, lon


def trajectory(rng, user: int, traj: int, timed: bool, n: int | None = None) -> list[tuple]:
    """One trajectory's rows (user_id, traj_id, ts, seq, lat, lon): timestamped (ts a minute apart, seq NULL) or
    timeless (ts NULL, ordered by seq, with gaps in seq)."""
    n = int(rng.integers(4, 12)) if n is None else n
    lat, lon = _walk(rng, n)
    start = T0 + timedelta(minutes=int(rng.integers(0, 600)))
    seqs = np.cumsum(rng.integers(1, 4, n))
    return [(user, traj, start + timedelta(minutes=i) if timed else None, None if timed else int(seqs[i]),
             float(lat[i]), float(lon[i])) for i in range(n)]


@dataclass
class Points:
    """A table of points D: its rows (physical order scrambled) and the next free ids."""
    rows: list[tuple]
    next_user: int
    next_traj: int

    def plus(self, extra: list[tuple], rng) -> "Points":
        """D + ``extra`` rows, the whole table scrambled again (D' is another physical order of more rows)."""
        rows = self.rows + extra
        order = rng.permutation(len(rows))
        return Points([rows[i] for i in order], self.next_user, self.next_traj)

    def arrow(self) -> pa.Table:
        return pa.table({name: [r[j] for r in self.rows] for j, name in enumerate(POINTS.names)}, schema=POINTS)


def points(rng, n_traj: int, *, timed_share: float, users: int, per_user: int | None = None) -> Points:
    """Random small table: ``n_traj`` trajectories of ``users`` users (at most ``per_user`` each when given),
    traj_ids shared across users, a ``timed_share`` of them timestamped and the rest timeless, some duplicate
    rows, NULL coordinates, a timeless point with NULL seq, all rows in scrambled physical order."""
    if per_user is not None and users * per_user < n_traj:
        raise ValueError("users * per_user must be at least n_traj")
    rows = []
    taken: dict[int, int] = {}
    keys: set[tuple[int, int]] = set()
    for t in range(n_traj):
        user = int(rng.integers(0, users))
        if per_user is not None:
            while taken.get(user, 0) >= per_user:
                user = (user + 1) % users
        taken[user] = taken.get(user, 0) + 1
        traj = t % max(2, n_traj // 3)    # traj_ids shared across users; each (user, traj) key is one trajectory
        while (user, traj) in keys:
            traj += 1
        keys.add((user, traj))
        rows += trajectory(rng, user, traj, bool(rng.random() < timed_share))
    dup = rng.choice(len(rows), size=max(1, len(rows) // 10), replace=False)
    rows += [rows[i] for i in dup]        # duplicate rows
    for i in rng.choice(len(rows), size=2, replace=False):
        u, t, ts, seq, lat, lon = rows[i]
        rows[i] = (u, t, ts, seq, None, lon)   # a NULL coordinate drops that point
    timeless = [i for i, r in enumerate(rows) if r[2] is None]
    if timeless:
        u, t, ts, seq, lat, lon = rows[timeless[0]]
        rows.append((u, t, None, None, lat + 0.001, lon))   # a timeless point without seq
    order = rng.permutation(len(rows))
    return Points([rows[i] for i in order], users, max(t for _, t in keys) + 1)


def neighbour_trajectory(rng, d: Points, timed: bool, n: int | None = None) -> list[tuple]:
    """One more trajectory: an existing user's, under a traj_id another user already has (a new (user, traj) key),
    spread over ``n`` rows."""
    used = {(r[0], r[1]) for r in d.rows}
    for traj in range(d.next_traj):
        for user in range(d.next_user):
            if (user, traj) not in used and any(r[1] == traj for r in d.rows):
                return trajectory(rng, user, traj, timed, n)
    return trajectory(rng, 0, d.next_traj + 7, timed, n)


def neighbour_user(rng, d: Points, k: int, timed: bool | None = None) -> list[tuple]:
    """One more user with k trajectories (ids above every existing one: the contribution bounding's random draws
    of the other users are the same on D and D', whose trajectories sort first)."""
    rows = []
    for j in range(k):
        rows += trajectory(rng, d.next_user + 5, d.next_traj + 100 + j,
                           bool(rng.random() < 0.5) if timed is None else timed)
    return rows


def cell_rows(rng, n_keys: int, n_states: int, users: int) -> list[tuple]:
    """A cell-sequence table (user_id, traj_id, cells): each (user, traj) key stored as 1-3 rows, traj_ids shared
    across users, cells walking on a w x w grid (w * w = n_states) so they suit a neighbour support."""
    w = int(round(n_states ** 0.5))
    rows = []
    for t in range(n_keys):
        user, traj = int(rng.integers(0, users)), t % max(2, n_keys // 3)
        for _ in range(int(rng.integers(1, 4))):
            rows.append((user, traj, walk_cells(rng, w, int(rng.integers(2, 7)))))
    return [rows[i] for i in rng.permutation(len(rows))]


def walk_cells(rng, w: int, n: int) -> list[int]:
    r, c = int(rng.integers(0, w)), int(rng.integers(0, w))
    out = []
    for _ in range(n):
        out.append(r * w + c)
        r = int(np.clip(r + rng.integers(-1, 2), 0, w - 1))
        c = int(np.clip(c + rng.integers(-1, 2), 0, w - 1))
    return out


def cells_arrow(rows: list[tuple]) -> pa.Table:
    return pa.table({name: [r[j] for r in rows] for j, name in enumerate(CELLS.names)}, schema=CELLS)
