"""Length-normalised transition counts and their noisy release (duckmob.privacy.counting)."""

import math
import re

import numpy as np
import pytest

from duckmob.errors import DuckmobError
from duckmob.privacy.counting import (MAX_UNITS, bound_contributions, first_order_support, noisy_count,
                                      noisy_region_transition_counts, noisy_transition_counts,
                                      noisy_transition_counts_sparse, region_transition_counts, transition_counts,
                                      truncate, windows)
from duckmob.privacy.noise import NoiseSource, granularity
from duckmob.privacy.unit import PrivacyUnit


def ragged(seqs):
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
    cells = np.concatenate([np.asarray(s, dtype=np.int64) for s in seqs]) if seqs else np.zeros(0, np.int64)
    return offsets, cells


def random_seqs(n, n_states, rng, max_len=12):
    return [rng.integers(0, n_states, rng.integers(1, max_len)) for _ in range(n)]


ADVERSARIAL = {
    "very long": lambda m, rng: rng.integers(0, m, 50_000),
    "looping": lambda m, rng: np.tile([0, 1, 2, 3], 5_000),
    "one transition repeated": lambda m, rng: np.tile([4, 5], 10_000),
    "one cell": lambda m, rng: np.array([7]),
    "two cells": lambda m, rng: np.array([3, 3]),
    "stays": lambda m, rng: np.full(1000, 2),
}


def test_small_example_by_hand():
    off, cells = ragged([[0, 1, 2], [2, 0], [], [1]])
    c = transition_counts(off, cells, 3, 1)
    S, E = 3, 4
    expected = np.zeros((5, 5))
    for a, b in [(S, 0), (0, 1), (1, 2), (2, E)]:
        expected[a, b] += 1 / 4
    for a, b in [(S, 2), (2, 0), (0, E)]:
        expected[a, b] += 1 / 3
    for a, b in [(S, 1), (1, E)]:
        expected[a, b] += 1 / 2
    np.testing.assert_allclose(c, expected)
    c2 = transition_counts(off, cells, 3, 2)
    assert c2.shape == (5, 5, 5)
    assert c2[S, 0, 1] == c2[0, 1, 2] == c2[1, 2, E] == pytest.approx(1 / 3)
    assert c2[S, 2, 0] == c2[2, 0, E] == pytest.approx(1 / 2)
    assert c2[S, 1, E] == 1.0
    assert c2.sum() == pytest.approx(3.0)


@pytest.mark.parametrize("order", [1, 2])
def test_every_trajectory_adds_exactly_one(order):
    rng = np.random.default_rng(0)
    seqs = random_seqs(200, 9, rng) + [[]]
    off, cells = ragged(seqs)
    assert transition_counts(off, cells, 9, order).sum() == pytest.approx(200)
    idx, owner, n_windows = windows(off, cells, 9, order)
    assert np.array_equal(np.bincount(owner, minlength=201), n_windows)


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_adding_any_trajectory_changes_l1_by_at_most_one(order, name):
    m = 16
    rng = np.random.default_rng(1)
    base = random_seqs(100, m, rng)
    extra = ADVERSARIAL[name](m, rng)
    d, d_plus = ragged(base), ragged(base + [extra])
    change = np.abs(transition_counts(*d_plus, m, order) - transition_counts(*d, m, order)).sum()
    assert change == pytest.approx(1.0)
    # the released version: same seed -> same noise, so the difference is the grid counts' difference
    kw = dict(cut=False)
    a = noisy_transition_counts(*d, m, order, 0.7, NoiseSource(5), **kw)
    b = noisy_transition_counts(*d_plus, m, order, 0.7, NoiseSource(5), **kw)
    assert np.abs(b - a).sum() == pytest.approx(1.0, abs=1e-12)  # exactly the trajectory's mass 1
    # HRNet's region counts (its own indicator normalisation)
    if order == 1:
        ch = np.abs(region_transition_counts(*d_plus, 4, 1) - region_transition_counts(*d, 4, 1)).sum()
        assert ch <= 1.0 + 1e-12
        ra = noisy_region_transition_counts(*d, 4, 1, 0.7, NoiseSource(5))
        rb = noisy_region_transition_counts(*d_plus, 4, 1, 0.7, NoiseSource(5))
        assert np.abs(rb - ra).sum() <= 1.0 + 1e-12


