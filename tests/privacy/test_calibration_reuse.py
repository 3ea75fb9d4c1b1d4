"""The DP-SGD calibration reuses the fixed parts' RDP across its bisection (issue 42 item 5): the same epsilons, so
the same noise multipliers, as composing every candidate afresh."""

from __future__ import annotations

import copy

import pytest
from dp_accounting import rdp

from duckmob.privacy import accounting
from duckmob.synth.cleanslate import CleanSlate

BOX = [39.8477, 116.1956, 40.1133, 116.4880]


def test_a_copied_accountant_plus_the_run_gives_the_fresh_epsilon_exactly():
    fixed = [accounting.laplace(0.2), accounting.laplace(0.05), accounting.dp_sgd(9.0, 0.04, 300)]
    base = rdp.RdpAccountant().compose(accounting.compose(fixed).to_dp_event())
    for sigma in (0.7, 3.1, 40.0):
        run = accounting.dp_sgd(sigma, 0.04, 250)
        fresh = rdp.RdpAccountant().compose(accounting.compose(fixed + [run]).to_dp_event()).get_epsilon(1e-5)
        reused = copy.deepcopy(base).compose(run.to_dp_event()).get_epsilon(1e-5)
        assert reused == fresh


def test_the_default_clean_slate_plan_keeps_its_noise_multipliers():
    """Recorded before the reuse (code 510d192): both calibrations of the default plan at eps 1, delta 1e-5."""
    plan = CleanSlate(BOX, progress=False).plan(1.0, 1e-5)
    # (to 1e-9: another platform's FFT may move the last bits; another bracket would move sigma by ~1e-3)
    assert (plan.sigma_ti, plan.sigma_tpg) == pytest.approx((22.626865077372333, 11.287511028854295), rel=1e-9)
    assert (plan.steps_ti, plan.steps_tpg, plan.sample_rate) == (500, 250, 0.04)
