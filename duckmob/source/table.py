"""Reading a DuckDB table, view or query out of core: checked points routed to buckets of whole trajectories, and
the per-trajectory rows the counting releases read.

:func:`prepare` does everything that needs no row, before a release reserves any budget: the lineage (whose
budget it draws on, :mod:`duckmob.source.lineage`), the columns and their types (``DESCRIBE``, zero rows, checked
by :mod:`duckmob.source.schema`) and the SELECT that converts every value with TRY_CAST. After the reservation,
:class:`TableSource` reads that SELECT in record batches: one scan routes the points to ``hash(traj_id)`` buckets
(the number of buckets follows the row count; it only sets how the work is cut, and nothing of it is released),
cleaned by :func:`duckmob.source.batches.clean`. Buckets beyond the first go to Arrow IPC files in a temporary
folder (``tempfile``: set TMPDIR to put them elsewhere), deleted when the release ends.
"""

from __future__ import annotations

import atexit
import math
import os
import shutil
import sys
import tempfile
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from duckmob.grid import BBox
from duckmob.privacy.unit import PrivacyUnit
from duckmob.source import PointSource
from duckmob.source.batches import Batches, clean
from duckmob.source.lineage import Lineage, resolve
from duckmob.source.schema import Mapping, check_ids, check_points, resolve_columns, select_sql

# Points per bucket: bounds the memory of cleaning and of a method's per-batch statistics (about 100-200 bytes a
# point at the peak of a PrivTrace pass).
BUCKET_POINTS = 1 << 21
# Rows per record batch read from DuckDB while routing points to buckets.
READ_ROWS = 1 << 20
# Threads that split record batches by bucket while routing (the writes stay in the reader's order, on the thread
# that reads). One: on 2 cores a second cost CPU (2.2 -> 2.3 s for the scan of 15.3 M fixes) and no wall time
# could be shown gained beside DuckDB's own threads (docs/scale.md, "Fourth round").
ROUTE_THREADS = 1
SEQUENCE_ROWS = 1 << 13   # cell sequences per batch of mob_transitions (~1-2 M cells)


@dataclass(frozen=True)
class Prepared:
    """A relation checked for a release, before any row is read: its lineage, whether it has a user column, and
    the SELECT (TRY_CAST) the release reads after its reservation."""

    lineage: Lineage
    has_user: bool
    select: str


def prepare(con, relation: str, mapping: Mapping, *, home: str, shape: str = "points") -> Prepared:
    """Check ``relation`` on ``con`` for a release whose ledger is kept in database ``home`` (schema and plan only:
    no row is read). ``shape``: 'points' (a points table), 'ids' (one row per trajectory: traj_id, user_id) or
    'sequences' (traj_id, user_id, cells)."""
    lineage = resolve(con, relation, home)
    described = con.execute(f"DESCRIBE SELECT * FROM {relation}").fetchall()
    columns = [r[0] for r in described]
    what = {"points": ("traj_id", "user_id", "ts", "lat", "lon", "seq"), "ids": ("traj_id", "user_id"),
            "sequences": ("traj_id", "user_id", "cells")}[shape]
    names = resolve_columns(columns, mapping, what=what)
    by_name = {r[0]: str(r[1]) for r in described}
    types = {col: (by_name[src] if src is not None else None) for col, src in names.items()}
    has_user = check_points(types, mapping) if shape == "points" else check_ids(types, mapping)
    return Prepared(lineage, has_user, select_sql(relation, names))


def n_buckets(n_points: int, bucket_points: int = BUCKET_POINTS) -> int:
    """Buckets for ``n_points`` points: about ``bucket_points`` each (a public tuning, not a statistic)."""
    return max(1, math.ceil(n_points / bucket_points))


