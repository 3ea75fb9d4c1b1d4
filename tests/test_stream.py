"""Out-of-core releases (duckmob.source): the same release as the in-memory path, bit for bit, under a fixed seed,
on a table split across many batches, for both privacy units."""

import io

import duckdb
import numpy as np
import pytest

import duckmob
from duckmob.privacy.unit import PrivacyUnit
from duckmob.source import table as stream
from duckmob.source.schema import Mapping
from duckmob.api import synthesize
from duckmob.synth import store
from grid_roads import grid_roads

SAMPLE = "duckmob/data/geolife_sample.parquet"
BBOX = [39.8477, 116.1956, 40.1133, 116.4880]


@pytest.fixture(scope="module")
def con():
    c = duckdb.connect()
    duckmob.register(c)
    # 400 trajectories of the shipped sample; the temp copy goes through the in-memory (list) path of the macros
    c.execute(f"CREATE TABLE t AS FROM '{SAMPLE}' WHERE traj_id IN "
              f"(SELECT DISTINCT traj_id FROM '{SAMPLE}' ORDER BY traj_id % 97, traj_id LIMIT 400)")
    c.execute("CREATE TEMP TABLE mem AS FROM t")
    c.execute(f"CREATE TABLE s AS FROM mob_cell_sequences('t', bbox := {BBOX}, w := 8, outside := 'drop', "
              "stay_points := false)")
    c.execute("CREATE TEMP TABLE smem AS FROM s")
    for name in ("t", "mem", "s", "smem"):
        c.execute(f"FROM mob_set_budget('{name}', eps := 1000, delta := 1e-3)").fetchall()
    yield c
    c.close()


@pytest.fixture
def small_batches(monkeypatch):
    """Buckets of about 2,000 points (the 400 trajectories fall in about 20 of them), 25 sequences a batch."""
    monkeypatch.setattr(stream, "BUCKET_POINTS", 2000)
    monkeypatch.setattr(stream, "SEQUENCE_ROWS", 25)


def _model_arrays(con, name):
    _method, model = store.load(con, name)
    return {k: v for k, v in np.load(io.BytesIO(model.payload())).items()}


@pytest.mark.parametrize("unit", ["trajectory", "user"])
def test_privtrace_model_out_of_core_equals_in_memory(con, small_batches, unit):
    spy = []
    read = stream.read_points
    spied = lambda *a, **k: spy.append(1) or read(*a, **k)   # noqa: E731
    stream.read_points = spied
    try:
        opts = f"eps := 20.0, bbox := {BBOX}, seed := 11, privacy_unit := '{unit}', " \
               f"max_trajectories_per_user := {50 if unit == 'user' else 'NULL'}"
        con.execute(f"FROM mob_fit('mem', 'in_memory_{unit}', {opts})").fetchall()
        assert not spy                                   # a temp table: gathered as lists
        con.execute(f"FROM mob_fit('t', 'out_of_core_{unit}', {opts})").fetchall()
        assert spy                                       # a committed table: read by the release, in buckets
    finally:
        stream.read_points = read
    a, b = _model_arrays(con, f"in_memory_{unit}"), _model_arrays(con, f"out_of_core_{unit}")
    assert a.keys() == b.keys()
    for key in a:
        assert np.array_equal(a[key], b[key]), key
    assert int(a["K"]) >= 2 and a["density"].sum() > 0 and float(a["n_noisy"]) > 50


def test_a_release_on_roads_out_of_core_equals_in_memory(con, small_batches):
    # the street-piece density is summed batch by batch (integers): the same model as the in-memory path, and
    # every point of its output on a road
    from duckmob.roads import Roads, snap

    con.register("grid_arrow", grid_roads(BBOX))
    con.execute("CREATE OR REPLACE TABLE grid AS FROM grid_arrow")
    opts = f"eps := 20.0, bbox := {BBOX}, seed := 11, roads := 'grid'"
    con.execute(f"FROM mob_fit('mem', 'roads_in_memory', {opts})").fetchall()
    con.execute(f"FROM mob_fit('t', 'roads_out_of_core', {opts})").fetchall()
    a, b = _model_arrays(con, "roads_in_memory"), _model_arrays(con, "roads_out_of_core")
    assert a.keys() == b.keys() and "fine_road" in a and a["fine_road"].sum() > 0
    for key in a:
        assert np.array_equal(a[key], b[key]), key
    rows = con.sql("FROM mob_sample('roads_out_of_core', n := 40, seed := 2)").to_arrow_table()
    network = Roads.of(grid_roads(BBOX)).clip(BBOX)
    assert snap(network, rows.column("lat").to_numpy(), rows.column("lon").to_numpy())[4].max() < 1e-3


