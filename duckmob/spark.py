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
The points carry ``seq`` (NULL where the DataFrame has none), as on DuckDB: a trajectory without any ts is ordered
by its own seq, whatever the other trajectories hold.

Whose budget (:func:`budget_keys`): the data the DataFrame's plan reads, never a name the caller types. Each file
it reads (a path read, a catalog table, a view over either) is a key: ``file:`` and its real path for a local file,
exactly as DuckDB's releases key the files a view reads (so both engines draw on one budget in one ledger), its URI
(``s3a://bucket/trips/part-0.parquet``) for other storage; a catalog table without files is
``catalog.database.table`` in lower case. So ``spark.table('TRIPS')``, ``spark.table('default.trips')``, a
temporary view over it and ``spark.read.parquet`` of its folder resolve to the same keys, and a release draws on
each one's budget (the ledger's rule for several base tables: it fits only if it fits every one). New files (an
append) have no budget until one is declared for them. :func:`set_budget` takes a DataFrame or a table name Spark
resolves, and refuses one it cannot resolve. A DataFrame whose rows are built on the driver (no file, no catalog table) is
refused: write it out first.

Stability (:func:`_stability`): a plan that only filters, projects, renames, casts, sorts or repartitions keeps one
row one row. A join (other than a semi or anti join against constants), union, generator (explode), aggregate,
window, limit, sample or subquery is refused, naming the operator, unless the caller declares ``stability=s`` (an
int >= 1, public): the release core then runs the method at eps / s and charges its event grouped by s.

Before anything is reserved, :func:`check_workers` runs one tiny job: the workers' python must import duckmob (of
the driver's version); if not, the release is refused in one line saying how to fix it. PySpark started from a
plain ``python`` ignores ``spark.pyspark.python`` (it reads ``PYSPARK_PYTHON``, else runs ``python3`` from PATH);
this module applies that setting, so ``spark.pyspark.python = sys.executable`` works from an unactivated venv.

