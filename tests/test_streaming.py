"""Streamed output (issue 31): synthesize and mob_sample draw their rows block by block, in memory bounded by one
block whatever n is; a seed fixes the rows whatever the chunk or batch size (SQL, the Python table, the Python
reader); every method's public max_points really bounds its sampled trajectories; the registry of open outputs
stays bounded; long outputs report progress."""

import json
import subprocess
import sys
import textwrap

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import duckmob
from duckmob.errors import DuckmobError
from duckmob import progress
from duckmob.release import registry, sampling

BBOX = [39.8477, 116.1956, 40.1133, 116.4880]


@pytest.fixture(scope="module")
def con(fitted_sample):
    """The sample as ``trips`` and a PrivTrace model ``m`` on it (conftest.fitted_sample)."""
    return fitted_sample


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by([("traj_id", "ascending"), ("seq", "ascending")])


def test_a_seed_gives_the_same_rows_whatever_the_chunk_or_batch_size(con):
    n = 5000   # three blocks, the last one partial
    sql = con.sql("FROM mob_sample('m', n := 5000, seed := 3)").to_arrow_table()
    assert sql.column("traj_id").to_pylist() == sorted(sql.column("traj_id").to_pylist())   # in order, as drawn
    assert len(set(sql.column("traj_id").to_pylist())) == n
    table = duckmob.sample(con, "m", n, seed=3)
    assert table.equals(sql)
    for batch_size in (None, 1, 777, 100_000):
        reader = duckmob.sample(con, "m", n, seed=3, stream=True, batch_size=batch_size)
        assert isinstance(reader, pa.RecordBatchReader)
        assert reader.read_all().equals(sql)
    for batch_size in (100, 5000):   # DuckDB's own batches of the streamed query
        reader = con.sql("FROM mob_sample('m', n := 5000, seed := 3)").to_arrow_reader(batch_size)
        assert reader.read_all().equals(sql)
    assert not duckmob.sample(con, "m", n, seed=4).equals(sql)
    # a trajectory's rows depend on (model, seed, n, its id) only: the first 2048 of a smaller output differ (n is
    # part of the block's size), but any ids, in any order and misaligned, give the rows of the whole output
    from duckmob import release
    from duckmob.synth import store

    _, model = release.read_ledger(release.database(con), lambda cur: store.load(cur, "m"))
    seed = np.random.SeedSequence(42)
    whole = sampling.Output(model, n, seed).trajectories()
    ids = np.array([4999, 17, 2047, 2048, 3000, 0])
    part = sampling.draw_ids(model, n, seed, ids)
    assert part.traj_id.tolist() == ids.tolist()
    for k, i in enumerate(ids):
        a, b = part.offsets[k], part.offsets[k + 1]
        c, d = whole.offsets[i], whole.offsets[i + 1]
        assert np.array_equal(part.lat[a:b], whole.lat[c:d]) and np.array_equal(part.lon[a:b], whole.lon[c:d])


def test_synthesize_streams_the_same_rows_as_its_table_and_as_sql(con):
    sql = con.sql(f"FROM synthesize('trips', eps := 1.0, bbox := {BBOX}, seed := 8, n := 3000)").to_arrow_table()
    table = duckmob.synthesize(con, "trips", 1.0, bbox=BBOX, seed=8, n=3000)
    reader = duckmob.synthesize(con, "trips", 1.0, bbox=BBOX, seed=8, n=3000, stream=True, batch_size=999)
    assert isinstance(reader, pa.RecordBatchReader)
    assert table.equals(sql) and reader.read_all().equals(sql)
    assert len(set(sql.column("traj_id").to_pylist())) == 3000


def test_one_query_opens_its_output_once_and_the_registry_stays_bounded(con):
    from duckmob import release

    db = release.database(con)
    before = len(db.outputs._items)
    got = con.sql("SELECT count(*), count(DISTINCT traj_id) FROM mob_sample('m', n := 4100, seed := 1)").fetchall()
    assert got[0][1] == 4100
    assert len(db.outputs._items) == min(before + 1, registry.Outputs.SIZE)
    outputs = registry.Outputs()
    handles = [outputs.open(k) for k in range(registry.Outputs.SIZE + 3)]
    assert len(outputs._items) == registry.Outputs.SIZE
    assert outputs.get(handles[0]) is None and outputs.get(handles[-1]) == registry.Outputs.SIZE + 2
    from duckmob.sql.synth import draw

    with pytest.raises(DuckmobError, match="no longer open .* run the query again"):
        draw(db, pa.array(["no-such-handle"]), pa.array([0], pa.int64()))


