"""duckmob.spark on local[2]: Spark and DuckDB give the same reduced tables, and the same release, on the same rows.

pyspark comes with the [test] extra (duckmob[spark]); skipped when it or Java is missing. One SparkSession for the
module, 300 trajectories: under a minute, mostly Spark's start and its first job. The synthetic table is sampled on
the executors (Spark's Python workers are processes of their own: what the driver's monkeypatches forbid, they may
do)."""

import shutil
import sys

import json

import duckdb
import numpy as np
import pyarrow as pa
import pytest

pyspark = pytest.importorskip("pyspark")
pytest.importorskip("pandas")   # PySpark's Arrow functions need it
if shutil.which("java") is None:
    pytest.skip("Spark needs Java", allow_module_level=True)

import duckmob  # noqa: E402
from duckmob import release  # noqa: E402
from duckmob import spark as dspark  # noqa: E402
from duckmob.release import fitting, sampling  # noqa: E402
from duckmob.release.fitting import default_size  # noqa: E402
from duckmob.privacy.unit import PrivacyUnit  # noqa: E402
from duckmob.source import batches as source_batches, table as stream  # noqa: E402
from duckmob.api import synthesize  # noqa: E402
from duckmob.synth import placement  # noqa: E402
from duckmob.synth.base import fit_unrecorded  # noqa: E402
from duckmob.synth.privtrace import PrivTrace  # noqa: E402
from duckmob.synth.privtrace.markov import density_sums  # noqa: E402
from duckmob.synth.cells import state_sequences, uniform_grid  # noqa: E402
from duckmob.trajectories import from_points, synthetic_table  # noqa: E402
from grid_roads import grid_roads  # noqa: E402

SAMPLE = "duckmob/data/geolife_sample.parquet"
BBOX = [39.8477, 116.1956, 40.1133, 116.4880]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("spark")
    path = str(folder / "points.parquet")
    con = duckdb.connect()
    con.execute(f"COPY (FROM '{SAMPLE}' WHERE traj_id IN (SELECT DISTINCT traj_id FROM '{SAMPLE}' "
                f"ORDER BY traj_id % 97, traj_id LIMIT 300)) TO '{path}' (FORMAT parquet)")
    con.close()
    from pyspark.sql import SparkSession

    # a short-lived test JVM: the C1 compiler alone and the serial GC start faster, and tiny shuffles need no
    # adaptive re-planning (the file: 26-39 s with these on the shared 2-core machine, 60-100 s without)
    session = (SparkSession.builder.master("local[2]").appName("duckmob-test").config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "4").config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.adaptive.enabled", "false")
               .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")
               # local workers run this interpreter (the venv's), not whatever python3 is first on PATH
               .config("spark.pyspark.python", sys.executable)
               .config("spark.sql.warehouse.dir", str(folder / "warehouse"))
               .getOrCreate())
    yield folder, path, session
    session.stop()


def _statistics_fn():
    """A method's per-batch statistics: a length-normalised density and the fine stage's two tables (a local
    function: Spark's workers get it by value, as they get a method's)."""
    def statistics(d):
        grid = uniform_grid(BBOX, 8)
        off, states, _ = state_sequences(grid, d.offsets, d.lat, d.lon)
        return {"density": density_sums(off, states, 64, 2.0),
                **placement.statistics(d, BBOX, 64, {"density": 3.0, "steps": 5.0})}
    return statistics


def _visits_fn():
    """Clean-slate's reduction of a trajectory to its cell visits (as the method gathers it)."""
    from duckmob.synth.cleanslate.trips import visits

    def reduce(d):
        return visits(d, BBOX, 16)
    return reduce


