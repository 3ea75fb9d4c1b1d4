"""The fine family (fine-grid point, trajectory and route density, step lengths, one-point share, points per trajectory)
on tables small enough to compute by hand; the same rows through mob_evaluate."""

from __future__ import annotations

import math

import numpy as np
import pytest

import duckmob
from duckmob.metrics import evaluate, load_side
from duckmob.metrics.fine import step_edges_m
from duckmob.grid import haversine_m

from metrics_helpers import BBOX, W, city, table

LN2 = math.log(2)
JSD_HALF_VS_ONE = 0.75 * math.log(4 / 3)   # JSD((1/2, 1/2), (1, 0)), and of (1/4 x 4) vs (1/2, 0, 0, 1/2)
FINE = dict(families=["fine"], fine_point_w=W, fine_traj_w=W)   # the test grid's 0.01 degree cells


def fine(real, synth, **options) -> dict:
    rows = evaluate(table(real), table(synth), BBOX, **{**FINE, **options})
    return {r["metric"]: r["value"] for r in rows if r["metric"].startswith("fine_")}


def test_identical_tables():
    v = fine(city(), city())
    for name in ("fine_point_density_jsd", "fine_traj_density_jsd", "fine_route_density_jsd", "fine_step_jsd"):
        assert v[name] == 0.0, name
    assert v["fine_points_per_traj_ratio"] == 1.0
    assert v["fine_one_point_share_real"] == v["fine_one_point_share_synth"] == 0.0


def test_disjoint_places_same_shapes():
    west = [[(r, c), (r, c + 1), (r + 1, c + 1)] for r in range(2, 12) for c in range(1, 6)]
    east = [[(r, c + 20), (r, c + 21), (r + 1, c + 21)] for r in range(2, 12) for c in range(1, 6)]
    v = fine(west, east)
    assert v["fine_point_density_jsd"] == pytest.approx(LN2)
    assert v["fine_traj_density_jsd"] == pytest.approx(LN2)
    assert v["fine_route_density_jsd"] == pytest.approx(LN2)
    # One step east and one north in both tables; east/west steps differ by cos(latitude) only, well inside a bin.
    assert v["fine_step_jsd"] == pytest.approx(0.0, abs=1e-12)
    assert v["fine_points_per_traj_ratio"] == 1.0


def test_point_density_counts_points_trajectory_density_counts_cells_once():
    # Real: A, A, B (a repeated fix); synthetic: A, B. Points (2/3, 1/3) vs (1/2, 1/2); each trajectory passes
    # A and B once on both sides; steps (0 m, |AB|) vs (|AB|): (1/2, 1/2) vs (0, 1).
    a, b = (10, 10), (10, 11)
    v = fine([[a, a, b]], [[a, b]])
    p, q = np.array([2 / 3, 1 / 3]), np.array([1 / 2, 1 / 2])
    m = (p + q) / 2
    expected = 0.5 * np.sum(p * np.log(p / m)) + 0.5 * np.sum(q * np.log(q / m))
    assert v["fine_point_density_jsd"] == pytest.approx(expected)
    assert v["fine_traj_density_jsd"] == v["fine_route_density_jsd"] == 0.0
    assert v["fine_step_jsd"] == pytest.approx(JSD_HALF_VS_ONE)
    assert v["fine_points_per_traj_ratio"] == pytest.approx(2 / 3)
    # Going back and forth counts each cell once per trajectory; a second trajectory on the same cells doubles
    # every count, so the distribution is unchanged.
    v = fine([[a, b, a]], [[a, b], [b, a]])
    assert v["fine_traj_density_jsd"] == v["fine_route_density_jsd"] == 0.0


def test_sparse_points_on_the_same_route():
    # Real: every cell of row 5 from column 5 to 8; synthetic: only both ends. The routes pass the same four
    # cells; the points, and the cells holding a point, are (1/4 x 4) vs (1/2, 0, 0, 1/2); steps of one cell vs
    # one step of three cells (two different log bins: 853 m and 2560 m, about 5 bins apart): ln 2.
    dense = [[(5, 5), (5, 6), (5, 7), (5, 8)]]
    sparse = [[(5, 5), (5, 8)]]
    v = fine(dense, sparse)
    assert v["fine_route_density_jsd"] == 0.0
    assert v["fine_traj_density_jsd"] == pytest.approx(JSD_HALF_VS_ONE)
    assert v["fine_point_density_jsd"] == pytest.approx(JSD_HALF_VS_ONE)
    assert v["fine_step_jsd"] == pytest.approx(LN2)
    assert v["fine_points_per_traj_ratio"] == pytest.approx(0.5)


