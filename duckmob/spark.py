"""Releases from a Spark DataFrame (PySpark 4), when one machine is not enough: the same release, run by Spark.

Nothing here is a second implementation. The release core (:func:`duckmob.release.fit`) runs on the driver with
its ledger in a DuckDB file; what it reads is a :class:`SparkSource`, whose :class:`SparkBatches` give a method
the same two things the out-of-core DuckDB path gives (:mod:`duckmob.source`):

* the cleaned trajectories: the DataFrame is hash-partitioned by traj_id (every partition holds whole
  trajectories) and each partition goes through ``from_points(private=True)`` in ``mapInArrow``; cleaned
  partitions are cached in the per-trajectory Arrow form of ``batches.to_lists``. Under the user unit, only the
  (traj_id, user_id) pairs of the kept trajectories reach the driver (16 bytes a trajectory), where
  ``batches.bound_keys`` draws the bounding exactly as the in-memory path does;
* ``gather(fn)``: a method's per-trajectory reduction (HRNet's stay points, clean-slate's cell visits, PateGail's
  slot fixes) runs on each partition; only its output is collected, in the in-memory order;
* ``reduce(fn)``: the method's own per-batch statistics function (for PrivTrace, ``PrivTrace._statistics``:
  integer noise-grid steps) runs on each partition in ``mapInArrow``; only those integer tables, bounded by the
  public grid and state sizes, are collected and summed on the driver, where the release core adds the noise once.

So a Spark release fits the same model as the DuckDB one on the same rows under the same seed (tests/test_spark.py).

The synthetic table is sampled on the executors (:func:`sample`): the model's stored bytes are broadcast, and a
DataFrame of block ids (``spark.range``) is turned into rows by ``mapInArrow``, each partition loading the model
once and drawing its blocks with :func:`duckmob.release.sampling.draw_block` (2,048 trajectories a block, each
block from its own stream keyed by the output's seed and the block id). Nothing of the output passes through the
driver, and the rows are those :func:`duckmob.release.sampling.blocks` draws in one process for the same model and
seed, whatever the partitioning. Pointing it at a cluster: build the SparkSession with your master
(``SparkSession.builder.master("yarn")`` or ``spark://...``); duckmob and its dependencies must be installed on the
executors (the statistics functions are shipped by cloudpickle and import duckmob there). See docs/scale.md.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa

from duckmob import release
from duckmob.source import PointSource
from duckmob.source import batches as source_batches
from duckmob.source.schema import Mapping, check_points
from duckmob.errors import DuckmobError
from duckmob.release import fitting, sampling
from duckmob.trajectories import Trajectories, from_points, synthetic_table

_SUMS_SCHEMA = "name string, sums binary"
# the synthetic table (duckmob.trajectories.synthetic_table) as Spark types: its ts is a zone-less timestamp
_ROWS_DDL = "traj_id long, seq long, lat double, lon double, ts timestamp_ntz"
# source_batches.to_lists' columns as Spark types (Spark's arrays are Arrow lists with 32-bit offsets)
_LISTS_DDL = "traj_id long, user_id long, ts array<long>, lat array<double>, lon array<double>"
_LISTS32 = pa.schema([("traj_id", pa.int64()), ("user_id", pa.int64()), ("ts", pa.list_(pa.int64())),
                      ("lat", pa.list_(pa.float64())), ("lon", pa.list_(pa.float64()))])


# Spark's simple type names as DuckDB spells them, for the schema check shared by every input path
_SPARK_TYPES = {"tinyint": "TINYINT", "smallint": "SMALLINT", "int": "INTEGER", "bigint": "BIGINT",
                "float": "FLOAT", "double": "DOUBLE", "timestamp": "TIMESTAMP", "timestamp_ntz": "TIMESTAMP",
                "date": "DATE", "void": "NULL"}


def _duckdb_type(spark_type: str) -> str:
    if spark_type.startswith("decimal"):   # scale 0: Spark's integers beyond bigint (try_cast makes those NULL)
        return "HUGEINT" if spark_type.replace(" ", "").endswith(",0)") else "DECIMAL"
    return _SPARK_TYPES.get(spark_type, spark_type.upper())


def _columns(df, m: Mapping) -> dict[str, str | None]:
    """The DataFrame's own column names for the contract's columns (case-insensitive; None for a missing user
    column); a missing required column is refused naming the mapping parameter (schema, not data)."""
    from duckmob.source.schema import resolve_columns

    return resolve_columns(list(df.columns), m, what=("traj_id", "user_id", "ts", "lat", "lon"))


def check(df, m: Mapping) -> bool:
    """The schema check of :mod:`duckmob.source.schema` on the DataFrame's schema (no row is read); returns whether
    it has a user column."""
    names = _columns(df, m)
    kinds = dict(df.dtypes)
    return check_points({col: _duckdb_type(kinds[src]) if src is not None else None for col, src in names.items()}, m)


def _points(df, m: Mapping):
    """The contract's columns from a DataFrame, every value converted with try_cast (NULL when it cannot be: the
    cleaning drops that point; an ANSI cast would quote the value in its error). The user column whenever the
    DataFrame has one: a trajectory is the pair (user_id, traj_id) under both units."""
    from pyspark.sql import functions as F

    names = _columns(df, m)

    def cast(col: str, kind: str):
        return F.expr(f"try_cast(`{names[col].replace('`', '``')}` AS {kind})")

    user = cast("user_id", "bigint") if names["user_id"] is not None else F.lit(None).cast("long")
    # a zone-less timestamp passes as it is (DuckDB's TIMESTAMP); one with the session's zone as epoch µs (UTC), so
    # no clock change can reorder a trajectory's points
    kind = dict(df.dtypes).get(names["ts"])
    ts = F.unix_micros(F.col(names["ts"])) if kind == "timestamp" else cast("ts", "timestamp_ntz")
    return df.select(cast("traj_id", "bigint").alias("traj_id"), user.alias("user_id"), ts.alias("ts"),
                     cast("lat", "double").alias("lat"), cast("lon", "double").alias("lon"))


def _cleaner(bbox, time_required: bool):
    def clean(batches):
        table = pa.Table.from_batches(list(batches))
        data, _ = from_points(table, bbox=bbox, outside="drop", time_required=time_required, private=True)
        yield from source_batches.to_lists(data).cast(_LISTS32).to_batches()
    return clean


def _kept(data: Trajectories, keys) -> Trajectories:
    """The trajectories of ``data`` whose (traj_id, user_id) is among the sorted ``keys`` (a structured array)."""
    if keys is None or data.n_trajectories == 0:
        return data
    mine = np.rec.fromarrays([data.traj_id, data.user_id], names="t,u")
    pos = np.minimum(np.searchsorted(keys, mine), max(len(keys) - 1, 0))
    return data.take(keys[pos] == mine if len(keys) else np.zeros(data.n_trajectories, dtype=bool))


class SparkBatches(source_batches.Batches):
    """Cleaned trajectories cached in Spark; :meth:`reduce` runs a statistics function on every partition and sums
    the integer tables it returns on the driver."""

    def __init__(self, cleaned, keys, n_trajectories: int):
        self.cleaned, self.keys, self.n_trajectories = cleaned, keys, int(n_trajectories)

    def reduce(self, fn: Callable[[Trajectories], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        keys = self.keys

        def partition(batches):
            data = _kept(source_batches.from_lists(pa.Table.from_batches(list(batches), schema=_LISTS32)), keys)
            out = fn(data)
            yield pa.RecordBatch.from_pydict({"name": list(out),
                                              "sums": [np.asarray(v, dtype=np.int64).tobytes() for v in out.values()]})

        total = {k: np.asarray(v, dtype=np.int64).copy() for k, v in fn(Trajectories.empty()).items()}
        rows = self.cleaned.mapInArrow(partition, _SUMS_SCHEMA).toArrow()
        for name, blob in zip(rows.column("name").to_pylist(), rows.column("sums").to_pylist()):
            total[name] += np.frombuffer(blob, dtype=np.int64)
        return total

    def gather(self, fn: Callable[[Trajectories], Trajectories]) -> Trajectories:
        """``fn`` (a per-trajectory reduction: a method's stay points, cell visits, slot fixes) runs on every
        partition in ``mapInArrow``; only its output reaches the driver, in the in-memory order."""
        keys = self.keys

        def partition(batches):
            data = _kept(source_batches.from_lists(pa.Table.from_batches(list(batches), schema=_LISTS32)), keys)
            yield from source_batches.to_lists(fn(data)).cast(_LISTS32).to_batches()

        return source_batches.in_order(source_batches.from_lists(self.cleaned.mapInArrow(partition, _LISTS_DDL).toArrow()))

    def __iter__(self):
        """Every kept trajectory on the driver, as one batch (what iterating gives: O(points))."""
        yield _kept(source_batches.from_lists(self.cleaned.toArrow()), self.keys)

    def close(self) -> None:
        self.cleaned.unpersist()


class SparkSource(PointSource):
    """A Spark DataFrame of points read by the release core, after its reservation, in ``partitions`` hash
    partitions of traj_id (default: four per core of the session)."""

    def __init__(self, df, *, partitions: int | None = None, traj_col="traj_id", ts_col="ts", lat_col="lat",
                 lon_col="lon", user_col="user_id"):
        self.df, self.partitions = df, partitions
        self.mapping = Mapping.of(traj_col=traj_col, ts_col=ts_col, lat_col=lat_col, lon_col=lon_col,
                                  user_col=user_col)
        self.has_user = check(df, self.mapping)   # the schema, before any reservation
        self._batches = None

    def batches(self, *, bbox, time_required, unit, rng) -> SparkBatches:
        from pyspark import StorageLevel

        spark = self.df.sparkSession
        n = self.partitions or 4 * spark.sparkContext.defaultParallelism
        points = _points(self.df, self.mapping).repartition(n, "traj_id")
        cleaned = points.mapInArrow(_cleaner(bbox, time_required), _LISTS_DDL).persist(
            StorageLevel.MEMORY_AND_DISK)
        ids = cleaned.select("traj_id", "user_id").toArrow()
        traj = ids.column("traj_id").to_numpy()
        user = ids.column("user_id").to_numpy()
        keys = None
        n_kept = len(traj)
        if unit.is_user:
            keep = source_batches.bound_keys(traj, user, unit.max_trajectories_per_user, rng())
            keys = np.sort(np.rec.fromarrays([traj[keep], user[keep]], names="t,u"))
            n_kept = int(keep.sum())
        self._batches = SparkBatches(cleaned, keys, n_kept)
        return self._batches

    def close(self) -> None:
        if self._batches is not None:
            self._batches.close()
            self._batches = None


def _ledger(ledger: str):
    import duckdb

    from duckmob.sql import register

    con = duckdb.connect(ledger)
    register(con)
    return con


def set_budget(ledger: str, source: str, eps: float, delta: float) -> dict:
    """Declare or raise the budget of ``source`` (a name for the Spark table) in the DuckDB ledger file."""
    con = _ledger(ledger)
    try:
        return release.set_budget(release.database(con), source, eps, delta)
    finally:
        con.close()


def sample(spark, model, n: int | None, seed: np.random.SeedSequence, *, partitions: int | None = None,
           max_rows: int | None = None):
    """``n`` trajectories of ``model`` (None: its noisy count, :func:`duckmob.release.fitting.default_size`) as a
    Spark DataFrame (traj_id, seq, lat, lon, ts) sampled on the executors: free post-processing of the model. n and
    the output's size are checked on the driver as the release core checks them (:func:`fitting.output`: refused,
    before any Spark job, when the output could have more than ``max_rows`` rows).

    The output's blocks of :data:`~duckmob.release.sampling.BLOCK` trajectories are spread over ``partitions``
    partitions (default: at most four per core of the session, never more than the blocks); each partition reads the
    broadcast model once and draws its blocks, block ``b`` from its own stream ``block_generator(seed, b)``. So the
    rows equal those of :func:`duckmob.release.sampling.blocks` for the same model, n and seed (sorted by traj_id,
    seq), and no partition holds more than one block's rows in Python at a time. Lazy, as any DataFrame: the
    blocks are drawn when an action (write, count) runs, again at each action (the same rows each time)."""
    n = fitting.output(model, n, seed, max_rows).n   # the core's n and size checks; its rows are drawn below
    blocks = sampling.n_blocks(n)
    if partitions is None:
        partitions = 4 * spark.sparkContext.defaultParallelism
    partitions = max(1, min(int(partitions), blocks))
    stored = spark.sparkContext.broadcast(model.to_bytes())
    load, method = type(model).from_bytes, model.stored_method()
    entropy, spawn_key = seed.entropy, tuple(seed.spawn_key)   # a SeedSequence travels as these two

    def draw(batches):
        here = load(stored.value, method)
        out_seed = np.random.SeedSequence(entropy, spawn_key=spawn_key)
        for batch in batches:
            for block in batch.column(0).to_numpy():
                yield from synthetic_table(sampling.draw_block(here, n, out_seed, int(block))).to_batches()

    return spark.range(blocks, numPartitions=partitions).mapInArrow(draw, _ROWS_DDL)


@release.interrupts.entered()   # Ctrl-C from the first moment
def synthesize(df, *, source: str, ledger: str, eps, method: str = "privtrace", delta=None, bbox=None, n=None,
               seed=None, privacy_unit: str = "trajectory", max_trajectories_per_user=None, params=None,
               max_rows=None, partitions: int | None = None, output_partitions: int | None = None,
               traj_col="traj_id", ts_col="ts", lat_col="lat", lon_col="lon", user_col="user_id", **method_params):
    """``synthesize`` on a Spark DataFrame: fit + sample, one spend of ``source``'s budget recorded in the DuckDB
    file ``ledger`` (declare it first with :func:`set_budget`); returns the synthetic table as a Spark DataFrame
    (traj_id, seq, lat, lon, ts) sampled on the executors (:func:`sample`, in ``output_partitions`` partitions).
    Arguments as the SQL macro's (``max_rows`` too: an explicit n is checked before the reservation); ``source`` is
    the name the ledger records; ``partitions`` are the input's."""
    from duckmob import synth

    con = _ledger(ledger)
    try:
        db = release.database(con)
        r = release.fit_request(source=source, eps=eps, delta=delta, method=method, bbox=bbox,
                                privacy_unit=privacy_unit, max_trajectories_per_user=max_trajectories_per_user,
                                params={**synth.parse_params(params), **method_params}, seed=seed, n=n,
                                max_rows=max_rows)
        src = SparkSource(df, partitions=partitions, traj_col=traj_col, ts_col=ts_col, lat_col=lat_col,
                          lon_col=lon_col, user_col=user_col)
        if r.unit.is_user and not src.has_user:
            raise DuckmobError(f"the DataFrame has no {user_col} column, so privacy_unit := 'user' cannot tell whose "
                               "each trajectory is: name its user column with user_col=..., or use "
                               "privacy_unit='trajectory'")
        model, _, noise = release.fit(db, r, src)
    finally:
        con.close()
    return sample(df.sparkSession, model, r.n, noise.output_seed(), partitions=output_partitions,
                  max_rows=r.max_rows)


__all__ = ["SparkSource", "SparkBatches", "sample", "synthesize", "set_budget"]
