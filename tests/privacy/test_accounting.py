"""Privacy events and epsilon (duckmob.privacy.accounting) against independent dp_accounting computations."""

import math

import dp_accounting
import pytest
from dp_accounting import pld, rdp

from duckmob.errors import DuckmobError
from duckmob.privacy import accounting as acc

SGD = dict(noise_multiplier=1.0, sample_rate=0.00256, steps=4000)


def independent_pld(dp_event, delta):
    a = pld.PLDAccountant()
    a.compose(dp_event)
    return a.get_epsilon(delta)


def test_json_round_trip_and_flattening():
    e = acc.compose([acc.laplace(0.5), acc.compose([acc.gaussian(2.0), acc.dp_sgd(**SGD)])])
    assert [leaf.kind for leaf in e.leaves()] == ["laplace", "gaussian", "dp_sgd"]
    assert len(e.children) == 3  # nested compose flattened
    s = e.to_json()
    assert acc.Event.from_json(s) == e
    assert acc.Event.from_json(s).to_json() == s
    assert acc.laplace(0.1).to_json() == '{"kind":"laplace","eps":0.1}'
    assert str(acc.dp_sgd(**SGD)) == "dp_sgd(noise_multiplier=1, sample_rate=0.00256, steps=4000)"


def test_dp_events():
    assert acc.laplace(0.5).to_dp_event() == dp_accounting.LaplaceDpEvent(2.0)
    assert acc.gaussian(1.5).to_dp_event() == dp_accounting.GaussianDpEvent(1.5)
    assert acc.dp_sgd(**SGD).to_dp_event() == dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.00256, dp_accounting.GaussianDpEvent(1.0)), 4000)
    assert acc.compose([]).to_dp_event() == dp_accounting.NoOpDpEvent()


def test_engineering_figure_laplace_plus_dp_sgd():
    event = acc.compose([acc.laplace(0.5), acc.dp_sgd(**SGD)])
    eps = acc.epsilon(event, 1e-5)
    assert eps == pytest.approx(1.284, abs=1e-3)
    independent = independent_pld(dp_accounting.ComposedDpEvent([
        dp_accounting.LaplaceDpEvent(2.0),
        dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(0.00256,
                                                                              dp_accounting.GaussianDpEvent(1.0)),
                                          4000)]), 1e-5)
    assert eps == pytest.approx(independent, rel=1e-9)
    sgd_alone = acc.epsilon(acc.dp_sgd(**SGD), 1e-5)
    assert eps < 0.5 + sgd_alone  # tighter than adding (1.326)
    assert 0.5 + sgd_alone == pytest.approx(1.326, abs=1e-3)
    r = rdp.RdpAccountant()
    r.compose(acc.dp_sgd(**SGD).to_dp_event())
    assert sgd_alone < r.get_epsilon(1e-5)  # PLD is tighter than RDP (0.826 vs 1.096)


def test_pure_laplace_compositions():
    event = acc.compose([acc.laplace(e) for e in (0.1, 0.2, 0.3)])
    assert acc.pure_epsilon(event) == pytest.approx(0.6)
    assert acc.epsilon(event, 0.0) == pytest.approx(0.6)  # exact sum at delta 0 (the PLD says inf there)
    assert math.isinf(independent_pld(event.to_dp_event(), 1e-15))
    at = acc.epsilon(event, 1e-5)
    assert at <= 0.6 and at == pytest.approx(independent_pld(event.to_dp_event(), 1e-5))
    # many small releases: PLD at delta > 0 is far below the sum
    many = acc.compose([acc.laplace(0.1)] * 50)
    assert acc.epsilon(many, 0) == pytest.approx(5.0)
    assert acc.epsilon(many, 1e-5) == pytest.approx(2.7966, abs=1e-3)


def test_mixed_composition_is_never_above_basic_composition():
    event = acc.compose([acc.laplace(2.0), acc.gaussian(5.0)])
    basic = 2.0 + acc.epsilon(acc.gaussian(5.0), 1e-6)
    assert acc.epsilon(event, 1e-6) <= basic + 1e-12
    assert acc.pure_epsilon(event) is None
    assert math.isinf(acc.epsilon(event, 0.0))
    assert acc.epsilon(acc.compose([]), 1e-5) == 0.0


