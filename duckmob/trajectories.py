"""Trajectories as ragged arrays: a table of points <-> offsets + columns; validation and cleaning.

The one shape every other module takes. A :class:`Trajectories` holds ``n`` trajectories and ``m`` points:
``offsets`` (int64, length n + 1, offsets[0] = 0, offsets[-1] = m) cuts the point columns ``ts``, ``lat`` and
``lon`` into trajectories; ``traj_id`` and ``user_id`` have one entry per trajectory (a trajectory is the pair
(user_id, traj_id); -1 is "no user"). Points of a trajectory are sorted by time with no duplicate timestamps.
Everything here is vectorised over points (numpy sorts and reductions); nothing loops in Python over points or
trajectories.

:func:`from_points` cleans a table two ways: ``private=True`` for releases (drops silently, never raises on the
data, reports nothing) and the default for the exact tools (refuses with counts). :func:`inspect` is the exact,
NOT private, report of that cleaning for the data owner (mob_check).

Timestamps are int64 microseconds since the epoch (DuckDB's TIMESTAMP, no zone); latitude and longitude are
WGS 84 degrees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pyarrow as pa

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

    @classmethod
    def empty(cls) -> "Trajectories":
        """No trajectory and no point (``offsets == [0]``)."""
        ids = np.zeros(0, dtype=np.int64)
        return cls(np.zeros(1, dtype=np.int64), ids, ids.copy(), ids.copy(), np.zeros(0), np.zeros(0))

    @property
    def has_time(self) -> bool:
        """False when some trajectory has no timestamps (its ``ts`` hold NO_TIME): a synthetic table of a method
        that models no time, or a timeless trajectory kept by ``from_points(time_required=False)``."""
        firsts = self.offsets[:-1][self.lengths > 0]
        return not (self.ts[firsts] == NO_TIME).any()

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
        rows = np.asarray(rows)
        if rows.dtype == bool:      # a mask keeps the order: the points are compressed by a mask, not gathered
            lengths = self.lengths[rows]
            keep = np.repeat(rows, self.lengths)
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            return Trajectories(offsets, self.traj_id[rows], self.user_id[rows],
                                self.ts[keep], self.lat[keep], self.lon[keep])
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
    """What cleaning changed, in exact counts (non-private tools only: see :func:`from_points`).

    Point checks (``null_traj_id`` .. ``lon_out_of_range``) count every point that fails each check, so a point
    can count twice; ``outside_bbox`` counts points that pass them; ``duplicate_timestamps`` and ``short_*``
    count what the later steps dropped. ``trajectories_in`` is the number of (user_id, traj_id) trajectories
    after the point checks.
    """

    points_in: int = 0
    trajectories_in: int = 0
    null_traj_id: int = 0
    null_ts: int = 0
    missing_coordinates: int = 0
    lat_out_of_range: int = 0
    lon_out_of_range: int = 0
    outside_bbox: int = 0
    invalid_coordinates: int = 0  # points with a NULL/NaN or out-of-range lat or lon, dropped with outside='drop'
    duplicate_timestamps: int = 0
    unordered_points: int = 0   # points of timeless trajectories without a seq (dropped: no order of their own)
    unsorted_trajectories: int = 0
    short_trajectories: int = 0
    min_points: int = 2
    points_out: int = 0
    trajectories_out: int = 0
    notes: list[str] = field(default_factory=list)

    def messages(self) -> list[str]:
        out = []
        if self.unsorted_trajectories:
            out.append(f"sorted the points of {self.unsorted_trajectories} trajectories by time")
        if self.duplicate_timestamps:
            out.append(f"dropped {self.duplicate_timestamps} points with a duplicate timestamp (kept the one with the "
                       "smallest (lat, lon))")
        if self.invalid_coordinates:
            out.append(f"dropped {self.invalid_coordinates} points with a NULL, NaN or out-of-range lat or lon")
        if self.outside_bbox:
            out.append(f"dropped {self.outside_bbox} points outside the bounding box")
        if self.short_trajectories:
            out.append(f"dropped {self.short_trajectories} trajectories with fewer than {self.min_points} points")
        return out + self.notes


def ragged_gather(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Indices ``starts[i] + 0 .. starts[i] + lengths[i] - 1`` for every i, concatenated (no Python loop): one
    array of steps (1 inside a range, the jump to the next range at its head) summed in place."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    some = lengths > 0
    starts, lengths = np.asarray(starts, dtype=np.int64)[some], lengths[some]
    out = np.ones(total, dtype=np.int64)
    out[0] = starts[0]
    out[(np.cumsum(lengths) - lengths)[1:]] = starts[1:] - starts[:-1] - lengths[:-1] + 1
    return np.cumsum(out, out=out)


def distinct_pairs(owner: np.ndarray, values: np.ndarray, n_values: int,
                   capacity: int = 1 << 32) -> tuple[np.ndarray, np.ndarray]:
    """The distinct ``(owner, value)`` pairs, sorted by owner then value, of ``owner`` (non-decreasing) and
    ``values`` (each in ``[0, n_values)``): ``(owner, value)``. Pairs are sorted as 32-bit keys (4x faster than 64-bit
    ones) in slices of owners whose keys ``(owner - first) * n_values + value`` stay below ``capacity``; the slices
    are owner ranges, so their sorted keys laid end to end are sorted."""
    owner, values = np.asarray(owner, dtype=np.int64), np.asarray(values, dtype=np.int64)
    n_values = max(int(n_values), 1)
    per = max(int(capacity) // n_values, 1)               # owners per slice
    if not len(owner):
        return owner, values
    dtype = np.uint32 if capacity <= 1 << 32 and per * n_values <= 1 << 32 else np.int64
    first = int(owner[0])
    bounds = np.searchsorted(owner, np.arange(first, int(owner[-1]) + 1, per), side="left").tolist() + [len(owner)]
    outs_o, outs_v = [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        if a == b:
            continue
        lo = int(owner[a])
        key = np.sort(((owner[a:b] - lo) * n_values + values[a:b]).astype(dtype))
        key = key[np.concatenate([[True], key[1:] != key[:-1]])]
        o, v = np.divmod(key.astype(np.int64), n_values)
        outs_o.append(o + lo)
        outs_v.append(v)
    return np.concatenate(outs_o), np.concatenate(outs_v)


def _column(points, name: str) -> pa.Array:
    if isinstance(points, pa.StructArray):
        # flatten() makes a NULL struct a NULL in every field (field() would expose what lies beneath)
        col = points.field(name) if points.null_count == 0 else points.flatten()[points.type.get_field_index(name)]
    else:
        col = points.column(name)
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    return col


def _n_rows(points) -> int:
    if points is None:
        return 0
    return len(points) if isinstance(points, pa.StructArray) else points.num_rows


def _names(points) -> list[str]:
    return points.type.names if isinstance(points, pa.StructArray) else points.column_names


def _is_null(col: pa.Array) -> np.ndarray:
    if col.null_count == 0:
        return np.zeros(len(col), dtype=bool)
    return col.is_null().to_numpy(zero_copy_only=False)


def _ints(col: pa.Array, fill: int) -> np.ndarray:
    """int64 values (timestamps and dates as µs since the epoch), NULLs replaced by ``fill``.

    Casts are unchecked (``safe=False``: sub-µs digits are truncated, out-of-range ids wrap) so that no value in
    the table can make reading it fail."""
    if pa.types.is_timestamp(col.type) or pa.types.is_date(col.type):
        col = col.cast(pa.timestamp("us"), safe=False)
    if col.type != pa.int64():
        col = col.cast(pa.int64(), safe=False)
    if col.null_count:
        col = col.fill_null(fill)
    return col.to_numpy(zero_copy_only=False)


def _floats(col: pa.Array) -> np.ndarray:
    """float64 values, NULLs as NaN."""
    if col.type != pa.float64():
        col = col.cast(pa.float64(), safe=False)
    if col.null_count:
        col = col.fill_null(np.nan)
    return col.to_numpy(zero_copy_only=False)


def _lex_order(keys: tuple[np.ndarray, ...]) -> tuple[np.ndarray | None, tuple[np.ndarray, ...], tuple]:
    """The stable order sorting the rows by ``keys`` (primary first; the first two name a trajectory), or None
    when they already are in that order; the keys in that order; and for each pair of neighbours in it, whether
    they tie on every key and on the first two (:func:`_pair_order`).

    The check is O(m), so sorted input is never sorted again. Rows that come as runs of one trajectory in order
    (each trajectory's rows together or in a few pieces, the pieces out of order: tables written by parallel
    writers, buckets routed from them) are ordered by sorting the runs by their first rows and gathering them
    once; when that gives the keys in order, with tied rows in table order, it IS the stable lexicographic order
    (the only one). Otherwise, and when the runs are many, a full ``np.lexsort``."""
    m = len(keys[0])
    if m < 2:
        return None, keys, (np.zeros(0, bool), np.zeros(0, bool))
    ordered, tied, same = _pair_order(keys)
    if ordered.all():
        return None, keys, (tied, same)
    starts = np.flatnonzero(np.concatenate([[True], ~(same & ordered)]))
    if len(starts) * 4 <= m:          # runs of 4 rows or more on average: sorting the runs is cheaper
        ends = np.append(starts[1:], m)
        # by their first rows, then by their last (a run of rows all tied with the next run's first goes first)
        runs = np.lexsort((keys[-1][ends - 1],) + tuple(k[starts] for k in keys[::-1]))
        order = ragged_gather(starts[runs], (ends - starts)[runs])
        out = tuple(k[order] for k in keys)
        ordered, tied, same = _pair_order(out)
        if ordered.all():
            # rows tied on every key that meet across two runs go back to table order
            if (tied & (order[1:] < order[:-1])).any():
                order = _order_tied(order, tied, lambda rows: (rows,))
            return order, out, (tied, same)
    order = np.lexsort(keys[::-1])
    out = tuple(k[order] for k in keys)
    return order, out, _pair_order(out)[1:]


def _pair_order(keys: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each pair of neighbouring rows: whether they are in lexicographic order of ``keys``, whether they tie
    on every key, and whether they tie on the first two (the same trajectory)."""
    ahead = np.zeros(len(keys[0]) - 1, dtype=bool)
    tied = np.ones(len(keys[0]) - 1, dtype=bool)
    same = tied
    for i, k in enumerate(keys):
        ahead |= tied & (k[1:] > k[:-1])
        tied = tied & (k[1:] == k[:-1])
        if i == min(1, len(keys) - 1):
            same = tied
    return ahead | tied, tied, same


