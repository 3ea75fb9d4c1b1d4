"""The baseline column of mob_evaluate: every metric between real half 0 and a naive table (half 1's trajectories
as straight trips between uniformly random places in the bbox), the absolute anchor a value is read against."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import duckmob
from duckmob.metrics import evaluate, load_side
from duckmob.metrics.common import BASELINE_TRAJECTORIES, DEFAULT_SEED, baseline_side, reference_half, reference_sides
from duckmob.report import compare
from duckmob.trajectories import to_arrow

from metrics_helpers import BBOX, W, city, table


def keyed(n: int = 120) -> pa.Table:
    real = table(city(n))
    return real.append_column("user_id", pc.bit_wise_and(real.column("traj_id"), 3))  # four users


def test_baseline_side_is_straight_trips_between_uniform_places():
    real = load_side(keyed(), BBOX, "real")[0]
    _, half1 = reference_sides(real)
    naive = baseline_side(half1, None)
    t, h = naive.traj, half1.traj
    # Keys, sizes and times are half 1's; only the places change.
    for name in ("offsets", "traj_id", "user_id", "ts"):
        assert np.array_equal(getattr(t, name), getattr(h, name)), name
    assert not np.allclose(t.lat, h.lat)
    # Recomputed from the docstring: ends drawn uniform from the generator seeded [DEFAULT_SEED, 1], points evenly
    # spaced from the start (first point) to the end (last point).
    ends = np.random.default_rng([DEFAULT_SEED, 1]).random((4, h.n_trajectories))
    lat0 = BBOX[0] + ends[0] * (BBOX[2] - BBOX[0])
    lon1 = BBOX[1] + ends[3] * (BBOX[3] - BBOX[1])
    first, last = t.offsets[:-1], t.offsets[1:] - 1
    assert np.allclose(t.lat[first], lat0) and np.allclose(t.lon[last], lon1)
    steps_lat = np.diff(t.lat)[half1.owner[1:] == half1.owner[:-1]]
    per_traj = half1.owner[1:][half1.owner[1:] == half1.owner[:-1]]
    spread = np.array([np.ptp(steps_lat[per_traj == i]) for i in np.unique(per_traj)])
    assert spread.max() < 1e-12          # equal steps: a straight line walked evenly
    assert ((t.lat >= BBOX[0]) & (t.lat <= BBOX[2]) & (t.lon >= BBOX[1]) & (t.lon <= BBOX[3])).all()
    # The same table for one seed, another for another.
    assert np.array_equal(baseline_side(half1, None).traj.lon, t.lon)
    assert not np.allclose(baseline_side(half1, 5).traj.lon, t.lon)


def test_baseline_side_is_bounded():
    """A large half 1 gives a naive table of at most ``most`` of its trajectories, drawn by the seed; the
    informational rows' baseline says the sizes compared."""
    side = load_side(keyed(), BBOX, "real")[0]
    half1 = reference_sides(side)[1]
    small = baseline_side(half1, None, most=10)
    assert small.n == 10 and half1.n > 10
    chosen = set(small.traj.traj_id.tolist())
    assert chosen <= set(half1.traj.traj_id.tolist())
    lengths = dict(zip(half1.traj.traj_id.tolist(), half1.traj.lengths.tolist()))
    assert small.traj.lengths.tolist() == [lengths[t] for t in small.traj.traj_id.tolist()]
    assert set(baseline_side(half1, None, most=10).traj.traj_id.tolist()) == chosen
    assert set(baseline_side(half1, 2, most=10).traj.traj_id.tolist()) != chosen
    assert BASELINE_TRAJECTORIES == 1000 and baseline_side(half1, None).n == half1.n