@pytest.mark.parametrize("bad", [lambda: acc.laplace(0), lambda: acc.laplace(-1), lambda: acc.laplace(math.inf),
                                 lambda: acc.laplace("a"), lambda: acc.dp_sgd(1.0, 1.5, 10),
                                 lambda: acc.dp_sgd(1.0, 0.1, 2.5), lambda: acc.gaussian(0),
                                 lambda: acc.compose([1.0]), lambda: acc.epsilon(acc.laplace(1), 1.0),
                                 lambda: acc.Event.from_json('{"kind": "nope"}'),
                                 lambda: acc.Event.from_json("not json")])
def test_bad_input_is_a_duckmob_error(bad):
    with pytest.raises(DuckmobError):
        bad()


def previous(event, delta):
    """What epsilon() answered before the fast paths: min(PLD of the ungrouped composition, basic composition)."""
    pure = acc.pure_epsilon(event)
    pld_eps = independent_pld(event.to_dp_event(), delta)
    return min(pld_eps, pure) if pure is not None else pld_eps


@pytest.mark.parametrize("eps", [[0.1] * 50, [0.1, 0.2, 0.3], [0.25] * 4 + [0.5], [0.001] * 40 + [0.3] * 3])
def test_pure_laplace_pld_path_gives_the_previous_value(eps):
    event = acc.compose([acc.laplace(e) for e in eps])
    got = acc.epsilon(event, 1e-5)
    assert got == pytest.approx(previous(event, 1e-5), abs=1e-9)
    assert got < math.fsum(eps)


@pytest.mark.parametrize("eps", [[0.5], [50.0], [100.0], [30.0, 40.0], [2.0, 3.0], [1.0] * 30, [0.9, 1.5]])
def test_pure_laplace_sum_path_gives_exactly_the_sum(eps):
    """One event, events above PLD_MAX_LAPLACE_EPSILON, or a total above PLD_MAX_LAPLACE_TOTAL: the sum (the advanced
    composition bound is larger for all of these)."""
    event = acc.compose([acc.laplace(e) for e in eps])
    assert acc.epsilon(event, 1e-5) == math.fsum(eps)
    assert acc.epsilon(event, 0.0) == math.fsum(eps)


def test_large_laplace_events_are_added_to_the_pld_of_the_small_ones():
    event = acc.compose([acc.laplace(0.1)] * 20 + [acc.laplace(3.0)])
    small = independent_pld(dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(10.0), 20), 1e-5)
    assert acc.epsilon(event, 1e-5) == pytest.approx(3.0 + small, abs=1e-9)
    assert acc.epsilon(event, 1e-5) < 5.0


@pytest.mark.parametrize("eps", [1000, 1e9, 100.5])
def test_laplace_above_max_epsilon_is_refused(eps):
    with pytest.raises(DuckmobError, match=r"above the limit of 100 .*use a smaller eps"):
        acc.laplace(eps)
    assert acc.laplace(acc.MAX_EPSILON).param("eps") == 100.0


@pytest.mark.parametrize("eps", [1000, 1e9])
def test_recorded_events_above_max_epsilon_still_read_and_are_summed(eps):
    event = acc.Event.from_json(f'{{"kind":"compose","events":[{{"kind":"laplace","eps":{eps!r}}},'
                                '{"kind":"laplace","eps":0.5}]}')
    assert acc.epsilon(event, 1e-5) == eps + 0.5
    mixed = acc.compose([event, acc.dp_sgd(1.0, 0.01, 100)])
    assert acc.epsilon(mixed, 1e-5) == pytest.approx(eps + 0.5 + acc.epsilon(acc.dp_sgd(1.0, 0.01, 100), 1e-5))


def test_thousands_of_small_laplace_releases():
    many = acc.compose([acc.laplace(0.001)] * 5000)
    got = acc.epsilon(many, 1e-5)
    assert math.isfinite(got) and got <= 5.0
    grouped = independent_pld(dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(1000.0), 5000), 1e-5)
    assert got == pytest.approx(grouped, abs=1e-9)  # one self-composed PLD: 0.233 (5 by adding)