def _break_ties(order: np.ndarray | None, tied: np.ndarray, lat: np.ndarray, lon: np.ndarray,
                kept: np.ndarray | None) -> np.ndarray | None:
    """``order`` (None: the identity) with every run of rows equal on all ``keys`` (a repeated timestamp, or a
    repeated seq in a timeless trajectory) put in (lat, lon) order: which of them comes first, and so which one a
    repeated timestamp keeps, then depends on the points' own values, never on where the table stores them (a
    table's row order moves with the other rows, and with how DuckDB's threads gathered them). ``tied``: for
    each pair of neighbours in ``order``, whether they tie on every key (:func:`_lex_order`; still true once the
    runs are put in order); ``lat``/``lon`` are indexed by the rows before ``kept`` (None: all rows) selects them.
    Costs O(rows) when nothing ties."""
    m = len(tied) + 1
    if m < 2 or not tied.any():
        return order
    src = (lambda rows: rows) if kept is None else (lambda rows: kept[rows])
    return _order_tied(np.arange(m) if order is None else order, tied,
                       lambda rows: (lon[src(rows)], lat[src(rows)]))


def _order_tied(order: np.ndarray, tied: np.ndarray, by: Callable) -> np.ndarray:
    """``order`` with each run of neighbours that ``tied`` joins sorted by ``by(rows)`` (sort keys, last primary,
    as np.lexsort takes them, of the rows in the run); the rest is unchanged. O(rows tied) beyond one pass."""
    m = len(order)
    member = np.zeros(m, dtype=bool)
    member[1:] |= tied
    member[:-1] |= tied
    idx = np.flatnonzero(member)
    run = np.cumsum(np.concatenate([[True], ~((idx[1:] == idx[:-1] + 1) & tied[idx[:-1]])]))
    rows = order[idx]
    order[idx] = rows[np.lexsort((*by(rows), run))]
    return order