def test_progress_lines_say_trajectories_and_rows_and_are_off_under_pytest(capsys, monkeypatch):
    assert not progress.enabled()
    monkeypatch.setenv("DUCKMOB_PROGRESS", "1")
    assert progress.enabled()
    monkeypatch.setattr(progress.Rows, "QUIET", 0.0)
    monkeypatch.setattr(progress.Rows, "EVERY", 0.0)
    p = progress.Rows("mob_sample m", 4096)
    p.update(2048, 90_000)
    p.update(2048, 91_000)
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["duckmob: mob_sample m: 50% (2,048/4,096 trajectories, 90,000 rows)",
                     "duckmob: mob_sample m: 100% (4,096/4,096 trajectories, 181,000 rows)"]
    quiet = progress.Rows("x", 10, progress=False)
    quiet.update(10, 10)
    assert capsys.readouterr().err == ""


def test_one_switch_governs_fits_and_outputs(capsys, monkeypatch):
    """DUCKMOB_PROGRESS turns the DP-SGD and pre-training counters on and off like the output's lines; a
    method's explicit progress parameter wins over it."""
    import torch

    from duckmob.synth import dpsgd

    def fit(progress=None):
        model = torch.nn.Linear(2, 1)
        x = torch.ones(8, 2)
        schedule = dpsgd.Schedule(sample_rate=0.5, steps=5, noise_multiplier=1.0, max_grad_norm=1.0,
                                  expected_batch_size=4.0, lr=0.1)
        context = dpsgd.RunContext(np.random.default_rng(0), torch.device("cpu"), progress, desc="toy DP-SGD")
        dpsgd.train_ghost(model, lambda m, rows: m(x[torch.as_tensor(rows)]).sum(1), 8, schedule, context)
        return capsys.readouterr().err

    monkeypatch.setenv("DUCKMOB_PROGRESS", "0")
    assert fit() == "" and not progress.enabled()
    monkeypatch.setenv("DUCKMOB_PROGRESS", "1")
    assert "duckmob: toy DP-SGD: 100% (5/5 steps)" in fit().splitlines()   # stderr is no terminal here: lines
    assert fit(progress=False) == ""


# method -> (small public hyper-parameters that keep a fit to seconds, with caps small enough to bind)
CAPPED = {
    "privtrace": {"max_points": 12},
    "privtrace_cells": {"output": "cells", "max_len": 4},
    "hrnet": {"epochs": 1, "pretrain_iterations": 10, "n_hint": 200, "max_len": 3},
    "hrnet_points": {"epochs": 1, "pretrain_iterations": 10, "n_hint": 200, "output": "points", "max_points": 9},
    "cleanslate": {"ti_epochs": 1, "tpg_epochs": 1, "n_hint": 200, "max_path": 5},
    "pategail": {"rounds": 1, "episodes": 16, "max_steps": 3},
    "fake": {},
}


@pytest.mark.parametrize("case", sorted(CAPPED))
def test_every_methods_max_points_bounds_its_sampled_trajectories(case):
    from duckmob import synth
    from duckmob.privacy.noise import NoiseSource
    from duckmob.synth.base import fit_unrecorded
    from duckmob.trajectories import from_points

    if case == "fake":
        from tests.synth import fake_method

        cls = fake_method.Fake
    else:
        cls = synth.get(case.split("_")[0])
    c = duckdb.connect()
    c.execute("CREATE TABLE t AS SELECT * FROM read_parquet(?) WHERE traj_id IN (SELECT DISTINCT traj_id FROM "
              "read_parquet(?) ORDER BY traj_id LIMIT 200)", [_sample_path()] * 2)
    data, _ = from_points(c.sql("FROM t").to_arrow_table(), private=True, bbox=BBOX, outside="drop")
    c.close()
    synthesizer = cls(BBOX, **CAPPED[case])
    plan = synthesizer.plan(4.0, synthesizer.default_delta or 1e-3)
    model = fit_unrecorded(synthesizer, data, 4.0, synthesizer.default_delta or 1e-3, NoiseSource(5))
    assert plan.max_points == model.max_points >= 2
    out = model.sample(400, np.random.default_rng(2))
    assert out.n_trajectories == 400
    assert out.lengths.max() <= model.max_points, (case, int(out.lengths.max()), model.max_points)


def _sample_path():
    from duckmob.samples import sample_path

    return str(sample_path())