def test_bucketing_keeps_whole_trajectories(con):
    n = con.sql("SELECT count(*) FROM t").fetchall()[0][0]
    query = _points_query(con, "t")
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        tables = list(stream.read_points(con, query, bucket_points=2000, folder=folder))
    assert len(tables) == stream.n_buckets(n, 2000) > 5
    assert sum(t.num_rows for t in tables) == n
    seen = [set(t.column("traj_id").to_pylist()) for t in tables]
    assert sum(len(s) for s in seen) == len(set().union(*seen))   # no trajectory in two buckets


@pytest.mark.parametrize("unit", ["trajectory", "user"])
def test_synthesize_python_api_many_buckets(con, small_batches, unit):
    k = 2 if unit == "user" else None
    out = synthesize(con, "t", 1.0, bbox=BBOX, seed=5, n=30, privacy_unit=unit, max_trajectories_per_user=k)
    rows = con.sql(f"FROM synthesize('mem', eps := 1.0, bbox := {BBOX}, seed := 5, n := 30, privacy_unit := "
                   f"'{unit}', max_trajectories_per_user := {k or 'NULL'})").fetchall()
    assert [tuple(r.values()) for r in out.to_pylist()] == rows


@pytest.mark.parametrize("unit", ["trajectory", "user"])
@pytest.mark.parametrize("order,support", [(1, None), (2, None), (2, "neighbours")])
def test_transitions_out_of_core_equal(con, small_batches, unit, order, support):
    k = 3 if unit == "user" else None
    states, values = duckmob.transitions(con, "s", order=order, eps=1.0, n_states=64, seed=9, privacy_unit=unit,
                                        max_trajectories_per_user=k, support=support, w=8 if support else None)
    got = sorted((None if order == 1 else int(s[0]), int(s[-2]), int(s[-1]), float(v))
                 for s, v in zip(states, values) if v > 0)
    sup = f", support := '{support}', w := 8" if support else ""
    want = con.sql(f"FROM mob_transitions('smem', markov_order := {order}, eps := 1.0, n_states := 64, seed := 9, "
                   f"privacy_unit := '{unit}', max_trajectories_per_user := {k or 'NULL'}{sup}) ORDER BY ALL"
                   ).fetchall()
    assert got == sorted(want, key=lambda r: (r[0] is not None, r))  # NULLs first, as ORDER BY ALL
    assert len(got) > 50


@pytest.mark.parametrize("unit,what", [("trajectory", "trajectories"), ("user", "trajectories"),
                                       ("trajectory", "users")])
def test_noisy_count_out_of_core_equal(con, unit, what):
    k = 2 if unit == "user" else None
    got = duckmob.noisy_count(con, "t", eps=1.0, seed=4, privacy_unit=unit, max_trajectories_per_user=k, what=what)
    want = con.sql(f"FROM mob_noisy_count('mem', eps := 1.0, seed := 4, privacy_unit := '{unit}', "
                   f"max_trajectories_per_user := {k or 'NULL'}, what := '{what}')").fetchall()[0][0]
    assert got == want