def route(reader: pa.RecordBatchReader, n: int, folder: str | None,
          on_version: Callable[[tuple[int, int]], None] | None = None) -> Iterator[pa.Table]:
    """Points routed to ``n`` buckets by their ``_bucket`` column (dropped), each bucket in table order; with one
    bucket the reader is read whole, otherwise each bucket goes to an IPC file in ``folder`` and is yielded (then
    deleted) one at a time.

    With ``on_version`` every row also has its ``_row_hash`` (dropped), and ``on_version`` gets the count of the
    rows and the sum of their hashes (:func:`content_version` of what the reader gives) once the scan is over,
    before the first bucket is yielded. While DuckDB makes the next record batches, ``ROUTE_THREADS`` threads
    split the batches already read (:func:`_split`: hash sums, the stable order by bucket, the gather); the splits
    are written in the reader's order, so each bucket keeps table order whatever the threads."""
    names = [f.name for f in reader.schema if f.name not in ("_bucket", "_row_hash")]
    version = _Version()
    if n == 1:
        table = reader.read_all()
        if on_version is not None:
            version.add(table)
            on_version(version.value())
        yield table.select(names)
        return
    schema = pa.schema([reader.schema.field(c) for c in names])
    paths = [os.path.join(folder, f"raw-{i}.arrow") for i in range(n)]
    sinks = [pa.OSFile(p, "wb") for p in paths]
    writers = [pa.ipc.new_file(s, schema) for s in sinks]

    def write(split: tuple[pa.RecordBatch, np.ndarray, tuple[int, int] | None]) -> None:
        routed, counts, part = split
        if part is not None:
            version.n, version.total = version.n + part[0], version.total + part[1]
        start = 0
        for i in np.flatnonzero(counts):
            writers[i].write_batch(routed.slice(start, int(counts[i])))
            start += int(counts[i])

    try:
        with ThreadPoolExecutor(ROUTE_THREADS) as pool:
            pending: deque = deque()
            for batch in reader:
                pending.append(pool.submit(_split, batch, names, n, on_version is not None))
                del batch
                if len(pending) > ROUTE_THREADS:
                    write(pending.popleft().result())
            while pending:
                write(pending.popleft().result())
    finally:
        for w, s in zip(writers, sinks):
            w.close()
            s.close()
    if on_version is not None:
        on_version(version.value())
    for p in paths:
        # mapped, not copied here: from_points copies each column into one chunk on the thread that cleans the
        # bucket (this loop is serial; the copies then run two at a time). The mapping outlives the closed file
        # and its removal while the table holds it
        with pa.memory_map(p) as source:
            table = pa.ipc.open_file(source).read_all()
        os.remove(p)
        yield table


def _split(batch: pa.RecordBatch, names: list[str], n: int, hashed: bool):
    """One record batch of :func:`route` on a thread: its rows in bucket order (stable: on 16-bit keys NumPy's
    stable sort is a radix sort), the rows per bucket, and (``hashed``) its rows' count and hash sum."""
    b = batch.column("_bucket").to_numpy(zero_copy_only=False)
    order = np.argsort(b.astype(np.int16) if n <= np.iinfo(np.int16).max else b, kind="stable")
    counts = np.bincount(b, minlength=n)
    part = _hash_sum(batch.column("_row_hash")) if hashed else None
    return pc.take(batch.select(names), pa.array(order), boundscheck=False), counts, part   # a permutation


def _hash_sum(column: pa.Array) -> tuple[int, int]:
    """(rows, the exact sum of their unsigned 64-bit hashes): the 32-bit halves summed apart in uint64 (no overflow
    below 2^32 rows), read through a view (no temporary array)."""
    h = column.to_numpy(zero_copy_only=False).astype(np.uint64, copy=False)
    halves = h.view(np.uint32).reshape(-1, 2)
    low, high = (0, 1) if sys.byteorder == "little" else (1, 0)
    return len(h), (int(np.sum(halves[:, high], dtype=np.uint64)) << 32) + \
        int(np.sum(halves[:, low], dtype=np.uint64))


class _Version:
    """:func:`content_version` summed over record batches that carry ``_row_hash``: the count and the exact sum of
    the unsigned 64-bit hashes (as DuckDB's HUGEINT sum), whatever the batches."""

    def __init__(self) -> None:
        self.n, self.total = 0, 0

    def add(self, batch) -> None:
        h = batch.column("_row_hash")
        n, total = _hash_sum(h.combine_chunks() if isinstance(h, pa.ChunkedArray) else h)
        self.n, self.total = self.n + n, self.total + total

    def value(self) -> tuple[int, int]:
        return self.n, self.total