def _refuse(report: CleaningReport, lat, lon, lat_bad, lon_bad, time_required: bool, coordinates: bool) -> None:
    """The non-private refusals: how many points fail a check and how to fix it, for a table the user will fix.
    No value from the table is quoted (no coordinate, no id). ``coordinates``: whether invalid coordinates are
    refused too (``outside := 'fail'``); with ``'drop'`` they are dropped like points outside the bbox."""
    for name, count in (("traj_id", report.null_traj_id), ("ts", report.null_ts if time_required else 0)):
        if count:
            raise DuckmobError(f"{count} points have a NULL {name}: filter them out first "
                               f"(WHERE {name} IS NOT NULL) or fill them in")
    if not coordinates:
        return
    drop = " or pass outside := 'drop' to drop them"
    for name, values in (("lat", lat), ("lon", lon)):
        count = int(np.isnan(values).sum())
        if count:
            raise DuckmobError(f"{count} points have a NULL or NaN {name}: filter them out first "
                               f"(WHERE {name} IS NOT NULL AND NOT isnan({name})){drop}")
    if lat_bad.any():
        hint = " (are lat and lon swapped?)" if (np.abs(lon) <= 90).all() else ""
        raise DuckmobError(f"{int(lat_bad.sum())} points have a latitude outside [-90, 90]{hint}: lat and lon "
                           f"must be WGS 84 degrees; filter them out (WHERE lat BETWEEN -90 AND 90){drop}")
    if lon_bad.any():
        raise DuckmobError(f"{int(lon_bad.sum())} points have a longitude outside [-180, 180]: lat and lon must be "
                           f"WGS 84 degrees; filter them out (WHERE lon BETWEEN -180 AND 180){drop}")


