"""PrivTrace components against the paper's equations on small hand-made data, and the fit/sample pipeline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from duckmob import synth
from duckmob.errors import DuckmobError
from duckmob.privacy import accounting
from duckmob.privacy.noise import NoiseSource
from duckmob.privacy.unit import PrivacyUnit
from duckmob.release import fitting
from duckmob.synth import base
from duckmob.synth.cells import StateGrid, state_sequences, uniform_grid
from duckmob.synth.privtrace import PrivTrace, PrivTraceConfig, PrivTraceModel, upgrade_format_1_meta
from duckmob.synth.privtrace.markov import (Support, normcut_rows, release_transitions,
                                            select_second_order, transition_counts, transition_windows)
from duckmob.synth.privtrace.trips import hop_distances, trip_distribution
from duckmob.synth.privtrace.walk import (cumulative_rows, hazard, length_bins,
                                          length_histogram, random_walks, stacked_rows)
from duckmob.trajectories import Trajectories

BOX = [0.0, 0.0, 1.0, 1.0]
MODELS_V1 = Path(__file__).parent.parent / "data" / "models_v1"


def _fit(synthesizer: PrivTrace, data, eps: float, seed: int) -> PrivTraceModel:
    """A seeded fit outside any ledger (PrivTrace is pure eps-DP: delta 0)."""
    return base.fit_unrecorded(synthesizer, data, eps, 0.0, NoiseSource(seed))


def _traj(paths: list[list[tuple[float, float]]]) -> Trajectories:
    lengths = [len(p) for p in paths]
    pts = np.array([xy for p in paths for xy in p], dtype=float)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    n = len(paths)
    return Trajectories(offsets, np.arange(n), np.full(n, -1), np.arange(len(pts)), pts[:, 0], pts[:, 1])


# ---------------------------------------------------------------------------------------------- the grid

def test_two_layer_grid_states_and_geometry():
    # 2 x 2 first layer; cell 3 (top right) split 2 x 2 -> 3 + 4 = 7 states
    g = StateGrid(BOX, 2, 1, np.array([0, 0, 0, 1]))
    assert g.m == 7 and g.W == 4
    assert g.state_of([0.1, 0.1, 0.6, 0.9, 0.9], [0.1, 0.9, 0.6, 0.6, 0.9]).tolist() == [0, 1, 3, 5, 6]
    a, b, c, d = g.bounds(np.array([0, 6]))
    assert np.allclose([a[0], b[0], c[0], d[0]], [0, 0, 0.5, 0.5])
    assert np.allclose([a[1], b[1], c[1], d[1]], [0.75, 0.75, 1, 1])
    off, dst = g.neighbours()
    nb = {s: set(dst[off[s]:off[s + 1]].tolist()) for s in range(g.m)}
    assert nb[0] == {1, 2, 3}                       # corner contact with subcell 3 counts (8-neighbourhood)
    assert nb[1] == {0, 2, 3, 4}                    # the big cell below the split cell touches 3 and 4
    assert nb[6] == {3, 4, 5}
    assert all(s in nb[t] for s in nb for t in nb[s])   # symmetric


def test_state_sequences_fill_gaps_with_neighbours_and_collapse_repeats():
    g = uniform_grid(BOX, 4)
    t = _traj([[(0.05, 0.05), (0.06, 0.06), (0.95, 0.95)], [(0.6, 0.1)]])
    off, states, owner = state_sequences(g, t.offsets, t.lat, t.lon)
    assert off.tolist() == [0, 4, 5]
    assert states[:4].tolist() == [0, 5, 10, 15]    # the diagonal, repeats collapsed
    assert states[4] == 8 and owner.tolist() == [0, 0, 0, 0, 1]
    # every consecutive pair is a neighbour pair on any grid, e.g. a random two-layer one
    rng = np.random.default_rng(0)
    g2 = StateGrid(BOX, 3, 2, rng.integers(0, 3, 9))
    t2 = _traj([[tuple(p) for p in rng.random((20, 2))] for _ in range(30)])
    off, states, owner = state_sequences(g2, t2.offsets, t2.lat, t2.lon)
    support = Support.of(g2.m, *g2.neighbours())
    inner = owner[1:] == owner[:-1]
    support.edge_index(states[:-1][inner], states[1:][inner])   # raises if a pair is not adjacent
    assert (states[:-1][inner] != states[1:][inner]).all()


# ----------------------------------------------------------------------------------------- the counts

def _line_support(m):
    # states 0 - 1 - 2 - ... in a line
    offs = [0]
    dst = []
    for s in range(m):
        nb = [x for x in (s - 1, s + 1) if 0 <= x < m]
        dst += nb
        offs.append(len(dst))
    return Support.of(m, np.array(offs), np.array(dst))


def test_transition_counts_are_length_normalised_as_in_appendix_b2():
    sup = _line_support(3)          # D = 2; columns: neighbours then end at column 2
    seq_off = np.array([0, 3, 4])   # T1 = (0, 1, 2), T2 = (1,)
    states = np.array([0, 1, 2, 1])
    start, first, second = transition_counts(sup, seq_off, states)
    # T1 has |T| + 1 = 4 first-order transitions each 1/4; T2 has 2 each 1/2
    assert np.allclose(start, [0.25, 0.5, 0.0])
    assert np.isclose(first[0, 0], 0.25)            # 0 -> 1 (only neighbour of 0)
    assert np.isclose(first[1, 1], 0.25)            # 1 -> 2 (second neighbour of 1)
    assert np.isclose(first[2, 2], 0.25)            # 2 -> end
    assert np.isclose(first[1, 2], 0.5)             # T2: 1 -> end
    # second order: T1 triples (start,0,1) (0,1,2) (1,2,end) each 1/3; T2 triple (start,1,end) weight 1
    assert np.isclose(second[0, 0], 1 / 3)
    e01 = sup.edge_index(np.array([0]), np.array([1]))[0]
    e12 = sup.edge_index(np.array([1]), np.array([2]))[0]
    assert np.isclose(second[3 + e01, 1], 1 / 3)
    assert np.isclose(second[3 + e12, 2], 1 / 3)
    assert np.isclose(second[1, 2], 1.0)
    # each trajectory adds exactly 1 to the L1 norm of each table (Theorem 2: sensitivity 1)
    assert np.isclose(start.sum() + first.sum(), 2.0) and np.isclose(second.sum(), 2.0)
    assert (first[~sup.mask1()] == 0).all() and (second[~sup.mask2()] == 0).all()


def _random_sequences():
    """40 random trajectories on a two-layer grid of 3 x 3 first-layer cells: (grid, trajectories, offsets,
    states, support)."""
    rng = np.random.default_rng(3)
    g = StateGrid(BOX, 3, 1, rng.integers(0, 2, 9))
    t = _traj([[tuple(p) for p in rng.random((rng.integers(1, 15), 2))] for _ in range(40)])
    off, states, _ = state_sequences(g, t.offsets, t.lat, t.lon)
    return g, t, off, states, Support.of(g.m, *g.neighbours())


def test_one_trajectory_changes_each_table_by_at_most_one_in_l1():
    g, t, off, states, sup = _random_sequences()
    full = transition_counts(sup, off, states)
    for drop in range(0, 40, 7):
        keep = np.ones(40, bool)
        keep[drop] = False
        t2 = t.take(keep)
        o2, s2, _ = state_sequences(g, t2.offsets, t2.lat, t2.lon)
        part = transition_counts(sup, o2, s2)
        d1 = np.abs(full[0] - part[0]).sum() + np.abs(full[1] - part[1]).sum()
        d2 = np.abs(full[2] - part[2]).sum()
        assert d1 <= 1 + 1e-9 and d2 <= 1 + 1e-9


def test_windows_list_each_trajectory_together_with_its_mass_divisor():
    sup = _line_support(3)
    win = transition_windows(sup, np.array([0, 3, 4]), np.array([0, 1, 2, 1]))
    assert win.first_owner.tolist() == [0, 0, 0, 0, 1, 1] and win.second_owner.tolist() == [0, 0, 0, 1]
    assert win.n_first.tolist() == [4, 2] and win.n_second.tolist() == [3, 1]
    m, D = 3, 2
    # T1: start->0, 0->1, 1->2, 2->end; T2: start->1, 1->end
    assert win.first_index.tolist() == [0, m + 0 * (D + 1) + 0, m + 1 * (D + 1) + 1, m + 2 * (D + 1) + D,
                                        1, m + 1 * (D + 1) + D]


def test_release_transitions_is_the_exact_table_plus_noise_on_the_support_only():
    _, _, off, states, sup = _random_sequences()
    exact = transition_counts(sup, off, states)
    # a tiny noise scale: the release equals the exact counts up to the grid split and the noise
    start, first, second = release_transitions(sup, off, states, 1e-7, 1e-7, NoiseSource(0))
    for got, want in zip((start, first, second), exact):
        assert np.allclose(got, want, atol=1e-5)
    assert (first[~sup.mask1()] == 0).all() and (second[~sup.mask2()] == 0).all()
    # at scale 1 the noise is there on the support (NormCut keeps each row's noisy total when positive)
    start, first, second = release_transitions(sup, off, states, 1.0, 1.0, NoiseSource(1))
    assert not np.allclose(first, exact[1], atol=0.05)
    assert (first[~sup.mask1()] == 0).all() and (second[~sup.mask2()] == 0).all()


def test_normcut_rows_matches_appendix_b6_example():
    out = normcut_rows(np.array([[-5.0, 1.0, 7.0]]))
    assert np.allclose(out, [[0, 0, 3]])


def test_model_selection_follows_section_4_6():
    sup = _line_support(4)
    first = np.zeros((4, 3))
    first[1] = [100, 10, 5]     # dominant: 100 / 10 >= 5 -> first order
    first[2] = [60, 40, 5]      # not dominant, large -> second order
    first[3] = [0.5, 0, 0.1]    # below theta1 -> first order
    use2 = select_second_order(first, sup, scale=1.0, theta2=5.0)
    assert use2.tolist() == [False, False, True, False]


# ------------------------------------------------------------------------------------- trip distribution

def test_trip_distribution_follows_section_4_4():
    sup = _line_support(6)
    b = np.array([3.0, 0, 0, 0, 0, 1.0])
    q = np.array([0, 0, 1.0, 0, 0, 3.0])
    hops = hop_distances(sup.offsets, sup.dst, np.arange(6))
    assert hops[0, 5] == 5 and hops[2, 2] == 0
    # maximum entropy u = b q^T / B; t = u (l + c) with l = hops + 2 and c set so that sum t = N
    p, info = trip_distribution(b, q, n_trips=24.0, offsets=sup.offsets, dst=sup.dst)
    assert info["decay"] == 0
    u = np.outer(b, q) / 4
    l = hops + 2
    c = 24.0 / 4 - (u * l).sum() / u.sum()
    assert np.isclose(info["detour"], c) and c > 0
    t = u * (l + c)
    assert np.isclose(t.sum(), 24.0)
    assert np.allclose(p, t.sum(axis=1) / t.sum())
    # starts at 0 head for far ends (long trips) and are up-weighted relative to b
    assert p[0] / p[5] > b[0] / b[5] and p[1:5].sum() == 0
    # a total below what independent trips give (mean l 5.375; the most local plan gives 5.0) is met by a
    # gravity decay > 0 fitted by bisection, with no detour
    p0, info0 = trip_distribution(b, q, n_trips=4 * 5.2, offsets=sup.offsets, dst=sup.dst)
    assert info0["detour"] == 0 and info0["decay"] > 0 and abs(info0["mean_shortest"] - 5.2) < 0.06
    assert np.isclose(p0.sum(), 1) and p0[1:5].sum() == 0
    # with a gravity decay the margins of u are still b and q (iterative proportional fitting)
    pg, _ = trip_distribution(b, q, n_trips=24.0, offsets=sup.offsets, dst=sup.dst, decay=1.0)
    assert np.isclose(pg.sum(), 1) and pg[0] > 0 and pg[5] > 0


# ----------------------------------------------------------------------------------------- lengths and walk

def test_length_hazard_reproduces_the_histogram():
    edges = length_bins(60)
    assert edges[0] == 1 and edges[-1] == 61 and (np.diff(edges) >= 1).all()
    lengths = np.array([1, 1, 2, 5, 5, 5, 30, 60, 200])
    h = length_histogram(lengths, edges)
    assert h.sum() == 9 and h[0] == 2 and h[-1] == 2    # 60 and 200 (clipped) share the last bin
    probs = np.zeros(len(edges) - 1)
    probs[[0, 3]] = [0.25, 0.75]                          # P(len = 1) = .25, P(len = 4) = .75
    hz = hazard(edges, probs)
    assert np.isclose(hz[1], 0.25) and np.isclose(hz[2], 0) and np.isclose(hz[4], 1.0)


def test_random_walk_lengths_follow_the_histogram_and_moves_follow_rows():
    sup = _line_support(3)
    nbr = sup.padded_neighbours()
    rows = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])   # 0 -> 1 -> 2 -> 1 -> 2 ...
    cum1, ok1 = cumulative_rows(rows)
    cum2, ok2 = cumulative_rows(np.ones((3 + sup.n_edges, 2)))
    edges = length_bins(10)
    probs = np.zeros(len(edges) - 1)
    probs[[1, 4]] = [0.5, 0.5]                             # lengths 2 and 5
    off, states = random_walks(
        20_000, np.random.default_rng(0), p_start=np.array([1.0, 0, 0]), cum=stacked_rows(cum1, cum2), ok1=ok1,
        ok2=ok2, use2=np.zeros(3, bool), neighbours=np.maximum(nbr, 0), edge_offsets=sup.offsets,
        end_propensity=np.ones(3), hazard_by_len=hazard(edges, probs))
    L = np.diff(off)
    assert set(np.unique(L).tolist()) == {2, 5}
    assert abs((L == 2).mean() - 0.5) < 0.02
    assert states[off[0]:off[1]].tolist() in ([0, 1], [0, 1, 2, 1, 2])


# ------------------------------------------------------------------------------------------- pipeline

def _toy(n=300, seed=0) -> Trajectories:
    rng = np.random.default_rng(seed)
    paths = []
    for _ in range(n):
        a, b = rng.random(2) * 0.4 + 0.1, rng.random(2) * 0.4 + 0.5
        k = rng.integers(2, 30)
        f = np.linspace(0, 1, k)[:, None]
        pts = a + f * (b - a) + rng.normal(0, 0.01, (k, 2))
        paths.append([tuple(p) for p in np.clip(pts, 0, 1)])
    return _traj(paths)


def test_fit_and_sample_are_deterministic_under_a_seed_and_round_trip():
    data = _toy()
    pt = PrivTrace(BOX, K=4)
    m1 = _fit(pt, data, 1.0, 5)
    m2 = _fit(pt, data, 1.0, 5)
    assert m1.to_bytes() == m2.to_bytes()
    s1 = m1.sample(200, np.random.default_rng(9))
    s2 = PrivTraceModel.from_bytes(m1.to_bytes()).sample(200, np.random.default_rng(9))
    assert np.array_equal(s1.offsets, s2.offsets) and np.array_equal(s1.lat, s2.lat)
    assert s1.n_trajectories == 200 and not s1.has_time
    assert ((s1.lat >= 0) & (s1.lat <= 1) & (s1.lon >= 0) & (s1.lon <= 1)).all()
    m3 = _fit(pt, data, 1.0, 6)
    assert m3.to_bytes() != m1.to_bytes()


def test_generated_lengths_match_real_ones_at_high_eps():
    data = _toy(2000, seed=1)
    model = _fit(PrivTrace(BOX, K=4), data, 20.0, 2)
    off, states, _ = state_sequences(model.grid, data.offsets, data.lat, data.lon)
    real = np.diff(off)
    syn = np.diff(model.sample_states(4000, np.random.default_rng(1))[0])
    assert abs(syn.mean() - real.mean()) < 0.1 * real.mean()
    assert abs(np.median(syn) - np.median(real)) <= 2


def test_the_planned_event_is_the_sum_of_the_parts():
    plan = PrivTrace(BOX).plan(1.0, 1e-6)
    assert abs(accounting.epsilon(plan.event, 1e-6) - 1.0) < 0.02
    assert plan.sample_rate is None and plan.default_size is None and not plan.needs_time
    # the parts' eps are accounting.split's: eps (1 - fine_share) times each fraction
    assert plan.part_eps == accounting.split(1.0 * (1 - 0.2), PrivTraceConfig().fractions())
    user = PrivTrace(BOX).plan(1.0, 0.0, PrivacyUnit.user(3))
    assert user.scales == pytest.approx({part: 3 * s for part, s in plan.scales.items()})


def test_bad_inputs_give_clear_errors():
    data = _toy(50)
    # eps and n are refused by the release core, before any plan or read
    for eps in (0.0, -1.0):
        with pytest.raises(DuckmobError, match="eps must be a positive number"):
            fitting.fit_request(source="t", eps=eps, method="privtrace", bbox=BOX)
    with pytest.raises(DuckmobError, match="unknown PrivTrace parameter"):
        PrivTrace(BOX, kapa=3)
    model = _fit(PrivTrace(BOX, K=3), data, 1.0, 0)
    with pytest.raises(DuckmobError, match="n must be an integer of at least 1"):
        fitting.sample(model, 0, np.random.SeedSequence(0))
    empty = Trajectories(np.zeros(1, np.int64), *(np.zeros(0, np.int64),) * 3, np.zeros(0), np.zeros(0))
    # zero trajectories is a valid input (a release never refuses on the data): the model is noise alone
    fitted = _fit(PrivTrace(BOX), empty, 1.0, 0)
    assert fitted.sample(5, np.random.default_rng(0)).n_trajectories == 5


def test_length_histogram_post_processing_removes_noise_in_the_tail():
    from duckmob.synth.cells import truncate_tail
    from duckmob.synth.privtrace.walk import decreasing_tail

    edges = length_bins(100)
    noisy = np.zeros(len(edges) - 1)
    noisy[:6] = [50, 120, 90, 60, 30, 12]
    noisy[8:10] = [-4, 1]
    noisy[-3] = 40                                       # a spike of noise far out
    cut = truncate_tail(noisy, scale=10.0)
    assert cut[-3] == 0 and cut[:6].tolist() == [50, 120, 90, 60, 30, 12]
    smooth = decreasing_tail(np.array([50.0, 120, 90, 100, 30, 12] + [0] * (len(edges) - 7)), edges)
    dens = smooth / np.diff(edges)
    assert np.isclose(smooth.sum(), 402) and (np.diff(dens[1:]) <= 1e-12).all()
    assert np.allclose(smooth[[1, 2, 3]], [120, 95, 95])


def test_state_sequences_in_chunks_equal_one_pass(monkeypatch):
    import duckmob.synth.cells as states

    rng = np.random.default_rng(0)
    g = StateGrid(BOX, 5, 2, rng.integers(0, 3, 25))
    lengths = rng.integers(1, 40, 300)
    off = np.concatenate([[0], np.cumsum(lengths)])
    lat, lon = rng.random(off[-1]), rng.random(off[-1])
    whole = state_sequences(g, off, lat, lon)
    monkeypatch.setattr(states, "CHUNK_POINTS", 333)
    chunked = state_sequences(g, off, lat, lon)
    assert all(np.array_equal(a, b) for a, b in zip(whole, chunked))


def test_a_walk_that_returns_to_a_state_returns_to_the_same_point():
    model = _fit(PrivTrace(BOX, K=3, output="cells"), _toy(400, seed=4), 5.0, 3)
    rng_states = np.random.default_rng(8)
    off, states = model.sample_states(300, rng_states)
    syn = model.sample(300, np.random.default_rng(8))
    owner = np.repeat(np.arange(300), np.diff(off))
    key = owner * model.grid.m + states
    for k in np.unique(key)[:200]:
        pts = set(zip(syn.lat[key == k].tolist(), syn.lon[key == k].tolist()))
        assert len(pts) == 1
    assert np.array_equal(model.grid.state_of(syn.lat, syn.lon), states)


@pytest.mark.parametrize("params, says", [
    ({"K": 2.5}, "K must be an integer in [1, 1024]"),
    ({"max_depth": 9}, "max_depth must be an integer in [0, 6]"),
    ({"c": "big"}, "c must be a number > 0"),
    ({"end_bias": True}, "end_bias must be a number in [0, 1]"),
    ({"budget_split": {"count": 1.0}}, "budget_split must give a fraction for each"),
    ({"budget_split": "{not json"}, "budget_split must be a JSON object"),
])
def test_config_is_typed_and_each_bad_parameter_is_named(params, says):
    with pytest.raises(DuckmobError) as err:
        PrivTrace(BOX, **params)
    assert says in str(err.value)


def test_config_accepts_sql_numbers_and_nulls_as_defaults():
    cfg = PrivTrace(BOX, K=4.0, max_len=None, trip_decay=1).config
    assert cfg.K == 4 and isinstance(cfg.K, int) and cfg.max_len == PrivTraceConfig().max_len
    assert cfg.trip_decay == 1.0 and isinstance(cfg.trip_decay, float)


def test_backtrack_zero_redraws_immediate_returns():
    data = _toy(400, seed=4)
    counts = {}
    for bt in (1.0, 0.0):
        model = _fit(PrivTrace(BOX, K=3, backtrack=bt), data, 5.0, 3)
        off, st = model.sample_states(2000, np.random.default_rng(5))
        own = np.repeat(np.arange(2000), np.diff(off))
        i = np.arange(len(st) - 2)
        counts[bt] = int(((own[i] == own[i + 2]) & (st[i] == st[i + 2])).sum())
    assert counts[1.0] > 0 and counts[0.0] < counts[1.0] / 3   # some states have no other live neighbour


def test_stored_models_carry_their_format_and_models_of_format_1_are_upgraded():
    model = _fit(PrivTrace(BOX, K=3), _toy(100), 2.0, 1)
    method, version, _ = base.unpack(model.to_bytes())
    assert (method, version) == ("privtrace", 2)
    again = PrivTraceModel.from_bytes(model.to_bytes())
    assert again.config == model.config and isinstance(again.config, PrivTraceConfig)
    assert again.info["eps"] == 2.0
    # format 1 (tests/data/models_v1, stored before models carried a header): the fit's eps and contribution
    # bound came in the config; models older than route_draws drew one route per move
    old = synth.model_class("privtrace").from_bytes((MODELS_V1 / "privtrace.bin").read_bytes())
    assert isinstance(old.config, PrivTraceConfig) and old.info["eps"] == 4.0 and old.fine is not None
    meta = upgrade_format_1_meta({"config": {"K": 3, "eps": 1.0, "contribution_bound": 2}, "info": {"K": 3}})
    assert meta == {"config": {"K": 3, "route_draws": 1}, "info": {"eps": 1.0, "K": 3}}
    assert PrivTraceConfig.parse(meta["config"]).route_draws == 1