def test_user_level_change_is_at_most_k():
    m, k = 16, 3
    rng = np.random.default_rng(2)
    base = random_seqs(60, m, rng)
    users = np.repeat(np.arange(20), 3)
    new_user = [np.tile([0, 1], 500), np.array([5]), rng.integers(0, m, 300), np.array([1, 2, 3]), np.array([9])]
    d = ragged(base)
    users_plus = np.concatenate([users, np.full(len(new_user), 99)])
    keep = bound_contributions(users_plus, k, np.random.default_rng(3))
    assert keep[:60].all() and keep[60:].sum() == k
    kept = [s for s, kp in zip(base + new_user, keep) if kp]
    change = np.abs(transition_counts(*ragged(kept), m, 1) - transition_counts(*d, m, 1)).sum()
    assert change == pytest.approx(k)


def test_bound_contributions_keeps_at_most_k_per_user_at_random():
    users = np.repeat([3, 1, 2], [10, 1, 4])
    masks = np.array([bound_contributions(users, 2, np.random.default_rng(s)) for s in range(400)])
    per_user = np.array([[m[users == u].sum() for u in (3, 1, 2)] for m in masks])
    assert (per_user == [2, 1, 2]).all()
    freq = masks[:, users == 3].mean(axis=0)  # each of user 3's 10 trajectories kept with prob 2/10
    assert np.allclose(freq, 0.2, atol=0.07)
    with pytest.raises(DuckmobError, match="max_trajectories_per_user"):
        bound_contributions(users, 0, np.random.default_rng(0))


def test_truncate():
    off, cells = ragged([[1, 2, 3, 4], [5], [6, 7, 8]])
    o, c = truncate(off, cells, 2)
    assert o.tolist() == [0, 2, 3, 5] and c.tolist() == [1, 2, 5, 6, 7]
    t = transition_counts(off, cells, 9, 1, max_length=2)
    assert t.sum() == pytest.approx(3) and t[3, 4] == 0 and t[2, 10] == pytest.approx(1 / 3)
    with pytest.raises(DuckmobError, match="max_length"):
        truncate(off, cells, 0)


@pytest.mark.parametrize("order", [1, 2])
def test_noise_on_the_whole_support_and_nowhere_else(order):
    m = 9
    rng = np.random.default_rng(4)
    off, cells = ragged(random_seqs(300, m, rng))
    eps = 2.0
    exact = transition_counts(off, cells, m, order)
    noisy = noisy_transition_counts(off, cells, m, order, eps, NoiseSource(6), cut=False)
    sup = first_order_support(m)
    if order == 2:
        real = np.arange(m + 2) < m
        sup = sup[:, :, None] & (sup & real[:, None])[None]
    assert (noisy[~sup] == 0).all()
    assert (noisy[sup] != 0).all()  # zero counts are noised too
    assert (exact[~sup] == 0).all()  # the structural support holds every real transition
    resid = (noisy - exact)[sup]
    assert resid.std() == pytest.approx(math.sqrt(2) / eps, rel=0.1 if order == 1 else 0.02)
    assert abs(resid.mean()) < 4 * math.sqrt(2) / eps / math.sqrt(resid.size)


def test_normcut_is_applied_per_row():
    m = 9
    off, cells = ragged(random_seqs(300, m, np.random.default_rng(5)))
    raw = noisy_transition_counts(off, cells, m, 1, 1.0, NoiseSource(7), cut=False)
    cut = noisy_transition_counts(off, cells, m, 1, 1.0, NoiseSource(7))
    assert (cut >= 0).all()
    coverable = raw.clip(0).sum(1) >= -raw.clip(None, 0).sum(1)
    np.testing.assert_allclose(cut.sum(1)[coverable], raw.sum(1)[coverable])
    assert (cut[~coverable] == 0).all()
    f32 = noisy_transition_counts(off, cells, m, 2, 1.0, NoiseSource(7), dtype=np.float32)
    assert f32.dtype == np.float32 and (f32 >= 0).all()


def test_neighbour_support_drops_jumps_and_noises_only_neighbours():
    w, m = 3, 9
    sup = first_order_support(m, "neighbours", w=w)
    assert sup[0, 1] and sup[0, 4] and not sup[0, 2] and not sup[0, 8]
    assert sup[m, :m].all() and sup[:m, m + 1].all() and not sup[m, m + 1]
    off, cells = ragged([[0, 1, 2], [0, 8]])  # 0 -> 8 is a jump: dropped
    noisy = noisy_transition_counts(off, cells, m, 1, 1e6, NoiseSource(1), support="neighbours", w=w,
                                    cut=False)
    assert noisy[0, 8] == 0 and noisy[0, 1] == pytest.approx(0.25, abs=1e-4)
    assert (noisy[~sup] == 0).all()
    n2 = noisy_transition_counts(off, cells, m, 2, 1.0, NoiseSource(1), support="neighbours", w=w, cut=False)
    assert n2[0, 1, 2] != 0 and n2[0, 2, 1] == 0 and n2[0, 1, 8] == 0
    with pytest.raises(DuckmobError, match="w \\* w"):
        first_order_support(m, "neighbours", w=4)