def from_points(points: pa.StructArray | pa.Table | None, bbox=None, outside: str = "fail", min_points: int = 2,
                time_required: bool = True, *, private: bool = False) -> tuple[Trajectories, CleaningReport]:
    """Build validated, cleaned :class:`Trajectories` from Arrow points.

    ``points`` has fields ``traj_id`` (integer), ``ts`` (timestamp), ``lat``, ``lon`` (WGS 84 degrees) and
    optionally ``user_id`` (integer) and ``seq``. The input is never modified.

    A trajectory is the pair (user_id, traj_id): a traj_id used by two users gives two trajectories, so removing
    one user never changes another user's trajectory. A NULL user_id stands for "no user" (-1, as do negative
    ids): those points form the trajectory (-1, traj_id). ``traj_id`` keeps the traj_id, ``user_id`` the user;
    trajectories come ordered by (traj_id, user_id), their points by time.

    Cleaning, in this order; every step acts on each point or each trajectory by itself, so a trajectory's result
    depends on its own points only:

    1. point checks: a NULL traj_id, a NULL or NaN lat or lon, a latitude outside [-90, 90], a longitude outside
       [-180, 180], a NULL ts (when ``time_required``);
    2. points outside ``bbox`` (``[min_lat, min_lon, max_lat, max_lon]``, edges included);
    3. points with a timestamp already seen in their trajectory (of the points sharing one timestamp, the one with
       the smallest (lat, lon) is kept: a rule on the trajectory's own values, never on the table's row order);
    4. trajectories left with fewer than ``min_points`` points.

    ``private=True`` (every release path: synthesize, mob_fit): nothing in the table can make this function
    raise, and nothing computed from the table leaves it except the trajectories. Steps 1 and 2 drop the points
    silently (step 2 whatever ``outside`` says), 3 and 4 drop as above; an empty input, or one where nothing is
    left, gives an empty :class:`Trajectories` (``offsets == [0]``), not an error. The report returned is blank:
    a refusal or a count that depends on the data would be an unaccounted release. Only the public arguments
    (``outside``, ``bbox``) are checked and can raise.

    ``private=False`` (tools whose output is the exact data anyway: mob_staypoints, mob_cell_sequences, the
    evaluation): a failed point check raises a :class:`DuckmobError` saying how many points fail and how to fix
    it (never a value from the table); so do points outside ``bbox`` with ``outside='fail'``, an empty table and a
    table where no trajectory is left. ``outside='drop'`` drops invalid coordinates (NULL or NaN, a latitude
    outside [-90, 90], a longitude outside [-180, 180]) like points outside the bbox, each point on its own (the
    rest of its trajectory is kept); a NULL traj_id or ts is still refused. The returned report counts what was
    changed.

    With ``time_required=False`` (methods that model no time) a trajectory whose points all have a NULL ts is
    timeless: its points are ordered by their own ``seq`` (equal seqs by (lat, lon)), never deduplicated, and get
    ``ts`` = :data:`NO_TIME`; a point of it with a NULL seq (or a table without seq) has no order of its own and is
    dropped (private) or refused. In the other trajectories a point with a NULL ts is dropped (private) or refused.
    So each trajectory is read from its own points alone, whatever the other rows hold or where they are stored.
    """
    out, report = _clean(points, bbox, outside, min_points, time_required, private, counted=not private)
    return (out, CleaningReport()) if private else (out, report)


