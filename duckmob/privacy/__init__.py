"""The privacy core: one noise sampler, NormCut, length-normalised counting, accounting and the budget ledger.

- :mod:`duckmob.privacy.noise`: ``NoiseSource`` — Laplace noise on a power-of-two grid (Mironov-safe), and the
  post-processing ``generator()``.
- :mod:`duckmob.privacy.normcut`: PrivTrace's NormCut (App. B.6, Algorithm 2).
- :mod:`duckmob.privacy.counting`: length-normalised transition counts (PrivTrace §4.3, HRNet §4.1) and their
  noisy release; contribution bounding.
- :mod:`duckmob.privacy.events`: privacy events (what a release spends); :mod:`duckmob.privacy.composition`: their
  epsilon (PLD accountant of dp_accounting); :mod:`duckmob.privacy.calibration`: the least noise that fits a budget;
  :mod:`duckmob.privacy.budget`: the budget split; :mod:`duckmob.privacy.stopping`: a calibration's stop point.
  :mod:`duckmob.privacy.accounting` names them together.
- :mod:`duckmob.privacy.ledger`: per-source budgets and the record of every release, in the user's database.

Mechanisms, accounting and the ledger do not reach into each other beyond these names.
"""