def read_points(cur, query: str, *, bucket_points: int = BUCKET_POINTS, folder: str | None = None,
                bbox=None, time_required: bool = False,
                on_version: Callable[[tuple[int, int]], None] | None = None) -> Iterator[pa.Table]:
    """Point tables of whole trajectories from ``query`` (the contract's columns traj_id, user_id, ts, lat, lon,
    seq: :func:`prepare`), read by DuckDB on the cursor ``cur`` in record batches: one scan routes the points to
    ``hash(traj_id)`` buckets of about ``bucket_points`` points each (the number of buckets follows the row count;
    it only sets how the work is cut, and nothing of it is released). ``seq`` is carried whenever a row has no
    timestamp: a trajectory without time is then ordered by its own seq, as in memory (a trajectory's order never
    depends on the other rows; when every row has a ts, seq is never used and not read).

    The scan already drops the points that ``from_points(private=True)`` drops one by one before anything else
    (:func:`point_filter`), so they are neither routed nor written; the cleaning that follows is unchanged.

    ``on_version``: called with ``content_version(cur, query, where=point_filter(bbox, time_required))``, the
    version of the rows this scan keeps, computed in the same scan (a hash per row), so a release that needs the
    version of what it read (the repeated-request cache, :mod:`duckmob.release.tables`) needs no second scan.
    Never released."""
    n_rows, n_ts = cur.sql(f"SELECT count(*), count(ts) FROM ({query})").fetchall()[0]
    n = n_buckets(int(n_rows), bucket_points)
    if n > 1 and folder is None:
        raise ValueError("several buckets need a folder")
    seq = ", seq" if n_ts < n_rows else ""
    bucket = f"(hash(traj_id) % {n})::{'SMALLINT' if n <= np.iinfo(np.int16).max else 'BIGINT'} AS _bucket"
    row_hash = ", hash(q) AS _row_hash" if on_version is not None else ""
    sql = (f"SELECT traj_id, user_id, ts, lat, lon{seq}, {bucket}{row_hash} FROM ({query}) q "
           f"WHERE {point_filter(bbox, time_required)}")
    yield from route(cur.sql(sql).to_arrow_reader(batch_size=READ_ROWS), n, folder, on_version)


def point_filter(bbox, time_required: bool) -> str:
    """SQL true exactly for the points that steps 1 and 2 of ``from_points(private=True)`` keep, each point on its
    own: a traj_id, a lat and a lon that are neither NULL nor NaN, within [-90, 90] and [-180, 180] and inside the
    public ``bbox`` (edges included; None: no bbox), and a ts when ``time_required``. DuckDB orders NaN above every
    number, so BETWEEN is false on NaN as on NULL; the bounds are the bbox's float64 values written exactly
    (``repr`` round-trips and DuckDB's string-to-DOUBLE rounds correctly). A per-point transformation of public
    parameters: what the later cleaning and every release see is unchanged."""
    lat, lon = (-90.0, 90.0), (-180.0, 180.0)
    if bbox is not None:
        box = BBox.of(bbox)
        lat, lon = (box.min_lat, box.max_lat), (box.min_lon, box.max_lon)

    def between(col, lo, hi):
        return f"{col} BETWEEN '{float(lo)!r}'::DOUBLE AND '{float(hi)!r}'::DOUBLE"

    ts = " AND ts IS NOT NULL" if time_required else ""
    return f"traj_id IS NOT NULL AND {between('lat', *lat)} AND {between('lon', *lon)}{ts}"


class TableSource(PointSource):
    """A checked relation read out of core by the release core after its reservation (``Release.read``):
    :meth:`batches` reads and cleans the points (:func:`read_points`, :func:`duckmob.source.batches.clean`) and
    bounds contributions. Holds the temporary folder until :meth:`close`.

    ``con`` is the connection the SELECT runs on (the caller's, or a cursor the release opened: ``owned`` ones are
    closed after); ``select`` gives the contract's columns (:func:`prepare`)."""

    def __init__(self, con, select: str, *, owned: bool = False, bucket_points: int | None = None):
        self.con, self.query, self.owned, self.bucket_points = con, select, owned, bucket_points
        self.folder: str | None = None
        self.versioned = False
        self.version: tuple[int, int] | None = None
        self.where = "TRUE"

    def track_version(self) -> None:
        """Compute the :func:`content_version` of the rows read in the scan that reads them (:func:`read_points`):
        :attr:`version` is set once they are read, ``content_version(con, query, where)`` with :attr:`where` the
        point filter applied. For the repeated-request cache of a first release, which then needs no scan of its
        own."""
        self.versioned = True

    def _set_version(self, version: tuple[int, int]) -> None:
        self.version = version

    def batches(self, *, bbox, time_required, unit, rng) -> Batches:
        return clean(self.open(bbox=bbox, time_required=time_required), bbox=bbox, time_required=time_required,
                     unit=unit, rng=rng, folder=self.folder)

    def open(self, *, bbox=None, time_required: bool = False) -> Iterator[pa.Table]:
        self.folder = tempfile.mkdtemp(prefix="duckmob-")
        _FOLDERS.add(self.folder)
        self.where = point_filter(bbox, time_required)   # the rows :attr:`version` counts
        return read_points(self.con, self.query, bucket_points=self.bucket_points or BUCKET_POINTS,
                           folder=self.folder, bbox=bbox, time_required=time_required,
                           on_version=self._set_version if self.versioned else None)

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