def _clean(points, bbox, outside, min_points, time_required, private,
           counted: bool = True) -> tuple[Trajectories, CleaningReport]:
    """:func:`from_points`, returning the filled report in both modes (for :func:`inspect`; ``counted=False``
    leaves out the count of trajectories sorted, which costs a pass, for a report nobody reads). Four steps: point
    checks (:func:`_check_points`), the public bounding box (:func:`_outside_box`), the sort by (traj_id, user_id,
    ts) without repeated timestamps (:func:`_sort_keys`, :func:`_kept_in_order`), trajectories too short
    (:func:`_drop_short`)."""
    if outside not in ("fail", "drop"):
        raise DuckmobError(f"outside := '{outside}' is not an option: use 'drop' (drop points outside the bbox "
                           "and report how many) or 'fail'")
    box = None
    if bbox is not None:
        from duckmob.grid import BBox
        box = BBox.of(bbox)
    n = _n_rows(points)
    report = CleaningReport(points_in=n, min_points=int(min_points))
    if n == 0:
        if private:
            return Trajectories.empty(), report
        raise DuckmobError("the trajectory table is empty: give a table with at least one trajectory of 2 points")
    names = _names(points)
    if box is not None and not counted and private:     # nothing to count or refuse: one mask
        traj, ts, ts_null, lat, lon, bad = _points_in_box(points, box, time_required)
    else:
        traj, ts, ts_null, lat, lon, bad = _check_points(points, report, outside, time_required, private)
        if box is not None:
            bad |= _outside_box(box, bad, lat, lon, report, outside, private)
    user = _ints(_column(points, "user_id"), -1) if "user_id" in names else np.full(n, -1, dtype=np.int64)
    if (user < -1).any():
        user = np.maximum(user, -1)  # every negative id means "no user"
    kept = np.flatnonzero(~bad) if bad.any() else None
    del bad
    if kept is not None:
        traj, ts, user, ts_null = traj[kept], ts[kept], user[kept], ts_null[kept]
    keys, seq_null = _sort_keys(points, names, n, kept, traj, user, ts, ts_null)
    timeless = seq_null is not None  # only without time_required: NULL ts points are gone otherwise
    order, keys, (tied, same) = _lex_order(keys)
    order = _break_ties(order, tied, lat, lon, kept)
    del tied
    if order is not None:   # the keys come in order: (traj, user, ts) or (traj, user, ts_null, ts, seq)
        traj, user, ts = keys[0], keys[1], keys[-2 if timeless else -1]
        if timeless:
            ts_null, seq_null = keys[2].view(bool), seq_null[order]
    del keys
    start, keep = _kept_in_order(same, ts, ts_null, seq_null, order, report, private, counted)
    del same, seq_null
    firsts = np.flatnonzero(start)
    counts = _drop_short(firsts, keep, report)    # points kept per trajectory; 0: dropped
    if not keep.all():
        sel = np.flatnonzero(keep)
        ts, ts_null = ts[sel], ts_null[sel]
        order = sel if order is None else order[sel]
        del sel
    # one gather of the coordinates (each column is read once, not permuted and then masked)
    pos = order if kept is None else (kept if order is None else kept[order])
    if pos is not None:
        lat, lon = lat[pos], lon[pos]
    del pos, order, kept, keep
    if timeless:
        ts = np.where(ts_null, NO_TIME, ts)
    alive = counts > 0
    offsets = np.concatenate([[0], np.cumsum(counts[alive])]).astype(np.int64)
    out = Trajectories(offsets, traj[firsts[alive]], user[firsts[alive]], ts, lat, lon)
    report.points_out, report.trajectories_out = out.n_points, out.n_trajectories
    if out.n_trajectories == 0 and not private:
        raise DuckmobError("no trajectory is left after cleaning (" + "; ".join(report.messages()) +
                           "): check the bbox and that each trajectory has at least 2 points")
    return out, report