def test_many_distinct_laplace_releases_use_the_advanced_composition_bound():
    eps = [0.05 + i * 1e-4 for i in range(200)]
    event = acc.compose([acc.laplace(e) for e in eps])
    got = acc.epsilon(event, 1e-5)
    assert math.isfinite(got) and got <= math.fsum(eps)
    assert got == acc.advanced_composition(eps, 1e-5) < 0.4 * math.fsum(eps)


@pytest.mark.parametrize("eps, delta", [([0.1] * 50, 1e-5), ([0.5] * 20, 1e-6), ([0.3, 0.1, 0.2] * 20, 1e-2),
                                        ([0.01 * i for i in range(1, 60)], 1e-5)])
def test_advanced_composition_bounds_the_worst_pure_mechanism(eps, delta):
    """Binary randomised response at eps_i is the least private eps_i-DP mechanism (Kairouz et al. 2015); the
    bound is above its composed PLD, and above the Laplace one."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    worst = None
    for e in eps:
        rr = pld_lib.from_randomized_response(2 / (math.exp(e) + 1), 2)
        worst = rr if worst is None else worst.compose(rr)
    bound = acc.advanced_composition(eps, delta)
    assert bound >= worst.get_epsilon_for_delta(delta)
    assert bound >= independent_pld(acc.compose([acc.laplace(e) for e in eps]).to_dp_event(), delta)


def test_dp_sgd_with_a_large_laplace_part():
    sgd = acc.dp_sgd(1.0, 0.01, 100)
    alone = acc.epsilon(sgd, 1e-5)
    got = acc.epsilon(acc.compose([acc.laplace(50.0), sgd]), 1e-5)
    assert math.isfinite(got) and got == pytest.approx(50.0 + alone, abs=1e-12)
    # more distinct Laplace epsilons than PLD_MAX_LAPLACE_GROUPS: added too
    eps = [0.01 * (i + 1) for i in range(acc.PLD_MAX_LAPLACE_GROUPS + 1)]
    got = acc.epsilon(acc.compose([acc.laplace(e) for e in eps] + [sgd]), 1e-5)
    assert got == pytest.approx(math.fsum(eps) + alone, abs=1e-12)


def test_dp_sgd_with_a_small_laplace_part_is_the_pld_of_the_whole():
    """HRNet's events (count shares, pre-training, DP-SGD): grouped and reordered, the PLD is the one of before."""
    event = acc.compose([acc.laplace(0.25)] * 2 + [acc.laplace(0.1), acc.laplace(2.0), acc.dp_sgd(0.9, 0.01, 300)])
    got = acc.epsilon(event, 1e-5)
    assert got == pytest.approx(previous(event, 1e-5), abs=1e-9)
    assert got < 2.6 + acc.epsilon(acc.dp_sgd(0.9, 0.01, 300), 1e-5)


def test_a_dp_sgd_calibration_is_the_smallest_sigma_and_is_cached(monkeypatch):
    """The sigma fits (eps, delta) and 0.5 % less does not; the same public request again is answered from the
    cache (no accountant evaluation) with the same sigma, whoever builds the events."""
    fixed = [acc.laplace(0.05), acc.laplace(0.2)]
    sigma = acc.calibrate_noise_multiplier(fixed, 0.05, 40, 1.3, 1e-5)

    def run(s):
        return acc.compose(fixed + [acc.dp_sgd(s, 0.05, 40)])

    assert acc.epsilon(run(sigma), 1e-5) <= 1.3 < acc.epsilon(run(sigma / 1.005), 1e-5)
    evaluations = []
    epsilon = acc.epsilon
    monkeypatch.setattr(acc, "epsilon", lambda *a, **kw: evaluations.append(1) or epsilon(*a, **kw))
    again = acc.calibrate_noise_multiplier([acc.laplace(0.05), acc.laplace(0.2)], 0.05, 40, 1.3, 1e-5)
    assert again == sigma and evaluations == []