def test_user_level_noise_scales_with_k():
    m = 9
    rng = np.random.default_rng(8)
    seqs = random_seqs(200, m, rng)
    users = rng.integers(0, 30, 200)
    off, cells = ragged(seqs)
    noisy = noisy_transition_counts(off, cells, m, 1, 1.0, NoiseSource(9), user_id=users, unit=PrivacyUnit.user(4),
                                    cut=False)
    resid_scale = np.abs(noisy[first_order_support(m)]).mean()
    assert resid_scale > 2.5  # Laplace(4) noise has mean |z| = 4 (vs 1 at trajectory level)
    with pytest.raises(DuckmobError, match="user_id"):
        noisy_transition_counts(off, cells, m, 1, 1.0, NoiseSource(1), unit=PrivacyUnit.user(2))
    with pytest.raises(ValueError, match="privacy unit kind"):   # a unit is checked once, where it is made
        PrivacyUnit("person")


def test_region_transition_counts_are_hrnet_eq3():
    off, cells = ragged([[0, 1, 5, 0, 1], [15, 10]])
    t = region_transition_counts(off, cells, 4, 1)
    assert t.shape == (4, 16)
    # trajectory 0: transitions 0->1, 1->5, 5->0, 0->1 (repeat counted once); all from region 0; 4 transitions
    assert t[0, 1] == t[0, 5] == t[0, 0] == pytest.approx(0.25)
    assert t[3, 10] == 1.0  # cell 15 lies in region 3
    assert t.sum() == pytest.approx(1.75)
    noisy = noisy_region_transition_counts(off, cells, 4, 1, 1.0, NoiseSource(2))
    assert noisy.shape == (4, 16) and (noisy != 0).all()


def test_noisy_count():
    draws = np.array([noisy_count(1000, 0.5, NoiseSource(s)) for s in range(3000)])
    assert draws.mean() == pytest.approx(1000, abs=0.3)
    assert draws.var() == pytest.approx(2 * 2.0 ** 2, rel=0.15)
    assert np.var([noisy_count(10, 1.0, NoiseSource(s), sensitivity=5) for s in range(2000)]) == \
        pytest.approx(50, rel=0.15)
    for bad in (dict(n_items=-1, eps=1.0), dict(n_items=3, eps=0), dict(n_items=3, eps=1e-9)):
        with pytest.raises(DuckmobError):
            noisy_count(noise=NoiseSource(1), **bad)


@pytest.mark.parametrize("bad, match", [
    (dict(order=3), "order"),
    (dict(eps=-1), "eps"),
    (dict(n_states=0), "n_states"),
    (dict(offsets=np.array([0, 3])), "offsets"),
])
def test_bad_input(bad, match):
    args = dict(offsets=np.array([0, 2]), cells=np.array([0, 1]), n_states=9, order=1, eps=1.0,
                noise=NoiseSource(1))
    args.update(bad)
    with pytest.raises(DuckmobError, match=match):
        noisy_transition_counts(**args)


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("support", ["neighbours", None])
def test_sparse_release_equals_dense(order, support):
    from duckmob.privacy.counting import noisy_transition_counts_sparse

    off, cells = ragged(random_seqs(100, 9, np.random.default_rng(0), max_len=10))
    dense = noisy_transition_counts(off, cells, 9, order, 1.0, NoiseSource(3), support=support, w=3)
    states, values = noisy_transition_counts_sparse(off, cells, 9, order, 1.0, NoiseSource(3), support=support, w=3)
    rebuilt = np.zeros_like(dense)
    rebuilt[tuple(states.T)] = values
    assert np.array_equal(rebuilt, dense)


def test_second_order_neighbour_support_on_a_32_grid_is_small():
    from duckmob.privacy.counting import noisy_transition_counts_sparse, support_entries

    entries = support_entries(1024, 2, "neighbours", w=32)
    assert len(entries) < 110_000 and np.all(np.diff(entries) > 0)
    off, cells = ragged([[0, 1, 33, 34], [1023, 990]])
    states, values = noisy_transition_counts_sparse(off, cells, 1024, 2, 1.0, NoiseSource(1), w=32)
    assert len(values) == len(entries) and (values >= 0).all()
    with pytest.raises(DuckmobError, match="neighbours"):
        noisy_transition_counts(off, cells, 1024, 2, 1.0, NoiseSource(1))