def _check_points(points, report: CleaningReport, outside: str, time_required: bool, private: bool):
    """Step 1 of :func:`_clean`, the point checks, each on every point: the columns (traj, ts, ts_null, lat, lon)
    and the mask of points to drop; counts go into ``report`` (and refusals are raised unless ``private``)."""
    cols = {k: _column(points, k) for k in ("traj_id", "ts", "lat", "lon")}
    traj_null, ts_null = _is_null(cols["traj_id"]), _is_null(cols["ts"])
    traj, ts = _ints(cols["traj_id"], 0), _ints(cols["ts"], 0)
    lat, lon = _floats(cols["lat"]), _floats(cols["lon"])
    del cols
    missing = np.isnan(lat) | np.isnan(lon)
    lat_bad, lon_bad = (lat > 90) | (lat < -90), (lon > 180) | (lon < -180)  # False on NaN
    report.null_traj_id, report.null_ts = int(traj_null.sum()), int(ts_null.sum())
    report.missing_coordinates = int(missing.sum())
    report.lat_out_of_range, report.lon_out_of_range = int(lat_bad.sum()), int(lon_bad.sum())
    if not private:
        _refuse(report, lat, lon, lat_bad, lon_bad, time_required, coordinates=outside == "fail")
    bad = traj_null | missing | lat_bad | lon_bad
    if outside == "drop":   # counted once per point for the report (the checks above may count one twice)
        report.invalid_coordinates = int((missing | lat_bad | lon_bad).sum())
    del traj_null, missing, lat_bad, lon_bad
    if time_required:
        bad |= ts_null
    else:
        report.null_ts = 0  # counted below: only NULLs in trajectories that have timestamps are dropped
    return traj, ts, ts_null, lat, lon, bad


def _points_in_box(points, box, time_required: bool):
    """Steps 1 and 2 of :func:`_clean` at once, for a private release that counts nothing: what
    :func:`_check_points` and :func:`_outside_box` return, the mask being the points without a traj_id (or, when
    ``time_required``, a ts) or outside the public ``box``. The box lies within [-90, 90] x [-180, 180], and a NaN
    compares false, so inside it a point's coordinates are valid: the same mask."""
    cols = {k: _column(points, k) for k in ("traj_id", "ts", "lat", "lon")}
    traj, ts = _ints(cols["traj_id"], 0), _ints(cols["ts"], 0)
    lat, lon = _floats(cols["lat"]), _floats(cols["lon"])
    bad = ~box.contains(lat, lon)
    if cols["traj_id"].null_count:
        bad |= _is_null(cols["traj_id"])
    ts_null = _is_null(cols["ts"])
    if time_required and cols["ts"].null_count:
        bad |= ts_null
    return traj, ts, ts_null, lat, lon, bad


def _outside_box(box, bad: np.ndarray, lat: np.ndarray, lon: np.ndarray, report: CleaningReport, outside: str,
                 private: bool) -> np.ndarray:
    """Step 2 of :func:`_clean`: the valid points outside the public bounding box (counted, or refused with
    ``outside='fail'`` unless ``private``)."""
    out_box = ~bad & ~box.contains(lat, lon)
    report.outside_bbox = int(out_box.sum())
    if report.outside_bbox and outside == "fail" and not private:
        raise DuckmobError(f"{report.outside_bbox} points lie outside the bounding box {box.as_list()}: pass "
                           "outside := 'drop' to drop them (they are reported), or declare a larger bbox")
    return out_box


def _sort_keys(points, names, n: int, kept, traj, user, ts, ts_null):
    """The keys :func:`_clean` sorts the kept points by, and (only when some trajectory is timeless, so some ts is
    NULL: never with time_required) the kept points' NULL-seq mask, else None. Timed points tie on seq = 0;
    timeless ones (sorted last) follow their own seq."""
    if not ts_null.any():
        return (traj, user, ts), None
    seq_null = np.ones(n, dtype=bool)
    seq = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    if "seq" in names:
        seq_col = _column(points, "seq")
        seq_null, seq = _is_null(seq_col), _ints(seq_col, np.iinfo(np.int64).max)
    seq, seq_null = (seq, seq_null) if kept is None else (seq[kept], seq_null[kept])
    return (traj, user, ts_null.view(np.int8), ts, np.where(ts_null, seq, 0)), seq_null