def test_baseline_is_half_0_against_the_naive_table():
    """The column equals evaluating real half 0 against the naive table built by hand."""
    real = keyed()
    rows = evaluate(real, real, BBOX, w=W)
    side = load_side(real, BBOX, "real")[0]
    half = reference_half(real.column("user_id").to_numpy(), real.column("traj_id").to_numpy())
    half0 = real.filter(pa.array(half == 0))
    naive = baseline_side(reference_sides(side)[1], None)
    by_hand = {r["metric"]: r["value"] for r in evaluate(half0, naive, BBOX, w=W, reference=False, baseline=False)}
    compared = 0
    for r in rows:
        expected = by_hand[r["metric"]]
        if r["metric"] in ("real_trajectories", "synth_trajectories"):
            assert r["baseline"] == r["reference"]      # the sizes of the two halves
            continue
        assert (r["baseline"] is None) == (expected is None), r["metric"]
        if expected is not None:
            assert r["baseline"] == pytest.approx(expected, rel=1e-9, abs=1e-12), r["metric"]
            compared += 1
    assert compared >= len(rows) - 3
    # The naive table is worse than real data on every metric with a direction (each row has a scale) but one:
    # on 120 short walks no start cell holds enough trajectories, so HRNet's destination JSD is ln 2 (its
    # maximum) between the real halves already, and the report says "not telling".
    directed = {r["metric"]: r for r in rows if r["lower_is_better"] is not None and r["baseline"] is not None}
    assert len(directed) == 33
    flat = [m for m, r in directed.items()
            if not (r["baseline"] > r["reference"] if r["lower_is_better"] else r["baseline"] < r["reference"])]
    assert flat == ["hrnet_destination_jsd"]
    assert directed[flat[0]]["reference"] == directed[flat[0]]["baseline"] == pytest.approx(np.log(2))
    assert compare.verdict(0.5, np.log(2), np.log(2), True).startswith("not telling")


def test_baseline_switches():
    real, synth = keyed(), table(city(80, seed=3), with_time=False)
    both = evaluate(real, synth, BBOX, w=W, families=["privtrace", "fine"])
    off = evaluate(real, synth, BBOX, w=W, families=["privtrace", "fine"], baseline=False)
    only = evaluate(real, synth, BBOX, w=W, families=["privtrace", "fine"], reference=False)
    assert all(r["baseline"] is None for r in off)
    assert [r["reference"] for r in off] == [r["reference"] for r in both]
    assert all(r["reference"] is None for r in only)
    assert [r["baseline"] for r in only] == [r["baseline"] for r in both]
    one = table(city(1))
    assert all(r["baseline"] is None for r in evaluate(one, one, BBOX, w=W, families=["privtrace"]))
    with pytest.raises(Exception, match="option baseline must be true or false"):
        evaluate(real, synth, BBOX, baseline="yes")
    con = duckmob.connect()
    con.register("r", real)
    con.register("s", synth)
    con.execute("CREATE TEMP TABLE real AS FROM r; CREATE TEMP TABLE synth AS FROM s")
    query = f"SELECT metric, reference, baseline FROM mob_evaluate('real', 'synth', bbox := {BBOX}, w := {W}, " \
            "families := ['privtrace', 'fine']"
    assert con.sql(query + ", baseline := false)").fetchall() == [(r["metric"], r["reference"], None) for r in off]
    assert con.sql(query + ")").fetchall() == [(r["metric"], r["reference"], r["baseline"]) for r in both]
    con.close()


def test_the_anchors_place_a_copy_near_real_and_a_naive_table_at_the_baseline():
    """Real data read against itself sits at the reference (position <= 0) on every metric; a naive table of the
    real table's full size (straight trips between random places) sits near the baseline (position about 1)."""
    real = keyed(400)
    side = load_side(real, BBOX, "real")[0]
    naive = to_arrow(baseline_side(side, 11).traj)
    for synth, low, high in ((real, -np.inf, 0.0), (naive, 0.75, 1.1)):
        rows = evaluate(real, synth, BBOX, w=W, families=["hrnet", "privtrace", "fine"])
        where = {r["metric"]: compare.position(r["value"], r["reference"], r["baseline"], r["lower_is_better"])
                 for r in rows if r["lower_is_better"] is not None}
        # On 400 short walks HRNet's destination and transition JSDs and its trajectory-pattern ARE hardly tell
        # real halves from the naive table (their baseline within a quarter of the reference): not telling.
        assert sorted(m for m, p in where.items() if p is None) == \
            ["hrnet_destination_jsd", "hrnet_traj_pattern_are", "hrnet_transition_jsd"]
        placed = np.array([p for p in where.values() if p is not None])
        assert len(placed) == 14 and ((placed >= low) & (placed <= high)).all(), placed.round(2)