The synthetic table is sampled on the executors (:func:`sample`): the model's stored bytes are broadcast, and a
DataFrame of block ids (``spark.range``) is turned into rows by ``mapInArrow``, each partition loading the model
once and drawing its blocks with :func:`duckmob.release.sampling.draw_block` (2,048 trajectories a block, each
block from its own stream keyed by the output's seed and the block id). Nothing of the output passes through the
driver, and the rows are those :func:`duckmob.release.sampling.blocks` draws in one process for the same model and
seed, whatever the partitioning. Pointing it at a cluster: build the SparkSession with your master
(``SparkSession.builder.master("yarn")`` or ``spark://...``); duckmob and its dependencies must be installed on the
executors (the statistics functions are shipped by cloudpickle and import duckmob there; :func:`check_workers`).
See docs/scale.md.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np
import pyarrow as pa

from duckmob import release, validators
from duckmob.source import PointSource
from duckmob.source import batches as source_batches
from duckmob.source.schema import Mapping, check_points
from duckmob.errors import DuckmobError
from duckmob.privacy.unit import no_user_column
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
    """The DataFrame's own column names for the contract's columns (case-insensitive; None for a missing user or
    seq column); a missing required column is refused naming the mapping parameter (schema, not data)."""
    from duckmob.source.schema import resolve_columns

    return resolve_columns(list(df.columns), m, what=("traj_id", "user_id", "ts", "lat", "lon", "seq"))


def check(df, m: Mapping) -> bool:
    """The schema check of :mod:`duckmob.source.schema` on the DataFrame's schema (no row is read); returns whether
    it has a user column."""
    names = _columns(df, m)
    kinds = dict(df.dtypes)
    return check_points({col: _duckdb_type(kinds[src]) if src is not None else None for col, src in names.items()}, m)


def _points(df, m: Mapping):
    """The contract's columns from a DataFrame, every value converted with try_cast (NULL when it cannot be: the
    cleaning drops that point; an ANSI cast would quote the value in its error). The user column whenever the
    DataFrame has one: a trajectory is the pair (user_id, traj_id) under both units. ``seq`` always, NULL where the
    DataFrame has none (as every DuckDB path passes it): ``from_points`` orders a trajectory without any ts by its
    own seq, so the same rows give the same release on Spark and on DuckDB."""
    from pyspark.sql import functions as F

    names = _columns(df, m)

    def cast(col: str, kind: str):
        return F.expr(f"try_cast(`{names[col].replace('`', '``')}` AS {kind})")

    user = cast("user_id", "bigint") if names["user_id"] is not None else F.lit(None).cast("long")
    seq = cast("seq", "bigint") if names["seq"] is not None else F.lit(None).cast("long")
    # a zone-less timestamp passes as it is (DuckDB's TIMESTAMP); one with the session's zone as epoch µs (UTC), so
    # no clock change can reorder a trajectory's points
    kind = dict(df.dtypes).get(names["ts"])
    ts = F.unix_micros(F.col(names["ts"])) if kind == "timestamp" else cast("ts", "timestamp_ntz")
    return df.select(cast("traj_id", "bigint").alias("traj_id"), user.alias("user_id"), ts.alias("ts"),
                     cast("lat", "double").alias("lat"), cast("lon", "double").alias("lon"), seq.alias("seq"))


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
                 lon_col="lon", user_col="user_id", seq_col="seq"):
        self.df, self.partitions = df, partitions
        self.mapping = Mapping.of(traj_col=traj_col, ts_col=ts_col, lat_col=lat_col, lon_col=lon_col,
                                  user_col=user_col, seq_col=seq_col)
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


# -- whose budget: the data the DataFrame's plan reads ------------------------------------------------------------

# analyzed-plan nodes that keep each row of their input as at most one row of their output, which depends on that
# row alone (stability 1): filters, projections (renames, casts), aliases, views, hints, sorts and repartitions
_STABLE = {"Project", "Filter", "SubqueryAlias", "View", "ResolvedHint", "Sort", "Repartition",
           "RepartitionByExpression", "RebalancePartitions", "WithCTE", "CTERelationDef"}
# leaves whose rows come from elsewhere in the same plan (a WITH clause's definition, walked on its own)
_ELSEWHERE = {"CTERelationRef"}
# leaves whose rows are public constants, not data (spark.range, literal rows, createDataFrame): no budget
_PUBLIC = {"Range", "OneRowRelation", "LocalRelation"}
# leaves that read data: each resolves to budget keys (_leaf_keys)
_DATA = {"LogicalRelation", "HiveTableRelation", "DataSourceV2Relation", "DataSourceV2ScanRelation"}


def _seq(scala_seq) -> list:
    return [scala_seq.apply(i) for i in range(scala_seq.size())]


def _walk(node):
    """Every node of a logical plan, its subqueries' plans included."""
    yield node
    for child in _seq(node.children()):
        yield from _walk(child)
    for sub in _seq(node.subqueries()):
        yield from _walk(sub)


def _file_key(uri: str) -> str:
    """The budget key of one file: ``file:`` and its real path for a local file (links and ``..`` resolved, as
    DuckDB's releases key the files a view reads, :mod:`duckmob.source.lineage`), its URI for other storage. A key
    holding ', ' is quoted (the ledger's list separator)."""
    import os
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(uri)
    key = "file:" + os.path.realpath(unquote(parts.path)) if parts.scheme in ("", "file") else uri
    return f'"{key}"' if ", " in key or '"' in key else key


def _catalog_key(parts: list[str]) -> str:
    """A catalog table without files: its qualified name, lower-case (Spark's names are case-insensitive)."""
    return ".".join(str(p).lower() for p in parts)


def _file_keys(index) -> set[str] | None:
    return {_file_key(f) for f in index.inputFiles()} or None   # no file yet: nothing a budget could follow


def _leaf_keys(node) -> set[str] | None:
    """The budget keys of a plan leaf that reads data (None: it cannot be resolved)."""
    name = node.nodeName()
    try:
        if name == "LogicalRelation":
            rel = node.relation()
            if rel.getClass().getSimpleName() == "HadoopFsRelation":
                return _file_keys(rel.location())
            if node.catalogTable().isDefined():
                ident = node.catalogTable().get().identifier()
                catalog = ident.catalog().get() if ident.catalog().isDefined() else "spark_catalog"
                db = ident.database().get() if ident.database().isDefined() else "default"
                return {_catalog_key([catalog, db, ident.table()])}
            return None
        if name == "HiveTableRelation":
            return None   # a Hive table read without conversion: its files are not listed here
        if name in ("DataSourceV2Relation", "DataSourceV2ScanRelation"):
            rel = node.relation() if name == "DataSourceV2ScanRelation" else node
            table = rel.table()
            try:
                return _file_keys(table.fileIndex())   # a file source read through the v2 API
            except Exception:
                pass
            if rel.identifier().isDefined() and rel.catalog().isDefined():
                ident = rel.identifier().get()
                return {_catalog_key([rel.catalog().get().name(), *list(ident.namespace()), ident.name()])}
    except Exception:   # an API this Spark does not have: unresolved, refused below
        return None
    return None


def _plan(df):
    return df._jdf.queryExecution().analyzed()


def budget_keys(df) -> tuple[str, ...]:
    """The budget keys of what ``df`` reads (its plan's leaves, subqueries included; no row is read). A key names
    the data, not the DataFrame: each file (of a path read, a catalog table, a view over either) as ``file:`` and
    its real path (other storage: its URI), the same key DuckDB's releases give the file; a catalog table without
    files as ``catalog.database.table`` in lower case. So ``spark.table('TRIPS')``, ``spark.table('default.trips')``,
    a view over it and ``spark.read.parquet`` of its folder all draw on the same budgets. Leaves of public constants
    (``spark.range``, literal rows) have none. Refused: a DataFrame that reads no data with a budget key (rows built
    on the driver: save them as files or a table first; a table with no file yet), or a leaf this module cannot
    resolve (named)."""
    keys: set[str] = set()
    for node in _walk(_plan(df)):
        name = node.nodeName()
        if name in _PUBLIC or name in _ELSEWHERE or name not in _DATA and _seq(node.children()):
            continue
        found = _leaf_keys(node) if name in _DATA else None
        if found is None:
            raise DuckmobError(f"duckmob: the DataFrame reads {name}, whose data has no file or catalog table for its "
                               "privacy budget to follow: write it to files or a table first "
                               "(df.write.saveAsTable('trips')) and release that")
        keys |= found
    if not keys:
        raise DuckmobError("duckmob: the DataFrame reads no file or catalog table (its rows are built on the driver), "
                           "so no privacy budget can follow its data: write it to files or a table first "
                           "(df.write.saveAsTable('trips')) and release that")
    return tuple(sorted(keys))


def _unstable(df) -> list[str]:
    """The operators of ``df``'s analyzed plan that can turn one row of the data into several rows, or make a row
    depend on other rows (joins, unions, generators such as explode, aggregates, windows, limits, samples,
    subqueries); a semi or anti join against public constants only is a filter. Empty: the plan is stable
    (filters, projections, renames, casts, sorts, repartitions)."""
    found = []
    for node in _walk(_plan(df)):
        name = node.nodeName()
        if name in _STABLE or name in _PUBLIC or name in _DATA or name in _ELSEWHERE:
            if _seq(node.subqueries()):
                found.append(f"a subquery in {name}")
            continue
        if name == "Join":
            kind = str(node.joinType().toString())
            public = all(n.nodeName() in _PUBLIC or n.nodeName() in _STABLE for n in _walk(node.right()))
            if kind in ("LeftSemi", "LeftAnti") and public:
                continue
            name = f"Join ({kind})"
        found.append(name)
    return sorted(set(found))


def _stability(df, stability) -> int | None:
    """The caller's public ``stability`` (an int >= 1: the most rows of what is released that one row of the data
    can become), or None when the plan is provably stable; a plan that is not, without ``stability``, is refused
    naming its operators (before anything is reserved)."""
    if stability is not None:
        if isinstance(stability, bool) or not isinstance(stability, (int, np.integer)) or stability < 1:
            raise DuckmobError(f"stability must be a whole number >= 1 (the most rows one row of the data can become "
                               f"in the DataFrame); got {stability!r}")
        return int(stability)
    ops = _unstable(df)
    if ops:
        raise DuckmobError(f"duckmob: the DataFrame's plan has {', '.join(ops)}, which can turn one row of the data "
                           "into several rows of what is released (or make a row depend on others), so one "
                           "trajectory could count more than once: release a DataFrame that only filters and "
                           "projects, or declare the most rows one row can become with stability=s (a public "
                           "bound; the release then costs s times the sensitivity)")
    return None


def _resolve(df=None, *, name: str | None = None, spark=None):
    """The DataFrame of ``name`` (a catalog table or view, in any spelling Spark resolves) or ``df`` itself."""
    if name is None:
        return df
    from pyspark.sql import SparkSession

    spark = spark or SparkSession.getActiveSession()
    if spark is None:
        raise DuckmobError("duckmob: no active SparkSession to look the table up in: pass the DataFrame itself, "
                           "dspark.set_budget(ledger, spark.table('trips'), eps=..., delta=...)")
    try:
        return spark.table(name)
    except Exception as err:
        if "NOT_FOUND" in str(getattr(err, "getCondition", lambda: "")() or "") or "not found" in str(err).lower() \
                or "cannot be found" in str(err).lower():
            raise DuckmobError(f"duckmob: no table or view '{name}' in the Spark catalog: check its spelling "
                               "(spark.catalog.listTables()), or pass the DataFrame that reads the data") from None
        raise DuckmobError(f"duckmob: '{name}' is not a table name Spark can read: pass the DataFrame that reads "
                           "the data instead") from None


# -- the workers' python -----------------------------------------------------------------------------------------

_WORKERS_OK: set = set()


def _probe_fn(want_version: str):
    """A function run once on a worker: what its python makes of ``import duckmob`` (by value: it names nothing
    of duckmob itself, so a worker without duckmob can still run it and say so)."""
    def probe(_):
        import sys as worker_sys
        try:
            import duckmob.api as worker_duckmob   # (the package, then the API that holds __version__)
            import pyarrow  # noqa: F401
            version = getattr(worker_duckmob, "__version__", "?")
            return ("ok" if version == want_version else f"duckmob {version}") + "|" + worker_sys.executable
        except Exception as err:   # an import error: the worker's python lacks a package
            return f"{type(err).__name__}: {err}|{worker_sys.executable}"
    return probe


def check_workers(spark) -> None:
    """Refuse, before anything is reserved, a session whose Python workers cannot import duckmob (one tiny job,
    once per SparkContext and interpreter). PySpark run from a plain ``python`` (not spark-submit) starts its
    workers with ``PYSPARK_PYTHON`` or else the first ``python3`` on PATH, ignoring ``spark.pyspark.python``; so
    when that setting is given it is applied here, as Spark documents it (the python of the driver and the
    executors), and in local mode without either the workers run this very interpreter (``sys.executable``, which
    has duckmob): an unactivated virtual environment works as docs/scale.md sets it up."""
    import os
    import sys

    from duckmob.api import __version__

    sc = spark.sparkContext
    wanted = sc.getConf().get("spark.pyspark.python")
    if wanted and sc.pythonExec != wanted:
        sc.pythonExec = wanted
    elif not wanted and "PYSPARK_PYTHON" not in os.environ and sc.master.startswith("local"):
        sc.pythonExec = sys.executable
    key = (sc.applicationId, sc.pythonExec)
    if key in _WORKERS_OK:
        return
    how = ("set spark.pyspark.python (or PYSPARK_PYTHON) to a python that has duckmob[spark], or install "
           "duckmob[spark] in the workers' python (on a cluster: spark.archives with a packed environment)")
    try:
        answer = sc.parallelize([0], 1).map(_probe_fn(__version__)).collect()[0]
    except Exception:
        raise DuckmobError(f"duckmob: Spark could not start a Python worker with '{sc.pythonExec}': {how}") from None
    status, python = answer.rsplit("|", 1)
    if status != "ok":
        raise DuckmobError(f"duckmob: Spark's workers run '{sc.pythonExec}' ({python}), which cannot use duckmob "
                           f"{__version__} "
                           f"({status}); nothing was reserved: {how}")
    _WORKERS_OK.add(key)


def _ledger(ledger: str):
    import duckdb

    from duckmob.sql import register

    con = duckdb.connect(ledger)
    register(con)
    return con


def set_budget(ledger: str, source, eps: float, delta: float, *, spark=None) -> list[dict]:
    """Declare or raise, in the DuckDB ledger file ``ledger``, the budget of the data ``source`` reads: a DataFrame,
    or the name of a catalog table or view (any spelling Spark resolves: ``'TRIPS'``, ``'default.trips'``; looked
    up in ``spark``, default the active session). The budget goes to each of its keys (:func:`budget_keys`: its
    files, or the catalog table), so every DataFrame that reads that data draws on it, whatever it is
    called; a name Spark cannot resolve is refused. Returns the budget row of each key."""
    from pyspark.sql import DataFrame

    df = source if isinstance(source, DataFrame) else None
    if df is None:
        if not isinstance(source, str) or not source.strip():
            raise DuckmobError(f"source must be a DataFrame or the name of a Spark table or view; got {source!r}")
        df = _resolve(name=source, spark=spark)
    keys = budget_keys(df)
    con = _ledger(ledger)
    try:
        db = release.database(con)
        return [release.set_budget(db, key, eps, delta) for key in keys]
    finally:
        con.close()


def sample(spark, model, n: int | None, seed: np.random.SeedSequence, *, partitions: int | None = None,
           max_rows: int | None = None, roads=None, scatter_m: float | None = None, bbox=None):
    """``n`` trajectories of ``model`` (None: its noisy count, :func:`duckmob.release.fitting.default_size`) as a
    Spark DataFrame (traj_id, seq, lat, lon, ts) sampled on the executors: free post-processing of the model. n and
    the output's size are checked on the driver as the release core checks them (:func:`fitting.output`: refused,
    before any Spark job, when the output could have more than ``max_rows`` rows).

    The output's blocks of :data:`~duckmob.release.sampling.BLOCK` trajectories are spread over ``partitions``
    partitions (default: at most four per core of the session, never more than the blocks); each partition reads the
    broadcast model once and draws its blocks, block ``b`` from its own stream ``block_generator(seed, b)``. So the
    rows equal those of :func:`duckmob.release.sampling.blocks` for the same model, n and seed (sorted by traj_id,
    seq), and no partition holds more than one block's rows in Python at a time. With ``roads`` (a public
    :class:`duckmob.roads.Roads`, broadcast as Arrow) every point is placed on them as the release core places it
    (:class:`duckmob.synth.onroads.OnRoads`, inside ``bbox``, scattered by ``scatter_m`` metres when given). Lazy, as any DataFrame: the blocks are drawn when an action (write,
    count) runs, again at each action (the same rows each time)."""
    n = fitting.output(model, n, seed, max_rows).n   # the core's n and size checks; its rows are drawn below
    check_workers(spark)   # the workers import duckmob to draw (once per session: already done by a release)
    blocks = sampling.n_blocks(n)
    if partitions is None:
        partitions = 4 * spark.sparkContext.defaultParallelism
    partitions = max(1, min(int(partitions), blocks))
    stored = spark.sparkContext.broadcast(model.to_bytes())
    load, method = type(model).from_bytes, model.stored_method()
    entropy, spawn_key = seed.entropy, tuple(seed.spawn_key)   # a SeedSequence travels as these two
    on_roads = None if roads is None else spark.sparkContext.broadcast(_arrow_bytes(roads.to_arrow()))

    def draw(batches):
        here = load(stored.value, method)
        if on_roads is not None:
            from duckmob.roads import Roads

            here = fitting.on_roads(here, Roads.of(pa.ipc.open_stream(on_roads.value).read_all()), bbox,
                                    scatter_m)
        out_seed = np.random.SeedSequence(entropy, spawn_key=spawn_key)
        for batch in batches:
            for block in batch.column(0).to_numpy():
                yield from synthetic_table(sampling.draw_block(here, n, out_seed, int(block))).to_batches()

    return spark.range(blocks, numPartitions=partitions).mapInArrow(draw, _ROWS_DDL)


def _arrow_bytes(table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _with_roads(r, roads, roads_name, sensitive: tuple[str, ...], ledger: str):
    """``r`` with its public road network (``roads=``: a Spark DataFrame, read on the driver, or an Arrow table),
    clipped to the bbox, before anything is reserved: a public input costs no budget. A DataFrame whose data is
    what the release reads, or has a declared budget in ``ledger``, is refused: a network built from the sensitive
    traces is not public. An Arrow table is the caller's own declaration that it is public."""
    from duckmob.privacy import ledger as ledgers

    if hasattr(roads, "toArrow"):
        keys = budget_keys(roads)
        con = _ledger(ledger)
        try:
            budgeted = [k for k in keys if k in sensitive or ledgers.budget(con.cursor(), k) is not None]
        finally:
            con.close()
        if budgeted:
            raise DuckmobError(f"duckmob: roads= reads {', '.join(sorted(budgeted))}, which has a privacy budget (or "
                               "is what this release reads): a road network built from the sensitive data is not "
                               "public. Give a public network: an OpenStreetMap extract, a city's GIS")
        table, name = roads.toArrow(), roads_name or release_source(keys)
    elif isinstance(roads, pa.Table):
        table, name = roads, roads_name or "roads"
    else:
        raise DuckmobError(f"duckmob: roads= takes a Spark DataFrame or a pyarrow Table of road segments (lat1, lon1, "
                           f"lat2, lon2), got {type(roads).__name__}")
    return fitting.with_network(r, table, name)


def _fit_request(stability, **kwargs):
    """fit_request with the caller's stability (None: the plan was proven stable)."""
    import inspect

    if "stability" in inspect.signature(release.fit_request).parameters:
        return release.fit_request(stability=stability, **kwargs)
    if stability not in (None, 1):   # NOTE: until the release core takes stability, s > 1 cannot be charged
        raise DuckmobError("stability > 1 is not supported by this version of the release core: release a "
                           "DataFrame that only filters and projects")
    return release.fit_request(**kwargs)


def synthesize(df, *, ledger: str, eps, method: str = "privtrace", delta=None, bbox=None, n=None, seed=None,
               privacy_unit: str = "trajectory", max_trajectories_per_user=None, params=None, max_rows=None,
               stability: int | None = None, partitions: int | None = None, output_partitions: int | None = None,
               traj_col="traj_id", ts_col="ts", lat_col="lat", lon_col="lon", user_col="user_id", seq_col="seq",
               source=None, roads=None, roads_name: str | None = None, scatter_m=None, **method_params):
    """``synthesize`` on a Spark DataFrame: fit + sample, one spend recorded in the DuckDB file ``ledger``, drawn
    on the budget of the data ``df`` reads (:func:`budget_keys`; declare it first with :func:`set_budget`);
    returns the synthetic table as a Spark DataFrame (traj_id, seq, lat, lon, ts) sampled on the executors
    (:func:`sample`, in ``output_partitions`` partitions). Arguments as the SQL macro's (``max_rows`` too: an
    explicit n is checked before the reservation); ``partitions`` are the input's.

    Before anything is reserved: the arguments, the DataFrame's schema, its budget keys, its plan (a plan that can
    turn one row into several is refused naming the operator unless ``stability=s`` is declared: the release then
    costs s times the sensitivity, :func:`_stability`), the roads (``roads=``: a public network as a Spark
    DataFrame or an Arrow table, :func:`_with_roads`; ``roads_name`` names it in the ledger) and the workers'
    python (:func:`check_workers`)."""
    from duckmob import synth
    from duckmob.release import interrupts

    with interrupts.entered():
        if source is not None:
            raise DuckmobError("duckmob: source= is not taken any more: a Spark release draws on the budget of the "
                               "data its DataFrame reads (declare it with dspark.set_budget(ledger, df, ...)); "
                               "drop source=")
        src = SparkSource(df, partitions=partitions, traj_col=traj_col, ts_col=ts_col, lat_col=lat_col,
                          lon_col=lon_col, user_col=user_col, seq_col=seq_col)   # the schema first
        keys = budget_keys(df)
        s = _stability(df, stability)
        r = _fit_request(s, source=release_source(keys), eps=eps, delta=delta, method=method, bbox=bbox,
                         privacy_unit=privacy_unit, max_trajectories_per_user=max_trajectories_per_user,
                         params={**synth.parse_params(params), **method_params}, seed=seed, n=n, max_rows=max_rows)
        if r.unit.is_user and not src.has_user:
            raise no_user_column("the DataFrame", instead="use privacy_unit='trajectory'", column=f"{user_col} column",
                                 name_it="user_col=...")
        scatter = validators.scatter_m(scatter_m, roads)
        if roads is not None:
            r = replace(_with_roads(r, roads, roads_name, keys, ledger), scatter_m=scatter)
        check_workers(df.sparkSession)
        con = _ledger(ledger)
        try:
            model, _, noise = release.fit(release.database(con), r, src)
        finally:
            con.close()
    return sample(df.sparkSession, model, r.n, noise.output_seed(), partitions=output_partitions,
                  max_rows=r.max_rows, roads=r.on_roads, scatter_m=r.scatter_m,
                  bbox=r.synthesizer.bbox.as_list())


def release_source(keys) -> str:
    """The ledger's source text of a release over ``keys`` (one key: itself)."""
    from duckmob.privacy.ledger import join_keys

    return join_keys(keys)


__all__ = ["SparkSource", "SparkBatches", "sample", "synthesize", "set_budget", "budget_keys", "check_workers"]
