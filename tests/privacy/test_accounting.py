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
