"""The reference column of mob_evaluate: every metric again between two halves of the real table, split by a
fixed hash of the trajectory key (user_id, traj_id)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import duckmob
from duckmob.metrics import evaluate, load_side
from duckmob.metrics.common import reference_half, reference_sides

from metrics_helpers import BBOX, W, city, table

SAMPLE_BBOX = [39.8477, 116.1956, 40.1133, 116.4880]


@pytest.fixture(scope="module")
def sample():
    """The shipped GeoLife sample as 'trips', and 'synth': a thinned copy moved ~200 m and 7 minutes."""
    con = duckmob.connect()
    con.execute("SET enable_progress_bar = false")
    con.execute("CREATE TABLE trips AS FROM mob_geolife_sample()")
    con.execute("CREATE TABLE synth AS SELECT traj_id, user_id, ts + INTERVAL 7 MINUTE AS ts, lat + 0.002 AS lat, "
                "lon - 0.002 AS lon FROM trips WHERE hash(ts) % 3 = 0")
    yield con
    con.close()


def keys(side) -> set[tuple[int, int]]:
    return set(zip(side.traj.user_id.tolist(), side.traj.traj_id.tolist()))


def test_split_partitions_the_sample_by_its_key(sample):
    real = load_side(sample.sql("SELECT * FROM mob_points('trips')").to_arrow_table(), SAMPLE_BBOX, "real")[0]
    half0, half1 = reference_sides(real)
    assert keys(half0).isdisjoint(keys(half1))
    assert keys(half0) | keys(half1) == keys(real)
    assert half0.traj.n_points + half1.traj.n_points == real.traj.n_points
    assert 0.4 < half0.n / real.n < 0.6
    again0, _ = reference_sides(real)
    assert keys(again0) == keys(half0)


def test_split_is_a_fixed_function_of_the_key():
    users = np.array([-1, -1, 0, 1, 5, 5, 1_000_000], dtype=np.int64)
    trajs = np.array([0, 1, 0, 0, 12_345, 12_346, 2**40], dtype=np.int64)
    halves = reference_half(users, trajs)
    # Pinned: changing the hash changes every published reference, so it must be a deliberate edit.
    assert halves.tolist() == [0, 0, 1, 0, 0, 1, 1]
    order = np.random.default_rng(1).permutation(len(users))
    assert reference_half(users[order], trajs[order]).tolist() == halves[order].tolist()
    # The key is the pair: one traj_id under many users does not all fall in one half.
    many = reference_half(np.arange(200), np.full(200, 7))
    assert 60 < many.sum() < 140


def test_every_row_has_a_deterministic_reference(sample):
    query = f"FROM mob_evaluate('trips', 'synth', bbox := {SAMPLE_BBOX})"
    first = sample.sql(query).to_arrow_table()
    assert first.column_names == ["exact_not_private", "metric", "value", "reference", "baseline", "lower_is_better",
                                  "source", "description"]
    assert first.num_rows == 38 and first.column("reference").null_count == 0
    # Values and references, not descriptions: the real table's cleaning note can say "sorted the points of 1
    # trajectories by time" or not, as DuckDB's parallel list() hands the points over in varying order.
    numbers = ["metric", "value", "reference", "baseline"]
    assert first.select(numbers).equals(sample.sql(query).to_arrow_table().select(numbers))
    rows = first.to_pylist()
    by = {r["metric"]: r for r in rows}
    assert by["real_trajectories"]["reference"] + by["synth_trajectories"]["reference"] == \
        by["real_trajectories"]["value"]
    assert all(len(r["description"]) <= 100 for r in rows if not r["metric"].endswith("_trajectories"))
    off = sample.sql(f"FROM mob_evaluate('trips', 'synth', bbox := {SAMPLE_BBOX}, families := ['privtrace'], "
                     "reference := false)").to_arrow_table()
    assert off.column("reference").null_count == off.num_rows
    assert off.column("value").to_pylist() == [by[m]["value"] for m in off.column("metric").to_pylist()]


def test_reference_is_the_half_against_half_value():
    """With synth = real every value is 0 or perfect, and the reference equals the value of evaluating one
    real half against the other: the scale a synthetic value is read against."""
    real = table(city(120))
    real = real.append_column("user_id", pc.bit_wise_and(real.column("traj_id"), 3))  # four users
    rows = evaluate(real, real, BBOX, w=W)
    half = reference_half(real.column("user_id").to_numpy(), real.column("traj_id").to_numpy())
    half0 = real.filter(pa.array(half == 0))
    half1 = real.filter(pa.array(half == 1))
    halves = {r["metric"]: r["value"] for r in evaluate(half0, half1, BBOX, w=W, reference=False)}
    compared = 0
    for r in rows:
        expected = halves[r["metric"]]
        assert (r["reference"] is None) == (expected is None), r["metric"]
        if expected is not None:
            assert r["reference"] == pytest.approx(expected, rel=1e-9, abs=1e-12), r["metric"]
            compared += 1
        if r["lower_is_better"] is True and r["value"] is not None:
            assert r["value"] == pytest.approx(0.0, abs=1e-9) and r["reference"] >= r["value"], r["metric"]
    assert compared >= len(rows) - 2


def test_no_reference_without_two_halves():
    one = table(city(1))
    rows = evaluate(one, one, BBOX, w=W, families=["privtrace"])
    assert all(r["reference"] is None for r in rows)


def test_audit_and_downstream_keep_the_row_shape():
    con = duckmob.connect()
    con.register("r", table(city(40)))
    con.execute("CREATE TEMP TABLE real AS FROM r")
    for query in (f"FROM mob_downstream('real', 'real', bbox := {BBOX}, task := 'commute')",
                  f"FROM mob_audit('real', 'real', 'real', bbox := {BBOX}, k := 8, seed := 1)"):
        got = con.sql(query).to_arrow_table()
        assert got.column_names == ["exact_not_private", "metric", "value", "reference", "baseline", "lower_is_better",
                                    "source", "description"]
        assert got.column("reference").null_count == got.num_rows
        assert got.column("baseline").null_count == got.num_rows
    con.close()


def test_taken_side_equals_one_computed_afresh():
    """Side.take slices what the parent computed; a Side built from the same trajectories computes it anew."""
    real = load_side(table(city(80)), BBOX, "real")[0]
    evaluate(real, real, BBOX, w=W, reference=False)  # fill every cache of real
    assert real.od_m is not None  # the one no family reads
    rows = np.flatnonzero(np.arange(real.n) % 3 != 1)
    taken = real.take(rows, "taken")
    fresh = type(real)(real.traj.take(rows), real.bbox, "fresh")
    for name in ("length_m", "diameter_m", "gyration_m", "od_m", "step_m", "step_owner"):
        assert name in taken.__dict__, name
        np.testing.assert_array_equal(getattr(taken, name), getattr(fresh, name), err_msg=name)
    assert taken._routes and taken._visits and taken._cells
    for w in taken._routes:
        assert (taken.routes(w) != fresh.routes(w)).nnz == 0
    for w in taken._visits:
        assert (taken.visits(w) != fresh.visits(w)).nnz == 0
    for w in taken._cells:
        a, b = taken.cells(w), fresh.cells(w)
        for field in ("offsets", "cells", "ts", "first_point"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=f"{w} {field}")
    with pytest.raises(ValueError, match="increasing"):
        real.take(rows[::-1], "reversed")