def test_streamed_copy_stays_in_bounded_memory_and_matches_a_smaller_batch_size(tmp_path):
    """COPY (FROM mob_sample(...)) TO parquet, in a fresh process: the peak RSS grows far less than the whole output
    would take in memory, and the file holds the rows that a Python reader with small batches gives."""
    script = textwrap.dedent(f"""
        import json, resource, sys
        import duckmob
        con = duckmob.connect()
        con.execute("CREATE TABLE trips AS FROM mob_geolife_sample()")
        con.execute("FROM mob_set_budget('trips', eps := 10, delta := 1e-5)").fetchall()
        con.execute("FROM mob_fit('trips', 'm', eps := 1.0, bbox := {BBOX}, seed := 1)").fetchall()
        con.sql("FROM mob_sample('m', n := 3000, seed := 2)").fetchall()   # warm: code paths, the model
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        con.execute("COPY (FROM mob_sample('m', n := 100000, seed := 9)) TO '{tmp_path}/x.parquet'")
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        q = "SELECT count(*), count(DISTINCT traj_id), sum(hash(traj_id, seq, lat, lon, ts)) FROM "
        copied = con.sql(q + "read_parquet('{tmp_path}/x.parquet')").fetchall()[0]
        reader = duckmob.sample(con, 'm', 100000, seed=9, stream=True, batch_size=1000)
        streamed = con.sql(q + "reader").fetchall()[0]
        con.close()
        print(json.dumps({{"grew_mb": (peak - before) / 1024, "rows": copied[0], "copied": str(copied),
                          "streamed": str(streamed)}}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["copied"] == got["streamed"]
    whole_mb = got["rows"] * 40 / 2 ** 20   # the output as Arrow columns: 5 x 8 bytes a row (and more in DuckDB)
    assert got["rows"] > 2_000_000 and got["grew_mb"] < whole_mb / 3, got


def _model(con):
    from duckmob import release
    from duckmob.synth import store

    return release.read_ledger(release.database(con), lambda cur: store.load(cur, "m"))[1]


def test_blocks_drawn_ahead_on_threads_are_the_rows_drawn_on_one(con):
    """PrivTrace draws blocks ahead on worker threads (its sample is concurrent-safe); the rows are the same with
    1, 2 or 4 threads, in SQL too under SET threads = 1, and the workers are gone once the last block is out."""
    model = _model(con)
    assert model.concurrent_sample
    n, seed = 9000, np.random.SeedSequence(5)       # five blocks, the last one partial
    one = sampling.Output(model, n, seed, threads=1).table()
    for threads in (2, 4):
        out = sampling.Output(model, n, seed, threads=threads)
        assert out._ahead.threads == threads
        assert out.table().equals(one)
        assert out._ahead.pool is None and not out._ahead.pending     # shut down after the last block
    sql = con.sql("FROM mob_sample('m', n := 9000, seed := 6)").to_arrow_table()
    con.execute("SET threads = 1")
    try:
        assert con.sql("FROM mob_sample('m', n := 9000, seed := 6)").to_arrow_table().equals(sql)
    finally:
        con.execute("RESET threads")


def test_drawing_ahead_is_bounded_and_skips_and_errors_behave(monkeypatch):
    """Blocks 1 and 2 are drawn on two threads at once (a barrier both must reach); at most threads + 1 blocks are
    held or drawn at once; a caller that jumps ahead cancels what it skipped; an error in a block drawn ahead
    reaches the caller asking for that block."""
    import threading

    monkeypatch.setattr(sampling, "CHEAP_BLOCK_S", 0.0)     # every first block is worth drawing ahead after
    drawn, live, peak, lock = [], [0], [0], threading.Lock()
    both = threading.Barrier(2, timeout=60)

    def draw(b):
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        if b in (1, 2):
            both.wait()     # raises BrokenBarrierError unless the other one is being drawn too
        with lock:
            live[0] -= 1
            drawn.append(b)
        if b == 7:
            raise ValueError("block 7 failed")
        return b

    ahead = sampling._Ahead(draw, 10, threads=2)
    assert [ahead.get(b) for b in range(4)] == [0, 1, 2, 3]
    assert 2 <= peak[0] <= 3 and set(ahead.pending) == {4, 5}
    assert ahead.get(6) == 6                         # 4 and 5 skipped: no longer pending
    assert set(ahead.pending) == {7, 8} and ahead.pool is not None
    with pytest.raises(ValueError, match="block 7"):
        ahead.get(7)
    assert 7 in drawn and ahead.get(9) == 9 and ahead.pool is None


def test_torch_methods_draw_on_the_reading_thread_only():
    """Their sampling sets the process's torch thread count, so they never draw on several threads at once."""
    from types import SimpleNamespace

    from duckmob.synth.cleanslate import CleanSlateModel
    from duckmob.synth.hrnet import FittedModel
    from duckmob.synth.pategail import PateGailModel

    assert not any(c.concurrent_sample for c in (CleanSlateModel, FittedModel, PateGailModel))
    assert sampling.Output(SimpleNamespace(), 5000, np.random.SeedSequence(1), threads=4)._ahead.threads == 1
    assert sampling.Output(SimpleNamespace(concurrent_sample=True), 5000, np.random.SeedSequence(1),
                           threads=64)._ahead.threads == sampling.MAX_THREADS


def test_cheap_blocks_are_drawn_on_the_reading_thread():
    """Blocks drawn faster than CHEAP_BLOCK_S (the cell outputs') turn drawing ahead off: no worker thread."""
    ahead = sampling._Ahead(lambda b: b, 6, threads=2)
    assert [ahead.get(b) for b in range(6)] == list(range(6))
    assert ahead.threads == 1 and ahead.pool is None and not ahead.pending
