"""Out-of-core releases: trajectories read in batches of whole trajectories, statistics summed exactly.

The in-memory path gathers a whole table into Python (one ``list()`` per column), so its memory grows with the
points. Here the release core reads the source through DuckDB itself, as Arrow record batches, and what reaches
the mechanism is a :class:`Batches`: the cleaned trajectories, one batch at a time, which a method reduces to exact
tables bounded by its public grid and state sizes (``Batches.reduce``); the release core adds the noise once, as
before. Memory follows the batch size and the model, not the table.

Why the result is the in-memory one, bit for bit (tests/test_stream.py):

* every cleaning step of :func:`duckmob.trajectories.from_points` acts on each trajectory by itself, so cleaning
  batches that each hold whole trajectories keeps exactly the trajectories (and points) of cleaning the table at
  once. A batch holds whole trajectories because points are routed to one of P buckets by ``hash(traj_id)``
  (every point of a (user_id, traj_id) trajectory has the same traj_id), in table order;
* contribution bounding (``privacy_unit := 'user'``) draws its random numbers over ALL kept trajectories in their
  (traj_id, user_id) order, as the in-memory path does (``counting.bound_contributions`` on the same ids with the
  same generator): the ids of every batch are gathered after the cleaning pass (16 bytes a trajectory), the keep
  mask is computed once and applied to each batch;
* every statistic is a sum of whole noise-grid steps (``counting.normalised_sums``), an integer, so batch sums
  add up exactly; ``counting.release_sums`` then draws the same noise in the same order.

One thing is not pinned by the batching: when a trajectory has two points with one timestamp, the first in table
order is kept, and "table order" is DuckDB's scan order (as for the in-memory path's ``list()``).

Cleaned buckets are kept in memory when the table fits in one (``BUCKET_POINTS``), else written once to Arrow IPC
files in a temporary folder (``tempfile``: set TMPDIR to put them elsewhere), read back a bucket at a time by each
pass, and deleted when the release ends.
"""

from __future__ import annotations

import atexit
import math
import os
import shutil
import tempfile
from typing import Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa

from duckmob.trajectories import Trajectories, from_points

# batches whose statistics are computed at once by Batches.reduce (threads)
REDUCE_THREADS = max(1, min(2, os.cpu_count() or 1))

# Points per bucket: bounds the memory of cleaning and of a method's per-batch statistics (about 100-200 bytes a
# point at the peak of a PrivTrace pass).
BUCKET_POINTS = 1 << 21
# Rows per record batch read from DuckDB while routing points to buckets.
READ_ROWS = 1 << 20