def _kept_in_order(same, ts, ts_null, seq_null, order, report: CleaningReport, private: bool,
                   counted: bool = True):
    """Step 3 of :func:`_clean`, on the points sorted by (traj_id, user_id, ts) (``order``: the permutation applied,
    None if they came sorted): the mask of trajectory starts and of the points kept (repeated timestamps dropped;
    in timeless trajectories, with ``seq_null`` given, NULL ts among timestamps and points without a seq dropped or
    refused). ``same``: whether each point and the next have one (traj_id, user_id)."""
    m = len(ts)
    start = np.ones(m, dtype=bool)
    np.logical_not(same, out=start[1:])
    if order is not None and counted:
        group = np.cumsum(start) - 1
        report.unsorted_trajectories = int(len(np.unique(group[1:][~start[1:] & (order[1:] < order[:-1])])))
        del group
    keep = np.ones(m, dtype=bool)
    if seq_null is not None:
        keep &= ~_timeless_dropped(start, ts_null, seq_null, report, private)
    # within a trajectory timed points come first, so a timed point's predecessor is timed (or another trajectory)
    repeated = ~start[1:] & (ts[1:] == ts[:-1]) & ~ts_null[1:]
    report.duplicate_timestamps = int(repeated.sum())
    keep[1:] &= ~repeated
    return start, keep


def _timeless_dropped(start, ts_null, seq_null, report: CleaningReport, private: bool) -> np.ndarray:
    """The sorted points :func:`_kept_in_order` drops when some trajectory is timeless: a NULL ts in a trajectory
    with timestamps, and a point of a timeless trajectory without a seq (refused unless ``private``)."""
    group = np.cumsum(start) - 1
    stray = ts_null & ~ts_null[np.flatnonzero(start)][group]  # NULL ts in a trajectory with timestamps
    report.null_ts = int(stray.sum())
    if report.null_ts and not private:
        raise DuckmobError(f"{report.null_ts} points have a NULL ts in trajectories that have timestamps: "
                           "filter them out first (WHERE ts IS NOT NULL) or fill them in")
    # a point of a timeless trajectory without a seq has no place that its own values give (the table's order
    # is none: it moves with the other rows), so it is dropped (private) or refused
    unordered = ts_null & seq_null & ~stray
    report.unordered_points = int(unordered.sum())
    if report.unordered_points and not private:
        raise DuckmobError(f"{report.unordered_points} points have neither a ts nor a seq, so their order in "
                           "their trajectory is unknown: give the table a seq column that numbers each "
                           "trajectory's points (seq_col := '...' names another), or filter them out first "
                           "(WHERE ts IS NOT NULL OR seq IS NOT NULL)")
    return stray | unordered


def _drop_short(firsts: np.ndarray, keep: np.ndarray, report: CleaningReport) -> np.ndarray:
    """Step 4 of :func:`_clean`, on the sorted points before they are gathered (``firsts``: where each trajectory
    starts): the points kept of each trajectory, 0 for those left with fewer than ``report.min_points``, whose
    points ``keep`` (changed in place) then drops. Counts the trajectories with a point kept, and the short ones,
    into ``report``. A trajectory is its own points, wherever its first one went."""
    counts = np.add.reduceat(keep, firsts, dtype=np.int64) if len(firsts) else np.zeros(0, np.int64)
    report.trajectories_in = int(np.count_nonzero(counts))
    short = (counts > 0) & (counts < report.min_points)
    if short.any():
        report.short_trajectories = int(short.sum())
        keep &= ~np.repeat(short, np.diff(np.append(firsts, len(keep))))
        counts[short] = 0
    return counts


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


NOT_PRIVATE = "exact counts: NOT differentially private"
_DROPPED = "dropped by private releases (synthesize, mob_fit); refused by mob_staypoints, mob_cell_sequences"
_DROPPED_COORDINATES = ("dropped by private releases and with outside := 'drop'; refused by mob_staypoints and "
                        "with outside := 'fail'")


