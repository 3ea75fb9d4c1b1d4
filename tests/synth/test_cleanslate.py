"""The clean-slate method (Lestyan et al.): trips and grams, per-trajectory clipping, the accountant, most
probable paths against brute force, and fits through SQL and the release core."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

import duckmob
from duckmob.errors import DuckmobError
from duckmob.privacy import accounting, ledger
from duckmob.privacy.noise import NoiseSource
from duckmob.release.fitting import fit_request
from duckmob.synth import dpsgd
from duckmob.synth.base import fit_unrecorded, pack, unpack
from duckmob.synth.cleanslate import CleanSlate, CleanSlateModel, CleanSlatePlan, upgrade_format_1
from duckmob.synth.cleanslate.paths import most_probable_paths, replace, through
from duckmob.synth.cleanslate.prior import (bucket, bucket_range, chebyshev, coarse_of, destinations, detour_bins,
                                            detour_shape, detours, draw_detours, exact_histogram, gravity, hops,
                                            noisy_histogram, prior_events, refine, release_prior, waypoints)
from duckmob.synth.cleanslate.transitions import Transitions
from duckmob.synth.cleanslate.trips import fill_gaps, grams, neighbour_offsets, trips, valid_moves
from duckmob.trajectories import Trajectories

BOX = [0.0, 0.0, 1.0, 1.0]
# small and fast; every fit below at eps 1 shares one calibration of the noise (cached: it is public)
TINY = dict(w=4, n_time=4, ti_epochs=1, tpg_epochs=1, ti_hidden=8, ti_latent=2, tpg_embed=4, tpg_hidden=8,
            n_hint=200, batch_size=8, ti_coarse=2)
DAY0 = 1_700_000_000_000_000 - 1_700_000_000_000_000 % 86_400_000_000   # a midnight, µs


def straight_lines(n: int, seed: int = 0) -> Trajectories:
    """n trajectories along straight segments in the unit box, 2-14 fixes a minute apart, random start times."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, 15, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    a, b = rng.random((n, 2)) * 0.98 + 0.01, rng.random((n, 2)) * 0.98 + 0.01
    owner = np.repeat(np.arange(n), lengths)
    f = (np.arange(offsets[-1]) - offsets[owner]) / (lengths[owner] - 1)
    lat = a[owner, 0] + f * (b[owner, 0] - a[owner, 0])
    lon = a[owner, 1] + f * (b[owner, 1] - a[owner, 1])
    start = DAY0 + rng.integers(0, 86_400, n) * 1_000_000
    ts = start[owner] + (np.arange(offsets[-1]) - offsets[owner]) * 60_000_000
    return Trajectories(offsets, np.arange(n), np.arange(n) // 2, ts.astype(np.int64), lat, lon)


# -- trips and grams ---------------------------------------------------------------------------------------

def test_gaps_are_filled_by_hops_of_at_most_r_cells():
    w = 8
    offsets, cells = fill_gaps(np.array([0, 2, 4]), np.array([0, 3, 9 * 1, 9 * 1 + 7 * 8]), w, 1)
    assert offsets.tolist() == [0, 4, 12]
    assert cells[:4].tolist() == [0, 1, 2, 3]
    row, col = np.divmod(cells[4:], w)
    assert (np.maximum(np.abs(np.diff(row)), np.abs(np.diff(col))) == 1).all()
    assert cells[4] == 9 and cells[-1] == 65
    # r = 2: a hop of 5 cells becomes 3 hops of at most 2
    offsets, cells = fill_gaps(np.array([0, 2]), np.array([0, 5]), w, 2)
    assert cells.tolist() == [0, 2, 3, 5] or cells.tolist() == [0, 2, 4, 5]
    assert (np.abs(np.diff(cells)) <= 2).all()


def test_trips_and_grams_come_from_each_trajectory_alone():
    data = straight_lines(40)
    t = trips(data, BOX, 8, 1, 24)
    g = grams(t, 8, 1, max_grams=3)
    assert t.n == 40 and (g.count <= 3).all() and (g.count == np.minimum(np.diff(t.offsets) - 1, 3)).all()
    dr, dc = neighbour_offsets(1)
    used = np.arange(3)[None] < g.count[:, None]
    nxt = g.current + dr[g.label] * 8 + dc[g.label]
    assert valid_moves(8, 1)[g.current[used], g.label[used]].all()
    assert np.isin(nxt[used], t.cells).all()
    assert (t.slot == (data.ts[data.offsets[:-1]] - DAY0) // 3_600_000_000).all()
    # a neighbouring table (one trajectory removed) changes that trajectory's row only
    keep = np.arange(40) != 7
    t2 = trips(data.take(keep), BOX, 8, 1, 24)
    g2 = grams(t2, 8, 1, max_grams=3)
    for a, b in ((t.source, t2.source), (t.dest, t2.dest), (t.slot, t2.slot), (g.current, g2.current),
                 (g.label, g2.label), (g.count, g2.count)):
        assert np.array_equal(a[keep], b)


def test_rowcol_heads_are_distributions_over_all_cells():
    from duckmob.synth.cleanslate import build_networks

    torch.manual_seed(0)
    ti, _ = build_networks(CleanSlate(BOX, **{**TINY, "ti_coarse": 1}, ti_heads="rowcol").config)
    assert ti.source_head.out_features == 2 * 4
    ls, ld, lt = ti.decode(torch.randn(5, TINY["ti_latent"]))
    assert ls.shape == ld.shape == (5, 16) and lt.shape == (5, 4)
    assert torch.allclose(ls.exp().sum(-1), torch.ones(5)) and torch.allclose(ld.exp().sum(-1), torch.ones(5))
    # logit(row, col) = a[row] + b[col]: the distribution over cells is a product of row and column factors
    p = ls.exp().reshape(5, 4, 4)
    assert torch.allclose(p, p.sum(2, keepdim=True) * p.sum(1, keepdim=True), atol=1e-6)


# -- the prior ---------------------------------------------------------------------------------------------------

def _prior_values(t, w=8, r=1, max_path=12):
    """The per-trajectory values of the prior's histograms: (bins, size) each, as release_prior builds them."""
    detour = detours(t.source, t.dest, np.diff(t.offsets), w, r, max_path)
    return [((t.source, t.dest), w * w), (t.source, w * w), (t.dest, w * w), (t.slot, 24),
            (chebyshev(t.source, t.dest, w), w),
            (detour_bins(t.source, t.dest, detour, w, max_path), int(np.prod(detour_shape(w, max_path))))]


def test_prior_histograms_move_by_at_most_one_per_trajectory_and_k_per_user():
    """Neighbouring tables (one trajectory, or one user's k trajectories, less) differ by at most 1 (k) in L1 in
    each histogram before noise; the detours are never negative and a trajectory adds exactly mass 1."""
    data = straight_lines(60, seed=3)
    t = trips(data, BOX, 8, 1, 24)
    assert (np.diff(t.offsets) - 1 - hops(t.source, t.dest, 8, 1) >= 0).all()
    full = [exact_histogram(v, size, 0.3) for v, size in _prior_values(t)]
    assert all(h.sum() == pytest.approx(t.n) for h in full)
    for out in (0, 17, 59):
        less = trips(data.take(np.arange(60) != out), BOX, 8, 1, 24)
        for h, (v, size) in zip(full, _prior_values(less)):
            assert np.abs(h - exact_histogram(v, size, 0.3)).sum() == pytest.approx(1.0)
    # users of at most k = 2 trajectories (straight_lines: user = trajectory // 2)
    for user in (0, 11):
        less = trips(data.take(data.user_id != user), BOX, 8, 1, 24)
        for h, (v, size) in zip(full, _prior_values(less)):
            assert np.abs(h - exact_histogram(v, size, 0.3, k=2)).sum() <= 2.0 + 1e-9


def test_prior_noise_is_laplace_at_k_over_eps_h_on_every_bin(monkeypatch):
    """Every bin, empty or not, gets Laplace(k / eps_h): mean |noise| = scale, variance 2 scale^2 (fixed seed,
    60,000 bins); release_prior splits eps_prior in equal parts over its histograms, as prior_events accounts."""
    from duckmob.synth.cleanslate import prior as prior_mod

    values = np.repeat(np.arange(10), 50)                       # 500 trajectories in 10 of 60,000 bins
    eps, k = 0.2, 2
    noise = noisy_histogram(values, 60_000, eps, NoiseSource(11), k) - exact_histogram(values, 60_000, eps, k)
    scale = k / eps
    assert abs(np.abs(noise).mean() / scale - 1) < 0.02
    assert abs(noise.var() / (2 * scale ** 2) - 1) < 0.05
    assert abs(noise.mean()) < 0.05 * scale
    calls = []
    real = prior_mod.noisy_histogram
    monkeypatch.setattr(prior_mod, "noisy_histogram",
                        lambda v, size, e, nz, kk=1: calls.append((size, e, kk)) or real(v, size, e, nz, kk))
    t = trips(straight_lines(30), BOX, 8, 1, 24)
    for endpoints, h in (("shared", 4), ("separate", 5)):
        calls.clear()
        release_prior(t.source, t.dest, t.slot, 8, 24, 0.6, NoiseSource(1), 3, endpoints,
                      detours(t.source, t.dest, np.diff(t.offsets), 8, 1, 12), 12)
        assert [c[1:] for c in calls] == [(pytest.approx(0.6 / h), 3)] * h
        assert [e.param("eps") for e in prior_events(0.6, endpoints)] == pytest.approx([0.6 / h] * h)


def test_prior_blocks_follow_the_noisy_count_and_keep_the_bound(monkeypatch):
    """The end and distance histograms go on blocks sized from the noisy count (at most SIGNAL n eps_h / k bins) or
    the public prior_cells; a trajectory still moves each by at most 1 in L1, and the released probabilities are
    spread evenly inside each block."""
    from duckmob.synth.cleanslate import prior as prior_mod
    from duckmob.synth.cleanslate.prior import SIGNAL, coarse_of, prior_block

    assert prior_block(32, 3000, 0.495) == 1                  # 3 x 3000 x 0.124 bins: 33 per side, w = 32 fits
    assert prior_block(119, 3000, 0.495) == 4                 # the 250 m grid: 30 x 30 blocks
    assert prior_block(119, 3000, 0.495, k=4) > 4             # a user's k trajectories: k times the noise
    assert prior_block(119, 1e9, 10.0) == 1 and prior_block(119, 0, 0.1) == 119
    assert prior_block(119, 3000, 0.495, cells=60) == 2       # public: the count is not used
    side = 119 // prior_block(119, 3000, 0.495)
    assert side ** 2 <= SIGNAL * 3000 * 0.495 / 4 * 1.2
    data = straight_lines(60, seed=3)
    t = trips(data, BOX, 8, 1, 24)
    less = trips(data.take(np.arange(60) != 17), BOX, 8, 1, 24)
    for values in (lambda x: (coarse_of(x.source, 8, 3), coarse_of(x.dest, 8, 3)),
                   lambda x: chebyshev(x.source, x.dest, 8) // 3):
        full, part = (exact_histogram(values(x), 9, 0.3) for x in (t, less))
        assert np.abs(full - part).sum() == pytest.approx(1.0)
    sizes = []
    real = prior_mod.noisy_histogram
    monkeypatch.setattr(prior_mod, "noisy_histogram",
                        lambda v, size, e, nz, kk=1: sizes.append(size) or real(v, size, e, nz, kk))
    out = release_prior(t.source, t.dest, t.slot, 8, 24, 0.6, NoiseSource(1), 1, "shared",
                        detours(t.source, t.dest, np.diff(t.offsets), 8, 1, 12), 12, block=3)
    assert sizes[0] == 9 and sizes[2] == 3                    # 3 x 3 blocks of the 8 x 8 grid; distances 0-2, 3-5, 6-7
    for name in ("source", "distance"):
        assert out[name].sum() == pytest.approx(1.0)
    owner = coarse_of(np.arange(64), 8, 3)
    for b in range(9):
        assert np.ptp(out["source"][owner == b]) < 1e-15
    assert np.ptp(out["distance"][:3]) < 1e-15 and np.ptp(out["distance"][6:]) < 1e-15


def test_refine_spreads_blocks_by_the_fine_end_histogram(monkeypatch):
    """With prior_refine (the default above w = 64) one more histogram, of both ends pooled on the fine cells, is
    released and accounted (H = 5), and shares each block's probability among its cells; a block whose fine
    cells are all empty is spread evenly."""
    from duckmob.synth.cleanslate import prior as prior_mod
    from duckmob.synth.cleanslate.prior import coarse_of, n_histograms, within

    owner = coarse_of(np.arange(16), 4, 2)                     # 2 x 2 blocks of a 4 x 4 grid
    fine = np.zeros(16)
    fine[[0, 1]] = [3.0, 1.0]                                  # block 0: cells 0 and 1 only; the others empty
    p = within(np.array([0.5, 0.2, 0.2, 0.1]), fine, owner)
    assert p[0] == pytest.approx(0.375) and p[1] == pytest.approx(0.125) and p[4] == 0 and p[5] == 0
    assert np.allclose(p[owner == 3], 0.025) and p.sum() == pytest.approx(1.0)
    assert n_histograms("shared", True) == 5 and len(prior_events(1.0, "shared", True)) == 5
    assert CleanSlate(BOX, w=119).config.prior_refine and not CleanSlate(BOX).config.prior_refine
    eps_seen = []
    real = prior_mod.noisy_histogram
    monkeypatch.setattr(prior_mod, "noisy_histogram",
                        lambda v, size, e, nz, kk=1: eps_seen.append((size, e)) or real(v, size, e, nz, kk))
    t = trips(straight_lines(30), BOX, 8, 1, 24)
    out = release_prior(t.source, t.dest, t.slot, 8, 24, 1.0, NoiseSource(2), 1, "shared",
                        detours(t.source, t.dest, np.diff(t.offsets), 8, 1, 12), 12, block=2, refine=True)
    assert [size for size, _ in eps_seen][:2] == [64, 16] and all(e == pytest.approx(0.2) for _, e in eps_seen)
    assert out["source"].sum() == pytest.approx(1.0)
    # 1 x 1 blocks: the fine release and the block release estimate one histogram; the mean of the two is used
    one = release_prior(t.source, t.dest, t.slot, 8, 24, 1.0, NoiseSource(2), 1, "shared",
                        detours(t.source, t.dest, np.diff(t.offsets), 8, 1, 12), 12, block=1, refine=True)
    again = NoiseSource(2)
    first = prior_mod.probabilities(prior_mod.histogram((t.source, t.dest), 64, 0.2, again))
    second = prior_mod.probabilities(prior_mod.histogram((t.source, t.dest), 64, 0.2, again))
    assert np.allclose(one["source"], (first + second) / 2) and not np.allclose(first, second)


def test_detours_are_drawn_given_the_distance_bucket():
    assert bucket(np.arange(9)).tolist() == [0, 1, 2, 2, 3, 3, 3, 3, 4]
    assert [r.tolist() for r in bucket_range(np.arange(5), 6)] == [[0, 1, 2, 4, 8], [0, 1, 3, 6, 6]]
    w, cap = 8, 12                                              # distance buckets 0..3 (D <= 7), detour 0..4
    assert detour_shape(w, cap) == (4, 5)
    joint = np.zeros((4, 5))
    joint[0, 0] = 1.0                                          # same-cell trips: no detour
    joint[1, 3] = 1.0                                          # distance 1: detours of 4-7 hops
    s = np.zeros(3000, dtype=np.int64)
    d = np.repeat([0, 1, 3 * w + 3], 1000)                      # distance 0, 1, 3 (bucket 2: empty row)
    detour = draw_detours(s, d, joint.ravel(), w, cap, np.random.default_rng(2))
    assert (detour[:1000] == 0).all() and set(detour[1000:2000]) == {4, 5, 6, 7}
    assert set(detour[2000:]) == {0, 4, 5, 6, 7}                # from the whole histogram


def test_gravity_fits_the_distance_and_destination_histograms():
    w = 6
    rng = np.random.default_rng(4)
    p_s, p_d = rng.dirichlet(np.ones(w * w)), rng.dirichlet(np.ones(w * w))
    p_s[:5] = 0
    p_s /= p_s.sum()
    h = np.array([0.3, 0.3, 0.2, 0.1, 0.05, 0.05])
    g, f = gravity(p_s, p_d, h, w, iterations=200)
    cells = np.arange(w * w)
    kernel = p_d[None] * g[None] * f[chebyshev(cells[:, None], cells[None], w)]
    joint = p_s[:, None] * kernel / kernel.sum(1, keepdims=True)
    dist = np.bincount(chebyshev(cells[:, None], cells[None], w).ravel(), weights=joint.ravel(), minlength=w)
    assert np.allclose(dist, h, atol=2e-3) and np.allclose(joint.sum(0), p_d, atol=2e-3)
    assert np.allclose(joint.sum(1), p_s)
    # sampling destinations given sources follows the same conditional (TI's coarse head flat: one coarse cell)
    s = np.full(20_000, 20)
    d = destinations(s, np.zeros((len(s), 1)), p_d, g, f, w, w, np.random.default_rng(5))
    assert np.abs(np.bincount(d, minlength=w * w) / len(s) - kernel[20] / kernel[20].sum()).max() < 0.01


def test_waypoints_add_the_detour_and_legs_join():
    w, r = 8, 1
    rng = np.random.default_rng(0)
    s, d = rng.integers(0, w * w, 200), rng.integers(0, w * w, 200)
    detour = rng.integers(0, 5, 200)
    mid = waypoints(s, d, detour, np.ones(w * w), w, r, rng)
    assert ((mid < 0) == (detour == 0)).all()
    via = mid >= 0
    extra = hops(s[via], mid[via], w, r) + hops(mid[via], d[via], w, r) - hops(s[via], d[via], w, r)
    gap = np.abs(extra - detour[via])
    assert (gap[s[via] != d[via]] == 0).mean() > 0.9 and (gap <= 1).all()   # round trips: even extra hops only
    # two legs joined at the waypoint; a first leg that did not reach it keeps that leg alone; the cap cuts
    lengths, cells = through(np.array([3, 2]), np.array([1, 2, 3, 7, 8]), np.array([2, 3]),
                             np.array([3, 4, 9, 5, 6]), np.array([True, True]), 4)
    assert lengths.tolist() == [4, 2] and cells.tolist() == [1, 2, 3, 4, 7, 8]
    lengths, cells = replace(np.array([2, 1, 2]), np.array([0, 1, 5, 6, 7]), np.array([True, False, True]),
                             np.array([1, 3]), np.array([9, 10, 11, 12]))
    assert lengths.tolist() == [1, 1, 3] and cells.tolist() == [9, 5, 10, 11, 12]


def test_chained_waypoints_make_long_detours_along_shortest_legs():
    """A detour longer than one waypoint can add takes several (at most MAX_WAYPOINTS); the legs are shortest
    paths, so the path's hops beyond the fewest equal the waypoints' extra hops; every hop moves at most r cells
    and the path ends at the destination."""
    from duckmob.synth.cleanslate import MAX_WAYPOINTS, SHORTEST, chain_waypoints, chained_paths
    from duckmob.synth.cleanslate.paths import Router

    w, r, cap = 10, 1, 300
    rng = np.random.default_rng(4)
    n = 300
    s, d = rng.integers(0, w * w, n), rng.integers(0, w * w, n)
    detour = rng.integers(0, 40, n)
    stops = chain_waypoints(s, d, detour, np.ones(w * w), w, r, rng)
    assert 2 <= len(stops) <= MAX_WAYPOINTS
    assert ((stops[0] < 0) == (detour == 0)).all()
    one = hops(s, stops[0], w, r) + hops(stops[0], d, w, r) - hops(s, d, w, r)
    many = (stops[1] >= 0)
    assert many.any() and (detour[many] > one[many]).all()       # a second waypoint only where one fell short
    log_p = np.log(np.full((1, w * w, 9), 1 / 9))
    router = Router(lambda dd, tt: np.repeat(log_p, len(dd), 0), w, r, hop_cost=SHORTEST)
    via = stops[0] >= 0
    lengths, cells = chained_paths(router, s[via], d[via], np.zeros(int(via.sum()), np.int64),
                                   [m[via] for m in stops], cap)
    ends = np.cumsum(lengths)
    assert (cells[ends - 1] == d[via]).all() and (cells[ends - lengths] == s[via]).all()
    step = chebyshev(cells[1:], cells[:-1], w)
    inside = np.ones(len(cells) - 1, dtype=bool)
    inside[ends[:-1] - 1] = False
    assert (step[inside] <= r).all() and (step[inside] >= 1).all()
    made = lengths - 1 - hops(s[via], d[via], w, r)
    prev, extra = s[via].copy(), np.zeros(int(via.sum()), np.int64)
    for m in stops:
        m = m[via]
        go = m >= 0
        extra += np.where(go, hops(prev, m, w, r) + hops(m, d[via], w, r) - hops(prev, d[via], w, r), 0)
        prev = np.where(go, m, prev)
    assert (made == extra).all()                                   # shortest legs: no detour of their own
    assert np.abs(made - detour[via]).mean() < 2 and np.abs(made - detour[via]).mean() < detour[via].mean() / 5


def test_refine_draws_a_fine_cell_inside_the_coarse_cell():
    w, coarse = 6, 4                                            # 2 x 2 coarse cells, the last ones narrower
    p = np.zeros(w * w)
    p[[0, 7, 8]] = [0.2, 0.6, 0.2]                              # coarse cell 0 only; the others empty: uniform
    c = np.repeat(np.arange(4), 3000)
    fine = refine(c, p, w, coarse, np.random.default_rng(1))
    assert (coarse_of(fine, w, coarse) == c).all()
    first = np.bincount(fine[c == 0], minlength=w * w) / 3000
    assert abs(first[7] - 0.6) < 0.03 and first[[0, 7, 8]].sum() == 1.0
    assert len(np.unique(fine[c == 3])) == 4                    # the 2 x 2 corner block, uniform


# -- privacy: clipping and accounting ---------------------------------------------------------------------

def _clipped_sum_seen(monkeypatch, model, losses, n_rows, expected, max_grad_norm, **kw):
    """The summed clipped gradient one noiseless DP-SGD step hands to Adam (times the expected batch)."""
    seen = []

    def record(opt, args, kwargs):
        if isinstance(opt, torch.optim.Adam):
            seen.append(torch.cat([p.grad.flatten() * expected for p in model.parameters()]).clone())

    handle = register_optimizer_step_pre_hook(record)
    try:
        schedule = dpsgd.Schedule(sample_rate=1.0, steps=1, noise_multiplier=0.0, max_grad_norm=max_grad_norm,
                                  expected_batch_size=expected, lr=1e-3)
        dpsgd.train_ghost(model, losses, n_rows, schedule,
                          dpsgd.RunContext(np.random.default_rng(0), torch.device("cpu"), progress=False), **kw)
    finally:
        handle.remove()
    return seen[0]


def test_each_trajectory_moves_a_step_by_at_most_the_clipping_norm(monkeypatch):
    """TPG examples are whole trajectories: a long trajectory with many grams still moves the step's clipped sum
    by at most C; the sum is the sum of each trajectory's clipped mean-over-grams gradient."""
    torch.manual_seed(0)
    w, r, b, g_max = 4, 1, 6, 5
    gen = torch.Generator().manual_seed(1)
    current = torch.randint(0, w * w, (b, g_max), generator=gen)
    label = torch.randint(0, 9, (b, g_max), generator=gen)
    dest = torch.randint(0, w * w, (b,), generator=gen)
    slot = torch.randint(0, 3, (b,), generator=gen)
    count = torch.tensor([5, 1, 0, 3, 5, 2])
    clip = 0.05

    def fresh():
        torch.manual_seed(0)
        return Transitions(w, r, 3, 4, 8)

    def losses_of(rows_kept):
        def losses(module, rows):
            idx = torch.as_tensor(rows_kept[rows])
            return module(current[idx], dest[idx], slot[idx], label[idx], count[idx])
        return losses

    exact = dpsgd.per_example_gradients(fresh(), lambda call, *row: call(*(x[None] for x in row))[0],
                                        current, dest, slot, label, count)
    per_row = torch.cat([exact[n].reshape(b, -1) for n, _ in fresh().named_parameters()], 1)
    assert per_row.norm(dim=1)[0] > 10 * clip and per_row[2].abs().max() == 0     # clipping bites; no gram: 0
    expect = sum(gr * min(1.0, clip / (gr.norm().item() + 1e-6)) for gr in per_row)
    full = _clipped_sum_seen(monkeypatch, fresh(), losses_of(np.arange(b)), b, 4.0, max_grad_norm=clip)
    assert torch.allclose(full, expect, atol=1e-6)
    for out in range(b):
        kept = np.flatnonzero(np.arange(b) != out)
        less = _clipped_sum_seen(monkeypatch, fresh(), losses_of(kept), b - 1, 4.0, max_grad_norm=clip)
        assert (full - less).norm() <= clip * (1 + 1e-4)
    # the user unit: users of at most 2 trajectories, each clipped to C / 2, so a user moves the sum by <= C
    users = np.array([0, 0, 1, 2, 2, 3])
    full = _clipped_sum_seen(monkeypatch, fresh(), losses_of(np.arange(b)), b, 4.0, max_grad_norm=clip,
                             unit_of_row=users, max_trajectories_per_user=2)
    for u in range(4):
        kept = np.flatnonzero(users != u)
        less = _clipped_sum_seen(monkeypatch, fresh(), losses_of(kept), len(kept), 4.0, max_grad_norm=clip,
                                 unit_of_row=users[kept], max_trajectories_per_user=2)
        assert (full - less).norm() <= clip * (1 + 1e-4)


@pytest.fixture(scope="module")
def fitted():
    """One tiny fit at eps 1, with the Poisson rates the DP-SGD runs were built with."""
    rates = []
    real = dpsgd.UniformWithReplacementSampler

    class Recording(real):
        def __init__(self, **kw):
            super().__init__(**kw)
            rates.append(kw["sample_rate"])

    dpsgd.UniformWithReplacementSampler = Recording
    try:
        model = fit_unrecorded(CleanSlate(BOX, **TINY), straight_lines(150), 1.0, 1e-5, NoiseSource(3))
    finally:
        dpsgd.UniformWithReplacementSampler = real
    return model, rates


def test_the_event_is_the_rate_trained_with_and_matches_dp_accounting(fitted):
    import dp_accounting
    from dp_accounting import pld

    model, rates = fitted
    eps, delta = 1.0, 1e-5
    info = model.info
    leaves = model.event.leaves()
    # count, 4 prior histograms, the step histogram
    assert [e.kind for e in leaves] == ["laplace"] * 6 + ["dp_sgd", "dp_sgd"]
    ti, tpg = leaves[6], leaves[7]
    assert rates == [info["sample_rate"]] * 2 == [ti.param("sample_rate"), tpg.param("sample_rate")]
    assert info["sample_rate"] == 8 / 200          # batch_size / n_hint: public
    assert (ti.param("steps"), tpg.param("steps")) == (info["steps_ti"], info["steps_tpg"]) == (25, 25)
    plan = CleanSlate(BOX, **TINY).plan(eps, delta)
    assert model.event == plan.event and isinstance(plan, CleanSlatePlan)   # what fit spends is the plan
    # each DP-SGD run trains by the schedule whose event is its leaf of the plan
    assert [plan.dp_sgd(run, model.config, 3.0).event for run in (0, 1)] == [ti, tpg]
    assert (plan.sample_rate, plan.steps_ti, plan.sigma_tpg) == (info["sample_rate"], info["steps_ti"],
                                                                 info["noise_multiplier_tpg"])

    def dp_sgd(e):
        step = dp_accounting.PoissonSampledDpEvent(e.param("sample_rate"),
                                                   dp_accounting.GaussianDpEvent(e.param("noise_multiplier")))
        return dp_accounting.SelfComposedDpEvent(step, e.param("steps"))

    def independent(events):
        acc = pld.PLDAccountant()
        acc.compose(dp_accounting.ComposedDpEvent(events))
        return acc.get_epsilon(delta)

    count = dp_accounting.LaplaceDpEvent(1 / leaves[0].param("eps"))
    eps_count = 0.01 * eps
    eps_prior = 0.8 * (eps - eps_count)                     # prior_share of what the count leaves
    eps_steps = 0.05 * (eps - eps_count)                    # step_share of it
    assert [e.param("eps") for e in leaves[1:5]] == pytest.approx([eps_prior / 4] * 4, rel=1e-12)
    assert leaves[5].param("eps") == pytest.approx(eps_steps, rel=1e-12)
    assert info["eps_prior"] == pytest.approx(eps_prior) and info["eps_steps"] == pytest.approx(eps_steps)
    prior = [dp_accounting.LaplaceDpEvent(4 / eps_prior)] * 4 + [dp_accounting.LaplaceDpEvent(1 / eps_steps)]
    total = independent([count, *prior, dp_sgd(ti), dp_sgd(tpg)])
    assert total <= eps * 1.0001 and total >= eps * 0.99
    assert abs(total - accounting.epsilon(model.event, delta)) < 1e-6
    first = independent([count, *prior, dp_sgd(ti)])
    spent = eps_count + eps_prior + eps_steps
    assert abs(first - (spent + 0.5 * (eps - spent))) < 0.01 * eps


# -- trace generation ---------------------------------------------------------------------------------------

def _brute_force_path(log_p: np.ndarray, s: int, d: int, w: int, r: int) -> list[int]:
    """The most probable simple path s -> d by enumerating every simple path (tiny grids only)."""
    valid = valid_moves(w, r)
    dr, dc = neighbour_offsets(r)
    best = [np.inf, None]

    def walk(c, path, cost):
        if cost >= best[0]:
            return
        if c == d:
            best[:] = [cost, list(path)]
            return
        for k in np.flatnonzero(valid[c]):
            nxt = int(c + dr[k] * w + dc[k])
            if nxt not in path:
                walk(nxt, path + [nxt], cost - log_p[c, k])

    walk(s, [s], 0.0)
    return best[1]


@pytest.mark.parametrize("w, r", [(3, 1), (4, 2)])
def test_generated_path_is_the_brute_force_most_probable_path(w, r):
    rng = np.random.default_rng(w)
    valid = valid_moves(w, r)
    table = rng.normal(size=(w * w * 2, w * w, (2 * r + 1) ** 2)) * 2   # logits per (dest, slot)

    def log_probs(dest, slot):
        x = table[dest * 2 + slot] + np.where(valid, 0.0, -1e9)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    n = 60 if w == 3 else 25
    s, d, t = rng.integers(0, w * w, n), rng.integers(0, w * w, n), rng.integers(0, 2, n)
    lengths, cells = most_probable_paths(log_probs, s, d, t, w, r, max_len=w * w, )
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    for i in range(n):   # a loop over a handful of test cases, each against an exhaustive search
        expect = _brute_force_path(log_probs(np.array([d[i]]), np.array([t[i]]))[0], int(s[i]), int(d[i]), w, r)
        assert cells[offsets[i]:offsets[i + 1]].tolist() == expect
    # the public cap cuts longer paths
    short, _ = most_probable_paths(log_probs, s, d, t, w, r, max_len=2)
    assert (short == np.minimum(lengths, 2)).all()


def test_fit_sample_round_trip_and_times(fitted):
    model, _ = fitted
    out = model.sample(50, np.random.default_rng(6))
    assert out.n_trajectories == 50 and (out.lengths >= 2).all()
    assert ((out.lat >= 0) & (out.lat <= 1) & (out.lon >= 0) & (out.lon <= 1)).all()
    assert (np.diff(out.ts)[np.diff(out.offsets[:-1].repeat(out.lengths)) == 0] >= 0).all()
    again = CleanSlateModel.from_bytes(model.to_bytes()).sample(50, np.random.default_rng(6))
    assert np.array_equal(again.lat, out.lat) and np.array_equal(again.ts, out.ts)
    # nothing in the data can make a release refuse: an empty table trains on noise alone
    empty = fit_unrecorded(CleanSlate(BOX, **TINY), Trajectories.empty(), 1.0, 1e-5, NoiseSource(8))
    assert empty.sample(5, np.random.default_rng(0)).n_trajectories == 5 and empty.event == model.event
    with pytest.raises(DuckmobError, match="unknown cleanslate parameter"):
        CleanSlate(BOX, depth=3)
    with pytest.raises(DuckmobError, match="r must be below w"):
        CleanSlate(BOX, w=2, r=2)
    with pytest.raises(DuckmobError, match="cleanslate trains with DP-SGD and needs 0 < delta"):
        fit_request(source="trips", eps=1.0, delta=0.0, method="cleanslate", bbox=BOX)


def test_a_model_keeps_its_config_and_upgrades_format_1_explicitly(fitted):
    """The model's config is a CleanSlateConfig (the grid-derived defaults resolved; the machine's device and
    progress not stored); a format-1 blob (today's models before the header) loads through the upgrade, which
    renames the info's contribution bound and fills in no parameter it lacks."""
    import io

    model, _ = fitted
    config = model.config
    assert (config.max_path, config.ti_coarse, config.prior_refine, config.hop_cost) == (12, 2, False, 1.0)
    stored = torch.load(io.BytesIO(unpack(model.to_bytes())[2]), weights_only=True)
    assert "device" not in stored["config"] and stored["info"]["max_trajectories_per_user"] == 1
    old = dict(stored, info={**{k: v for k, v in stored["info"].items() if k != "max_trajectories_per_user"},
                             "contribution_bound": 1})
    buf = io.BytesIO()
    torch.save(old, buf)
    loaded = CleanSlateModel.from_bytes(buf.getvalue(), "cleanslate")   # no header: format 1
    assert loaded.info["max_trajectories_per_user"] == 1 and "contribution_bound" not in loaded.info
    a, b = loaded.sample(9, np.random.default_rng(1)), model.sample(9, np.random.default_rng(1))
    assert np.array_equal(a.lat, b.lat) and np.array_equal(a.ts, b.ts)
    without = dict(old, config={k: v for k, v in old["config"].items() if k != "hop_cost"})
    with pytest.raises(DuckmobError, match="lacks hop_cost"):
        upgrade_format_1(without)
    buf = io.BytesIO()
    torch.save(without, buf)
    with pytest.raises(DuckmobError, match="lacks hop_cost"):
        CleanSlateModel.from_bytes(buf.getvalue(), "cleanslate")
    assert unpack(pack("cleanslate", 2, model.payload()))[:2] == ("cleanslate", 2)


# -- through SQL and the release core ---------------------------------------------------------------------------

@pytest.fixture
def db():
    con = duckmob.connect()
    data = straight_lines(120, seed=7)
    owner = data.point_traj()
    con.register("pts", {"user_id": data.user_id[owner], "traj_id": data.traj_id[owner],
                         "ts": data.ts, "lat": data.lat, "lon": data.lon})
    con.execute("CREATE TABLE trips AS SELECT user_id, traj_id, make_timestamp(ts) AS ts, lat, lon FROM pts")
    con.execute("CREATE TABLE trips_less AS FROM trips WHERE traj_id <> 11")      # a neighbouring table
    con.unregister("pts")
    yield con
    con.close()


SQL_TINY = "{" + ", ".join(f"'{k}': {v}" for k, v in TINY.items()) + "}"
SQL_BOX = "[0.0, 0.0, 1.0, 1.0]"


def _spent(db):
    return [(r[0], accounting.Event.from_json(r[1])) for r in
            db.execute("SELECT source, event FROM duckmob_ledger WHERE status = 'spent' ORDER BY id").fetchall()]


def test_fit_sample_models_and_budget_through_sql(db):
    ledger.set_budget(db, "trips", 1.0, 1e-5)
    row = db.execute(f"FROM mob_fit('trips', 'cs', eps := 1.0, method := 'cleanslate', bbox := {SQL_BOX}, "
                     f"seed := 2, params := {SQL_TINY})").fetchall()
    assert row[0][:2] == ("cs", "cleanslate")
    a = db.execute("FROM mob_sample('cs', n := 20, seed := 3)").fetchall()
    assert len({r[0] for r in a}) == 20 and all(r[4] is not None for r in a)     # times are modelled
    assert a == db.execute("FROM mob_sample('cs', n := 20, seed := 3)").fetchall()
    assert db.execute("SELECT method, params->>'r' FROM mob_models()").fetchall() == [("cleanslate", "1")]
    spent = _spent(db)
    assert len(spent) == 1 and accounting.epsilon(spent[0][1], 1e-5) <= 1.0 + 1e-9
    # past the budget (nothing left: the count and TI alone do not fit): refused before anything is read or
    # recorded. (A request that the budget can hold by adding noise to TPG is calibrated down to it, as HRNet's.)
    with pytest.raises(Exception, match="budget"):
        db.execute(f"FROM synthesize('trips', eps := 1.0, method := 'cleanslate', bbox := {SQL_BOX}, "
                   f"params := {SQL_TINY})").fetchall()
    assert len(_spent(db)) == 1


def test_neighbouring_tables_spend_the_same_plan_and_one_event_each(db, monkeypatch):
    """D and D' (one trajectory less) reserve and spend the same event (the plan is public: it is computed before
    any data is read); it is one composed event within eps; the user unit works through the core."""
    reserved = []
    real_reserve = ledger.reserve

    def recording(c, prior, event, **kw):
        reserved.append(event)
        return real_reserve(c, prior, event, **kw)

    monkeypatch.setattr(ledger, "reserve", recording)
    for source in ("trips", "trips_less"):
        ledger.set_budget(db, source, 2.0, 1e-5)
        db.execute(f"FROM mob_fit('{source}', 'm_{source}', eps := 1.0, method := 'cleanslate', "
                   f"bbox := {SQL_BOX}, seed := 9, params := {SQL_TINY})").fetchall()
    assert reserved[0] == reserved[1]
    spent = _spent(db)
    assert [s for s, _ in spent] == ["trips", "trips_less"] and spent[0][1] == spent[1][1] == reserved[0]
    for _, event in spent:
        assert [e.kind for e in event.leaves()] == ["laplace"] * 6 + ["dp_sgd", "dp_sgd"]
        assert accounting.epsilon(event, 1e-5) <= 1.0 + 1e-9
    # synthesize with the user unit: k = 2, counts of (trajectories, users) and per-user clipping
    out = db.execute(f"FROM synthesize('trips', eps := 1.0, method := 'cleanslate', bbox := {SQL_BOX}, n := 10, "
                     f"seed := 4, privacy_unit := 'user', max_trajectories_per_user := 2, "
                     f"params := {SQL_TINY})").fetchall()
    assert len({r[0] for r in out}) == 10
    # the user unit: two counts (trajectories, users), 4 prior histograms, the step histogram
    assert [e.kind for e in _spent(db)[-1][1].leaves()] == ["laplace"] * 7 + ["dp_sgd", "dp_sgd"]


# -- speed (issue 32 item 3): the embedding norms and split batches give the same clipped sums --------------------

@pytest.mark.parametrize("lookups", [1, 4, 32, 300])
def test_embedding_norms_equal_opacus(lookups):
    from opacus.grad_sample.embedding_norm_sample import compute_embedding_norm_sample

    layer = torch.nn.Embedding(20, 5)
    gen = torch.Generator().manual_seed(lookups)
    ids = torch.randint(0, 6, (40, lookups), generator=gen)          # repeated ids within rows
    grads = torch.randn(40, lookups, 5, generator=gen)
    ours = dpsgd.embedding_norm_sample(layer, [ids], grads)[layer.weight]
    theirs = compute_embedding_norm_sample(layer, [ids], grads)[layer.weight]
    assert torch.allclose(ours, theirs, atol=1e-5)


def test_split_rows_give_the_same_training():
    """train_ghost with the batch split by width (by_width) takes the same noisy steps as with one part: each row
    is clipped alone either way, and the noise comes from the same generator."""
    from duckmob.synth.cleanslate.transitions import by_width

    data = straight_lines(60)
    t = trips(data, BOX, 8, 1, 4)
    gr = grams(t, 8, 1, 32)
    current, label, count = (torch.as_tensor(a) for a in (gr.current, gr.label, gr.count))
    dest, slot = torch.as_tensor(t.dest), torch.as_tensor(t.slot)

    def losses(module, rows):
        idx = torch.as_tensor(rows)
        width = max(1, int(count[idx].max()))
        return module(current[idx, :width], dest[idx], slot[idx], label[idx, :width], count[idx])

    weights = []
    for split in (None, by_width(gr.count, widths=(2, 3))):
        torch.manual_seed(0)
        model = Transitions(8, 1, 4, 4, 8)
        schedule = dpsgd.Schedule(sample_rate=0.5, steps=4, noise_multiplier=1.0, max_grad_norm=0.1,
                                  expected_batch_size=30, lr=1e-2)
        dpsgd.train_ghost(model, losses, t.n, schedule,
                          dpsgd.RunContext(np.random.default_rng(5), torch.device("cpu"), progress=False),
                          split_rows=split)
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.allclose(weights[0], weights[1], atol=1e-5)


# -- the step histogram and the spacing (issue 32 item 3) ------------------------------------------------------------

def test_the_step_histogram_is_laplace_at_k_over_eps_steps_on_every_bin():
    from duckmob.synth.cleanslate.spacing import N_BINS, release_steps

    scales = []

    class Recording(NoiseSource):
        def laplace(self, scale, size=None):
            scales.append((scale, size))
            return super().laplace(scale, size)

    out = release_steps(straight_lines(200), BOX, 0.5, Recording(1), 2, 200.0)
    assert scales == [(2 / 0.5, N_BINS)]
    assert out.shape == (N_BINS,) and (out >= 0).all() and out.sum() == pytest.approx(1.0)
    # no trajectory: the histogram is noise only and is dropped (one point per cell)
    empty = Trajectories(offsets=np.array([0]), traj_id=np.zeros(0, np.int64), user_id=np.zeros(0, np.int64),
                         ts=np.zeros(0, np.int64), lat=np.zeros(0), lon=np.zeros(0))
    assert not release_steps(empty, BOX, 0.5, NoiseSource(1), 1, 1.0).any()


def test_points_are_spaced_by_the_released_steps_and_capped():
    from duckmob.synth.cleanslate.spacing import N_BINS, corner_vertices, space
    from duckmob.synth.placement import STEP_EDGES_M
    from duckmob.grid import cell_of

    # a path of 4 cells on a 4 x 4 grid over a ~111 km box, one diagonal move
    cells = np.array([0, 1, 6, 7])
    lat, lon = np.array([0.1, 0.1, 0.4, 0.4]), np.array([0.1, 0.4, 0.6, 0.9])
    lengths, vlat, vlon = corner_vertices(np.array([4]), cells, lat, lon, BOX, 4)
    assert lengths.tolist() == [5] and (vlat[2], vlon[2]) == (0.25, 0.5)     # the corner of cells 1 and 6
    probs = np.zeros(N_BINS)
    probs[np.searchsorted(STEP_EDGES_M, 5000.0) - 1] = 1.0                    # steps of a few km
    out_len, plat, plon, along = space(lengths, vlat, vlon, probs, BOX, 1000, np.random.default_rng(0))
    assert out_len[0] > 10 and (plat[0], plon[0], plat[-1], plon[-1]) == (0.1, 0.1, 0.4, 0.9)
    assert np.all(np.diff(along) >= 0)
    assert set(cell_of(plat, plon, BOX, 4).tolist()) <= set(cells.tolist())   # no cell beside the path
    capped = space(lengths, vlat, vlon, probs, BOX, 6, np.random.default_rng(0))
    assert 4 <= capped[0][0] <= 6 and capped[3][-1] == pytest.approx(along[-1])


def test_a_format_2_model_samples_one_point_per_cell(fitted):
    """A model stored before the step histogram (format 2) loads with step_share 0, as it was fitted."""
    import io

    model, _ = fitted
    stored = torch.load(io.BytesIO(unpack(model.to_bytes())[2]), weights_only=True)
    old = dict(stored, config={k: v for k, v in stored["config"].items() if k != "step_share"},
               state={k: v for k, v in stored["state"].items() if k != "steps"})
    buf = io.BytesIO()
    torch.save(old, buf)
    loaded = CleanSlateModel.from_bytes(pack("cleanslate", 2, buf.getvalue()), "cleanslate")
    assert loaded.config.step_share == 0.0
    out = loaded.sample(20, np.random.default_rng(3))
    assert np.diff(out.offsets).max() <= loaded.config.max_path


# -- speed (issue 42 item 5): book-keeping ghost clipping, the collector ---------------------------------------------

class _Mixed(torch.nn.Module):
    """Every layer shape train_ghost's norms take apart: an embedding looked up several times a row (repeated ids),
    a linear layer over T = 6 steps whose rows' gradients are formed whole (2 x 3 <= 6 (2 + 3)), one over T = 2
    whose norms come from Gram matrices (16 x 16 > 2 (16 + 16)), a plain (B, n) linear layer and one without bias."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.steps = torch.nn.Linear(3, 2)
        self.wide = torch.nn.Linear(16, 16)
        self.flat = torch.nn.Linear(4, 1)
        self.nobias = torch.nn.Linear(2, 1, bias=False)

    def forward(self, ids, wide_in, flat_in):
        h = torch.tanh(self.steps(self.embed(ids)))                       # (B, 6, 2)
        return ((self.nobias(h) ** 2).sum((1, 2)) + self.wide(wide_in).pow(2).sum((1, 2))
                + self.flat(flat_in)[:, 0] ** 2)


def test_book_keeping_clipping_gives_the_per_example_clipped_sum(monkeypatch):
    """The clipped sum one noiseless train_ghost step hands to Adam equals the sum of every row's exact gradient
    (vmap) clipped to C, over every layer shape of _Mixed, with rows above and below C."""
    b, clip = 12, 8.0
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 3, (b, 6), generator=gen)                      # few ids: repeats within rows
    wide_in = torch.randn(b, 2, 16, generator=gen) * torch.linspace(0.01, 1.0, b)[:, None, None]
    flat_in = torch.randn(b, 4, generator=gen)

    def fresh():
        torch.manual_seed(0)
        return _Mixed()

    exact = dpsgd.per_example_gradients(fresh(), lambda call, *row: call(*(x[None] for x in row))[0],
                                        ids, wide_in, flat_in)
    per_row = torch.cat([exact[n].reshape(b, -1) for n, _ in fresh().named_parameters()], 1)
    norms = per_row.norm(dim=1)
    assert (norms > clip).any() and (norms < clip).any()
    expect = (per_row * (clip / (norms + 1e-6)).clamp(max=1.0)[:, None]).sum(0)

    def losses(module, rows):
        idx = torch.as_tensor(rows)
        return module(ids[idx], wide_in[idx], flat_in[idx])

    seen = _clipped_sum_seen(monkeypatch, fresh(), losses, b, 4.0, max_grad_norm=clip)
    assert torch.allclose(seen, expect, rtol=1e-4, atol=1e-5)


def test_train_ghost_refuses_what_its_norms_do_not_cover():
    """A trainable parameter outside nn.Linear and nn.Embedding, or a layer output changed in place (its gradient
    would be another tensor's), is refused in one line rather than clipped wrongly."""
    schedule = dpsgd.Schedule(sample_rate=1.0, steps=1, noise_multiplier=0.0, max_grad_norm=1.0,
                              expected_batch_size=2.0, lr=1e-3)
    x = torch.ones(2, 3)

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.scale = torch.nn.Linear(3, 1), torch.nn.Parameter(torch.ones(1))

        def forward(self, v):
            return (self.lin(v) * self.scale)[:, 0]

    class InPlace(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 1)

        def forward(self, v):
            return self.lin(v).mul_(2.0)[:, 0]

    for model, words in ((Scaled(), "plain nn.Linear and nn.Embedding"), (InPlace(), "in-place")):
        with pytest.raises(DuckmobError, match=words):
            dpsgd.train_ghost(model, lambda m, rows: m(x[torch.as_tensor(rows)]), 2, schedule,
                              dpsgd.RunContext(np.random.default_rng(0), torch.device("cpu"), progress=False))


def test_a_fit_freezes_the_collector_while_it_trains_and_leaves_it_as_found(monkeypatch):
    import gc

    frozen = []
    train = dpsgd.train_ghost

    def recording(*args, **kwargs):
        frozen.append(gc.get_freeze_count())
        return train(*args, **kwargs)

    monkeypatch.setattr(dpsgd, "train_ghost", recording)
    before = gc.get_freeze_count()
    fit_unrecorded(CleanSlate(BOX, w=8, ti_epochs=1, tpg_epochs=1, progress=False), straight_lines(40), 1.0, 1e-5,
                   NoiseSource(1))
    assert len(frozen) == 2 and min(frozen) > before and gc.get_freeze_count() == before
