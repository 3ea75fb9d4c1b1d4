"""Trajectories as ragged arrays: a table of points <-> offsets + columns; validation and cleaning.

The one shape every other module takes. A :class:`Trajectories` holds ``n`` trajectories and ``m`` points:
``offsets`` (int64, length n + 1, offsets[0] = 0, offsets[-1] = m) cuts the point columns ``ts``, ``lat`` and
``lon`` into trajectories; ``traj_id`` and ``user_id`` have one entry per trajectory. Points of a trajectory are
sorted by time with no duplicate timestamps. Everything here is vectorised over points (numpy sorts and
reductions); nothing loops in Python over points or trajectories.

Timestamps are int64 microseconds since the epoch (DuckDB's TIMESTAMP, no zone); latitude and longitude are
WGS 84 degrees.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from duckmob.errors import DuckmobError

US_PER_S = 1_000_000
NO_TIME = np.iinfo(np.int64).min  # ts of a point whose table carries no time (e.g. a PrivTrace synthetic table)


@dataclass(frozen=True)
class Trajectories:
    """Ragged trajectories: ``offsets`` (n + 1) over point columns ``ts`` (µs), ``lat``, ``lon`` (degrees)."""

    offsets: np.ndarray
    traj_id: np.ndarray
    user_id: np.ndarray
    ts: np.ndarray
    lat: np.ndarray
    lon: np.ndarray

    @property
    def n_trajectories(self) -> int:
        return len(self.offsets) - 1

    @property
    def has_time(self) -> bool:
        """False when the source had no timestamps (all ts NULL); ``ts`` then holds NO_TIME."""
        return not (len(self.ts) and self.ts[0] == NO_TIME)

    @property
    def n_points(self) -> int:
        return int(self.offsets[-1])

    @property
    def lengths(self) -> np.ndarray:
        """Number of points of each trajectory."""
        return np.diff(self.offsets)

    def point_traj(self) -> np.ndarray:
        """Index (0..n-1) of the trajectory each point belongs to."""
        return np.repeat(np.arange(self.n_trajectories, dtype=np.int64), self.lengths)

    def take_points(self, keep: np.ndarray) -> "Trajectories":
        """Keep the points where ``keep`` is true; trajectories left with no point disappear."""
        owner = self.point_traj()[keep]
        counts = np.bincount(owner, minlength=self.n_trajectories)
        alive = counts > 0
        offsets = np.concatenate([[0], np.cumsum(counts[alive])]).astype(np.int64)
        return Trajectories(offsets, self.traj_id[alive], self.user_id[alive],
                            self.ts[keep], self.lat[keep], self.lon[keep])

    def take(self, rows: np.ndarray) -> "Trajectories":
        """Keep trajectories by index (or boolean mask), in the order given."""
        rows = np.arange(self.n_trajectories)[rows]
        lengths = self.lengths[rows]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        idx = ragged_gather(self.offsets[rows], lengths)
        return Trajectories(offsets, self.traj_id[rows], self.user_id[rows],
                            self.ts[idx], self.lat[idx], self.lon[idx])


@dataclass(frozen=True)
class CellSequences:
    """Ragged cell sequences (the output of ``mob_cell_sequences``): ``offsets`` (n + 1) over ``cells``
    (int64 cell ids on a ``w`` x ``w`` grid) and ``ts`` (µs, the time each cell was entered)."""

    offsets: np.ndarray
    traj_id: np.ndarray
    user_id: np.ndarray
    cells: np.ndarray
    ts: np.ndarray

    @property
    def n_trajectories(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


@dataclass
class CleaningReport:
    """What validation changed, in counts, so callers can tell the user (nothing is dropped silently)."""

    points_in: int = 0
    trajectories_in: int = 0
    duplicate_timestamps: int = 0
    unsorted_trajectories: int = 0
    outside_bbox: int = 0
    short_trajectories: int = 0
    notes: list[str] = field(default_factory=list)

    def messages(self) -> list[str]:
        out = []
        if self.unsorted_trajectories:
            out.append(f"sorted the points of {self.unsorted_trajectories} trajectories by time")
        if self.duplicate_timestamps:
            out.append(f"dropped {self.duplicate_timestamps} points with a duplicate timestamp (kept the first)")
        if self.outside_bbox:
            out.append(f"dropped {self.outside_bbox} points outside the bounding box")
        if self.short_trajectories:
            out.append(f"dropped {self.short_trajectories} trajectories with fewer than 2 points")
        return out + self.notes


def ragged_gather(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Indices ``starts[i] + 0 .. starts[i] + lengths[i] - 1`` for every i, concatenated (no Python loop)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    run_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    base = np.repeat(np.asarray(starts, dtype=np.int64) - run_starts, lengths)
    return base + np.arange(total, dtype=np.int64)


def offsets_from_sorted_keys(keys: np.ndarray) -> np.ndarray:
    """Offsets of runs of equal values in a sorted key array."""
    if len(keys) == 0:
        return np.zeros(1, dtype=np.int64)
    change = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    return np.concatenate([[0], change, [len(keys)]]).astype(np.int64)


def _column(points, name: str) -> np.ndarray:
    col = points.field(name) if isinstance(points, pa.StructArray) else points.column(name)
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    return col


def _to_numpy(col: pa.Array, dtype) -> np.ndarray:
    if pa.types.is_timestamp(col.type):
        col = col.cast(pa.timestamp("us")).cast(pa.int64())
    return col.to_numpy(zero_copy_only=False).astype(dtype, copy=False)


def from_points(points: pa.StructArray | pa.Table, bbox=None, outside: str = "fail",
                min_points: int = 2, time_required: bool = True) -> tuple[Trajectories, CleaningReport]:
    """Build validated, cleaned :class:`Trajectories` from Arrow points.

    ``points`` has fields ``traj_id`` (integer), ``ts`` (timestamp), ``lat``, ``lon`` (double) and optionally
    ``user_id``. Checks, each failing with a :class:`DuckmobError` that says what to do: NULL or NaN
    coordinates, latitude outside [-90, 90], longitude outside [-180, 180], NULL ids or timestamps.
    Cleaning, each counted in the returned report: points are sorted by (traj_id, ts); points with a
    timestamp already seen in their trajectory are dropped (the first is kept); points outside ``bbox``
    (``[min_lat, min_lon, max_lat, max_lon]``, edges included) are dropped when ``outside='drop'`` or
    refused when ``outside='fail'``; trajectories left with fewer than ``min_points`` points are dropped.
    The input is never modified.

    With ``time_required=False`` a table whose ``ts`` is entirely NULL is accepted (synthetic output of a
    method that models no time): points are ordered by ``seq`` (or kept in table order) and ``ts`` holds
    :data:`NO_TIME`.
    """
    if outside not in ("fail", "drop"):
        raise DuckmobError(f"outside := '{outside}' is not an option: use 'drop' (drop points outside the bbox "
                           "and report how many) or 'fail'")
    n = len(points) if isinstance(points, pa.StructArray) else points.num_rows
    report = CleaningReport(points_in=n)
    if n == 0:
        raise DuckmobError("the trajectory table is empty: give a table with at least one trajectory of 2 points")
    names = points.type.names if isinstance(points, pa.StructArray) else points.column_names
    cols = {k: _column(points, k) for k in ("traj_id", "ts", "lat", "lon")}
    timeless = (not time_required) and cols["ts"].null_count == n
    for k in ("traj_id",) if timeless else ("traj_id", "ts"):
        nulls = cols[k].null_count
        if nulls:
            raise DuckmobError(f"{nulls} points have a NULL {k}: filter them out first "
                               f"(WHERE {k} IS NOT NULL) or fill them in")
    for k in ("lat", "lon"):
        nulls = cols[k].null_count + int(pc.sum(pc.is_nan(cols[k].fill_null(0.0))).as_py() or 0)
        if nulls:
            raise DuckmobError(f"{nulls} points have a NULL or NaN {k}: filter them out first "
                               f"(WHERE {k} IS NOT NULL AND NOT isnan({k}))")
    traj = _to_numpy(cols["traj_id"], np.int64)
    if timeless:
        # order by seq where the table has one (NULLs last, in table order); else keep the table's order
        if "seq" in names and _column(points, "seq").null_count < n:
            seq = _to_numpy(_column(points, "seq").fill_null(np.iinfo(np.int64).max), np.int64)
            ts = np.argsort(np.lexsort((np.arange(n), seq)), kind="stable").astype(np.int64)
        else:
            ts = np.arange(n, dtype=np.int64)
    else:
        ts = _to_numpy(cols["ts"], np.int64)
    lat = _to_numpy(cols["lat"], np.float64)
    lon = _to_numpy(cols["lon"], np.float64)
    if "user_id" in names and _column(points, "user_id").null_count < n:
        user = _column(points, "user_id").fill_null(-1)
        user = _to_numpy(user, np.int64)
    else:
        user = np.full(n, -1, dtype=np.int64)
    bad = np.abs(lat) > 90
    if bad.any():
        hint = " (are lat and lon swapped?)" if (np.abs(lon) <= 90).all() else ""
        raise DuckmobError(f"{int(bad.sum())} points have a latitude outside [-90, 90], e.g. {lat[bad][0]!r} in "
                           f"traj_id {traj[bad][0]}{hint}: lat and lon must be WGS 84 degrees")
    bad = np.abs(lon) > 180
    if bad.any():
        raise DuckmobError(f"{int(bad.sum())} points have a longitude outside [-180, 180], e.g. {lon[bad][0]!r} "
                           f"in traj_id {traj[bad][0]}: lat and lon must be WGS 84 degrees")

    # Sort by (traj_id, ts) only when needed: a stable check first keeps sorted input at O(m). Sorting and the
    # cleaning masks are combined into one index, so each column is gathered once (not permuted, then masked).
    in_order = (traj[1:] > traj[:-1]) | ((traj[1:] == traj[:-1]) & (ts[1:] >= ts[:-1]))
    order = None
    if not in_order.all():
        by_traj = np.argsort(traj, kind="stable")
        gt = traj[by_traj]
        backwards = (gt[1:] == gt[:-1]) & (ts[by_traj[1:]] < ts[by_traj[:-1]])
        report.unsorted_trajectories = len(np.unique(gt[1:][backwards]))
        del by_traj, gt, backwards
        order = np.lexsort((ts, traj))
    traj_s = traj if order is None else traj[order]
    ts_s = ts if order is None else ts[order]
    keep = np.ones(len(traj_s), dtype=bool)
    keep[1:] = (traj_s[1:] != traj_s[:-1]) | (ts_s[1:] != ts_s[:-1])
    report.duplicate_timestamps = int((~keep).sum())

    if bbox is not None:
        from duckmob.grid import BBox
        box = BBox.of(bbox)
        inside = box.contains(lat, lon)
        if order is not None:
            inside = inside[order]
        n_out = int((keep & ~inside).sum())
        if n_out and outside == "fail":
            raise DuckmobError(f"{n_out} points lie outside the bounding box {box.as_list()}: pass "
                               "outside := 'drop' to drop them (they are reported), or declare a larger bbox")
        report.outside_bbox = n_out
        keep &= inside
    if not keep.all():
        traj_s, ts_s = traj_s[keep], ts_s[keep]
        order = np.flatnonzero(keep) if order is None else order[keep]
    if order is not None:
        lat, lon, user = lat[order], lon[order], user[order]
    traj, ts = traj_s, ts_s
    del traj_s, ts_s, order, keep

    offsets = offsets_from_sorted_keys(traj)
    report.trajectories_in = len(np.unique(_to_numpy(cols["traj_id"], np.int64)))
    starts = offsets[:-1]
    if timeless:
        ts = np.full(len(ts), NO_TIME, dtype=np.int64)
    out = Trajectories(offsets, traj[starts], user[starts], ts, lat, lon)
    short = out.lengths < min_points
    if short.any():
        report.short_trajectories = int(short.sum())
        out = out.take(~short)
    if out.n_trajectories == 0:
        raise DuckmobError("no trajectory is left after cleaning (" + "; ".join(report.messages()) +
                           "): check the bbox and that each trajectory has at least 2 points")
    return out, report


def to_arrow(traj: Trajectories) -> pa.Table:
    """The points of ``traj`` as an Arrow table (traj_id, user_id, seq, ts, lat, lon)."""
    seq = np.arange(traj.n_points, dtype=np.int64) - np.repeat(traj.offsets[:-1], traj.lengths)
    return pa.table({
        "traj_id": np.repeat(traj.traj_id, traj.lengths),
        "user_id": np.repeat(traj.user_id, traj.lengths),
        "seq": seq,
        "ts": pa.array(traj.ts, pa.int64(), mask=traj.ts == NO_TIME).cast(pa.timestamp("us")),
        "lat": traj.lat,
        "lon": traj.lon,
    })


def inspect(points: pa.StructArray | pa.Table, bbox=None) -> list[dict]:
    """A data-quality report: one row per check (check, count, action) without raising.

    What :func:`from_points` would refuse (NULL/NaN/out-of-range values), repair (unsorted points, duplicate
    timestamps) or drop (points outside ``bbox`` with outside := 'drop', trajectories shorter than 2 points).
    """
    n = len(points) if isinstance(points, pa.StructArray) else points.num_rows
    rows = [{"check": "points", "count": n, "action": "read"}]
    if n == 0:
        rows.append({"check": "empty table", "count": 1, "action": "refused: give a table with trajectories"})
        return rows
    cols = {k: _column(points, k) for k in ("traj_id", "ts", "lat", "lon")}
    traj = _to_numpy(cols["traj_id"].fill_null(-1), np.int64)
    rows.append({"check": "trajectories", "count": len(np.unique(traj)), "action": "read"})

    def add(name, count, action):
        rows.append({"check": name, "count": int(count), "action": action if count else "ok"})

    add("NULL traj_id", cols["traj_id"].null_count, "refused: filter with WHERE traj_id IS NOT NULL")
    add("NULL ts", cols["ts"].null_count, "refused: filter with WHERE ts IS NOT NULL")
    lat = _to_numpy(cols["lat"].fill_null(np.nan), np.float64)
    lon = _to_numpy(cols["lon"].fill_null(np.nan), np.float64)
    add("NULL or NaN lat/lon", (np.isnan(lat) | np.isnan(lon)).sum(),
        "refused: filter with WHERE NOT isnan(lat) AND NOT isnan(lon)")
    add("lat outside [-90, 90]", (np.abs(lat) > 90).sum(), "refused: lat/lon must be WGS 84 degrees")
    add("lon outside [-180, 180]", (np.abs(lon) > 180).sum(), "refused: lat/lon must be WGS 84 degrees")
    ts = _to_numpy(cols["ts"].fill_null(0), np.int64)
    by_traj = np.argsort(traj, kind="stable")
    gt, gts = traj[by_traj], ts[by_traj]
    add("points out of time order", ((gt[1:] == gt[:-1]) & (gts[1:] < gts[:-1])).sum(),
        "repaired: sorted by (traj_id, ts)")
    order = np.lexsort((ts, traj))
    st, sts = traj[order], ts[order]
    same = st[1:] == st[:-1]
    add("duplicate timestamps", (same & (sts[1:] == sts[:-1])).sum(), "repaired: first point kept")
    if bbox is not None:
        from duckmob.grid import BBox
        box = BBox.of(bbox)
        add("points outside bbox", (~box.contains(lat, lon)).sum(),
            "dropped with outside := 'drop' (refused with the default 'fail')")
    keys, counts = np.unique(st[np.concatenate([[True], ~(same & (sts[1:] == sts[:-1]))])], return_counts=True)
    add("trajectories with fewer than 2 points", (counts < 2).sum(), "dropped")
    return rows