def test_one_point_trajectories():
    a, b = (10, 10), (10, 11)
    v = fine([[a, b]] * 4, [[a], [a, b], [b], [a, b]])
    assert v["fine_one_point_share_real"] == 0.0
    assert v["fine_one_point_share_synth"] == 0.5
    assert v["fine_points_per_traj_ratio"] == pytest.approx(1.5 / 2)
    # Only one-point synthetic trajectories: no step at all on that side, the maximum.
    v = fine([[a, b]], [[a], [b]])
    assert v["fine_step_jsd"] == pytest.approx(LN2)
    assert v["fine_one_point_share_synth"] == 1.0


def test_step_bins_are_public_and_log_spaced():
    edges = step_edges_m(BBOX, 50)
    diagonal = float(haversine_m(BBOX[0], BBOX[1], BBOX[2], BBOX[3]))
    assert len(edges) == 52 and edges[0] == 0.0 and edges[1] == 1.0
    assert edges[-1] == pytest.approx(diagonal)
    ratios = edges[2:] / edges[1:-1]
    assert ratios == pytest.approx(np.full(50, diagonal ** (1 / 50)))
    # A step beyond the last edge cannot occur inside the bbox, but would count in the last bin.
    side = load_side(table([[(0, 0), (31, 31)]]), BBOX, "real")[0]
    from duckmob.metrics.fine import step_histogram

    assert step_histogram(side, edges[:-5]).tolist()[-1] == 1.0


def test_default_grids_and_option_checks():
    rows = {r["metric"]: r for r in evaluate(table(city()), table(city(seed=2)), BBOX, families="fine")}
    assert "200x200" in rows["fine_point_density_jsd"]["description"]
    assert "100x100" in rows["fine_traj_density_jsd"]["description"]
    assert "50 log-spaced" in rows["fine_step_jsd"]["description"]
    assert all(r["source"] and r["description"] for r in rows.values())
    assert "100x100" in rows["fine_route_density_jsd"]["description"]
    for name in ("fine_point_density_jsd", "fine_traj_density_jsd", "fine_route_density_jsd", "fine_step_jsd"):
        assert 0 < rows[name]["value"] < LN2 and rows[name]["lower_is_better"] is True
    from duckmob.errors import DuckmobError

    with pytest.raises(DuckmobError, match="fine_point_w"):
        evaluate(table(city()), table(city()), BBOX, families="fine", fine_point_w=0)


def test_mob_evaluate_from_sql():
    con = duckmob.connect()
    try:
        a, b = (10, 10), (10, 11)
        con.register("r", table([[a, a, b]]))
        con.register("s", table([[a, b], [a]], with_time=False))
        con.execute("CREATE TEMP TABLE real AS FROM r; CREATE TEMP TABLE synth AS FROM s")
        got = dict(con.sql(f"SELECT metric, value FROM mob_evaluate('real', 'synth', bbox := {BBOX}, "
                           f"families := ['fine'], fine_point_w := {W}, fine_traj_w := {W}, step_bins := 50)"
                           ).fetchall())
        assert got["fine_one_point_share_synth"] == 0.5
        assert got["fine_points_per_traj_ratio"] == pytest.approx(1.5 / 3)
        # Real steps (0 m, |AB|), synthetic (|AB|): the worked example above.
        assert got["fine_step_jsd"] == pytest.approx(JSD_HALF_VS_ONE)
        # Points: real (2/3, 1/3) vs synthetic (2/3, 1/3): A, B and A again.
        assert got["fine_point_density_jsd"] == pytest.approx(0.0, abs=1e-12)
        # Trajectory-cell pairs: real A, B (1/2, 1/2) vs synthetic A, B, A (2/3, 1/3), with or without segments.
        p, q = np.array([1 / 2, 1 / 2]), np.array([2 / 3, 1 / 3])
        m = (p + q) / 2
        expected = 0.5 * np.sum(p * np.log(p / m)) + 0.5 * np.sum(q * np.log(q / m))
        assert got["fine_traj_density_jsd"] == pytest.approx(expected)
        assert got["fine_route_density_jsd"] == pytest.approx(expected)
        every = {m for (m,) in con.sql(f"SELECT metric FROM mob_evaluate('real', 'synth', bbox := {BBOX})"
                                       ).fetchall()}
        assert {"fine_point_density_jsd", "fine_traj_density_jsd", "fine_route_density_jsd", "fine_step_jsd",
                "fine_points_per_traj_ratio",
                "fine_one_point_share_real", "fine_one_point_share_synth"} <= every   # in the default families
    finally:
        con.close()