# -- what a release would read, as a version ---------------------------------------------------------------------

def content_version(cur, select: str, where: str = "TRUE") -> tuple[int, int]:
    """A version of the rows ``select`` gives (the contract's columns of a relation, as a release reads them):
    (row count, sum of DuckDB's row hashes). Order-free, and changed by any write to what the release reads (a DROP
    and CREATE, INSERT, DELETE, UPDATE; another connection's temporary table of the same name with other rows),
    barring a 2^-64 collision. It only decides whether a repeated request is the same release
    (:mod:`duckmob.release.tables`): it is never released, and a changed table always gets a new, charged release.
    One scan with a hash per row (15 M points: about 0.4 s). ``where``: only the rows it keeps (the point filter
    of a release whose output depends on those rows alone, :func:`point_filter`); a first release gets that
    version from the scan that reads its rows (:func:`read_points` with ``on_version``)."""
    n, total = cur.sql(f"SELECT count(*), coalesce(sum(hash(q)::HUGEINT), 0) FROM ({select}) q "
                       f"WHERE {where}").fetchall()[0]
    return int(n), int(total)


def table_version(table: pa.Table) -> tuple[int, int]:
    """:func:`content_version` of rows gathered in memory."""
    return _in_memory(table, content_version)


def _in_memory(table: pa.Table, query: Callable):
    """``query(con, select)`` on an in-process DuckDB that scans ``table`` as ``select``: the SQL of the
    out-of-core path run on rows gathered in memory."""
    import duckdb

    with duckdb.connect() as con:
        con.register("gathered_rows", table)
        return query(con, "SELECT * FROM gathered_rows")


# -- the per-trajectory rows of the counting releases -------------------------------------------------------------

def count_query(select: str, *, what: str, unit: PrivacyUnit) -> str:
    """The exact count mob_noisy_count noises, as one DuckDB aggregate over ``select`` (:func:`prepare`, shape
    'ids': values already TRY_CAST), equal to what :func:`pair_count` counts in memory: the distinct (traj_id,
    user_id) pairs with a traj_id (a NULL user is -1, no user); 'users': distinct user ids >= 0; the user unit: per
    user id >= 0, min(trajectories, max_trajectories_per_user), which is how many ``counting.bound_contributions``
    keeps whichever it keeps. ``what`` and ``unit`` are the release's validated public arguments."""
    pairs = (f"SELECT DISTINCT traj_id, coalesce(user_id, -1) AS user_id FROM ({select}) "
             f"WHERE traj_id IS NOT NULL")
    if what == "users":
        return f"SELECT count(DISTINCT user_id) FILTER (WHERE user_id >= 0) FROM ({pairs})"
    if unit.is_user:
        return (f"SELECT coalesce(sum(least(n, {int(unit.max_trajectories_per_user)})), 0)::BIGINT FROM "
                f"(SELECT user_id, count(*) AS n FROM ({pairs}) WHERE user_id >= 0 GROUP BY user_id)")
    return f"SELECT count(*) FROM ({pairs})"


def pair_count(traj_id: np.ndarray, user_id: np.ndarray, *, what: str, unit: PrivacyUnit) -> int:
    """:func:`count_query` on pairs in memory (``traj_id`` -1 or below: no id, not counted; ``user_id`` -1: no
    user)."""
    ok = traj_id >= 0
    pairs = np.unique(np.stack([traj_id[ok], user_id[ok]], axis=1), axis=0) if ok.any() else np.zeros((0, 2), int)
    users = pairs[:, 1]
    if what == "users":
        return int(np.unique(users[users >= 0]).size)
    if unit.is_user:
        _, n = np.unique(users[users >= 0], return_counts=True)
        return int(np.minimum(n, unit.max_trajectories_per_user).sum())
    return int(len(pairs))


