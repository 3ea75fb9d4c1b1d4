"""The accountant's public face: privacy events, their epsilon, noise calibration and the budget split, each in
its own module and named here together for the callers that use several (the ledger, the methods).

- :mod:`duckmob.privacy.events`: :class:`Event` (laplace, gaussian, dp_sgd, compose; grouped, gaussian_rounds),
  stored as JSON.
- :mod:`duckmob.privacy.composition`: the epsilon of an event at a delta (basic composition, the PLD accountant,
  advanced composition: the tightest that costs little).
- :mod:`duckmob.privacy.calibration`: the least noise that fits an (eps, delta): DP-SGD's noise multiplier,
  repeated Gaussian rounds.
- :mod:`duckmob.privacy.budget`: the one budget split of every method, the refusal of a release that needs delta.
- :mod:`duckmob.privacy.stopping`: the stop point a calibration calls (the release core's Ctrl-C check).

Nothing is defined here; what only one caller needs is imported from its module.
"""

from duckmob.privacy.budget import split
from duckmob.privacy.calibration import calibrate_gaussian_rounds, calibrate_noise_multiplier
from duckmob.privacy.composition import (PLD_MAX_LAPLACE_EPSILON, PLD_MAX_LAPLACE_GROUPS, PLD_MAX_LAPLACE_TOTAL,
                                         advanced_composition, epsilon, pld_loaded, pure_epsilon, quick_epsilon)
from duckmob.privacy.events import MAX_EPSILON, Event, compose, dp_sgd, gaussian, gaussian_rounds, grouped, laplace

__all__ = ["Event", "MAX_EPSILON", "laplace", "gaussian", "dp_sgd", "compose", "grouped", "gaussian_rounds",
           "epsilon", "pure_epsilon", "advanced_composition", "quick_epsilon", "pld_loaded", "PLD_MAX_LAPLACE_TOTAL",
           "PLD_MAX_LAPLACE_GROUPS", "PLD_MAX_LAPLACE_EPSILON", "calibrate_noise_multiplier",
           "calibrate_gaussian_rounds", "split"]
