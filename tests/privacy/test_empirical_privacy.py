"""Empirical privacy: one released transition count on neighbouring datasets D, D' (one trajectory removed).

The privacy loss log(P[M(D) in bin] / P[M(D') in bin]) over well-populated bins must stay within eps up to
sampling error; a negative control (the same count with 4x too little noise) must be caught by the same test.
"""

import numpy as np
import pytest

from duckmob.privacy.counting import noisy_transition_counts, transition_counts
from duckmob.privacy.noise import NoiseSource

EPS = 1.0
DRAWS = 20_000
MIN_COUNT = 300
Z = 4.0  # tolerance in standard errors of each bin's log-ratio


def ragged(seqs):
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
    return offsets, np.concatenate([np.asarray(s, dtype=np.int64) for s in seqs])


# D' and D = D' plus one trajectory that puts almost all its mass (98/100) on the entry (0, 0)
D_PRIME = [[0, 1], [1, 0, 1], [1]]
EXTRA = [0] * 99
ENTRY = (0, 0)


def losses(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """|log ratio| of the two histograms on shared bins where both hold >= MIN_COUNT draws, and its std error."""
    edges = np.arange(min(a.min(), b.min()), max(a.max(), b.max()) + 0.1, 0.1)
    ha, _ = np.histogram(a, edges)
    hb, _ = np.histogram(b, edges)
    ok = (ha >= MIN_COUNT) & (hb >= MIN_COUNT)
    assert ok.sum() >= 3  # enough bins to say something
    return np.abs(np.log(ha[ok] / hb[ok])), np.sqrt(1 / ha[ok] + 1 / hb[ok])


def release(seqs, noise) -> float:
    return noisy_transition_counts(*ragged(seqs), 2, 1, EPS, noise, cut=False)[ENTRY]


def test_one_released_count_is_eps_dp_empirically():
    d, d_prime = D_PRIME + [EXTRA], D_PRIME
    diff = transition_counts(*ragged(d), 2, 1)[ENTRY] - transition_counts(*ragged(d_prime), 2, 1)[ENTRY]
    assert diff == pytest.approx(98 / 100)  # the removed trajectory moves this entry by almost the full sensitivity
    src_a, src_b = NoiseSource(101), NoiseSource(202)
    a = np.array([release(d, src_a) for _ in range(DRAWS)])
    b = np.array([release(d_prime, src_b) for _ in range(DRAWS)])
    loss, se = losses(a, b)
    assert len(loss) >= 10
    assert (loss <= EPS + Z * se).all(), (loss.max(), EPS)
    # the test has power: in the tails the observed loss reaches the theoretical 0.98 eps
    assert loss.max() > 0.8 * EPS * diff


def test_negative_control_too_little_noise_is_caught():
    # the same exact count, noised at half the calibrated scale: really 1.96-DP, claimed 1-DP
    src = NoiseSource(303)
    exact_d, exact_d_prime = 0.98 + 1.0, 1.0
    a = exact_d + src.laplace(1 / EPS / 2, DRAWS)
    b = exact_d_prime + src.laplace(1 / EPS / 2, DRAWS)
    loss, se = losses(a, b)
    assert (loss > EPS + Z * se).any()
    assert loss.max() > 1.5 * EPS