def synthetic_table(traj: Trajectories) -> pa.Table:
    """The synthetic table: traj_id, seq, lat, lon, ts (NULL where the method models no time)."""
    lengths = traj.lengths
    seq = np.arange(traj.n_points, dtype=np.int64) - np.repeat(traj.offsets[:-1], lengths)
    ts = pa.array(traj.ts, pa.int64(), mask=traj.ts == NO_TIME).cast(pa.timestamp("us"))
    return pa.table({"traj_id": np.repeat(np.asarray(traj.traj_id, dtype=np.int64), lengths), "seq": seq,
                     "lat": traj.lat, "lon": traj.lon, "ts": ts})


def inspect(points: pa.StructArray | pa.Table | None, bbox=None) -> list[dict]:
    """An exact data-quality report for the data owner: one row per check (check, count, action), never raising.

    NOT differentially private: the counts are exact functions of the table (the first row says so). Keep the
    output with the data; do not share or publish it.

    The checks are the cleaning of :func:`from_points` (with ``private=True`` it drops silently what is listed
    here; mob_staypoints and mob_cell_sequences refuse instead): points with a NULL traj_id, a NULL ts, a NULL or
    NaN lat/lon, a latitude outside [-90, 90], a longitude outside [-180, 180] (each counted on every point, so a
    point can count twice); valid points outside ``bbox``; trajectories whose points are not in time order; points
    with a repeated timestamp; trajectories left with fewer than 2 points; and what is left. A trajectory is the
    pair (user_id, traj_id): the report also counts traj_ids shared by several users (split into one trajectory
    per user) and points without a user id (dropped by releases with privacy_unit := 'user').
    """
    n = _n_rows(points)
    rows = [{"check": NOT_PRIVATE, "count": None, "action": "for the data owner only: do not share this output"},
            {"check": "points", "count": n, "action": "read"}]
    if n == 0:
        rows.append({"check": "empty table", "count": 1,
                     "action": "private releases get no trajectory; mob_staypoints, mob_cell_sequences refuse it"})
        return rows

    def add(name, count, action):
        rows.append({"check": name, "count": int(count), "action": action if count else "ok"})

    names = _names(points)
    has_traj = ~_is_null(_column(points, "traj_id"))
    traj = _ints(_column(points, "traj_id"), 0)[has_traj]
    user_col = _column(points, "user_id") if "user_id" in names else pa.nulls(n, pa.int64())
    user = np.maximum(_ints(user_col, -1), -1)[has_traj]
    order = np.lexsort((user, traj))
    traj, user = traj[order], user[order]
    new_pair = np.ones(len(traj), dtype=bool)
    new_pair[1:] = (traj[1:] != traj[:-1]) | (user[1:] != user[:-1])
    pair_traj = traj[new_pair]  # sorted: a traj_id with several users repeats
    shared = pair_traj[1:][pair_traj[1:] == pair_traj[:-1]]
    rows.append({"check": "trajectories", "count": int(new_pair.sum()), "action": "read: one per (user_id, traj_id)"})
    add("traj_id shared by several users", len(np.unique(shared)),
        "split: each (user_id, traj_id) pair is its own trajectory")
    add("points with a NULL user_id", int((user < 0).sum()), "kept as no user; dropped by privacy_unit := 'user'")

    _, report = _clean(points, bbox, "drop", 2, True, private=True)
    add("NULL traj_id", report.null_traj_id, _DROPPED)
    add("NULL ts", report.null_ts, _DROPPED)
    add("NULL or NaN lat/lon", report.missing_coordinates, _DROPPED_COORDINATES)
    add("lat outside [-90, 90]", report.lat_out_of_range, _DROPPED_COORDINATES + " (lat/lon must be WGS 84 degrees)")
    add("lon outside [-180, 180]", report.lon_out_of_range,
        _DROPPED_COORDINATES + " (lat/lon must be WGS 84 degrees)")
    if bbox is not None:
        add("points outside bbox", report.outside_bbox,
            "dropped by private releases and with outside := 'drop'; refused with outside := 'fail'")
    add("trajectories out of time order", report.unsorted_trajectories, "repaired: points sorted by ts")
    add("duplicate timestamps", report.duplicate_timestamps, "dropped: the point with the smallest (lat, lon) kept")
    add("trajectories with fewer than 2 points", report.short_trajectories, "dropped")
    rows.append({"check": "trajectories left", "count": report.trajectories_out,
                 "action": "what a release cleans down to (before its own steps)"})
    rows.append({"check": "points left", "count": report.points_out, "action": "in those trajectories"})
    return rows
