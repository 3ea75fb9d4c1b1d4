"""PateGail's private reward aggregation (Wang et al., AAAI 2024, eq. 2-3), accounted end to end.

Each round the server asks B reward queries (the generated state-action pairs of that round, public). Device u
answers ``D_u(q) in [0, 1]`` for each (clipped: NaN -> 0, then to [0, 1], so the bound below holds whatever a
device's discriminator does). Released per round, with the Gaussian mechanism:

    X1 = sum_u D_u(q)    + N(0, (sigma_1 sqrt(B))^2)        for each of the B queries   (eq. 2, as a sum)
    X2 = sum_u D_u(q)^2  + N(0, (sigma_2 sqrt(B))^2)        (the variance term of eq. 3; only when it is used)

**Privacy map.** Neighbouring datasets differ by one device (one trajectory under the trajectory unit, one user
under the user unit: add or remove). A device adds at most 1 to each of the B sums of X1 and at most 1 to each
of X2, so ``||Delta S1||_2 <= sqrt(B)`` and ``||Delta S2||_2 <= sqrt(B)`` (as a mean over n devices: at most
1/n per query and sqrt(B)/n per batch). Scaling each part by ``1 / (sigma_i sqrt(B))`` gives unit noise and a
joint L2 sensitivity ``sqrt(1/sigma_1^2 + 1/sigma_2^2)``: one round is one Gaussian mechanism with multiplier
``sigma_round = (1/sigma_1^2 + 1/sigma_2^2)^(-1/2)`` (:func:`split_sigma` gives sigma_1, sigma_2 from it and
the variance share f: ``1/sigma_2^2 = f / sigma_round^2``). B varies between rounds but is public (it is the
number of generated pairs), and the noise is scaled to each round's own B. The queries of a round depend on
earlier rounds' outputs only (adaptive composition). T rounds are ``accounting.gaussian_rounds(sigma_round, T)``,
composed by the PLD accountant with the start model's Laplace releases into the one ledger event.

The rewards (:func:`rewards`) are post-processing: mean ``X1 / n~`` and variance ``X2 / n~ - mean^2`` (clipped
to [0, 1/4], the largest variance of values in [0, 1]) with the noisy device count ``n~``; eq. 3's reward is
``mean - beta * sqrt(variance)`` (the lower confidence bound of Theorem 1: Chebyshev gives the personal reward
above ``mean - beta sd`` with probability at least ``1 - 1/beta^2``).

Noise. Gaussian draws come from a ``numpy.random.Generator`` derived from the release's NoiseSource
(``NoiseSource.generator()``), the practice of opacus' DP-SGD (which hrnet/train.py follows). Floating-point
Gaussian noise is not covered by the grid argument of ``duckmob.privacy.noise`` (Mironov's attack targets
Laplace and applies in principle here too); as a mitigation the released sums are rounded to a power-of-two grid
about 2^-20 of the noise sd (post-processing), which discards the low-order bits the attack reads. The guarantee
is accounted as the continuous Gaussian mechanism.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from duckmob.privacy.noise import granularity

VARIANCE_MAX = 0.25


def clip_outputs(outputs: torch.Tensor) -> torch.Tensor:
    """Device outputs clipped to [0, 1] (NaN -> 0): the bound every sensitivity below rests on."""
    return torch.clamp(torch.nan_to_num(outputs, nan=0.0, posinf=1.0, neginf=0.0), 0.0, 1.0)


def device_sums(outputs: torch.Tensor, with_squares: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """(S1, S2): per-query sums over devices of the clipped outputs and of their squares, float64 (B,).

    ``outputs`` (n_devices, B). One device moves each entry of S1 and of S2 by at most 1."""
    d = clip_outputs(outputs).double()
    s1 = d.sum(dim=0).cpu().numpy()
    s2 = (d * d).sum(dim=0).cpu().numpy() if with_squares else None
    return s1, s2


def split_sigma(sigma_round: float, variance_share: float) -> tuple[float, float]:
    """(sigma_1, sigma_2) of the mean and variance parts for a round of multiplier ``sigma_round``:
    ``1/sigma_1^2 = (1 - f)/sigma_round^2``, ``1/sigma_2^2 = f/sigma_round^2`` (sigma_2 = inf when f = 0)."""
    f = float(variance_share)
    s1 = sigma_round / math.sqrt(1.0 - f)
    s2 = sigma_round / math.sqrt(f) if f > 0 else math.inf
    return s1, s2


def gaussian(values: np.ndarray, sd: float, rng: np.random.Generator) -> np.ndarray:
    """``values + N(0, sd^2)``, rounded to the power-of-two grid ``granularity(sd)`` (about 2^-20 sd)."""
    g = granularity(sd)
    noisy = np.asarray(values, dtype=np.float64) + rng.normal(0.0, sd, size=np.shape(values))
    return np.round(noisy / g) * g


def release_round(s1: np.ndarray, s2: np.ndarray | None, sigma_round: float, variance_share: float,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
    """One round's Gaussian mechanism (see the module docstring): noise sd ``sigma_i sqrt(B)`` on each part."""
    b = len(s1)
    sigma1, sigma2 = split_sigma(sigma_round, variance_share)
    root = math.sqrt(max(b, 1))
    x1 = gaussian(s1, sigma1 * root, rng)
    x2 = gaussian(s2, sigma2 * root, rng) if s2 is not None and math.isfinite(sigma2) else None
    return x1, x2


def rewards(x1: np.ndarray, x2: np.ndarray | None, n_devices: float, beta: float) -> np.ndarray:
    """Eq. 2-3 from the noised sums (post-processing): ``mean - beta sqrt(variance)`` with ``n_devices`` the
    noisy device count (at least 1)."""
    n = max(float(n_devices), 1.0)
    mean = x1 / n
    if x2 is None or beta == 0:
        return mean
    var = np.clip(x2 / n - np.clip(mean, 0.0, 1.0) ** 2, 0.0, VARIANCE_MAX)
    return mean - beta * np.sqrt(var)


def moments(x1: np.ndarray, x2: np.ndarray | None, n_devices: float) -> np.ndarray:
    """The released sums as per-query moments (B, 1 or 2): ``X1 / n~`` and ``X2 / n~`` (post-processing; the
    student's regression targets, unbiased up to the noisy count)."""
    n = max(float(n_devices), 1.0)
    cols = [x1 / n] if x2 is None else [x1 / n, x2 / n]
    return np.stack(cols, axis=1)


def moment_rewards(m: np.ndarray, beta: float) -> np.ndarray:
    """Eq. 2-3 from predicted moments (B, 1 or 2): ``mean - beta sqrt(variance)``, variance clipped to [0, 1/4]."""
    mean = m[:, 0]
    if m.shape[1] < 2 or beta == 0:
        return mean
    var = np.clip(m[:, 1] - np.clip(mean, 0.0, 1.0) ** 2, 0.0, VARIANCE_MAX)
    return mean - beta * np.sqrt(var)
