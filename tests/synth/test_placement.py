"""The shared fine-placement stage (duckmob/synth/placement/): its releases' sensitivity and accounting, and sampling
(routes along dense fine cells, spacing from the released steps, no one-point trajectory)."""

from __future__ import annotations

import numpy as np
import pytest

from duckmob.privacy import accounting
from duckmob.privacy.counting import normalised_release
from duckmob.privacy.noise import NoiseSource
from duckmob.synth import placement
from duckmob.synth.base import fit_unrecorded
from duckmob.synth.placement import releases
from duckmob.synth.placement import STEP_EDGES_M, FineStats, Placement, PlacementConfig
from duckmob.synth.privtrace import PrivTrace, PrivTraceModel
from duckmob.grid import BBox
from duckmob.trajectories import Trajectories

BOX = [40.0, 116.0, 40.05, 116.06]     # about 4.3 x 5.1 km


def _traj(paths) -> Trajectories:
    lengths = np.array([len(p) for p in paths])
    pts = np.array([q for p in paths for q in p], dtype=float).reshape(-1, 2)
    n = len(paths)
    return Trajectories(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), np.arange(n),
                        np.arange(n), np.zeros(len(pts), dtype=np.int64), pts[:, 0], pts[:, 1])


def _random_walks(n, seed=0):
    rng = np.random.default_rng(seed)
    paths = []
    for _ in range(n):
        k = int(rng.integers(2, 30))
        start = rng.random(2) * [0.05, 0.06] + [40.0, 116.0]
        steps = rng.normal(0, 0.0008, (k, 2)).cumsum(axis=0)
        paths.append(np.clip(start + steps, [40.0, 116.0], [40.05, 116.06]).tolist())
    return _traj(paths)


def _masses(data, w):
    """Each trajectory's exact contribution to the density and the step histogram (no noise)."""
    cells, owner, n_cells = placement.fine_cells(data, BOX, w)
    dens = np.zeros((data.n_trajectories, w * w))
    np.add.at(dens, (owner, cells), 1.0 / n_cells[owner])
    b, s_owner, n_steps = placement.step_bins(data, BOX)
    steps = np.zeros((data.n_trajectories, len(STEP_EDGES_M) - 1))
    np.add.at(steps, (s_owner, b), 1.0 / n_steps[s_owner])
    return dens, steps


def test_each_trajectory_adds_at_most_one_to_each_table_and_only_from_its_own_points():
    data = _random_walks(60)
    dens, steps = _masses(data, 32)
    assert np.allclose(dens.sum(axis=1), 1.0) and (dens >= 0).all()
    assert np.all(steps.sum(axis=1) <= 1 + 1e-12) and (steps >= 0).all()
    # a trajectory's cells are the same alone as among the others
    alone = data.take(np.arange(60) == 17)
    d_alone, s_alone = _masses(alone, 32)
    assert np.array_equal(d_alone[0], dens[17]) and np.array_equal(s_alone[0], steps[17])


def test_the_release_is_the_shared_mechanism_with_the_declared_scales():
    cfg = PlacementConfig()
    sc = placement.scales(2.0, cfg, 3)
    assert sc == pytest.approx({"density": 3 / (2.0 * 0.2 * 0.8), "steps": 3 / (2.0 * 0.2 * 0.2)})
    # on an empty table every fine cell is pure Laplace noise at that scale (before NormCut)
    w = placement.fine_width(BOX, cfg)
    noise = normalised_release(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), w * w,
                               sc["density"], NoiseSource(4))
    assert (noise != 0).all() and abs(np.abs(noise).mean() / sc["density"] - 1) < 0.05


def test_privtrace_event_composes_its_parts_and_the_fine_stage_to_eps():
    for params in ({}, {"output": "cells"}, {"fine_share": 0.5}, {"step_m": 20.0}):
        event = PrivTrace(BOX, **params).plan(1.0, 0.0).event
        assert accounting.epsilon(event, 0.0) == pytest.approx(1.0, rel=1e-9)
    assert placement.privacy_events(1.0, PlacementConfig(output="cells")) == []


