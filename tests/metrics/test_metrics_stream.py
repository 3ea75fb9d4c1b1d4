"""The evaluation in bounded memory (issue 42, item 6): tables read out of core in batches of whole trajectories
give the rows of the tables in memory, through Python and SQL, with per-point values spilled to disk."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow.compute as pc
import pytest

import duckmob
from duckmob.metrics import common, evaluate, evaluate_relations, load_side, stream, summary
from duckmob.metrics.fine import route_density
from duckmob.metrics.plots import passes
from duckmob.source.schema import select_sql

from metrics_helpers import BBOX, W, city, table



def select(con, name: str) -> str:
    """The contract's SELECT of table ``name`` (a missing optional column NULL)."""
    columns = {r[0] for r in con.execute(f"DESCRIBE {name}").fetchall()}
    return select_sql(name, {c: (c if c in columns else None) for c in ("traj_id", "user_id", "ts", "lat", "lon",
                                                                         "seq")})



def tables():
    real = table(city(150))
    real = real.append_column("user_id", pc.bit_wise_and(real.column("traj_id"), 3))   # four users
    return real, table(city(120, seed=3))


def same_rows(got, expected):
    assert [r["metric"] for r in got] == [r["metric"] for r in expected]
    for a, b in zip(got, expected):
        assert a["description"] == b["description"], a["metric"]
        for col in ("value", "reference", "baseline"):
            assert a[col] == b[col], (a["metric"], col)   # bit for bit


@pytest.fixture
def con():
    c = duckdb.connect()
    real, synth = tables()
    c.register("real_rows", real)
    c.register("synth_rows", synth)
    c.execute("CREATE TABLE real AS FROM real_rows")
    c.execute("CREATE TABLE synth AS FROM synth_rows")
    yield c
    c.close()


def test_batches_of_whole_trajectories_give_the_in_memory_rows(con, monkeypatch):
    """Small buckets (many batches), a baseline chosen among candidates of several batches, and per-point step
    lengths spilled to a temporary file and read back in small chunks: every row as in memory."""
    monkeypatch.setattr(common, "BASELINE_TRAJECTORIES", 20)
    monkeypatch.setattr(summary, "SPILL_VALUES", 300)
    monkeypatch.setattr(summary, "READ_VALUES", 128)
    real, synth = tables()
    read = stream.read_table(con.cursor(), select(con, "real"), BBOX, bucket_points=150)
    batches = [stream.trajectories(raw) for raw in read.batches]
    assert len(batches) >= 5 and sum(b.n_trajectories for b in batches) == 150
    assert len(set().union(*(set(b.traj_id.tolist()) for b in batches))) == 150   # whole trajectories
    expected = evaluate(real, synth, BBOX, w=W, seed=3)
    got = evaluate_relations(con.cursor(), select(con, "real"), select(con, "synth"), BBOX,
                             bucket_points=150, w=W, seed=3)
    same_rows(got, expected)
    by = {r["metric"]: r for r in got}
    assert by["synth_trajectories"]["baseline"] == 20.0   # the naive table: 20 of half 1's trajectories
    assert by["pategail_distance_jsd"]["value"] > 0


def test_spilled_points_come_back_in_order(monkeypatch):
    monkeypatch.setattr(summary, "SPILL_VALUES", 10)
    monkeypatch.setattr(summary, "READ_VALUES", 4)
    total = summary.Points()
    parts = [np.arange(k, k + 7, dtype=np.float64) for k in range(0, 70, 7)]
    for p in parts:
        total.add(summary.Points(p))
    assert total.file is not None
    assert np.array_equal(np.concatenate(list(total.chunks())), np.concatenate(parts))
    assert total.max == 69.0


def test_key_counts_add_key_by_key():
    a = summary.KeyCounts.of([5, 1, 5, 9])
    b = summary.KeyCounts.of([9, 2], [3, 4])
    got = a.add(b)
    assert got.keys.tolist() == [1, 2, 5, 9] and got.counts.tolist() == [1, 4, 2, 4]


def test_a_table_outside_the_bbox_is_refused_in_one_line(con):
    with pytest.raises(duckmob.DuckmobError, match="the real table has no trajectory inside the bbox"):
        evaluate_relations(con.cursor(), select(con, "real"), select(con, "synth"),
                           [10.0, 10.0, 11.0, 11.0], w=W)


def test_mob_evaluate_reads_committed_tables_out_of_core(monkeypatch):
    """mob_evaluate over committed tables (read by the UDF in batches) equals it over temporary tables (gathered,
    in memory), a mix of the two included."""
    monkeypatch.setattr(stream, "BUCKET_POINTS", 500)
    c = duckmob.connect()
    real, synth = tables()
    c.register("real_rows", real)
    c.register("synth_rows", synth)
    for name in ("real", "synth"):
        c.execute(f"CREATE TABLE {name} AS FROM {name}_rows")
        c.execute(f"CREATE TEMP TABLE {name}_t AS FROM {name}_rows")
    query = "FROM mob_evaluate('{}', '{}', bbox := " + str(BBOX) + f", w := {W}, seed := 3)"
    gathered = c.sql(query.format("real_t", "synth_t")).to_arrow_table().to_pylist()
    same_rows(c.sql(query.format("real", "synth")).to_arrow_table().to_pylist(), gathered)
    same_rows(c.sql(query.format("real", "synth_t")).to_arrow_table().to_pylist(), gathered)
    assert all(r["exact_not_private"] for r in gathered)
    c.close()


def test_density_picture_sums_route_passes_over_batches(tmp_path, monkeypatch):
    """The route passes of mob_plot_density, summed over batches, are the table's; the picture drawn from a
    committed table (out of core) is the one drawn from the same rows gathered."""
    real, synth = tables()
    side = load_side(real, BBOX, "real")[0]
    con = duckdb.connect()
    con.register("real_rows", real)
    got = passes(stream.read_table(con, select(con, "real_rows"), BBOX, bucket_points=300).batches, BBOX, 64)
    assert got.n == side.n and np.array_equal(got.counts, route_density(side, 64))
    monkeypatch.setattr(stream, "BUCKET_POINTS", 300)
    c = duckmob.connect()
    c.register("real_rows", real)
    c.register("synth_rows", synth)
    for name in ("real", "synth"):
        c.execute(f"CREATE TABLE {name} AS FROM {name}_rows")
        c.execute(f"CREATE TEMP TABLE {name}_t AS FROM {name}_rows")
    paths = []
    for suffix in ("", "_t"):
        path = tmp_path / f"d{suffix}.png"
        c.sql(f"FROM mob_plot_density('real{suffix}', 'synth{suffix}', path := '{path}', bbox := {BBOX})").fetchall()
        paths.append(path.read_bytes())
    assert paths[0] == paths[1]
    c.close()