def test_spark_and_duckdb_reduce_to_the_same_tables(data):
    _folder, path, session = data
    con = duckdb.connect()
    query = f"SELECT traj_id::BIGINT AS traj_id, user_id::BIGINT AS user_id, ts, lat, lon, NULL::BIGINT AS seq " \
            f"FROM '{path}'"
    source = stream.TableSource(con, query, bucket_points=3000)
    ddb = source.batches(bbox=BBOX, time_required=False, unit=PrivacyUnit.user(3),
                         rng=lambda: np.random.default_rng(1))
    want = ddb.reduce(_statistics_fn())
    want_visits = ddb.gather(_visits_fn())
    n_ddb = ddb.n_trajectories
    ddb.close()
    source.close()
    con.close()
    src = dspark.SparkSource(session.read.parquet(path), partitions=3)
    sb = src.batches(bbox=BBOX, time_required=False, unit=PrivacyUnit.user(3), rng=lambda: np.random.default_rng(1))
    got = sb.reduce(_statistics_fn())
    got_visits = sb.gather(_visits_fn())
    assert sb.n_trajectories == n_ddb > 20
    src.close()
    assert want.keys() == got.keys()
    for key in want:
        assert np.array_equal(want[key], got[key]), key
        assert want[key].sum() > 0
    # a method's per-trajectory reduction, run on the partitions: the same trajectories in the same order
    assert got_visits.n_trajectories == n_ddb and got_visits.n_points >= 2 * n_ddb
    for name in ("offsets", "traj_id", "user_id", "ts", "lat", "lon"):
        assert np.array_equal(getattr(got_visits, name), getattr(want_visits, name)), name


def _shares(table, w: int = 8) -> np.ndarray:
    """Each cell's share of a synthetic table's points on a w x w grid of BBOX (the density compared by eye in
    mob_plot_density)."""
    lat, lon = table.column("lat").to_numpy(), table.column("lon").to_numpy()
    i = np.clip(((lat - BBOX[0]) / (BBOX[2] - BBOX[0]) * w).astype(int), 0, w - 1)
    j = np.clip(((lon - BBOX[1]) / (BBOX[3] - BBOX[1]) * w).astype(int), 0, w - 1)
    return np.bincount(i * w + j, minlength=w * w) / len(lat)