# -- data never refuses: invalid trajectories are dropped, counts are clamped ----------------------------------

def test_trajectories_without_a_user_are_dropped_not_refused():
    users = np.array([1, -1, 5, -7, 1, 5])
    keep = bound_contributions(users, 1, np.random.default_rng(0))
    assert not keep[[1, 3]].any() and keep[[0, 4]].sum() == 1 and keep[[2, 5]].sum() == 1
    # NULLs (NaN, None) are no user either
    assert not bound_contributions(np.array([np.nan, 2.0]), 1, np.random.default_rng(0))[0]
    assert bound_contributions(np.array([None, 2], dtype=object), 1, np.random.default_rng(0)).tolist() == \
        [False, True]
    # the release equals the release of the table without those trajectories (same seed, same noise)
    m = 9
    seqs = random_seqs(40, m, np.random.default_rng(1))
    users = np.arange(40) % 7 - 1  # user -1: no user
    kw = dict(unit=PrivacyUnit.user(10), cut=False)
    got = noisy_transition_counts(*ragged(seqs), m, 1, 1.0, NoiseSource(3), user_id=users, **kw)
    kept = users >= 0
    want = noisy_transition_counts(*ragged([s for s, k in zip(seqs, kept) if k]), m, 1, 1.0, NoiseSource(3),
                                   user_id=users[kept], **kw)
    assert np.array_equal(got, want)


INVALID = {"too large": [3, 9, 1], "negative": [-1, 2], "NaN": [0.0, np.nan], "not an integer": [2.5, 1.0],
           "huge": [1e300, 0.0]}


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("name", sorted(INVALID))
def test_a_trajectory_with_an_invalid_cell_is_dropped_whole(name):
    m, w = 9, 3
    rng = np.random.default_rng(4)
    seqs = random_seqs(50, m, rng)
    bad = np.asarray(INVALID[name], dtype=np.float64)
    with_bad = [s.astype(np.float64) for s in seqs[:20]] + [bad] + [s.astype(np.float64) for s in seqs[20:]]
    off_b = np.concatenate([[0], np.cumsum([len(s) for s in with_bad])]).astype(np.int64)
    cells_b = np.concatenate(with_bad)  # float cells: NaN is a NULL
    users = np.arange(51) % 10
    users_clean = np.delete(users, 20)
    clean = ragged(seqs)
    np.testing.assert_array_equal(transition_counts(off_b, cells_b, m, 2), transition_counts(*clean, m, 2))
    for order in (1, 2):
        for kw in (dict(), dict(unit=PrivacyUnit.user(2))):
            a = noisy_transition_counts(off_b, cells_b, m, order, 1.0, NoiseSource(5), cut=False,
                                        user_id=users, **kw)
            b = noisy_transition_counts(*clean, m, order, 1.0, NoiseSource(5), cut=False, user_id=users_clean,
                                        **kw)
            assert np.array_equal(a, b)
        sa = noisy_transition_counts_sparse(off_b, cells_b, m, order, 1.0, NoiseSource(5), w=w)
        sb = noisy_transition_counts_sparse(*clean, m, order, 1.0, NoiseSource(5), w=w)
        assert all(np.array_equal(x, y) for x, y in zip(sa, sb))


def test_region_counts_drop_cells_outside_the_grid():
    rng = np.random.default_rng(6)
    seqs = random_seqs(30, 16, rng)
    with_bad = seqs[:10] + [np.array([3, 16, 2])] + seqs[10:]
    np.testing.assert_array_equal(region_transition_counts(*ragged(with_bad), 4, 1),
                                  region_transition_counts(*ragged(seqs), 4, 1))
    users = np.arange(31) % 4
    kw = dict(unit=PrivacyUnit.user(3))
    a = noisy_region_transition_counts(*ragged(with_bad), 4, 1, 1.0, NoiseSource(8), user_id=users, **kw)
    b = noisy_region_transition_counts(*ragged(seqs), 4, 1, 1.0, NoiseSource(8), user_id=np.delete(users, 10), **kw)
    assert np.array_equal(a, b)
    # masked entries are NULL cells
    cells = np.ma.masked_array(ragged(with_bad)[1], mask=False)
    cells.mask[0] = True
    assert np.array_equal(transition_counts(ragged(with_bad)[0], cells, 16, 1),
                          transition_counts(*ragged(seqs[1:10] + seqs[10:]), 16, 1))


