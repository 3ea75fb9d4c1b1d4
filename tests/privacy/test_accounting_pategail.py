"""Repeated Gaussian rounds in the accountant (PateGail's reward queries): gaussian_rounds, calibrate_gaussian_rounds."""

from __future__ import annotations

import dp_accounting
import pytest
from dp_accounting import pld

from duckmob.errors import DuckmobError
from duckmob.privacy import accounting


def _pld_epsilon(event: dp_accounting.DpEvent, delta: float) -> float:
    acc = pld.PLDAccountant()
    acc.compose(event)
    return float(acc.get_epsilon(delta))


def test_gaussian_rounds_is_the_self_composition_of_its_rounds():
    for sigma, rounds in [(3.0, 1), (20.0, 50), (44.0, 100)]:
        ours = accounting.epsilon(accounting.gaussian_rounds(sigma, rounds), 1e-5)
        theirs = _pld_epsilon(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma), rounds), 1e-5)
        assert ours == pytest.approx(theirs, rel=2e-3)
    assert accounting.gaussian_rounds(8.0, 4) == accounting.gaussian(4.0)


def test_calibration_spends_eps_with_the_laplace_parts():
    fixed = [accounting.laplace(0.2), accounting.laplace(0.02)]
    sigma = accounting.calibrate_gaussian_rounds(fixed, 60, 1.0, 1e-5)
    eps = accounting.epsilon(accounting.compose(fixed + [accounting.gaussian_rounds(sigma, 60)]), 1e-5)
    assert 0.99 <= eps <= 1.0
    # a little less noise would overspend
    less = accounting.epsilon(accounting.compose(fixed + [accounting.gaussian_rounds(sigma * 0.98, 60)]), 1e-5)
    assert less > 1.0
    # independent composition by dp_accounting, every round written out
    explicit = dp_accounting.ComposedDpEvent([dp_accounting.LaplaceDpEvent(5.0), dp_accounting.LaplaceDpEvent(50.0)]
                                             + [dp_accounting.GaussianDpEvent(sigma)] * 60)
    assert _pld_epsilon(explicit, 1e-5) == pytest.approx(eps, abs=5e-3)
    # without Laplace parts: the analytic Gaussian alone
    alone = accounting.calibrate_gaussian_rounds([], 10, 2.0, 1e-5)
    assert accounting.epsilon(accounting.gaussian_rounds(alone, 10), 1e-5) == pytest.approx(2.0, abs=1e-3)


def test_calibration_refuses_what_it_cannot_honour():
    with pytest.raises(DuckmobError, match="delta"):
        accounting.calibrate_gaussian_rounds([], 10, 1.0, 0.0)
    with pytest.raises(DuckmobError, match="leave no epsilon"):
        accounting.calibrate_gaussian_rounds([accounting.laplace(1.0)], 10, 1.0, 1e-5)
    with pytest.raises(DuckmobError, match="rounds"):
        accounting.gaussian_rounds(1.0, 0)