def test_spark_synthesize_equals_duckdb(data, monkeypatch):
    """One PrivTrace release on Spark and on DuckDB (read out of core in several buckets): the method's own reduced
    tables (both passes) are equal, only they reach the driver (no point is collected), and the release core records
    the same spend and fits the same model. The synthetic table is sampled on the executors, nothing on the driver:
    three blocks over two partitions give, row for row, what sampling.blocks draws in one process from that model and
    the release's output seed, which is DuckDB's table; under another seed, other rows in the same distribution."""
    folder, path, session = data
    reduced = {"spark": [], "duckdb": []}
    models, samples = [], []

    def record(cls, key):
        reduce = cls.reduce

        def spy(self, fn):
            out = reduce(self, fn)
            reduced[key].append(out)
            return out
        monkeypatch.setattr(cls, "reduce", spy)

    def collected(self):
        raise AssertionError("points were collected to the driver")

    fit, sample = PrivTrace.fit, dspark.sample

    def fit_spy(self, *args, **kwargs):
        models.append(fit(self, *args, **kwargs))
        return models[-1]

    def sample_spy(spark, model, n, seed, **kwargs):
        samples.append((model, n, seed))
        return sample(spark, model, n, seed, **kwargs)

    record(dspark.SparkBatches, "spark")
    record(source_batches.Batches, "duckdb")
    monkeypatch.setattr(dspark.SparkBatches, "__iter__", collected)
    monkeypatch.setattr(stream, "BUCKET_POINTS", 3000)
    monkeypatch.setattr(PrivTrace, "fit", fit_spy)
    monkeypatch.setattr(dspark, "sample", sample_spy)
    ledger = str(folder / "ledger.duckdb")
    dspark.set_budget(ledger, session.read.parquet(path), 10.0, 1e-5)
    n = 2 * sampling.BLOCK + 100
    out = dspark.synthesize(session.read.parquet(path), ledger=ledger, eps=2.0, bbox=BBOX, seed=3,
                            n=n, privacy_unit="user", max_trajectories_per_user=20, partitions=3,
                            output_partitions=2)
    [(model, n_drawn, seed)] = samples
    assert model is models[0] and n_drawn == n and seed.entropy == 3   # the release's model and seeded stream
    with monkeypatch.context() as driver:   # the driver draws nothing: the executors' Python workers do
        def drawn_here(*args, **kwargs):
            raise AssertionError("the synthetic table was sampled on the driver")
        for owner, name in ((type(model), "sample"), (sampling, "draw_block"), (release, "sample")):
            driver.setattr(owner, name, drawn_here)
        assert out.rdd.getNumPartitions() == 2
        got = out.toArrow().sort_by([("traj_id", "ascending"), ("seq", "ascending")])
    want = synthetic_table(source_batches.concat(list(sampling.blocks(model, n, seed))))
    assert got.schema == want.schema and got.num_rows > 2 * n
    assert got.equals(want)
    assert got.column("traj_id").to_numpy()[-1] == n - 1

    con = duckdb.connect()
    duckmob.register(con)
    con.execute(f"CREATE TABLE trips AS FROM '{path}'")
    con.execute("FROM mob_set_budget('trips', eps := 10, delta := 1e-5)").fetchall()
    ddb = synthesize(con, "trips", 2.0, bbox=BBOX, seed=3, n=n, privacy_unit="user",
                     max_trajectories_per_user=20)
    spend = "SELECT mechanism, epsilon, delta, privacy_unit, params, event, seeded, status FROM duckmob_ledger"
    want_spend = con.sql(spend).fetchall()
    con.close()
    assert len(models) == 2 and models[0].to_bytes() == models[1].to_bytes()
    # DuckDB derives its output seed as Spark does (NoiseSource.output_seed after the fit): the same rows
    assert ddb.equals(want)
    # another seed, drawn on the executors: other rows, the DuckDB table's size and density
    other = dspark.sample(session, model, n, np.random.SeedSequence(99), partitions=3).toArrow()
    assert other.num_rows != ddb.num_rows and len(set(other.column("traj_id").to_pylist())) == n
    assert abs(other.num_rows / ddb.num_rows - 1) < 0.05
    assert 0.5 * np.abs(_shares(other) - _shares(ddb)).sum() < 0.05
    assert len(reduced["spark"]) == len(reduced["duckdb"]) == 2      # PrivTrace's two passes
    for a, b in zip(reduced["spark"], reduced["duckdb"]):
        assert a.keys() == b.keys()
        for key in a:
            assert np.array_equal(a[key], b[key]), key
    assert sum(int(v.sum()) for v in reduced["spark"][1].values()) > 0
    led = duckdb.connect(ledger)
    rows = led.sql(spend).fetchall()
    sources = led.sql("SELECT source FROM duckmob_ledger").fetchall()
    led.close()
    assert rows == want_spend and len(rows) == 1 and rows[0][-1] == "spent"
    assert sources == [("file:" + str((folder / "points.parquet").resolve()),)]   # the file the DataFrame reads


def test_spark_sample_sizes_and_checks_like_the_core(data):
    """dspark.sample without n draws the model's noisy count (default_size), in one block and partition here; an n
    or a size (n * max_points over max_rows) the release core refuses is refused before any Spark job, with the
    core's message."""
    _folder, path, session = data
    con = duckdb.connect()
    points = con.sql(f"FROM '{path}'").arrow()
    points = points if isinstance(points, pa.Table) else points.read_all()
    con.close()
    trajectories, _ = from_points(points, bbox=BBOX, outside="drop", private=True)
    model = fit_unrecorded(PrivTrace(BBOX), trajectories, 2.0)
    seed = np.random.SeedSequence(11)
    out = dspark.sample(session, model, None, seed)
    assert out.rdd.getNumPartitions() == 1
    got = out.toArrow().sort_by([("traj_id", "ascending"), ("seq", "ascending")])
    want = synthetic_table(sampling.draw_block(model, default_size(model), seed, 0))
    assert got.equals(want) and len(set(got.column("traj_id").to_pylist())) == default_size(model)
    for bad, max_rows in ((0, None), (-3, None), (2.5, None), (10, 9 * model.max_points)):
        with pytest.raises(duckmob.DuckmobError) as err:
            dspark.sample(session, model, bad, seed, max_rows=max_rows)
        with pytest.raises(duckmob.DuckmobError) as core:
            fitting.output(model, bad, seed, max_rows)
        assert str(err.value) == str(core.value)