class Batches:
    """Cleaned, contribution-bounded trajectories, one batch of whole trajectories at a time.

    ``n_trajectories`` is the exact number of trajectories kept (as ``Trajectories.n_trajectories``: exact, to
    be noised by the mechanism). Iterating yields :class:`~duckmob.trajectories.Trajectories`; :meth:`reduce`
    sums a function's integer tables over the batches."""

    n_trajectories: int = 0

    def __iter__(self) -> Iterator[Trajectories]:
        raise NotImplementedError

    def reduce(self, fn: Callable[[Trajectories], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """``fn(batch)`` summed over the batches: a dict of int64 arrays (exact sums, order-free, so the same
        whatever order they finish in). ``REDUCE_THREADS`` batches at a time (NumPy releases the GIL in its
        heavy loops); at most that many batches in memory."""
        total: dict[str, np.ndarray] | None = None
        for part in in_threads(fn, self):
            if total is None:
                total = {k: np.asarray(v, dtype=np.int64).copy() for k, v in part.items()}
            else:
                for k, v in part.items():
                    total[k] += np.asarray(v, dtype=np.int64)
        if total is None:
            total = {k: np.asarray(v, dtype=np.int64) for k, v in fn(Trajectories.empty()).items()}
        return total

    def trajectories(self) -> Trajectories:
        """Every batch in one :class:`Trajectories`, in from_points' (traj_id, user_id) order as in memory (for
        methods that need all of them at once: O(points))."""
        return self.gather(lambda d: d)

    def gather(self, fn: Callable[[Trajectories], Trajectories]) -> Trajectories:
        """``fn(batch)`` of every batch in one :class:`Trajectories`, in from_points' (traj_id, user_id) order:
        for a per-trajectory ``fn`` (each output trajectory from its own input's points, e.g. stay points) the
        same as ``fn`` of all trajectories in memory, holding one batch's points at a time plus the outputs."""
        return in_order(concat([_owned(fn(batch)) for batch in self]))

    def close(self) -> None:
        """Delete what was written to disk (a no-op in memory)."""


class InMemory(Batches):
    """Trajectories already in memory, as one batch (what ``fit(data)`` gets on the in-memory path)."""

    def __init__(self, data: Trajectories):
        self.data = data
        self.n_trajectories = data.n_trajectories

    def __iter__(self):
        yield self.data

    def trajectories(self) -> Trajectories:
        return self.data

    def gather(self, fn):
        return fn(self.data)


def in_order(data: Trajectories) -> Trajectories:
    """``data``'s trajectories in from_points' (traj_id, user_id) order, the in-memory path's."""
    order = np.lexsort((data.user_id, data.traj_id))
    return data if np.all(order[1:] > order[:-1]) else data.take(order)


def as_batches(data: "Trajectories | Batches") -> Batches:
    """``data`` as :class:`Batches` (Trajectories become one in-memory batch)."""
    return data if isinstance(data, Batches) else InMemory(data)


def concat(parts: list[Trajectories]) -> Trajectories:
    """Trajectories of several batches, in order, as one."""
    parts = [p for p in parts if p.n_trajectories]
    if not parts:
        return Trajectories.empty()
    if len(parts) == 1:
        return parts[0]
    lengths = np.concatenate([p.lengths for p in parts])
    return Trajectories(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                        np.concatenate([p.traj_id for p in parts]), np.concatenate([p.user_id for p in parts]),
                        np.concatenate([p.ts for p in parts]), np.concatenate([p.lat for p in parts]),
                        np.concatenate([p.lon for p in parts]))


# -- cleaning a stream of point buckets ---------------------------------------------------------------------------

class Cleaned(Batches):
    """The output of :func:`clean`: cleaned buckets in memory or in Arrow IPC files, a keep mask per bucket."""

    def __init__(self, buckets: list, keep: list[np.ndarray | None], folder: str | None):
        self._buckets, self._keep, self._folder = buckets, keep, folder
        self.n_trajectories = int(sum(int(k.sum()) if k is not None else _n(b) for b, k in zip(buckets, keep)))

    def __iter__(self):
        for bucket, keep in zip(self._buckets, self._keep):
            data = _load(bucket)
            yield data if keep is None else data.take(keep)

    def close(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def __del__(self):
        self.close()


def _owned(data: Trajectories) -> Trajectories:
    """``data`` with arrays of its own: a batch read back from disk is zero-copy over one buffer of the whole
    batch, so an output that kept a view of it (e.g. the trajectory ids) would keep every batch's points alive
    (HRNet's stays at 100 M fixes: 3.0 GB instead of about 1)."""
    return Trajectories(*(np.array(a, copy=True) for a in (data.offsets, data.traj_id, data.user_id, data.ts,
                                                             data.lat, data.lon)))


def _n(bucket) -> int:
    return bucket.n_trajectories if isinstance(bucket, Trajectories) else bucket[1]


def to_lists(data: Trajectories) -> pa.Table:
    """Trajectories as an Arrow table of one row per trajectory (traj_id, user_id, and ts / lat / lon lists): the
    form cleaned batches take on disk (IPC) and between Spark's executors and the driver."""
    offsets = pa.array(data.offsets, pa.int64())
    return pa.table({"traj_id": pa.array(data.traj_id, pa.int64()), "user_id": pa.array(data.user_id, pa.int64()),
                     "ts": pa.LargeListArray.from_arrays(offsets, pa.array(data.ts, pa.int64())),
                     "lat": pa.LargeListArray.from_arrays(offsets, pa.array(data.lat, pa.float64())),
                     "lon": pa.LargeListArray.from_arrays(offsets, pa.array(data.lon, pa.float64()))})


LISTS_SCHEMA = to_lists(Trajectories.empty()).schema


def from_lists(table: pa.Table) -> Trajectories:
    """The inverse of :func:`to_lists` (zero-copy where Arrow allows)."""
    table = table.combine_chunks()
    if table.num_rows == 0:
        return Trajectories.empty()
    lat = table.column("lat").chunk(0)
    offsets = lat.offsets.to_numpy().astype(np.int64)
    lo, hi = int(offsets[0]), int(offsets[-1])
    return Trajectories(offsets - lo, table.column("traj_id").to_numpy(), table.column("user_id").to_numpy(),
                        table.column("ts").chunk(0).values.to_numpy()[lo:hi], lat.values.to_numpy()[lo:hi],
                        table.column("lon").chunk(0).values.to_numpy()[lo:hi])


def _save(data: Trajectories, folder: str, i: int):
    """Write one cleaned bucket as an Arrow IPC file; (path, number of trajectories)."""
    table = to_lists(data)
    path = os.path.join(folder, f"clean-{i}.arrow")
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return path, data.n_trajectories


def _load(bucket) -> Trajectories:
    if isinstance(bucket, Trajectories):
        return bucket
    with pa.OSFile(bucket[0], "rb") as source:
        return from_lists(pa.ipc.open_file(source).read_all())


def bound_keys(traj_id: np.ndarray, user_id: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Keep mask (in the given order) of the user unit's contribution bounding over trajectories listed in any
    order, drawn as the in-memory path draws it: ``counting.bound_contributions`` over them in from_points'
    (traj_id, user_id) order, so the same trajectories are kept whichever batches they came in."""
    from duckmob.privacy.counting import bound_contributions

    order = np.lexsort((user_id, traj_id))
    mask = np.empty(len(order), dtype=bool)
    mask[order] = bound_contributions(user_id[order], k, rng)
    return mask


def clean(buckets: Iterable[pa.Table], *, bbox, time_required: bool, privacy_unit: str = "trajectory",
          k: int | None = None, rng: Callable[[], np.random.Generator] | None = None,
          folder: str | None = None) -> Cleaned:
    """Clean point buckets (each holding whole trajectories) with ``from_points(private=True)`` and bound
    contributions over all of them: the trajectories the in-memory release path keeps, batch by batch.

    ``rng()`` gives the generator of the contribution bounding (``NoiseSource.generator``; called once, after the
    cleaning pass, only for the user unit). With ``folder`` every bucket after the first is written there (the
    first too once a second exists) and read back per pass; without it they stay in memory.
    Privacy: a per-trajectory transformation and the same bounding as the in-memory path (at most k trajectories
    per user, chosen at random), so the sensitivities of the mechanisms downstream are unchanged."""
    kept: list = []
    ids: list[tuple[np.ndarray, np.ndarray]] = []
    for data in _cleaned(buckets, bbox, time_required):
        if privacy_unit == "user":
            ids.append((data.traj_id, data.user_id))
        if folder is not None and kept:     # a second bucket: every bucket goes to disk
            if isinstance(kept[0], Trajectories):
                kept[0] = _save(kept[0], folder, 0)
            kept.append(_save(data, folder, len(kept)))
        else:
            kept.append(data)
        del data
    keep: list[np.ndarray | None] = [None] * len(kept)
    if privacy_unit == "user":
        traj = np.concatenate([t for t, _ in ids]) if ids else np.zeros(0, np.int64)
        user = np.concatenate([u for _, u in ids]) if ids else np.zeros(0, np.int64)
        mask = bound_keys(traj, user, k, rng())
        cuts = np.cumsum([0] + [len(t) for t, _ in ids])
        keep = [mask[a:b] for a, b in zip(cuts[:-1], cuts[1:])]
    return Cleaned(kept, keep, folder)


def _cleaned(buckets: Iterable[pa.Table], bbox, time_required: bool) -> Iterator[Trajectories]:
    """``from_points(private=True)`` of each bucket, in bucket order, ``REDUCE_THREADS`` buckets at a time
    (threads: NumPy and Arrow release the GIL in their sorts and copies); at most that many raw buckets held."""
    def one(table):
        return from_points(table, bbox=bbox, outside="drop", time_required=time_required, private=True)[0]

    return in_threads(one, buckets)


def in_threads(fn: Callable, items: Iterable) -> Iterator:
    """``fn(item)`` of each item, yielded in the items' order, ``REDUCE_THREADS`` items at a time on threads (at
    most that many items and results held at once)."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(REDUCE_THREADS) as pool:
        pending: deque = deque()
        for item in items:
            pending.append(pool.submit(fn, item))
            del item
            if len(pending) >= REDUCE_THREADS:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


# -- reading a source through DuckDB --------------------------------------------------------------------------------

def n_buckets(n_points: int, bucket_points: int = BUCKET_POINTS) -> int:
    """Buckets for ``n_points`` points: about ``bucket_points`` each (a public tuning, not a statistic)."""
    return max(1, math.ceil(n_points / bucket_points))


def route(reader: pa.RecordBatchReader, n: int, folder: str | None) -> Iterator[pa.Table]:
    """Points routed to ``n`` buckets by their ``_bucket`` column (dropped), each bucket in table order; with one
    bucket the reader is read whole, otherwise each bucket goes to an IPC file in ``folder`` and is yielded (then
    deleted) one at a time."""
    if n == 1:
        yield reader.read_all().drop_columns(["_bucket"])
        return
    schema = pa.schema([f for f in reader.schema if f.name != "_bucket"])
    paths = [os.path.join(folder, f"raw-{i}.arrow") for i in range(n)]
    sinks = [pa.OSFile(p, "wb") for p in paths]
    writers = [pa.ipc.new_file(s, schema) for s in sinks]
    try:
        for batch in reader:
            b = batch.column("_bucket").to_numpy(zero_copy_only=False).astype(np.int64)
            order = np.argsort(b, kind="stable")       # stable: each bucket keeps table order
            counts = np.bincount(b, minlength=n)
            routed = batch.drop_columns(["_bucket"]).take(pa.array(order))
            start = 0
            for i in np.flatnonzero(counts):
                writers[i].write_batch(routed.slice(start, int(counts[i])))
                start += int(counts[i])
    finally:
        for w, s in zip(writers, sinks):
            w.close()
            s.close()
    for p in paths:
        with pa.OSFile(p, "rb") as source:
            table = pa.ipc.open_file(source).read_all()
        os.remove(p)
        yield table


def read_points(cur, query: str, *, bucket_points: int = BUCKET_POINTS,
                folder: str | None = None) -> Iterator[pa.Table]:
    """Point tables of whole trajectories from ``query`` (columns traj_id, user_id, ts, lat, lon, seq, as
    mob_points gives them), read by DuckDB on the cursor ``cur`` in record batches: one scan routes the points to
    ``hash(traj_id)`` buckets of about ``bucket_points`` points each (the number of buckets follows the row count;
    it only sets how the work is cut, and nothing of it is released). ``seq`` is kept only when no row has a
    timestamp, as the in-memory path does (otherwise timeless trajectories keep table order)."""
    n_rows, n_ts = cur.sql(f"SELECT count(*), count(ts) FROM ({query})").fetchall()[0]
    n = n_buckets(int(n_rows), bucket_points)
    if n > 1 and folder is None:
        raise ValueError("several buckets need a folder")
    seq = ", seq" if n_ts == 0 and n_rows else ""
    reader = cur.sql(f"SELECT traj_id, user_id, ts, lat, lon{seq}, (hash(traj_id) % {n})::BIGINT AS _bucket "
                     f"FROM ({query})").to_arrow_reader(batch_size=READ_ROWS)
    yield from route(reader, n, folder)


class PointSource:
    """Points the release core reads out of core, after its reservation (``Release.read``): :meth:`batches` cleans
    them and bounds contributions as the in-memory path does, and returns :class:`Batches`; :meth:`close` frees
    what it holds. :class:`Source` reads a DuckDB table; ``duckmob.spark.SparkSource`` a Spark DataFrame."""

    def batches(self, *, bbox, time_required: bool, privacy_unit: str, k: int | None,
                rng: Callable[[], np.random.Generator]) -> Batches:
        raise NotImplementedError

    def close(self) -> None:
        """Free what the source holds (temporary files, cursors, cached data)."""


class Source(PointSource):
    """A table read out of core by the release core: ``open()`` (inside ``Release.read``) gives the point
    buckets; the release then cleans them (:func:`clean`). Holds the temporary folder until :meth:`close`.

    ``con`` is the connection the query runs on (the caller's, or a cursor the release opened: ``owned`` ones
    are closed after); ``query`` gives mob_points' columns (traj_id, user_id, ts, lat, lon, seq)."""

    def __init__(self, con, query: str, *, owned: bool = False, bucket_points: int | None = None):
        self.con, self.query, self.owned, self.bucket_points = con, query, owned, bucket_points
        self.folder: str | None = None

    def batches(self, *, bbox, time_required, privacy_unit, k, rng) -> Batches:
        return clean(self.open(), bbox=bbox, time_required=time_required, privacy_unit=privacy_unit, k=k, rng=rng,
                     folder=self.folder)

    def open(self) -> Iterator[pa.Table]:
        self.folder = tempfile.mkdtemp(prefix="duckmob-")
        _FOLDERS.add(self.folder)
        return read_points(self.con, self.query, bucket_points=self.bucket_points or BUCKET_POINTS,
                           folder=self.folder)

    def close(self) -> None:
        if self.owned and self.con is not None:
            try:
                self.con.close()
            except Exception:
                pass
            self.con = None
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            _FOLDERS.discard(self.folder)
            self.folder = None


# Temporary folders of releases in progress, removed at interpreter exit too (a killed process leaves its own).
_FOLDERS: set[str] = set()


@atexit.register
def _remove_folders() -> None:
    for folder in list(_FOLDERS):
        shutil.rmtree(folder, ignore_errors=True)


# -- counting releases read out of core -----------------------------------------------------------------------------
#
# mob_noisy_count and mob_transitions read rows that are already one per trajectory (a (traj_id, user_id) pair, a
# cell sequence), so they need no buckets: DuckDB counts the pairs where the data lives (an integer reaches Python),
# and the cell sequences arrive in record batches of whole sequences. The macros call these through
# duckmob.sql.privacy on a cursor of the release core's connection; the Python functions below on the caller's.

def _literal(text) -> str:
    return "NULL" if text is None else "'" + str(text).replace("'", "''") + "'"


def relation(table: str, traj_col: str, user_col: str, cells_col: str | None = None) -> str:
    """The rows of ``table`` the counting macros read, as privacy.sql forms them: traj_id, user_id (NULL when the
    table has no column named ``user_col``) and, with ``cells_col``, cells; the raw column types."""
    cells = f", {cells_col} AS cells" if cells_col is not None else ""
    return (f"SELECT {traj_col} AS traj_id, coalesce(*COLUMNS('^({user_col}|__mob_no_user)$')) AS user_id{cells} "
            f"FROM (SELECT *, NULL AS __mob_no_user FROM {table})")


def checked_user(con, table: str, traj_col: str, user_col: str, cells_col: str | None = None) -> str | None:
    """The macros' schema checks (privacy.sql's ``_mob_typed_source``: integer ids, lists of integer cells; a
    DuckDB error naming the column and its type otherwise) on the column types alone (no row is read), run on
    ``con`` (registered); returns the user column's name, or None when the table has none."""
    cells = "typeof(any_value(cells))" if cells_col is not None else "NULL"
    return con.sql(f"SELECT _mob_typed_source({_literal(table)}, typeof(any_value(traj_id)), "
                   f"typeof(any_value(user_id)), {cells}, {_literal(traj_col)}, {_literal(user_col)}, "
                   f"{_literal(cells_col)}) AS _, _mob_user_col(typeof(any_value(user_id)), {_literal(user_col)}) "
                   f"FROM ({relation(table, traj_col, user_col, cells_col)} LIMIT 0)").fetchall()[0][1]


def count_query(rel: str, *, what: str, privacy_unit: str, k: int) -> str:
    """The exact count mob_noisy_count noises, as one DuckDB aggregate over ``rel`` (:func:`relation`), equal to
    what the in-memory path counts from the gathered pairs (``release.noisy_count``): the (traj_id, user_id) pairs
    are grouped on the raw values, then TRY_CAST (an id beyond BIGINT becomes NULL, user -1); 'users': distinct
    user ids >= 0; the user unit: per user id >= 0, min(trajectories, k), which is how many
    ``counting.bound_contributions`` keeps whichever it keeps; otherwise every pair.
    ``what``, ``privacy_unit`` and ``k`` are the release's validated public arguments."""
    pairs = (f"SELECT TRY_CAST(traj_id AS BIGINT) AS traj_id, TRY_CAST(user_id AS BIGINT) AS user_id "
             f"FROM ({rel} GROUP BY ALL)")
    if what == "users":
        return f"SELECT count(DISTINCT user_id) FILTER (WHERE user_id >= 0) FROM ({pairs})"
    if privacy_unit == "user":
        return (f"SELECT coalesce(sum(least(n, {int(k)})), 0)::BIGINT FROM "
                f"(SELECT user_id, count(*) AS n FROM ({pairs}) WHERE user_id >= 0 GROUP BY user_id)")
    return f"SELECT count(*) FROM ({pairs})"


def count_release(db, cursor, table: str, *, eps, seed=None, privacy_unit="trajectory",
                  max_trajectories_per_user=None, what="trajectories", traj_col="traj_id", user_col="user_id",
                  user: str | None) -> float:
    """``mob_noisy_count`` of ``table`` counted by DuckDB on ``cursor`` after the reservation: only an integer
    reaches Python. ``user`` is the table's user column or None (:func:`checked_user`). Privacy map: as
    :func:`duckmob.release.noisy_count` (the same mechanism; the count is the in-memory path's, exactly)."""
    from duckmob import release, validators

    rel = relation(table, traj_col, user_col)
    k = max_trajectories_per_user

    def load() -> int:   # called after release.noisy_count validated these arguments
        unit, bound = validators.privacy_unit(privacy_unit, k, needs_bound=what == "trajectories")
        return int(cursor.sql(count_query(rel, what=what, privacy_unit=unit, k=bound)).fetchall()[0][0])

    return release.noisy_count(db, source=table, eps=eps, seed=seed, privacy_unit=privacy_unit,
                               max_trajectories_per_user=k, what=what, user_col=user, load=load)


def noisy_count(con, table: str, *, eps, seed=None, privacy_unit="trajectory", max_trajectories_per_user=None,
                what="trajectories", traj_col="traj_id", user_col="user_id") -> float:
    """``mob_noisy_count`` from Python, counted by DuckDB on ``con`` (which sees its temp tables): the same checks
    and the same release as the macro. Privacy map: as :func:`duckmob.release.noisy_count`."""
    from duckmob import release
    from duckmob.sql import register

    register(con)
    user = checked_user(con, table, traj_col, user_col)
    return count_release(release.database(con), con, table, eps=eps, seed=seed, privacy_unit=privacy_unit,
                         max_trajectories_per_user=max_trajectories_per_user, what=what, traj_col=traj_col,
                         user_col=user_col, user=user)


SEQUENCE_ROWS = 1 << 13   # cell sequences per batch of mob_transitions read out of core (~1-2 M cells)


def sequences_query(rel: str, privacy_unit) -> str:
    """The cell sequences of ``rel`` (:func:`relation`) as the in-memory path casts them (TRY_CAST: an id beyond
    BIGINT becomes NULL, a sequence with a cell that is not one is dropped). Under the user unit they come in the
    in-memory path's order, by traj_id with NULL as -1 (``_sequences``' stable sort; only the user unit's random
    choice depends on the order, the sums do not); ties (one traj_id on two rows) in DuckDB's order, as there."""
    query = (f"SELECT TRY_CAST(traj_id AS BIGINT) AS traj_id, TRY_CAST(user_id AS BIGINT) AS user_id, "
             f"TRY_CAST(cells AS BIGINT[]) AS cells FROM ({rel})")
    user = str(privacy_unit if privacy_unit is not None else "").strip().lower() == "user"
    return f"SELECT * FROM ({query}) ORDER BY coalesce(traj_id, -1)" if user else query


def transitions_release(db, cursor, table: str, *, order=1, eps, n_states, seed=None, privacy_unit="trajectory",
                        max_trajectories_per_user=None, max_length=None, support=None, w=None, traj_col="traj_id",
                        user_col="user_id", cells_col="cells", user: str | None):
    """``mob_transitions`` of ``table`` read by DuckDB on ``cursor`` after the reservation, in record batches of
    ``SEQUENCE_ROWS`` whole sequences (read twice under the user unit: the ids first, for the bounding). Returns
    ``(states, counts)`` as :func:`duckmob.release.transitions`, the same release bit for bit: every batch is
    reduced to integer noise-grid steps (``counting.noisy_transition_counts_batches``), summed, noised once.
    Python holds one batch and the table of the public support, whatever the table's size."""
    from duckmob import release
    from duckmob.sql import one_row
    from duckmob.sql.privacy import _sequences

    query = sequences_query(relation(table, traj_col, user_col, cells_col), privacy_unit)

    def batches():
        for rb in cursor.sql(query).to_arrow_reader(batch_size=SEQUENCE_ROWS):
            yield _sequences(one_row(pa.StructArray.from_arrays(rb.columns, names=rb.schema.names)))

    return release.transitions(db, source=table, order=order, eps=eps, n_states=n_states, seed=seed,
                               privacy_unit=privacy_unit, max_trajectories_per_user=max_trajectories_per_user,
                               max_length=max_length, support=support, w=w, user_col=user, load=lambda: batches)


def transitions(con, table: str, *, order=1, eps, n_states, seed=None, privacy_unit="trajectory",
                max_trajectories_per_user=None, max_length=None, support=None, w=None, traj_col="traj_id",
                user_col="user_id", cells_col="cells"):
    """``mob_transitions`` from Python, read on ``con`` (which sees its temp tables) in record batches: the same
    checks and the same release as the macro (:func:`transitions_release`)."""
    from duckmob import release
    from duckmob.sql import register

    register(con)
    user = checked_user(con, table, traj_col, user_col, cells_col)
    return transitions_release(release.database(con), con, table, order=order, eps=eps, n_states=n_states, seed=seed,
                               privacy_unit=privacy_unit, max_trajectories_per_user=max_trajectories_per_user,
                               max_length=max_length, support=support, w=w, traj_col=traj_col, user_col=user_col,
                               cells_col=cells_col, user=user)


__all__ = ["Batches", "InMemory", "Cleaned", "Source", "as_batches", "clean", "concat", "read_points", "route",
           "noisy_count", "transitions", "count_release", "transitions_release", "relation", "checked_user",
           "count_query", "sequences_query", "PointSource", "to_lists", "from_lists", "bound_keys",
           "n_buckets", "BUCKET_POINTS"]
