"""The metric set on constructed tables: identical, shifted, half, disjoint, timeless, degenerate."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duckmob.errors import DuckmobError
from duckmob.metrics import evaluate
from duckmob.metrics.common import LN2, are, diameters_m, jsd, shared_histograms
from duckmob.grid import haversine_m

from metrics_helpers import BBOX, W, center, city, table

LN2_ = math.log(2)
# Metrics whose best value is 1 (agreement ratios); every other metric is an error or divergence with best 0.
BEST_ONE = {"lestyan_pattern_tp_ratio", "adatrace_location_kendall_tau", "adatrace_pattern_f1"}
# Rows with no direction (lower_is_better NULL): their value on identical tables.
NEUTRAL = {"fine_points_per_traj_ratio": 1.0, "fine_one_point_share_real": 0.0, "fine_one_point_share_synth": 0.0}


def by_name(rows):
    return {r["metric"]: r for r in rows}


# ------------------------------------------------------------------------------------------------------ JSD

@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e6), st.floats(0, 1e6)), min_size=1, max_size=30))
def test_jsd_is_symmetric_and_within_zero_and_ln2(pairs):
    p = np.array([a for a, _ in pairs])
    q = np.array([b for _, b in pairs])
    a, b = jsd(p, q), jsd(q, p)
    assert a == pytest.approx(b, abs=1e-12)
    assert 0.0 <= a <= LN2 + 1e-12


def test_jsd_values_by_hand():
    assert jsd([1, 2, 3], [2, 4, 6]) == 0.0          # same distribution, other scale
    assert jsd([1, 0], [0, 1]) == pytest.approx(LN2_)  # disjoint supports
    # p = (1/2, 1/2), q = (1, 0): M = (3/4, 1/4); JSD = 1/2 * 1/2 ln(4/3) + 1/2 ln(4/3) = 3/4 ln(4/3)
    assert jsd([1, 1], [1, 0]) == pytest.approx(0.75 * math.log(4 / 3))
    assert jsd([0, 0], [0, 0]) == 0.0
    assert jsd([0, 0], [1, 0]) == pytest.approx(LN2_)   # a distribution missing on one side
    rows = jsd(np.array([[1, 0], [1, 1]]), np.array([[0, 1], [1, 1]]))
    assert rows == pytest.approx([LN2_, 0.0])


def test_are_by_hand():
    # |10-5|/10 + |0-3|/max(0, 2) + |4-4|/4 over 3 queries
    assert are([10, 0, 4], [5, 3, 4], phi=2) == pytest.approx((0.5 + 1.5 + 0) / 3)


def test_shared_histograms_use_one_set_of_edges():
    r, s = shared_histograms([0, 1, 2, 3], [0.5, 10.0], bins=3)
    assert r.tolist() == [1, 1, 2]          # edges 0, 1, 2, 3 from the real maximum
    assert s.tolist() == [1, 0, 1]          # 10 beyond the real range lands in the last bin


def test_diameter_matches_brute_force():
    rng = np.random.default_rng(3)
    lat = 40 + rng.random(300) * 0.2
    lon = 116 + rng.random(300) * 0.2
    offsets = np.array([0, 5, 50, 51, 300])
    got = diameters_m(lat, lon, offsets)
    for i in range(4):
        a, b = offsets[i], offsets[i + 1]
        exact = haversine_m(lat[a:b, None], lon[a:b, None], lat[None, a:b], lon[None, a:b]).max()
        assert exact * 0.997 <= got[i] <= exact + 1e-6


# ---------------------------------------------------------------------------------------------- whole set

def test_identical_tables_give_zero_for_every_divergence_and_error():
    real = table(city())
    rows = by_name(evaluate(real, real, BBOX, w=W, n_queries=100, adatrace_queries=50))
    assert rows["real_trajectories"]["value"] == 60
    for name, row in rows.items():
        if name.endswith("_trajectories"):
            continue
        assert row["value"] is not None, name
        best = NEUTRAL.get(name, 1.0 if name in BEST_ONE else 0.0)
        assert row["value"] == pytest.approx(best, abs=1e-12), name
        assert row["lower_is_better"] is (None if name in NEUTRAL else name not in BEST_ONE), name
        assert row["source"] and row["description"], name


def test_half_of_the_table_by_hand():
    # Two kinds of trip with disjoint cells but the same shape (same rows, so equal lengths in metres), 20 each;
    # the synthetic table keeps only the first kind.
    x = [(5, 5), (5, 6), (5, 7), (6, 7)]
    y = [(5, 25), (5, 26), (5, 27), (6, 27)]
    real = table([x] * 20 + [y] * 20)
    synth = table([x] * 20)
    rows = by_name(evaluate(real, synth, BBOX, w=W, top_k=1000, adatrace_top_k=1000))
    v = {k: r["value"] for k, r in rows.items()}
    # Start-end pairs: real (1/2, 1/2), synthetic (1, 0): 3/4 ln(4/3).
    assert v["adatrace_trip_jsd"] == pytest.approx(0.75 * math.log(4 / 3))
    # Two start cells; the one of kind y has no synthetic trajectory (ln 2), the other is identical (0).
    for name in ("hrnet_destination_jsd", "hrnet_transition_jsd", "hrnet_waypoint_jsd", "hrnet_route_jsd"):
        assert v[name] == pytest.approx(LN2_ / 2), name
    # Shapes per trajectory are equal for both kinds (same lengths, sizes, diameters), so these are 0.
    for name in ("privtrace_length_jsd", "lestyan_trip_size_jsd", "pategail_dailyloc_jsd", "pategail_irank_jsd",
                 "hrnet_travel_distance_jsd"):
        assert v[name] == pytest.approx(0.0, abs=1e-9), name
    # Half of the real frequent patterns (all of kind x) are in the synthetic list.
    assert v["lestyan_pattern_tp_ratio"] == pytest.approx(0.5)
    # Pattern ARE with counts rescaled by n_real / n_synth = 2: kind x patterns 20 vs 40 (error 1), kind y 20
    # vs 0 (error 1) with phi = 0.01 * 40 < 20, so every top pattern has error exactly 1.
    assert v["hrnet_traj_pattern_are"] == pytest.approx(1.0)
    assert v["privtrace_pattern_are"] == pytest.approx(1.0)


def test_shifted_copy_by_hand():
    # Every trip moved one cell east: shapes are unchanged, places all differ.
    paths = [[(10, 10), (10, 11), (11, 11)], [(12, 12), (13, 12), (14, 12), (14, 13)]] * 10
    shifted = [[(r, c + 1) for r, c in p] for p in paths]
    rows = by_name(evaluate(table(paths), table(shifted), BBOX, w=W))
    v = {k: r["value"] for k, r in rows.items()}
    for name in ("privtrace_length_jsd", "privtrace_diameter_jsd", "pategail_radius_jsd",
                 "pategail_distance_jsd", "pategail_dailyloc_jsd", "pategail_grank_jsd", "pategail_irank_jsd",
                 "lestyan_trip_size_jsd", "hrnet_travel_distance_jsd", "hrnet_diameter_jsd"):
        assert v[name] == pytest.approx(0.0, abs=1e-6), name
    # No synthetic trip starts where a real one does.
    assert v["hrnet_destination_jsd"] == pytest.approx(LN2_)
    assert v["lestyan_pattern_tp_ratio"] == 0.0
    # EMD: each trip is matched to its own shifted copy: start and end each move one cell east (metres).
    one_cell = {r: haversine_m(center(r, 10)[0], center(r, 10)[1], center(r, 11)[0], center(r, 11)[1])
                for r in (10, 11, 12, 14)}
    expected = (one_cell[10] + one_cell[11] + one_cell[12] + one_cell[14]) / 2
    assert v["lestyan_od_emd_m"] == pytest.approx(expected, rel=1e-9)
    assert v["lestyan_od_emd_hourly_m"] == pytest.approx(expected, rel=1e-9)


def test_disjoint_tables_reach_the_maxima():
    west = [[(r, c), (r, c + 1), (r + 1, c + 1)] for r in range(2, 12) for c in range(1, 6)]
    east = [[(r, c + 20), (r, c + 21), (r + 1, c + 21)] for r in range(2, 12) for c in range(1, 6)]
    v = {k: r["value"] for k, r in by_name(evaluate(table(west), table(east), BBOX, w=W)).items()}
    for name in ("hrnet_destination_jsd", "hrnet_transition_jsd", "hrnet_density_t_jsd"):
        assert v[name] == pytest.approx(LN2_), name
    assert v["lestyan_pattern_tp_ratio"] == 0.0
    assert v["adatrace_pattern_f1"] == 0.0
    assert v["hrnet_traj_pattern_are"] == pytest.approx(1.0)   # every real pattern counts 0 in the synthetic


def test_timeless_synthetic_gives_null_time_metrics_with_reason():
    real = table(city())
    synth = table(city(seed=1), with_time=False)
    rows = by_name(evaluate(real, synth, BBOX, w=W))
    for name in ("hrnet_density_t_jsd", "lestyan_trip_size_jsd_hourly", "lestyan_od_emd_hourly_m"):
        assert rows[name]["value"] is None
        assert "no timestamps" in rows[name]["description"]
    assert rows["privtrace_length_jsd"]["value"] is not None


def test_degenerate_synthetic_tables_give_defined_values():
    real = table(city())
    one_point = table([[(15, 15)]])
    standing = table([[(15, 15), (15, 15), (15, 15)]] * 5)
    for synth in (one_point, standing):
        rows = evaluate(real, synth, BBOX, w=W)
        for r in rows:
            assert r["value"] is None or np.isfinite(r["value"]), r
            if r["metric"].endswith("_jsd") and r["value"] is not None:
                assert 0 <= r["value"] <= LN2_ + 1e-12


def test_empty_or_outside_synthetic_is_a_clear_error():
    real = table(city())
    empty = table([])
    with pytest.raises(DuckmobError, match="synth table.*empty"):
        evaluate(real, empty, BBOX)
    far = pa.table({"traj_id": [1, 1], "ts": pa.array([None, None], pa.timestamp("us")),
                    "lat": [10.0, 10.1], "lon": [10.0, 10.1]})
    with pytest.raises(DuckmobError, match="synth"):
        evaluate(real, far, BBOX)


def test_options_are_checked():
    real = table(city())
    with pytest.raises(DuckmobError, match="unknown metric families"):
        evaluate(real, real, BBOX, families=["nope"])
    with pytest.raises(DuckmobError, match="unknown evaluation option"):
        evaluate(real, real, BBOX, wdth=3)
    with pytest.raises(DuckmobError, match="bins"):
        evaluate(real, real, BBOX, bins=0)
    rows = evaluate(real, real, BBOX, families="privtrace")
    assert {r["metric"].split("_")[0] for r in rows} == {"real", "synth", "privtrace"}


def test_same_seed_same_numbers_and_seed_changes_queries():
    real, synth = table(city()), table(city(seed=5))
    a = by_name(evaluate(real, synth, BBOX, families=["privtrace"]))
    b = by_name(evaluate(real, synth, BBOX, families=["privtrace"]))
    c = by_name(evaluate(real, synth, BBOX, families=["privtrace"], seed=7))
    assert a["privtrace_density_are"]["value"] == b["privtrace_density_are"]["value"]
    assert a["privtrace_density_are"]["value"] != c["privtrace_density_are"]["value"]