def test_shadowed_table_is_refused_and_nothing_left_on_disk(con, small_batches, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    synthesize(con, "t", 1.0, bbox=BBOX, seed=1, n=5)
    assert list(tmp_path.iterdir()) == []                # the buckets were deleted with the release
    other = duckdb.connect()
    try:
        duckmob.register(other)
        row = "SELECT 1 AS traj_id, TIMESTAMP '2020-01-01' AS ts, 40.0 AS lat, 116.3 AS lon"
        other.execute(f"CREATE TABLE x AS {row}")
        other.execute(f"CREATE TEMP TABLE x AS {row}")
        with pytest.raises(duckdb.Error, match="hides the table"):
            other.sql(f"FROM synthesize('x', eps := 1.0, bbox := {BBOX})").fetchall()
    finally:
        other.close()


@pytest.mark.parametrize("unit", ["trajectory", "user"])
def test_concatenated_batches_are_the_in_memory_trajectories(con, unit):
    """What a method that does not stream (HRNet, the baseline) gets: the in-memory path's trajectories, in its
    order, whatever the buckets."""
    from duckmob.privacy.counting import bound_contributions
    from duckmob.trajectories import from_points

    query = _points_query(con, "t")
    whole, _ = from_points(con.sql(query).to_arrow_table(), bbox=BBOX, outside="drop", time_required=True,
                           private=True)
    if unit == "user":
        whole = whole.take(bound_contributions(whole.user_id, 5, np.random.default_rng(2)))
    source = stream.TableSource(con, query, bucket_points=1500)
    got = source.batches(bbox=BBOX, time_required=True, unit=PrivacyUnit(unit, 5 if unit == "user" else 1),
                         rng=lambda: np.random.default_rng(2)).trajectories()
    source.close()
    for name in ("offsets", "traj_id", "user_id", "ts", "lat", "lon"):
        assert np.array_equal(getattr(got, name), getattr(whole, name)), name
    assert whole.n_trajectories > 30


@pytest.mark.parametrize("output", ["stays", "points"])
def test_hrnet_fit_on_batches_equals_in_memory(con, output):
    """HRNet streams: stay points batch by batch, gathered in the in-memory order, and the fine stage summed over
    the batches, give the in-memory model bit for bit under a seed (the weights and every released table)."""
    import torch

    from duckmob.synth.hrnet import HRNet

    params = dict(w=8, epochs=1, pretrain_iterations=20, max_len=6, progress=False, device="cpu", output=output)
    a, b = _fit_both(con, HRNet(BBOX, **params), 4.0)
    assert a.state.keys() == b.state.keys() and all(torch.equal(a.state[k], b.state[k]) for k in a.state)
    assert a.extra.keys() == b.extra.keys() and all(np.array_equal(a.extra[k], b.extra[k]) for k in a.extra)
    assert (a.extra["fine_steps"].sum() > 0) == (output == "points")   # the step histogram: released for points


def _fit_both(con, synth, eps):
    """``synth`` fitted on the in-memory trajectories and on the same trajectories out of core (many buckets),
    both under one seed."""
    from duckmob.privacy.noise import NoiseSource
    from duckmob.synth.base import fit_unrecorded
    from duckmob.trajectories import from_points

    query = _points_query(con, "t")
    whole, _ = from_points(con.sql(query).to_arrow_table(), bbox=BBOX, outside="drop", time_required=True,
                           private=True)
    a = fit_unrecorded(synth, whole, eps, 1e-5, NoiseSource(3))
    source = stream.TableSource(con, query, bucket_points=1500)
    batches = source.batches(bbox=BBOX, time_required=True, unit=PrivacyUnit(),
                             rng=lambda: np.random.default_rng(0))
    assert sum(1 for _ in batches) > 5
    b = fit_unrecorded(synth, batches, eps, 1e-5, NoiseSource(3))
    source.close()
    return a, b


def test_cleanslate_fit_on_batches_equals_in_memory(con, monkeypatch):
    """Clean-slate streams: each batch reduced to its cell visits (stream.Batches.gather), which is all its trips
    read, so the model out of core is the in-memory one bit for bit under a seed; memory follows the visits."""
    import torch

    from duckmob.synth.cleanslate import CleanSlate
    from duckmob.synth.cleanslate.trips import visits

    seen = []
    monkeypatch.setattr("duckmob.synth.cleanslate.visits", lambda d, *a: seen.append(d.n_points) or visits(d, *a))
    params = dict(w=8, n_time=4, ti_epochs=1, tpg_epochs=1, ti_hidden=8, ti_latent=2, tpg_embed=4, tpg_hidden=8,
                  n_hint=200, batch_size=8)
    a, b = _fit_both(con, CleanSlate(BBOX, **params), 1.0)
    assert len(seen) > 6 and max(seen[1:]) < seen[0]          # the whole table once, then one batch at a time
    assert a.state["ti"].keys() == b.state["ti"].keys()
    for part in ("ti", "tpg", "prior"):
        assert all(torch.equal(a.state[part][k], b.state[part][k]) for k in a.state[part]), part
    assert a.info["n_noisy"] == b.info["n_noisy"]


def test_pategail_fit_on_batches_equals_in_memory(con):
    """PateGail streams: each batch reduced to the fixes its episodes read (the first fix and the last fix of each
    slot); the model out of core is the in-memory one bit for bit under a seed."""
    import torch

    from duckmob.synth.pategail import PateGail

    a, b = _fit_both(con, PateGail(BBOX, rounds=2, episodes=16, disc_steps=1), 4.0)
    assert all(np.array_equal(a.start[k], b.start[k]) for k in a.start)
    assert all(torch.equal(a.state[k], b.state[k]) for k in a.state)
    assert a.info == b.info


def test_reductions_read_what_the_methods_read(con):
    """The per-trajectory reductions keep what trips / episodes read, and drop most fixes."""
    from duckmob.synth.cleanslate.trips import trips, visits
    from duckmob.synth.pategail import mdp
    from duckmob.trajectories import from_points

    whole, _ = from_points(con.sql(_points_query(con, "t")).to_arrow_table(),
                           bbox=BBOX, outside="drop", time_required=True, private=True)
    few = visits(whole, BBOX, 16)
    assert few.n_trajectories == whole.n_trajectories and few.n_points < whole.n_points / 5
    for x, y in zip(trips(few, BBOX, 16, 2, 4).__dict__.values(), trips(whole, BBOX, 16, 2, 4).__dict__.values()):
        assert np.array_equal(x, y)
    fixes = mdp.episode_fixes(whole, 48, 24)
    assert fixes.n_points < whole.n_points / 5
    dev = np.arange(whole.n_trajectories)
    for x, y in zip(mdp.episodes(fixes, BBOX, 16, 48, 24, dev).__dict__.values(),
                    mdp.episodes(whole, BBOX, 16, 48, 24, dev).__dict__.values()):
        assert np.array_equal(x, y)


def _points_query(con, table):
    """The checked SELECT every release reads (TRY_CAST, the user column under both units)."""
    return stream.prepare(con, table, Mapping(), home="memory").select