def sequences_query(select: str, privacy_unit: str) -> str:
    """The cell sequences of ``select`` (:func:`prepare`, shape 'sequences'), one row per trajectory.

    A trajectory is its (user_id, traj_id) key, however many rows hold it: the rows of one key are read as ONE
    sequence, their cells concatenated in the order of the rows' own values (lists compared element by element),
    so every mechanism normalises per key and one trajectory adds mass 1 whatever it is stored as (50 rows of one
    key are one trajectory, not 50). Rows without a traj_id belong to no trajectory and are dropped, as on the
    points path. Under the user unit the sequences come ordered by (traj_id, user_id), the order
    :func:`sequence_arrays` gives them in memory (only the user unit's random choice depends on the order; the sums
    do not)."""
    grouped = (f"SELECT traj_id, user_id, flatten(list(cells ORDER BY cells)) AS cells FROM ({select}) "
               "WHERE traj_id IS NOT NULL GROUP BY traj_id, user_id")
    return f"{grouped} ORDER BY traj_id, coalesce(user_id, -1)" if privacy_unit == "user" else grouped


def grouped_sequences(rows: pa.StructArray | None) -> pa.StructArray | None:
    """Gathered (traj_id, user_id, cells) rows grouped as :func:`sequences_query` groups a table's: one row per
    (user_id, traj_id) key (computed by an in-process DuckDB over the rows, the same SQL as out of core)."""
    if rows is None or len(rows) == 0:
        return rows
    table = pa.Table.from_struct_array(rows.filter(pc.is_valid(rows)) if rows.null_count else rows)
    out = _in_memory(table, lambda con, select: con.sql(sequences_query(select, "user")).to_arrow_table())
    return pa.StructArray.from_arrays([out.column(c).combine_chunks() for c in out.column_names],
                                      names=out.column_names)


def sequence_arrays(seqs: pa.StructArray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets, cells, user_id) of (traj_id, user_id, cells) rows; NULL users -> -1. A sequence holding a NULL cell
    is dropped whole (a per-trajectory transformation: nothing is refused on the data)."""
    if seqs is None or len(seqs) == 0 or seqs.null_count == len(seqs):
        return np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    seqs = seqs.filter(pc.is_valid(seqs))
    lists = seqs.field("cells")
    flat_valid = pc.is_valid(pc.list_flatten(lists.fill_null([]) if lists.null_count else lists))
    lengths = np.nan_to_num(pc.list_value_length(lists).to_numpy(zero_copy_only=False)).astype(np.int64)
    owner = np.repeat(np.arange(len(lengths)), lengths)
    bad = np.bincount(owner[~flat_valid.to_numpy(zero_copy_only=False)], minlength=len(lengths)) > 0
    seqs = seqs.filter(pa.array(~bad))
    order = np.argsort(seqs.field("traj_id").fill_null(-1).to_numpy(zero_copy_only=False), kind="stable")
    seqs = seqs.take(pa.array(order))
    lists = seqs.field("cells")
    lengths = np.nan_to_num(pc.list_value_length(lists).to_numpy(zero_copy_only=False)).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    cells = pc.list_flatten(lists).to_numpy(zero_copy_only=False).astype(np.int64)
    user_id = np.asarray(seqs.field("user_id").fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)
    return offsets, cells, user_id


def read_sequences(cur, select: str, privacy_unit: str) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(offsets, cells, user_id) batches of ``SEQUENCE_ROWS`` whole sequences of ``select``, read on ``cur``."""
    for rb in cur.sql(sequences_query(select, privacy_unit)).to_arrow_reader(batch_size=SEQUENCE_ROWS):
        yield sequence_arrays(pa.StructArray.from_arrays(rb.columns, names=rb.schema.names))


__all__ = ["Prepared", "prepare", "TableSource", "read_points", "point_filter", "route", "n_buckets", "count_query",
           "pair_count", "sequences_query", "grouped_sequences", "sequence_arrays", "read_sequences", "content_version",
           "table_version", "BUCKET_POINTS", "READ_ROWS", "SEQUENCE_ROWS"]