@pytest.mark.parametrize("column,value", [("lat", "'39.9xyz'"), ("traj_id", "'secret-4242'")])
def test_spark_wrong_types_are_refused_for_free_naming_no_value(data, column, value):
    """A string column where a number belongs: refused on the DataFrame's schema before anything is reserved,
    naming the column and its type only, with the same answer for an empty DataFrame."""
    folder, path, session = data
    ledger = str(folder / f"ledger_{column}.duckdb")
    dspark.set_budget(ledger, session.read.parquet(path), 10.0, 1e-5)
    df = session.read.parquet(path).selectExpr("*", f"{value} AS __bad").drop(column).withColumnRenamed("__bad", column)
    answers = []
    for frame in (df, df.limit(0)):
        with pytest.raises(duckmob.DuckmobError) as err:
            dspark.synthesize(frame, ledger=ledger, eps=1.0, bbox=BBOX)
        message = str(err.value)
        assert "has type" in message and "xyz" not in message and "secret" not in message
        answers.append(message)
    assert answers[0] == answers[1]
    led = duckdb.connect(ledger)
    assert led.sql("SELECT count(*) FROM duckmob_ledger").fetchall() == [(0,)]
    led.close()


def test_spark_try_cast_drops_unconvertible_values_and_keys_by_user(data):
    """Values Spark cannot convert (a double id beyond BIGINT) become NULL and their points are dropped, quietly;
    two users' trajectories that share a traj_id stay two trajectories, as on DuckDB."""
    _folder, path, session = data
    df = session.read.parquet(path).selectExpr(
        "CASE WHEN traj_id % 5 = 0 THEN 1e30 ELSE traj_id % 7 END AS traj_id", "user_id", "ts", "lat", "lon")
    src = dspark.SparkSource(df.selectExpr("CAST(traj_id AS DECIMAL(38, 0)) AS traj_id", "user_id", "ts", "lat",
                                           "lon"), partitions=2)
    batches = src.batches(bbox=BBOX, time_required=False, unit=PrivacyUnit(),
                          rng=lambda: np.random.default_rng(0))
    data_ = batches.trajectories()
    src.close()
    pairs = set(zip(data_.user_id.tolist(), data_.traj_id.tolist()))
    assert len(pairs) == data_.n_trajectories > len({t for _, t in pairs})   # traj_ids shared by several users
    assert set(data_.traj_id.tolist()) <= set(range(7))                      # the 1e30 ids were dropped


def _ledger_rows(ledger: str) -> list:
    led = duckdb.connect(ledger)
    try:
        return led.sql("SELECT source, epsilon, status FROM duckmob_ledger ORDER BY id").fetchall()
    except duckdb.CatalogException:
        return []
    finally:
        led.close()


