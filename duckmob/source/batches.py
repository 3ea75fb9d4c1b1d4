"""Batches of whole trajectories: what every method's ``fit`` reads, in memory or out of core.

A :class:`Batches` holds the cleaned, contribution-bounded trajectories one batch of whole trajectories at a time;
a method reduces each batch to exact tables bounded by its public grid and state sizes (:meth:`Batches.reduce`),
and the release core adds the noise once. Memory follows the batch size and the model, not the table.

Why a release over batches equals the in-memory one, bit for bit (tests/test_stream.py):

* every cleaning step of :func:`duckmob.trajectories.from_points` acts on each trajectory by itself, so cleaning
  batches that each hold whole trajectories keeps exactly the trajectories (and points) of cleaning the table at
  once. A batch holds whole trajectories because points are routed to buckets by ``hash(traj_id)`` (every point of
  a (user_id, traj_id) trajectory has the same traj_id), in table order;
* contribution bounding (``privacy_unit := 'user'``) draws its random numbers over ALL kept trajectories in their
  (traj_id, user_id) order (:func:`bound_keys`): the ids of every batch are gathered after the cleaning pass (16
  bytes a trajectory), the keep mask is computed once and applied to each batch;
* every statistic is a sum of whole noise-grid steps (``counting.normalised_sums``), an integer, so batch sums
  add up exactly; ``counting.release_sums`` then draws the same noise in the same order.

Nor does the order of the rows: of a trajectory's points with one timestamp, the one with the smallest (lat, lon) is
kept (``from_points``), whatever DuckDB's scan order.

Cleaned buckets are kept in memory when the table fits in one, else written once to Arrow IPC files in a temporary
folder, read back a bucket at a time by each pass, and deleted when the release ends.
"""

from __future__ import annotations

import os
import shutil
from typing import Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa

from duckmob.privacy.counting import bound_contributions
from duckmob.privacy.unit import PrivacyUnit
from duckmob.trajectories import Trajectories, from_points

# batches whose statistics are computed at once by Batches.reduce (threads)
REDUCE_THREADS = max(1, min(2, os.cpu_count() or 1))


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
        heavy loops), one more queued so that no thread waits for a slower one (:func:`in_threads`); a batch
        read back from disk is memory-mapped until its thread reads it."""
        total: dict[str, np.ndarray] | None = None
        for part in in_threads(fn, self, ahead=1):
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


# to_lists' schema, written out (building it from an empty table imports pandas: 0.4 s at every start)
LISTS_SCHEMA = pa.schema([("traj_id", pa.int64()), ("user_id", pa.int64()), ("ts", pa.large_list(pa.int64())),
                          ("lat", pa.large_list(pa.float64())), ("lon", pa.large_list(pa.float64()))])


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
    # mapped, not read into memory: the arrays are views of the page cache (the mapping outlives the file's
    # removal while an array holds it)
    with pa.memory_map(bucket[0]) as source:
        return from_lists(pa.ipc.open_file(source).read_all())


def bound_keys(traj_id: np.ndarray, user_id: np.ndarray, max_trajectories_per_user: int,
               rng: np.random.Generator) -> np.ndarray:
    """Keep mask (in the given order) of the user unit's contribution bounding over trajectories listed in any
    order, drawn as the in-memory path draws it: ``counting.bound_contributions`` over them in from_points'
    (traj_id, user_id) order, so the same trajectories are kept whichever batches they came in."""
    order = np.lexsort((user_id, traj_id))
    mask = np.empty(len(order), dtype=bool)
    mask[order] = bound_contributions(user_id[order], max_trajectories_per_user, rng)
    return mask


def clean(buckets: Iterable[pa.Table], *, bbox, time_required: bool, unit: PrivacyUnit = PrivacyUnit(),
          rng: Callable[[], np.random.Generator] | None = None,
          folder: str | None = None) -> Cleaned:
    """Clean point buckets (each holding whole trajectories) with ``from_points(private=True)`` and bound
    contributions over all of them: the trajectories the in-memory release path keeps, batch by batch.

    ``rng()`` gives the generator of the contribution bounding (``NoiseSource.generator``; called once, after the
    cleaning pass, only for the user unit). With ``folder`` every bucket after the first is written there (the
    first too once a second exists) and read back per pass; without it they stay in memory.
    Privacy: a per-trajectory transformation and the same bounding as the in-memory path (at most k trajectories
    per user, chosen at random: ``unit.max_trajectories_per_user``), so the sensitivities of the mechanisms
    downstream are unchanged."""
    kept: list = []
    ids: list[tuple[np.ndarray, np.ndarray]] = []
    for bucket, traj_user in _cleaned(buckets, bbox, time_required, folder):
        if unit.is_user:
            ids.append(traj_user)
        kept.append(bucket)
        del bucket
        if len(kept) == 2 and isinstance(kept[0], Trajectories):
            # a second bucket: every bucket goes to disk, the first written here while the threads clean on
            kept[0] = _save(kept[0], folder, 0)
    keep: list[np.ndarray | None] = [None] * len(kept)
    if unit.is_user:
        traj = np.concatenate([t for t, _ in ids]) if ids else np.zeros(0, np.int64)
        user = np.concatenate([u for _, u in ids]) if ids else np.zeros(0, np.int64)
        mask = bound_keys(traj, user, unit.max_trajectories_per_user, rng())
        cuts = np.cumsum([0] + [len(t) for t, _ in ids])
        keep = [mask[a:b] for a, b in zip(cuts[:-1], cuts[1:])]
    return Cleaned(kept, keep, folder)


def _cleaned(buckets: Iterable[pa.Table], bbox, time_required: bool,
             folder: str | None) -> Iterator[tuple[Trajectories | tuple, tuple[np.ndarray, np.ndarray]]]:
    """``from_points(private=True)`` of each bucket, in bucket order, ``REDUCE_THREADS`` buckets at a time
    (threads: NumPy and Arrow release the GIL in their sorts, copies and writes); at most that many raw buckets
    held. Yields each cleaned bucket -- in memory, or with ``folder`` from the second on written there by its thread
    (``_save``: (path, trajectories)) -- and its trajectories' (traj_id, user_id)."""
    def one(item):
        i, table = item
        data = from_points(table, bbox=bbox, outside="drop", time_required=time_required, private=True)[0]
        del table
        return (data if folder is None or i == 0 else _save(data, folder, i)), (data.traj_id, data.user_id)

    return in_threads(one, enumerate(buckets), ahead=1)


def in_threads(fn: Callable, items: Iterable, ahead: int = 0) -> Iterator:
    """``fn(item)`` of each item, yielded in the items' order, on ``REDUCE_THREADS`` threads (at most that many
    running at once). ``ahead`` more items are queued: a thread that finishes while the oldest item still runs
    starts the next one rather than wait for it (items that hold little until ``fn`` runs: memory-mapped
    buckets); at most ``REDUCE_THREADS + ahead`` items and results are held at once."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(REDUCE_THREADS) as pool:
        pending: deque = deque()
        for item in items:
            pending.append(pool.submit(fn, item))
            del item
            if len(pending) >= REDUCE_THREADS + ahead:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


__all__ = ["Batches", "InMemory", "Cleaned", "as_batches", "clean", "concat", "in_order", "in_threads", "to_lists",
           "from_lists", "bound_keys", "LISTS_SCHEMA", "REDUCE_THREADS"]
