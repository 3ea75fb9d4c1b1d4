"""HRNet / baseline: the released length distribution the samples follow, and the fine stage placing stays."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from duckmob import staypoints
from duckmob.grid import cell_of, haversine_m
from duckmob.privacy import accounting
from duckmob.privacy.noise import NoiseSource
from duckmob.synth import placement
from duckmob.synth.base import fit_unrecorded
from duckmob.synth.hrnet import Baseline, FittedModel, HRNet, release_lengths
from duckmob.synth.hrnet.generate import sample_sequences
from duckmob.synth.hrnet.model import BaselineModel
from tests.synth.test_hrnet import BOX, TINY, toy_trajectories


def test_release_lengths_noise_scale_is_k_over_eps():
    # 400 trajectories all of length 2: bin 1 holds 400, the others 0; the raw noisy bins (before NormCut) are
    # Laplace(k / eps): compare the spread of the released distribution's empty-bin mass over many seeds
    lengths = np.full(400, 2)
    eps, k = 0.5, 3
    draws = []
    for seed in range(300):
        p = release_lengths(lengths, 6, eps, NoiseSource(seed), k)
        draws.append(p)
    draws = np.array(draws)
    # the true bin keeps almost all the mass: 400 against Laplace(6) noise on 5 other bins
    assert np.all(draws[:, 1] > 0.85)
    assert abs(draws[:, 1].mean() - 1.0) < 0.06
    # NormCut keeps positive noise on empty bins: their mean mass is about E[max(Lap(6), 0)] = 6 / 2 = 3 per bin
    # (before normalisation; the total is ~400 + 5 * 3)
    empty_mass = draws[:, [0, 2, 3, 4, 5]].sum(1) * 400
    assert 8 < empty_mass.mean() < 22


def test_release_lengths_sensitivity_one_trajectory_moves_one_bin_by_one():
    from duckmob.privacy.counting import normalised_sums

    a = np.array([1, 2, 2, 3, 6])
    b = np.append(a, 4)
    scale = 1.0
    sa = normalised_sums(a - 1, np.arange(5), np.ones(5, np.int64), 6, scale)
    sb = normalised_sums(b - 1, np.arange(6), np.ones(6, np.int64), 6, scale)
    g = sb.sum() - sa.sum()          # one trajectory's whole mass on the noise grid
    assert np.abs(sb - sa).sum() == g and (sb - sa)[3] == g


def test_generator_runs_to_the_target_length():
    torch.manual_seed(0)
    net = BaselineModel(3, 5, 8, 4, 16)
    target = np.array([1, 2, 3, 6, 6, 4] * 50)
    lengths, cells, slots = sample_sequences(net, len(target), 6, np.random.default_rng(0), torch.device("cpu"),
                                             target=target)
    assert np.array_equal(lengths, target)
    assert len(cells) == target.sum() == len(slots)


@pytest.mark.parametrize("cls", [HRNet, Baseline])
def test_plan_composes_counts_lengths_fine_stage_and_dp_sgd_to_eps(cls):
    synth = cls(BOX, **TINY, n_hint=300)
    plan = synth.plan(1.0, 1e-5)
    assert plan.eps_lengths == pytest.approx(0.05) and plan.eps_fine == pytest.approx(0.1)
    assert accounting.epsilon(plan.event, 1e-5) <= 1.0 + 1e-9
    # the fine stage of 'stays' is the density alone, at the whole share
    assert placement.privacy_events(1.0, synth.config) == [accounting.laplace(0.1)]
    # switched off: no length and no fine events, DP-SGD gets more noise budget
    off = cls(BOX, **TINY, n_hint=300, output="cells", length_share=0).plan(1.0, 1e-5)
    assert off.eps_lengths == 0 and off.eps_fine == 0
    assert off.noise_multiplier < plan.noise_multiplier


def test_fit_samples_follow_the_released_lengths_and_fine_density():
    data = toy_trajectories(400)
    model = fit_unrecorded(HRNet(BOX, **TINY), data, 4.0, 1e-5, NoiseSource(11))
    probs = model.extra["len_probs"]
    assert probs.shape == (TINY["max_len"],) and probs.sum() == pytest.approx(1.0)
    out = model.sample(4000, np.random.default_rng(1))
    # lengths in cells (consecutive duplicates collapsed): a one-cell trajectory has two points in its cell
    n_cells = np.diff(staypoints.cell_sequences(out, BOX, TINY["w"], stay_points=False).offsets)
    share = np.bincount(n_cells, minlength=TINY["max_len"] + 1)[1:] / out.n_trajectories
    assert np.abs(share - probs).max() < 0.03
    assert out.lengths.min() >= 2 and np.array_equal(out.lengths, np.maximum(n_cells, 2))
    # the toy data lives near 5 places (~0.005 deg spread); in the cells holding a place, the fine density puts
    # the stays near it, while uniform points in the 8 x 8 cells (0.05 deg) spread over the whole cell
    places = np.array([[39.85, 116.25], [39.95, 116.35], [40.05, 116.45], [40.15, 116.55], [39.9, 116.5]])
    place_cells = cell_of(places[:, 0], places[:, 1], BOX, TINY["w"])

    def near(t):
        inside = np.isin(cell_of(t.lat, t.lon, BOX, TINY["w"]), place_cells)
        d = np.hypot(t.lat[:, None] - places[None, :, 0], t.lon[:, None] - places[None, :, 1]).min(1)
        return (d[inside] < 0.012).mean()

    cells_out = FittedModel.from_bytes(model.to_bytes())
    assert cells_out.fine is not None and np.array_equal(cells_out.extra["len_probs"], probs)
    uniform = fit_unrecorded(HRNet(BOX, **TINY, output="cells"), data, 4.0, 1e-5, NoiseSource(11)).sample(
        4000, np.random.default_rng(1))
    assert near(out) > 0.5 and near(uniform) < 0.2   # measured 0.66 and 0.05
    # placed points stay inside the cell the network drew (same cell sequence as without placement)
    cells = cell_of(out.lat, out.lon, BOX, TINY["w"])
    same = cells[1:] == cells[:-1]
    same[np.cumsum(out.lengths)[:-1] - 1] = False
    two_point = np.repeat(n_cells == 1, out.lengths)[1:]     # the second point of a one-cell trajectory
    assert not (same & ~two_point).any()


def test_place_draws_inside_the_coarse_cell_by_density():
    w = 8
    density = np.zeros(w * w, np.float32)
    density[2 * w + 3] = 5.0          # coarse cell 0 (rows 0-3, cols 0-3 of a 2 x 2 coarse grid) has one hot cell
    stats = placement.FineStats(w=w, density=density, steps=np.ones(len(placement.STEP_EDGES_M) - 1))
    coarse = placement.coarse_of_fine(w, BOX, lambda la, lo: cell_of(la, lo, BOX, 2))
    pl = placement.Placement(stats, BOX, coarse, 4)
    lat, lon, ok = pl.place(np.array([0] * 200 + [3] * 200), np.random.default_rng(0))
    assert ok.all()
    fine = cell_of(lat, lon, BOX, w)
    assert (fine[:200] == 2 * w + 3).all()
    # coarse cell 3 has no mass: uniform over its 16 fine cells, all inside it
    assert (cell_of(lat[200:], lon[200:], BOX, 2) == 3).all() and len(np.unique(fine[200:])) > 10


def test_points_output_routes_through_the_drawn_cells_timed_between_their_slots():
    """output 'points': the fine stage releases both parts (density of the fixes' walk, steps), every trajectory
    has >= 2 points, times never go back within a trajectory, and the model round-trips."""
    data = toy_trajectories(300)
    synth = HRNet(BOX, **TINY, output="points")
    assert placement.privacy_events(1.0, synth.config) == [accounting.laplace(0.1 * f) for f in
                                                            placement.PARTS.values()]
    model = fit_unrecorded(synth, data, 4.0, 1e-5, NoiseSource(5))
    assert model.fine is not None and model.fine.steps.sum() > 0 and (model.fine.steps >= 0).all()
    out = model.sample(500, np.random.default_rng(2))
    assert out.n_trajectories == 500 and out.lengths.min() >= 2
    assert (np.diff(out.ts)[np.diff(out.point_traj()) == 0] >= 0).all()
    again = FittedModel.from_bytes(model.to_bytes()).sample(500, np.random.default_rng(2))
    assert np.array_equal(again.lat, out.lat) and np.array_equal(again.ts, out.ts)


def test_points_output_with_a_public_step_m_releases_the_density_alone_and_spaces_by_it():
    data = toy_trajectories(200)
    synth = HRNet(BOX, **TINY, output="points", step_m=30.0)
    assert placement.privacy_events(1.0, synth.config) == [accounting.laplace(0.1)]
    model = fit_unrecorded(synth, data, 4.0, 1e-5, NoiseSource(6))
    assert model.fine is not None and not model.fine.steps.any()
    out = model.sample(300, np.random.default_rng(3))
    assert out.lengths.min() >= 2
    owner = out.point_traj()
    same = np.diff(owner) == 0
    step = haversine_m(out.lat[:-1], out.lon[:-1], out.lat[1:], out.lon[1:])
    capped = out.lengths[owner[1:]] >= 4999                 # max_points: longer routes are spaced wider, evenly
    assert step[same & ~capped].max() <= 30.0 * 1.01        # chords along routes of 30 m steps (metric: +1%)
    if capped.any():
        assert step[same & capped].max() < 3 * np.median(step[same & capped])    # no jump to the route's end


def test_points_output_starts_and_ends_in_the_network_cells_on_little_data(monkeypatch):
    """With few trajectories the data-driven fine width would be coarser than HRNet's grid (cells without a fine
    cell, hence without anchors); it is kept at least as fine, so routes start and end in the drawn cells."""
    data = toy_trajectories(150)
    model = fit_unrecorded(HRNet(BOX, **{**TINY, "w": 16}, output="points"), data, 1.0, 1e-5, NoiseSource(8))
    assert model.fine.w >= 16
    seen = {}
    points = placement.Placement.points

    def spy(self, offsets, coarse, rng, *args, **kwargs):
        seen["offsets"], seen["cells"] = offsets, coarse
        return points(self, offsets, coarse, rng, *args, **kwargs)

    monkeypatch.setattr(placement.Placement, "points", spy)
    out = model.sample(300, np.random.default_rng(4))
    off, cells = seen["offsets"], seen["cells"]
    first, last = out.offsets[:-1], out.offsets[1:] - 1
    assert np.array_equal(cell_of(out.lat[first], out.lon[first], BOX, 16), cells[off[:-1]])
    assert np.array_equal(cell_of(out.lat[last], out.lon[last], BOX, 16), cells[off[1:] - 1])


def test_points_times_run_from_the_first_cell_time_to_the_last_at_constant_speed_on_a_route():
    w = 16
    density = np.zeros(w * w, np.float32)
    density[3 * w + np.arange(w)] = 10.0                     # one road along row 3 across two coarse cells
    steps = np.zeros(len(placement.STEP_EDGES_M) - 1)
    steps[20] = 1.0
    coarse = (np.arange(w * w) % w >= w // 2).astype(np.int64)
    pl = placement.Placement(placement.FineStats(w, density, steps), BOX, coarse, 2, anchors=2)
    times = np.array([0, 1_000_000, 5_000_000, 9_000_000], dtype=np.int64)   # 2 cells, then 1 cell (2 times)
    lengths, lat, lon, ts = pl.points(np.array([0, 2, 3]), np.array([0, 1, 1]), np.random.default_rng(0),
                                      times=times)
    first, last = np.concatenate([[0], np.cumsum(lengths)[:-1]]), np.cumsum(lengths) - 1
    assert list(ts[first]) == [0, 5_000_000] and list(ts[last]) == [1_000_000, 9_000_000]
    t0 = ts[first[0]:last[0] + 1]
    assert (np.diff(t0) >= 0).all()
    # constant speed along the route: time is proportional to the distance travelled (to rounding and jitter)
    x, y = placement.local_xy(pl.bbox, lat[first[0]:last[0] + 1], lon[first[0]:last[0] + 1])
    travelled = np.concatenate([[0], np.cumsum(np.hypot(np.diff(x), np.diff(y)))])
    assert np.corrcoef(travelled, t0)[0, 1] > 0.95