def test_spark_budget_follows_the_data_whatever_its_spelling(data):
    """A catalog table's budget, declared under one spelling, is the budget of every spelling of it, of a view over
    it and of a path read of its folder; one DataFrame released under three spellings draws on that one budget (the
    third release does not fit and is refused before any read); a misspelt name is refused, declaring nothing."""
    folder, path, session = data
    ledger = str(folder / "ledger_names.duckdb")
    session.read.parquet(path).write.mode("overwrite").saveAsTable("trips_named")
    session.table("trips_named").createOrReplaceTempView("trips_view")
    import glob
    table_files = tuple(sorted("file:" + p for p in glob.glob(str((folder / "warehouse" / "trips_named").resolve())
                                                               + "/*.parquet")))
    table_folder = str((folder / "warehouse" / "trips_named").resolve())
    assert table_files
    frames = [session.table(name) for name in ("trips_named", "TRIPS_NAMED", "default.trips_named",
                                               "spark_catalog.default.Trips_Named", "trips_view")]
    frames.append(session.read.parquet(table_folder))
    frames.append(session.table("trips_named").filter("lat > 0").withColumnRenamed("lon", "LON"))
    frames.append(session.sql("WITH t AS (SELECT * FROM Trips_Named WHERE lat > 0) SELECT traj_id, lat FROM t"))
    assert {dspark.budget_keys(f) for f in frames} == {table_files}
    assert dspark._unstable(frames[-1]) == [] and dspark._unstable(session.sql(
        "WITH t AS (SELECT * FROM trips_named) SELECT * FROM t UNION ALL SELECT * FROM t")) == ["Union"]
    assert dspark.budget_keys(session.read.parquet(path)) == ("file:" + str((folder / "points.parquet").resolve()),)
    with pytest.raises(duckmob.DuckmobError) as err:
        dspark.set_budget(ledger, "trps_named", 1.0, 1e-5, spark=session)
    assert "no table or view 'trps_named'" in str(err.value) and "\n" not in str(err.value)
    rows = dspark.set_budget(ledger, "TRIPS_named", 1.0, 1e-5, spark=session)
    assert tuple(r["source"] for r in rows) == table_files
    for name in ("trips_named", "default.trips_named"):
        dspark.synthesize(session.table(name), ledger=ledger, eps=0.45, bbox=BBOX, seed=1, n=100, partitions=2)
    with pytest.raises(duckmob.BudgetError):
        dspark.synthesize(session.table("trips_view"), ledger=ledger, eps=0.45, bbox=BBOX, seed=1, n=100, partitions=2)
    got = _ledger_rows(ledger)
    assert [(s, st) for s, _, st in got] == [(", ".join(table_files), "spent")] * 2
    with pytest.raises(duckmob.DuckmobError, match="source= is not taken"):
        dspark.synthesize(session.table("trips_named"), source="trips", ledger=ledger, eps=0.1, bbox=BBOX)
    with pytest.raises(duckmob.DuckmobError, match="reads no file or catalog table|no file or catalog table"):
        dspark.set_budget(ledger, session.createDataFrame([(1, 2, 3.0, 4.0)], "traj_id long, user_id long, "
                                                          "lat double, lon double"), 1.0, 1e-5)
    assert len(_ledger_rows(ledger)) == 2


@pytest.mark.parametrize("build,operator", [
    (lambda s, df, p: df.unionByName(df), "Union"),
    (lambda s, df, p: df.join(df.select("traj_id", "user_id"), ["traj_id", "user_id"]), "Join (Inner)"),
    (lambda s, df, p: s.range(3).crossJoin(df).drop("id"), "Join (Cross)"),
    (lambda s, df, p: df.selectExpr("explode(array(1, 2)) AS copy", "*").drop("copy"), "Generate"),
    (lambda s, df, p: df.filter(f"traj_id IN (SELECT traj_id FROM parquet.`{p}` WHERE lat > 39.9)"), "a subquery"),
])
def test_spark_plans_that_fan_rows_out_are_refused_unless_stability_is_declared(data, monkeypatch, build,
                                                                                  operator):
    """A DataFrame whose plan can turn one row into several (or make a row depend on others) is refused before
    anything is reserved, naming the operator; with stability=s the plan passes and s reaches the release core's
    fit_request. Plans that only filter, project, rename or cast pass as they are."""
    folder, path, session = data
    ledger = str(folder / "ledger_fanout.duckdb")
    base = session.read.parquet(path)
    dspark.set_budget(ledger, base, 10.0, 1e-5)
    df = build(session, base, path)
    with pytest.raises(duckmob.DuckmobError) as err:
        dspark.synthesize(df, ledger=ledger, eps=1.0, bbox=BBOX)
    message = str(err.value)
    assert operator in message and "stability=s" in message and "\n" not in message
    assert _ledger_rows(ledger) == []
    seen = []

    class Stop(Exception):
        pass

    def spy(*, stability=None, **kwargs):
        seen.append((stability, kwargs["source"]))
        raise Stop

    monkeypatch.setattr(release, "fit_request", spy)
    with pytest.raises(Stop):
        dspark.synthesize(df, ledger=ledger, eps=1.0, bbox=BBOX, stability=2)
    with pytest.raises(Stop):
        dspark.synthesize(base.filter("lat > 39.9").selectExpr("traj_id", "user_id", "ts", "lat * 1.0 AS lat",
                                                               "CAST(lon AS double) AS lon"), ledger=ledger,
                          eps=1.0, bbox=BBOX)
    key = "file:" + str((folder / "points.parquet").resolve())
    assert seen == [(2, key), (None, key)]
    for bad in (0, 1.5, True):
        with pytest.raises(duckmob.DuckmobError, match="stability must be"):
            dspark.synthesize(df, ledger=ledger, eps=1.0, bbox=BBOX, stability=bad)
    assert _ledger_rows(ledger) == []