def test_fine_width_follows_the_public_bbox_only():
    assert placement.fine_width(BOX, PlacementConfig()) == 64          # 5.1 km / 100 m -> 2^6
    assert placement.fine_width(BOX, PlacementConfig(fine_m=400)) == 16
    assert placement.fine_width(BOX, PlacementConfig(fine_w=8)) == 8
    # the data-driven bound never goes coarser than the method's cells (at_least), so each holds fine cells
    assert placement.fine_width(BOX, PlacementConfig(), n_noisy=100, eps=1.0) == 8
    assert placement.fine_width(BOX, PlacementConfig(), n_noisy=100, eps=1.0, at_least=20) == 32


def _road_placement():
    """Two coarse cells (west/east halves of a 16 x 16 fine grid) and a dense road along row 3 only."""
    w = 16
    density = np.zeros(w * w, np.float32)
    density[3 * w + np.arange(w)] = 10.0
    steps = np.zeros(len(STEP_EDGES_M) - 1)
    steps[20] = 1.0
    coarse = (np.arange(w * w) % w >= w // 2).astype(np.int64)
    return Placement(FineStats(w, density, steps), BOX, coarse, 2, anchors=4)


def test_routes_follow_the_dense_cells_and_move_between_neighbours():
    pl = _road_placement()
    off, cells = pl.fine_paths(np.array([0, 2, 4]), np.array([0, 1, 1, 0]), np.random.default_rng(0))
    r, c = np.divmod(cells, 16)
    assert (r == 3).all()                                   # along the road, never across the empty cells
    same = np.repeat(np.arange(2), np.diff(off))
    inner = same[1:] == same[:-1]
    assert (np.abs(np.diff(r))[inner] <= 1).all() and (np.abs(np.diff(c))[inner] <= 1).all()
    assert (c[off[1] - 1] >= 8) and (c[off[2] - 1] < 8)     # each ends in its last coarse cell


def test_route_tables_are_computed_once_per_move_and_do_not_depend_on_which_moves_come_together():
    """Routes are cached per model (issue 32: the streamed output samples block by block, and each block used
    to recompute every route table): a move's routes are the same computed alone, with others, or from the
    cache, and the perturbed draws come from a public fixed seed, not from the caller's generator."""
    rng = np.random.default_rng(5)
    w = 16
    density = (rng.random(w * w) ** 3).astype(np.float32)
    coarse = (np.arange(w * w) // w // 8) * 2 + (np.arange(w * w) % w >= 8)       # 2 x 2 coarse cells
    stats = FineStats(w, density, np.ones(len(STEP_EDGES_M) - 1))

    def fresh():
        return Placement(stats, BOX, coarse, 4, anchors=3, route_draws=3)

    def routes(pl, moves):
        first, off, cells, _ = pl.route_tables(np.asarray(moves))
        return [[cells[off[r]:off[r + 1]].tolist() for r in range(first[d, i], first[d, i] + 3)]
                for d in range(3) for i in range(len(moves))]

    all_moves = [0 * 4 + 1, 1 * 4 + 3, 2 * 4 + 0, 3 * 4 + 3]
    together = routes(fresh(), all_moves)
    pl = fresh()
    one_by_one = [routes(pl, [m]) for m in all_moves[::-1]][::-1]     # filled in another order
    assert pl._cache["moves"]["keys"].size == 3 * len(all_moves)
    assert routes(pl, all_moves) == together                            # from the cache
    assert [r for d in range(3) for i in range(4) for r in [one_by_one[i][d]]] == together
    assert routes(fresh(), all_moves) == together                       # the draws are public, fixed
    # draw 0 is the released costs; the others differ from it somewhere
    assert np.array_equal(pl.cost_field(0), pl.cost) and not np.array_equal(pl.cost_field(1), pl.cost)
    # a one-cell leg is cached too and equals the uncached route table
    off, cells = pl.leg_paths(np.array([1, 1]), pl.anchor_cells[[pl.anchor_offsets[1]] * 2], np.array([2, 2]))
    first, r_off, r_cells, _ = Placement.route_table(fresh(), np.array([1 * 5]), target=2)
    assert cells[off[0]:off[1]].tolist() == r_cells[r_off[first[0]]:r_off[first[0] + 1]].tolist()


def test_moves_between_far_cells_are_bridged_and_follow_the_streets_the_whole_way():
    """HRNet's stays are often far apart: the cells between two non-neighbouring ones are inserted, so the route
    never jumps, follows the dense road, and its pieces still number the ORIGINAL sequence's cells."""
    w = 16
    density = np.zeros(w * w, np.float32)
    density[3 * w + np.arange(w)] = 10.0                   # a road along row 3
    coarse = (np.arange(w * w) % w) // 4                    # four vertical strips: 0 | 1 | 2 | 3
    pl = Placement(FineStats(w, density, np.ones(len(STEP_EDGES_M) - 1)), BOX, coarse, 4, anchors=4)
    off, cells, into = pl.bridge(np.array([0, 2, 5]), np.array([0, 3, 3, 1, 2]))
    assert off.tolist() == [0, 4, 8]
    assert cells.tolist() == [0, 1, 2, 3, 3, 2, 1, 2]       # 0 -> 3 bridged by 1, 2; 3 -> 1 by 2; 1 -> 2 as it was
    assert into.tolist() == [0, 1, 1, 1, 0, 1, 1, 2]
    f_off, f_cells, pos = pl.fine_paths(np.array([0, 2, 5]), np.array([0, 3, 3, 1, 2]), np.random.default_rng(0),
                                        with_pos=True)
    r, c = np.divmod(f_cells, w)
    owner = np.repeat(np.arange(2), np.diff(f_off))
    inner = owner[1:] == owner[:-1]
    assert (np.maximum(np.abs(np.diff(r)), np.abs(np.diff(c)))[inner] <= 1).all()   # no jump
    assert (r == 3).all()                                   # on the road
    first = slice(0, f_off[1])
    assert (pos[first][np.isin(coarse[f_cells[first]], [1, 2])] == 1).all()   # the bridge belongs to piece 1
    assert pos[first].max() <= 2 and set(pos[f_off[1]:].tolist()) <= {0, 1, 2, 3}
    assert (np.diff(pos)[inner] >= 0).all()                 # pieces in order
    assert coarse[f_cells[f_off[1] - 1]] == 3 and coarse[f_cells[-1]] == 2


def test_a_leg_inside_a_cell_is_its_most_probable_path_between_the_two_anchors():
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import dijkstra

    w = 8
    rng = np.random.default_rng(3)
    density = rng.random(w * w).astype(np.float32) ** 4      # uneven costs: the cheapest path is not straight
    coarse = (np.arange(w * w) % w >= w // 2).astype(np.int64)
    pl = Placement(FineStats(w, density, np.ones(len(STEP_EDGES_M) - 1)), BOX, coarse, 2, anchors=4)
    starts = pl.anchor_cells[[0, 1, 4, 6]]                  # anchors 0 and 1 of cell 0, 0 and 2 of cell 1
    off, cells = pl.leg_paths(np.array([0, 0, 1, 1]), starts, np.array([3, 2, 1, 3]))
    # brute force: Dijkstra over the cell's own fine cells, 8-neighbour moves costing cost(entered) x length
    for i, (c, t) in enumerate([(0, 3), (0, 2), (1, 1), (1, 3)]):
        path = cells[off[i]:off[i + 1]]
        goal = pl.anchor_cells[pl.anchor_offsets[c] + t]
        assert path[0] == starts[i] and path[-1] == goal and (coarse[path] == c).all()
        mine = np.flatnonzero(coarse == c)
        index = {cell: k for k, cell in enumerate(mine)}
        rows, cols, wts = [], [], []
        for u in mine:
            for dr in (-1, 0, 1):
                for dc in (-1, 0, 1):
                    r, q = divmod(int(u), w)
                    v = (r + dr) * w + q + dc
                    if (dr or dc) and 0 <= r + dr < w and 0 <= q + dc < w and coarse[v] == c:
                        rows.append(index[u]); cols.append(index[v]); wts.append(pl.cost[v] * np.hypot(dr, dc))
        dist = dijkstra(csr_matrix((wts, (rows, cols)), shape=(len(mine), len(mine))), indices=index[starts[i]])
        r, q = np.divmod(path, w)
        cost = sum(pl.cost[b] * np.hypot(r1 - r0, q1 - q0) for b, r0, q0, r1, q1 in
                   zip(path[1:], r[:-1], q[:-1], r[1:], q[1:]))
        assert cost == pytest.approx(dist[index[goal]], rel=1e-9)


def test_trajectories_end_at_anchors_of_their_last_cell_drawn_by_density():
    """The last leg: where a sequence ends follows the released density over its last cell's anchors, not the
    border nearest the previous cell."""
    w = 16
    density = np.ones(w * w, np.float32)
    far, near = 3 * w + 15, 3 * w + 8                        # in the east cell: far from and next to the west one
    density[far], density[near] = 30.0, 10.0
    coarse = (np.arange(w * w) % w >= w // 2).astype(np.int64)
    pl = Placement(FineStats(w, density, np.ones(len(STEP_EDGES_M) - 1)), BOX, coarse, 2, anchors=2)
    n = 4000
    off, cells = pl.fine_paths(np.arange(n + 1) * 2, np.tile([0, 1], n), np.random.default_rng(5))
    last = cells[off[1:] - 1]
    assert set(np.unique(last)) <= {far, near}
    assert np.mean(last == far) == pytest.approx(0.75, abs=0.03)   # 30 / (30 + 10)


def test_points_are_spaced_by_the_released_steps_and_never_fewer_than_two():
    pl = _road_placement()
    lengths, lat, lon = pl.points(np.array([0, 1, 3]), np.array([0, 0, 1]), np.random.default_rng(1))
    assert (lengths >= 2).all()
    owner = np.repeat(np.arange(2), lengths)
    x, y = placement.local_xy(pl.bbox, lat, lon)
    d = np.hypot(np.diff(x), np.diff(y))[owner[1:] == owner[:-1]]
    lo, hi = STEP_EDGES_M[20], STEP_EDGES_M[21]
    last = np.cumsum(lengths) - 2                            # the final step to the route's end is shorter
    inner = np.setdiff1d(np.arange(len(d)), last - np.arange(len(lengths)))
    # distances are along the (jittered) route: a straight chord is never longer, rarely much shorter
    assert np.all(d[inner] <= hi + 1e-6) and np.mean(d[inner] >= lo) > 0.8


def test_privtrace_samples_routed_points_inside_the_bbox_and_round_trips():
    data = _random_walks(300, seed=2)
    model = fit_unrecorded(PrivTrace(BOX, K=3), data, 5.0, 0.0, NoiseSource(3))
    syn = model.sample(200, np.random.default_rng(4))
    lengths = np.diff(syn.offsets)
    assert syn.n_trajectories == 200 and (lengths >= 2).all()
    assert ((syn.lat >= BOX[0]) & (syn.lat <= BOX[2]) & (syn.lon >= BOX[1]) & (syn.lon <= BOX[3])).all()
    again = PrivTraceModel.from_bytes(model.to_bytes())
    assert again.fine is not None and np.array_equal(again.fine.density, model.fine.density)
    a, b = again.sample(50, np.random.default_rng(9)), model.sample(50, np.random.default_rng(9))
    assert np.array_equal(a.lat, b.lat) and np.array_equal(a.offsets, b.offsets)
    cells = fit_unrecorded(PrivTrace(BOX, K=3, output="cells"), data, 5.0, 0.0, NoiseSource(3))
    assert cells.fine is None


def test_adaptive_density_keeps_strong_cells_and_spreads_weak_blocks():
    w, scale = 8, 1.0
    noisy = np.zeros(w * w)
    noisy[3 * w + 3] = 50.0                  # far above the noise: kept as is
    noisy[0:2] = [1.0, 1.5]                   # weak: spread over the smallest block whose sum is significant
    out = placement.adaptive_density(noisy, w, scale, tau=2.0, levels=3)
    assert out[3 * w + 3] == pytest.approx(50.0)
    # the strong cell's 2x2 block resolves its 3 other cells to what it left (0); the 12 cells still open in
    # the 4x4 block share what the resolved ones left of it: (52.5 - 50) / 12
    assert (out >= 0).all() and out[0] == pytest.approx(2.5 / 12) and out[0] == pytest.approx(out[1])
    assert out.sum() == pytest.approx(noisy.sum())
    # an even density stays as it is
    pure = placement.adaptive_density(np.full(w * w, 0.5), w, scale, tau=2.0, levels=3)
    assert np.allclose(pure, 0.5)


def test_step_blocks_widen_with_less_mass_in_noise_scales():
    n_bins = len(STEP_EDGES_M) - 1
    assert placement.step_block(16_739, 25.0) == 1          # PrivTrace on GeoLife at eps 1: every bin
    assert placement.step_block(1_000, 50.0) == 6           # HRNet's share on 1,000: B = 2 sqrt(20) ~ 8.9 blocks
    sizes = [placement.step_block(n, 50.0) for n in (10, 100, 1_000, 10_000, 1e6)]
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] == 1 and sizes[0] <= n_bins


def test_a_small_step_budget_releases_a_blocked_histogram_near_the_real_spacing(monkeypatch):
    """1,000 east-bound trajectories whose steps spread over two decades (5-500 m, log-uniform, as GPS traces
    mix walking and driving), steps released at eps 0.02 (HRNet's share at eps 1): the histogram is flat inside
    each block and its median mean step over 12 noise draws stays within a factor 2 of the real one; on single
    bins (blocks off) it does not."""
    rng = np.random.default_rng(0)
    n, k = 1000, 12
    step_m = np.exp(rng.uniform(np.log(5), np.log(500), (n, k - 1)))
    lon = 116.001 + np.concatenate([np.zeros((n, 1)), np.cumsum(step_m, axis=1)], axis=1) / (
        111_195 * np.cos(np.radians(40.025)))
    lat = np.repeat(40.001 + 0.048 * rng.random(n)[:, None], k, axis=1)
    data = _traj([np.stack([la, lo], axis=1).tolist() for la, lo in zip(lat, lon)])
    scale = 1 / 0.02
    sc = {"density": scale, "steps": scale}
    sums = placement.statistics(data, BOX, 16, sc)
    lo, hi = STEP_EDGES_M[:-1], STEP_EDGES_M[1:]
    mid = np.where(lo > 0, np.sqrt(lo * hi), hi / 2)
    real = float(np.mean(step_m))

    def median_mean_step():
        m = placement.step_block(n, scale)
        means = []
        for seed in range(12):
            steps = placement.release_statistics(sums, 16, sc, NoiseSource(seed), n_noisy=n).steps
            assert np.allclose(steps[:len(steps) // m * m].reshape(-1, m).std(axis=1), 0)
            means.append(float(steps @ mid / steps.sum()))
        return float(np.median(means))

    blocked = median_mean_step()
    assert real / 2 <= blocked <= real * 2
    monkeypatch.setattr(releases, "STEP_BLOCKS_C", 1e9)      # blocks of one bin
    assert placement.step_block(n, scale) == 1
    single = median_mean_step()
    assert not real / 2 <= single <= real * 2, single


def test_a_public_step_m_spends_the_whole_share_on_the_density_and_spaces_points_by_it():
    """With the public spacing ``step_m`` the step histogram is not released: one Laplace event at the fine
    share's eps, the density at that scale, no steps in the model; points lie step_m apart along their routes."""
    cfg = PlacementConfig(step_m=50.0)
    assert placement.scales(1.0, cfg, 2) == pytest.approx({"density": 2 / 0.2})
    events = placement.privacy_events(1.0, cfg)
    assert len(events) == 1 and accounting.epsilon(events[0], 0.0) == pytest.approx(0.2)
    data = _random_walks(300, seed=4)
    model = fit_unrecorded(PrivTrace(BOX, K=3, step_m=50.0), data, 5.0, 0.0, NoiseSource(3))
    assert model.fine is not None and not model.fine.steps.any()
    out = model.sample(200, np.random.default_rng(1))
    assert (out.lengths >= 2).all()
    x, y = placement.local_xy(BBox.of(BOX), out.lat, out.lon)
    owner = np.repeat(np.arange(out.n_trajectories), out.lengths)
    inner = owner[1:] == owner[:-1]
    d = np.hypot(np.diff(x), np.diff(y))[inner]
    # a chord is never longer than the 50 m along the route (the last step of each trajectory is shorter), and
    # straight stretches make most chords nearly 50 m
    assert d.max() <= 50.0 + 1e-6 and np.mean(d > 40.0) > 0.5
    again = PrivTraceModel.from_bytes(model.to_bytes())
    assert again.config.step_m == 50.0


def test_a_coarse_cell_without_fine_cells_is_routed_as_the_owner_of_the_fine_cell_at_its_centre():
    """A coarse cell smaller than a fine cell holds no fine cell centre, so it has no anchor and no route; it
    used to read another cell's routes (wrong cells silently, or an IndexError: the 300 M-fix crash)."""
    w = 8
    density = (np.random.default_rng(1).random(w * w) ** 3).astype(np.float32)
    coarse = (np.arange(w * w) % w >= w // 2).astype(np.int64) * 2          # cells 0 (west) and 2 (east) only
    stats = FineStats(w, density, np.ones(len(STEP_EDGES_M) - 1))
    lon = BOX[1] + np.array([0.1, 0.4, 0.6, 0.9]) * (BOX[3] - BOX[1])
    centres = (np.full(4, (BOX[0] + BOX[2]) / 2), lon)                     # 1 lies in the west, 3 in the east
    with pytest.raises(ValueError, match="centres"):
        Placement(stats, BOX, coarse, 4, anchors=3)
    pl = Placement(stats, BOX, coarse, 4, anchors=3, centres=centres)
    assert pl.proxy.tolist() == [0, 0, 2, 2]
    seqs = [[0, 2, 3], [3], [1, 2], [0, 1], [1, 3, 1]]
    off = np.concatenate([[0], np.cumsum([len(s) for s in seqs])])
    f_off, cells = pl.fine_paths(off, np.concatenate(seqs), np.random.default_rng(0))
    side = coarse[cells]
    first, last = side[f_off[:-1]], side[f_off[1:] - 1]
    assert first.tolist() == [0, 2, 0, 0, 0] and last.tolist() == [2, 2, 2, 0, 0]
    lengths, lat, lon_ = pl.points(off, np.concatenate(seqs), np.random.default_rng(0))
    assert (lengths >= 2).all() and np.isfinite(lat).all()


def test_routes_on_evenly_costed_cells_do_not_depend_on_the_moves_computed_with_them():
    """Equal-cost staircases tie everywhere on an even density: the next hop breaks ties by the lowest fine
    cell, not by the Dijkstra heap's order over the other moves, so cached routes equal fresh ones in any order."""
    w = 16
    coarse = (np.arange(w * w) // w // 8) * 2 + (np.arange(w * w) % w >= 8)
    stats = FineStats(w, np.ones(w * w, np.float32), np.ones(len(STEP_EDGES_M) - 1))

    def routes(pl, moves):
        first, off, cells, _ = pl.route_table(np.asarray(moves))
        return [cells[off[r]:off[r + 1]].tolist() for i in range(len(moves)) for r in range(first[i], first[i + 1])]

    moves = [0 * 4 + 1, 0 * 4 + 3, 1 * 4 + 2, 2 * 4 + 3, 3 * 4 + 0]
    together = routes(Placement(stats, BOX, coarse, 4, anchors=4), moves)
    alone = [r for m in moves for r in routes(Placement(stats, BOX, coarse, 4, anchors=4), [m])]
    assert together == alone
    # and each route is a shortest one: as many diagonal-or-straight steps as the Chebyshev distance
    first, off, cells, _ = Placement(stats, BOX, coarse, 4, anchors=4).route_table(np.asarray(moves))
    for r in range(len(off) - 1):
        rr, cc = np.divmod(cells[off[r]:off[r + 1]], w)
        assert (np.maximum(np.abs(np.diff(rr)), np.abs(np.diff(cc))) == 1).all()


def test_privtrace_with_a_fine_grid_coarser_than_its_cells_samples_in_any_block_order():
    """fine_w := 4 under 36 first-layer cells: most coarse cells hold no fine centre. Sampling works, and the route
    cache kept across blocks gives the same rows as fresh placements (block order reversed)."""
    data = _random_walks(300, seed=2)
    model = fit_unrecorded(PrivTrace(BOX, K=6, fine_w=4), data, 5.0, 0.0, NoiseSource(3))
    assert (np.bincount(model.placement().coarse, minlength=model.grid.m) == 0).any()
    ahead = [model.sample(40, np.random.default_rng(s)) for s in range(4)]
    fresh = PrivTraceModel.from_bytes(model.to_bytes())
    behind = [fresh.sample(40, np.random.default_rng(s)) for s in range(3, -1, -1)][::-1]
    for a, b in zip(ahead, behind):
        assert np.array_equal(a.offsets, b.offsets) and np.array_equal(a.lat, b.lat)


def test_chord_stretch_measures_how_a_polyline_winds():
    from duckmob.synth.placement.spacing import chord_stretch

    # a straight polyline (stretch 1) and a zigzag whose 45-degree legs make every 2-vertex span sqrt(2) longer
    # along it than in a straight line
    x1, y1 = np.arange(11.0) * 10, np.zeros(11)
    x2 = np.arange(11.0) * 10
    y2 = np.where(np.arange(11) % 2 == 1, 10.0, 0.0)
    x, y = np.r_[x1, x2], np.r_[y1, y2]
    seg = np.hypot(np.diff(x), np.diff(y))
    seg[10] = 0.0                                          # no step between the two polylines
    along = np.r_[0.0, np.cumsum(seg)]
    stretch = chord_stretch(x, y, along, np.array([0, 11, 22]), step_m=2 * 10 * np.sqrt(2))
    assert stretch[0] == pytest.approx(1.0)
    assert stretch[1] == pytest.approx(np.sqrt(2))
    # the span is at most CHORD_SPAN_CELLS fine cells: a long step on the zigzag measured over 2 vertices
    from duckmob.synth.placement.spacing import CHORD_SPAN_CELLS
    cell = 2 * 10 * np.sqrt(2) / CHORD_SPAN_CELLS
    assert chord_stretch(x, y, along, np.array([0, 11, 22]), step_m=1000.0, cell_m=cell)[1] == pytest.approx(np.sqrt(2))
    # too short to measure, and a polyline that doubles back on itself (capped at 3)
    assert chord_stretch(np.zeros(1), np.zeros(1), np.zeros(1), np.array([0, 1]), 50.0)[0] == 1.0
    xb = np.array([0.0, 100.0, 0.0, 100.0, 0.0])
    assert chord_stretch(xb, np.zeros(5), np.r_[0.0, np.cumsum(np.abs(np.diff(xb)))], np.array([0, 5]), 200.0)[0] \
        == 3.0
