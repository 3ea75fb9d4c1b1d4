"""The Laplace sampler: distribution, scale, grid, seeding (duckmob.privacy.noise)."""

import math

import numpy as np
import pytest
from scipy import stats

from duckmob.errors import DuckmobError
from duckmob.privacy import noise as noise_mod
from duckmob.privacy.noise import BITS, NoiseSource, epsilon_rounded, granularity


def test_granularity_is_a_power_of_two_about_a_millionth_of_the_scale():
    for scale in (1e-9, 0.3, 1.0, 2.0, 7.77, 1e9):
        g = granularity(scale)
        assert math.frexp(g)[0] == 0.5  # a power of two
        assert 2 ** BITS <= scale / g < 2 ** (BITS + 1)


@pytest.mark.parametrize("scale", [0.37, 3.7, 250.0])
def test_ks_against_continuous_laplace(scale):
    x = NoiseSource(11).laplace(scale, 200_000)
    assert stats.kstest(x, stats.laplace(scale=scale).cdf).pvalue > 1e-3


def test_variance_and_mean():
    b = 2.5
    x = NoiseSource(3).laplace(b, 2_000_000)
    # Var of the sample variance of Laplace: (kurtosis 6 - 1) var^2 / n -> 0.16 % relative sd here.
    assert x.var() == pytest.approx(2 * b * b, rel=0.01)
    assert abs(x.mean()) < 5 * math.sqrt(2) * b / math.sqrt(len(x))
    assert np.median(np.abs(x)) == pytest.approx(b * math.log(2), rel=0.01)


def test_outputs_lie_on_the_half_offset_grid_and_shape_is_kept():
    b = 0.9
    g = granularity(b)
    x = NoiseSource(5).laplace(b, (300, 7))
    assert x.shape == (300, 7) and x.dtype == np.float64
    units = x / g - 0.5
    assert np.array_equal(units, np.round(units))


def test_discrete_laplace_pmf_at_coarse_scale():
    t, n = 1.5, 400_000
    w = NoiseSource(8).discrete_laplace(t, n)
    q = math.exp(-1 / t)
    ks = np.arange(-12, 12)
    pmf = np.where(ks >= 0, 0.5 * (1 - q) * q ** np.where(ks >= 0, ks, 0),
                   0.5 * (1 - q) * q ** np.where(ks < 0, -ks - 1, 0))
    observed = np.array([(w == k).sum() for k in ks])
    expected = pmf * n
    rest_obs, rest_exp = n - observed.sum(), n - expected.sum()
    chi2 = ((observed - expected) ** 2 / expected).sum() + (rest_obs - rest_exp) ** 2 / rest_exp
    assert stats.chi2(len(ks)).sf(chi2) > 1e-3
    assert (w == 0).mean() == pytest.approx((w == -1).mean(), abs=0.005)  # symmetric around -1/2


def test_tail_redraw_keeps_the_exponential(monkeypatch):
    # With a tiny TAIL almost every draw takes the redraw path several times: still exactly Exp(1).
    monkeypatch.setattr(noise_mod, "TAIL", 0.3)
    src = NoiseSource(21)
    e = np.empty(200_000)
    src._exponential(e)
    assert e.max() > 5 * 0.3
    assert stats.kstest(e, stats.expon.cdf).pvalue > 1e-3


def test_far_tail_is_reachable():
    # Above numpy's ziggurat tail (7.7 b) values still come out, at the right rate e^-8 ~ 3.4e-4.
    b = 1.0
    x = NoiseSource(2).laplace(b, 2_000_000)
    frac = (np.abs(x) > 8 * b).mean()
    assert frac == pytest.approx(math.exp(-8), rel=0.1)


def test_add_laplace_exact_on_grid_inputs_and_same_support_for_neighbours():
    b = 1.0
    g = granularity(b)
    base = np.arange(1000) * g * 3.0  # on the grid
    for x in (base, base + g):  # neighbours on the grid
        out = NoiseSource(4).add_laplace(x, b)
        units = (out - x) / g - 0.5
        assert np.array_equal(units, np.round(units))  # x + noise computed exactly
        # every output is on one grid whatever x: the support does not depend on the input (Mironov)
        assert np.array_equal(out / g - 0.5, np.round(out / g - 0.5))
    a = NoiseSource(4).add_laplace(base, b)
    c = NoiseSource(4).add_laplace(base + g, b)
    assert np.array_equal(c - a, np.full(1000, g))


def test_add_laplace_rounds_off_grid_inputs_and_states_the_cost():
    b = 1.0
    g = granularity(b)
    out = NoiseSource(4).add_laplace(np.array([0.1, 1 / 3]), b)
    assert np.array_equal(out / g - 0.5, np.round(out / g - 0.5))
    assert epsilon_rounded(1.0, 1.0, b, changed=10) == pytest.approx(1.0 + 10 * g)
    with pytest.raises(DuckmobError, match="too large"):
        NoiseSource(1).add_laplace(np.array([1e300]), b)


def test_seeding_and_generator_streams():
    a, b = NoiseSource(7), NoiseSource(7)
    assert a.seeded and not NoiseSource().seeded
    assert np.array_equal(a.laplace(1.0, 10), b.laplace(1.0, 10))
    assert not np.array_equal(NoiseSource().laplace(1.0, 10), NoiseSource().laplace(1.0, 10))
    g1, g2 = a.generator(), a.generator()
    assert isinstance(g1, np.random.Generator)
    assert not np.array_equal(g1.random(5), g2.random(5))  # independent children
    assert np.array_equal(NoiseSource(7).generator().random(5), NoiseSource(7).generator().random(5))
    # drawing post-processing randomness does not change the noise stream
    c = NoiseSource(9)
    c.generator().random(100)
    assert np.array_equal(c.laplace(1.0, 5), NoiseSource(9).laplace(1.0, 5))


@pytest.mark.parametrize("scale", [0, -1, float("inf"), float("nan"), "x", None])
def test_bad_scale_is_a_duckmob_error(scale):
    with pytest.raises(DuckmobError, match="scale"):
        NoiseSource(1).laplace(scale, 3)


def test_bad_seed_is_a_duckmob_error():
    with pytest.raises(DuckmobError, match="seed"):
        NoiseSource(-1)
    with pytest.raises(DuckmobError, match="seed"):
        NoiseSource(1.5)