def test_spark_orders_a_timeless_trajectory_by_its_own_seq(data):
    """Timeless trajectories stored in scrambled row order beside timestamped ones: Spark carries seq to the
    cleaning, so each is ordered by its own seq (a NULL seq as from_points rules), exactly as in memory."""
    folder, path, session = data
    con = duckdb.connect()
    rows = con.sql(f"SELECT traj_id::BIGINT AS traj_id, user_id::BIGINT AS user_id, "
                   f"CASE WHEN traj_id % 4 = 0 THEN ts END AS ts, lat, lon, "
                   f"CASE WHEN hash(traj_id, ts) % 97 = 0 THEN NULL ELSE "
                   f"(row_number() OVER (PARTITION BY traj_id ORDER BY ts))::BIGINT END AS seq "
                   f"FROM '{path}' WHERE traj_id IN (SELECT DISTINCT traj_id FROM '{path}' ORDER BY traj_id LIMIT 24) "
                   f"ORDER BY hash(lat, lon)").arrow()
    rows = rows if isinstance(rows, pa.Table) else rows.read_all()
    con.close()
    timeless = str(folder / "timeless.parquet")
    import pyarrow.parquet as pq
    pq.write_table(rows, timeless)
    want, _ = from_points(rows, bbox=BBOX, outside="drop", time_required=False, private=True)
    src = dspark.SparkSource(session.read.parquet(timeless), partitions=3)
    got = src.batches(bbox=BBOX, time_required=False, unit=PrivacyUnit(),
                      rng=lambda: np.random.default_rng(0)).trajectories()
    src.close()
    assert got.n_trajectories == want.n_trajectories >= 20
    assert (want.ts == want.ts[0]).sum() > 0   # timeless trajectories are there
    for name in ("offsets", "traj_id", "user_id", "ts", "lat", "lon"):
        assert np.array_equal(getattr(got, name), getattr(want, name)), name
    # without seq the same rows are read in another order: seq is what orders them
    no_seq, _ = from_points(rows.drop(["seq"]), bbox=BBOX, outside="drop", time_required=False, private=True)
    assert not np.array_equal(no_seq.lat, got.lat)


def test_spark_refuses_workers_that_cannot_import_duckmob(data, monkeypatch, tmp_path):
    """spark.pyspark.python naming a python without duckmob: refused in one line saying how to fix it, before
    anything is reserved (no ledger row)."""
    folder, path, session = data
    ledger = str(folder / "ledger_workers.duckdb")
    dspark.set_budget(ledger, session.read.parquet(path), 10.0, 1e-5)
    bare = tmp_path / "bare-python"
    bare.write_text(f"#!/bin/sh\nexec '{sys.executable}' -S \"$@\"\n")   # no site-packages: no duckmob
    bare.chmod(0o755)
    sc = session.sparkContext
    conf = sc.getConf()
    conf.set("spark.pyspark.python", str(bare))
    monkeypatch.setattr(sc, "getConf", lambda: conf)
    monkeypatch.setattr(sc, "pythonExec", sc.pythonExec)   # restored after the test
    with pytest.raises(duckmob.DuckmobError) as err:
        dspark.synthesize(session.read.parquet(path), ledger=ledger, eps=1.0, bbox=BBOX)
    message = str(err.value)
    assert "\n" not in message and str(bare) in message and "spark.pyspark.python" in message
    assert "nothing was reserved" in message and "duckmob" in message
    assert _ledger_rows(ledger) == []


UNACTIVATED = """
import sys
from pyspark.sql import SparkSession
from duckmob import spark as dspark
folder, path = sys.argv[1], sys.argv[2]
session = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
           .config("spark.sql.shuffle.partitions", "2").config("spark.sql.adaptive.enabled", "false")
           .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")
           .config("spark.pyspark.python", sys.executable).getOrCreate())
before = session.sparkContext.pythonExec
trips = session.read.parquet(path).filter("traj_id % 10 = 0")
dspark.set_budget(folder + "/ledger_venv.duckdb", trips, eps=4.0, delta=1e-5)
out = dspark.synthesize(trips, ledger=folder + "/ledger_venv.duckdb", eps=1.0, n=50, seed=1, partitions=2,
                        bbox=[39.8477, 116.1956, 40.1133, 116.4880])
print("RESULT", before, session.sparkContext.pythonExec, out.select("traj_id").distinct().count())
session.stop()
"""