def test_messages_quote_nothing_from_the_data():
    # distinctive cell ids and lengths in the data; every refusal is about a public argument
    off, cells = ragged([[8, 7, 6], [5] * 13, [4, 987654]])
    noise = NoiseSource(1)
    for call in (lambda: noisy_transition_counts(off, cells, 0, 1, 1.0, noise),
                 lambda: noisy_transition_counts(off, cells, 9, 3, 1.0, noise),
                 lambda: noisy_transition_counts(off, cells, 9, 1, -1.0, noise),
                 lambda: noisy_transition_counts(off, cells, 9, 1, 1.0, noise, unit=PrivacyUnit.user(1)),
                 lambda: noisy_transition_counts(off, cells, 9, 1, 1.0, noise, unit=PrivacyUnit.user(1),
                                                 user_id=np.arange(7)),
                 lambda: noisy_count(-17, 1.0, noise)):
        with pytest.raises(DuckmobError) as exc:
            call()
        assert not re.search(r"987654|\b13\b|\b18\b|\b3 trajectories|-17", str(exc.value)), str(exc.value)
    # the data alone never raises: out-of-range cells drop their trajectory
    assert noisy_transition_counts(off, cells, 9, 1, 1.0, noise).shape == (11, 11)


def test_counts_are_clamped_to_a_public_maximum():
    # noisy_count: C = MAX_UNITS * g (2^31 at noise scale 1); beyond it every count releases the same
    g = granularity(1.0)
    cap = int(MAX_UNITS * g)
    assert cap == 2 ** 31
    assert noisy_count(2 ** 60, 1.0, NoiseSource(4)) == noisy_count(cap, 1.0, NoiseSource(4))
    assert noisy_count(cap - 1, 1.0, NoiseSource(4)) == noisy_count(cap, 1.0, NoiseSource(4)) - 1
    # transition counts: a huge eps makes the cap tiny (MAX_UNITS * g = 2^-9 at scale 2^-40), so one
    # trajectory's entries (1/3 each) are clamped; the change from one trajectory stays <= 1 in L1
    eps = 2.0 ** 40
    g = granularity(1 / eps)
    off, cells = ragged([[0, 1]])
    noisy = noisy_transition_counts(off, cells, 4, 1, eps, NoiseSource(2), cut=False)
    cap = MAX_UNITS * g
    assert cap == 2.0 ** -9
    assert np.allclose(noisy[[4, 0, 1], [0, 1, 5]], cap, atol=1e-9)
    empty = noisy_transition_counts(np.zeros(1, np.int64), np.zeros(0, np.int64), 4, 1, eps, NoiseSource(2),
                                    cut=False)
    assert np.abs(noisy - empty).sum() == pytest.approx(3 * cap)
    states, values = noisy_transition_counts_sparse(off, cells, 4, 1, eps, NoiseSource(2), w=2, cut=False)
    assert values.max() <= cap + 1e-9
    region = noisy_region_transition_counts(off, cells, 2, 1, eps, NoiseSource(2))
    assert region.max() <= cap + 1e-9


def test_normalised_release_noises_every_support_entry_and_bounds_each_trajectory():
    from duckmob.privacy.counting import normalised_release

    # no windows: pure Laplace(scale) on every entry, mean |x| = scale
    values = normalised_release(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), 100_000, 2.5,
                                NoiseSource(1))
    assert (values != 0).all() and abs(np.abs(values).mean() - 2.5) < 0.05
    # one trajectory of 3 windows, one outside the support: its mass on the support is 2/3, split on the grid
    entries = np.array([2, 5, 9])
    tiny = normalised_release(np.array([5, 9, 7]), np.zeros(3, np.int64), np.array([3]), entries, 1e-9,
                              NoiseSource(2))
    assert np.allclose(tiny, [0, 1 / 3, 1 / 3], atol=1e-6)
    # a trajectory's mass is exactly 1 whatever its number of windows: the neighbouring tables differ by 1 in L1
    idx = np.array([0, 0, 1, 3, 3, 3, 3])
    owner = np.array([0, 0, 0, 1, 1, 1, 1])
    a = normalised_release(idx, owner, np.array([3, 4]), 4, 1e-9, NoiseSource(3))
    b = normalised_release(idx[:3], owner[:3], np.array([3]), 4, 1e-9, NoiseSource(3))
    assert abs(np.abs(a - b).sum() - 1.0) < 1e-6