def test_spark_setup_of_the_docs_works_with_an_unactivated_venv(data, tmp_path):
    """docs/scale.md's set-up run by the venv's python with the venv not activated (no venv on PATH, so PySpark
    alone would start the first python3 on PATH): the workers run spark.pyspark.python and the release is made."""
    import os
    import subprocess

    folder, path, _session = data
    script = tmp_path / "unactivated.py"
    script.write_text(UNACTIVATED)
    env = {"HOME": os.environ.get("HOME", str(tmp_path)), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    if "JAVA_HOME" in os.environ:
        env["JAVA_HOME"] = os.environ["JAVA_HOME"]
    else:
        env["PATH"] = os.path.dirname(os.path.realpath(shutil.which("java"))) + ":" + env["PATH"]
    done = subprocess.run([sys.executable, str(script), str(tmp_path), path], env=env, capture_output=True,
                          text=True, timeout=240)
    result = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert done.returncode == 0 and result, done.stderr[-3000:]
    _, before, after, n = result[0].split()
    assert before == "python3" and after == sys.executable and int(n) == 50
    assert [st for _, _, st in _ledger_rows(str(tmp_path / "ledger_venv.duckdb"))] == ["spent"]


def test_spark_places_on_public_roads_as_duckdb_does_and_refuses_private_ones(data):
    """roads= on Spark: the same model, the same ledger record and the same rows as DuckDB's roads :=, every point
    on a road (placed on the executors); a roads DataFrame that reads the sensitive file is refused before any
    spend."""
    from duckmob.roads import Roads, snap

    folder, path, session = data
    ledger = str(folder / "ledger_roads.duckdb")
    dspark.set_budget(ledger, session.read.parquet(path), 10.0, 1e-5)
    grid = grid_roads(BBOX)
    n = 300
    out = dspark.synthesize(session.read.parquet(path), ledger=ledger, eps=1.0, bbox=BBOX, seed=5, n=n,
                            roads=grid, roads_name="grid", output_partitions=2).toArrow()
    got = out.sort_by([("traj_id", "ascending"), ("seq", "ascending")])
    network = Roads.of(grid).clip(BBOX)
    assert got.num_rows > n and snap(network, got.column("lat").to_numpy(), got.column("lon").to_numpy())[4].max() < 1e-3
    con = duckdb.connect()
    duckmob.register(con)
    con.execute(f"CREATE TABLE trips AS FROM '{path}'")
    con.register("grid_arrow", grid)
    con.execute("CREATE TABLE grid AS FROM grid_arrow")
    con.execute("FROM mob_set_budget('trips', eps := 10, delta := 1e-5)").fetchall()
    ddb = synthesize(con, "trips", 1.0, bbox=BBOX, seed=5, n=n, roads="grid")
    ddb_params = json.loads(con.sql("SELECT params FROM duckmob_ledger").fetchall()[0][0])
    con.close()
    assert ddb.equals(got)
    led = duckdb.connect(ledger)
    params = json.loads(led.sql("SELECT params FROM duckmob_ledger").fetchall()[0][0])
    spent = led.sql("SELECT count(*) FROM duckmob_ledger").fetchall()
    led.close()
    assert params["roads"] == "grid" and params["roads_digest"] == network.digest == ddb_params["roads_digest"]
    traced = session.read.parquet(path).selectExpr("lat AS lat1", "lon AS lon1", "lat + 1e-4 AS lat2", "lon AS lon2")
    with pytest.raises(duckmob.DuckmobError, match="a road network built from the sensitive data is not public"):
        dspark.synthesize(session.read.parquet(path), ledger=ledger, eps=1.0, bbox=BBOX, roads=traced)
    led = duckdb.connect(ledger)
    assert led.sql("SELECT count(*) FROM duckmob_ledger").fetchall() == spent
    led.close()
