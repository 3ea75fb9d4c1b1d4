"""The one source of randomness for privacy: Laplace noise on a power-of-two grid, safe against Mironov's attack.
(DP-SGD's Gaussian draws are here too, :func:`dp_sgd_gaussian`: opacus's floating-point ones, bit for bit.)

Why not ``numpy.random.Generator.laplace``: textbook floating-point Laplace ``x + b * ln(U)`` produces outputs
whose set of reachable doubles depends on ``x``; an observer of one output can often tell ``x`` from ``x'``
with certainty (I. Mironov, "On significance of the least significant bits for differential privacy",
CCS 2012). The fix used here is the one of Google's "Secure Noise Generation" note (2020) and of OpenDP's
``make_laplace`` (float inputs): put inputs and outputs on a grid ``g Z`` so that the output is a function of
an integer only.

Mechanism (``NoiseSource.laplace``). For a scale ``b`` (metres, counts, whatever the query's unit) let

    g = granularity(b) = 2^(floor(log2 b) - BITS),      so  t = b / g  lies in [2^BITS, 2^(BITS+1)),

and release, for an input ``x`` on the grid (``x = u g`` with ``u`` an integer vector),

    M(x) = g * (u + W + 1/2),   W = floor(X / g),  X ~ Laplace(0, b) coordinate-wise.

``W`` is drawn as ``S * (floor(t E) + 1/2) - 1/2`` with ``E ~ Exp(1)`` and a fair sign ``S``: for ``X = S b E``
this is exactly ``floor(X / g)`` (since ``floor(-y) = -floor(y) - 1`` off the integers). The added
``1/2`` makes the noise mean zero; the noise returned is ``g (W + 1/2)``, a value on the half-offset grid.

Privacy map. For ``x, x'`` on the grid ``g Z^d`` with ``||x - x'||_1 <= Delta``,
``g (u + W + 1/2) = g (floor((x + X) / g) + 1/2)`` is a fixed function of ``x + X``: a post-processing of the
continuous Laplace mechanism. So it is exactly ``(Delta / b)``-DP and its privacy-loss distribution is dominated
by the continuous Laplace one: account it as ``accounting.laplace(Delta / b)`` (dp_accounting's
``LaplaceDpEvent(b / Delta)``); NO epsilon increase. The float arithmetic ``x + noise`` is exact (both terms are
multiples of ``g / 2`` below ``2^52 g``), so nothing about ``x`` leaks through low-order bits.
Inputs NOT on the grid are rounded to it first (``add_laplace``): each coordinate where neighbours differ can
then move by up to ``g`` more, so a release touching at most ``c`` coordinates is ``(Delta + c g) / b``-DP, i.e.
``eps' = eps (1 + c g / Delta)`` with ``g <= 2^-BITS b``; :func:`epsilon_rounded` computes it.
Length-normalised counts avoid the rounding altogether (``duckmob.privacy.counting`` computes them in integer
multiples of ``g``).

Sampling accuracy (stated, not hidden). ``E`` comes from numpy's ziggurat exponential sampler restricted to its
body ``[0, TAIL]``, where its values lie on a lattice of spacing below ``2^-50``; a draw above ``TAIL`` is replaced
by ``TAIL`` plus a fresh draw (memorylessness of the exponential), so numpy's coarse ``-log1p(-U)`` tail is never
used and no integer ``W`` is unreachable before ``|X| > 2^31 b``. Each probability ``P(W = w)`` is then right to a
relative ``2^-20`` or better for ``|X| < 1000 b`` (an interval of width ``1/t > 2^-21`` holds more than ``2^29``
lattice points; the sum ``k TAIL + E`` and the product ``t E`` round at relative ``2^-52``), and the log-ratio of
two such probabilities is off by at most ``2^-19`` per coordinate that differs between neighbours: a release
that changes ``c`` coordinates is ``(eps + c 2^-19, e^-1000)``-DP in the worst case. OpenDP's samplers are exact;
this one trades that last ``2^-19`` per changed coordinate for speed (tens of millions of samples a second
against OpenDP's ~0.03 M/s from Python, see benchmarks/noise.py).

Randomness. ``numpy.random.PCG64`` streams derived from a ``SeedSequence`` seeded from OS entropy unless an
explicit seed is given (then ``seeded`` is True and the ledger marks the release "seeded, not for release").
PCG64 is a statistical generator, not a cryptographic one (OpenDP draws from a cryptographically secure one):
an adversary who could reconstruct its state from released outputs could predict the noise. Releases expose only
noisy aggregates, which makes that impractical, not impossible; we accept it for speed. See the threat model in
``duckmob.privacy.ledger``.
"""

from __future__ import annotations

import math

import numpy as np

from duckmob.errors import DuckmobError
from duckmob import validators
from duckmob.validators import positive

# Bits of the grid below the scale: g = 2^(floor(log2 b) - BITS), t = b / g in [2^BITS, 2^(BITS+1)).
BITS = 20
# Largest |value / g| for which x + noise stays exact in float64 (2^52 leaves room for the +1/2 offset).
_EXACT = float(2 ** 52)
# numpy's ziggurat body ends at 7.697 (its tail uses -log1p(-U), coarse far out); draws above TAIL are redrawn.
TAIL = 7.5
# Work in chunks so a 200 M-entry tensor does not need several temporary copies at once.
_CHUNK = 1 << 22


def granularity(scale: float) -> float:
    """The power-of-two grid step ``g`` used for Laplace noise of scale ``scale``: ``2^(floor(log2 b) - BITS)``.

    ``scale / g`` lies in ``[2^BITS, 2^(BITS+1))``: the grid is about a millionth of the noise scale.
    """
    scale = _check_scale(scale)
    return math.ldexp(1.0, math.frexp(scale)[1] - 1 - BITS)


def epsilon_rounded(eps: float, sensitivity: float, scale: float, changed: int) -> float:
    """The epsilon of ``add_laplace`` on inputs that are not on the grid (see the module docstring).

    A release whose neighbouring inputs differ by at most ``sensitivity`` in L1 over at most ``changed``
    coordinates, noised at ``scale = sensitivity / eps``, is ``(sensitivity + changed * g) / scale``-DP.
    """
    return (sensitivity + changed * granularity(scale)) / scale if eps > 0 else eps


def _check_scale(scale) -> float:
    return positive("noise scale", scale, " (sensitivity / eps)")


# Largest Laplace scale the grid sampler honours: above it the grid step g exceeds 1 and whole counts would be
# rounded by more than the accounted mechanism allows (and the release would carry no information anyway).
MAX_SCALE = float(2 ** (BITS + 1))


def check_scale(scale: float) -> float:
    """Refuse, before any data is read, a Laplace scale (sensitivity / eps) the sampler cannot honour."""
    scale = _check_scale(scale)
    if scale >= MAX_SCALE:
        raise DuckmobError(f"eps is too small for this release (noise scale {scale:.3g} = sensitivity / eps is at "
                           f"least {MAX_SCALE:.3g}): the result would carry no information; use a larger eps")
    return scale


def laplace_scale(sensitivity: float, eps) -> float:
    """The Laplace scale ``sensitivity / eps`` of an eps-DP release, refused (:func:`check_scale`) when eps is not
    positive or the scale is one the sampler cannot honour: the one check of a mechanism's eps in the privacy core,
    made before any data is read."""
    return check_scale(sensitivity / positive("eps", eps))


class NoiseSource:
    """The one source of randomness for privacy (Laplace noise) and for post-processing (``generator()``).

    ``NoiseSource()`` draws its seed from OS entropy; ``NoiseSource(seed)`` is reproducible and sets
    ``seeded = True`` (tests and demos only: "seeded, not for release").
    """

    def __init__(self, seed: int | None = None):
        seed = validators.seed(seed)   # the one check of a seed (releases pass one it already made)
        self.seeded: bool = seed is not None
        self._seeds = np.random.SeedSequence(seed)
        self._rng = np.random.Generator(np.random.PCG64(self._seeds.spawn(1)[0]))

    def __repr__(self) -> str:
        return f"NoiseSource(seeded={self.seeded})"

    def laplace(self, scale: float, size) -> np.ndarray:
        """Laplace noise of scale ``scale`` (density exp(-|z|/b)/2b, variance 2 b^2 + g^2/12), float64.

        Values are ``g (W + 1/2)`` with ``W = floor(X / g)``, ``X ~ Laplace(0, b)``, ``g = granularity(b)``.
        Add them ONLY to inputs on the grid ``g Z``: ``x + noise`` with an off-grid ``x`` reveals ``x mod g`` in
        the output's low bits (Mironov's attack again); use ``add_laplace``, or build the counts in whole grid
        steps as ``counting`` does. Privacy map: inputs on the grid at L1 distance ``Delta`` ->
        ``Delta / b``-DP, accounted as ``accounting.laplace(Delta / b)``.
        """
        scale = _check_scale(scale)
        g = granularity(scale)
        t = scale / g
        out = np.empty(size, dtype=np.float64)
        flat = out.reshape(-1)
        for start in range(0, flat.size, _CHUNK):
            part = flat[start:start + _CHUNK]
            self._exponential(part)
            part *= t
            np.floor(part, out=part)
            part += 0.5
            part *= g
            # One fair sign bit per value, unpacked from raw 64-bit draws.
            raw = self._rng.bit_generator.random_raw((part.size + 63) // 64)
            negative = np.unpackbits(np.asarray(raw, dtype=np.uint64).view(np.uint8), count=part.size).view(bool)
            np.negative(part, out=part, where=negative)
        return out

    def add_laplace(self, x, scale: float) -> np.ndarray:
        """``x`` rounded to the grid of ``scale`` plus ``laplace(scale, x.shape)``, computed exactly (float64).

        Privacy map: if neighbouring inputs are already on the grid (counts of whole units, or values built
        from multiples of ``granularity(scale)``), L1 distance ``Delta`` -> ``Delta / scale``-DP. Otherwise the
        rounding costs a little: see :func:`epsilon_rounded` (``eps * (1 + c g / Delta)`` for ``c`` changed
        coordinates).
        """
        scale = _check_scale(scale)
        g = granularity(scale)
        x = np.asarray(x, dtype=np.float64)
        units = np.rint(x / g)  # division by a power of two is exact; rint is exact
        if units.size and not np.all(np.abs(units) < _EXACT / 2):
            raise DuckmobError(  # no value from x in the message: an error is an output too
                f"some values are not finite or too large for noise of scale {scale:.3g} (more than 2^51 grid "
                "steps): use a larger scale (smaller eps) or rescale the values")
        return units * g + self.laplace(scale, x.shape)

    def discrete_laplace(self, t: float, size) -> np.ndarray:
        """Integers ``W = floor(X)`` with ``X ~ Laplace(0, t)`` (int64): the grid noise in units of ``g``.

        ``P(W = w) = (1 - e^{-1/t}) e^{-w/t} / 2`` for ``w >= 0`` and symmetrically ``P(W = -1 - w)``; exposed so
        tests can check the sampler exactly at coarse ``t``.
        """
        t = _check_scale(t)
        e = np.empty(size, dtype=np.float64)
        self._exponential(e.reshape(-1))
        w = np.floor(e * t).astype(np.int64)
        raw = self._rng.bit_generator.random_raw((w.size + 63) // 64)
        negative = np.unpackbits(np.asarray(raw, dtype=np.uint64).view(np.uint8), count=w.size).view(bool)
        return np.where(negative.reshape(w.shape), -w - 1, w)

    def _exponential(self, out: np.ndarray) -> None:
        """Fill the 1-d ``out`` with Exp(1) draws taken from the ziggurat body only (see "Sampling accuracy")."""
        self._rng.standard_exponential(out=out)
        idx = np.flatnonzero(out > TAIL)
        offset = TAIL
        while idx.size:
            fresh = self._rng.standard_exponential(idx.size)
            done = fresh <= TAIL
            out[idx[done]] = offset + fresh[done]
            idx = idx[~done]
            offset += TAIL

    def generator(self) -> np.random.Generator:
        """A fresh, independent ``numpy.random.Generator`` derived from this source, for post-processing
        randomness (sampling synthetic data, shuffles, Dirichlet mixing, dropping extra trajectories).
        Each call returns a new child stream; reproducible when the source is seeded."""
        return np.random.Generator(np.random.PCG64(self.output_seed()))

    def output_seed(self) -> np.random.SeedSequence:
        """A fresh child ``SeedSequence`` of this source: the seed of one synthetic output, from which
        :func:`duckmob.release.sampling.block_generator` derives one stream per block of trajectories (so any
        engine can draw any block). Each call returns a new child; reproducible when the source is seeded."""
        return self._seeds.spawn(1)[0]


def public_generator(*key: int) -> np.random.Generator:
    """A generator from a public, fixed seed ``key`` (no entropy, no data): for post-processing choices that must
    come out the same in every output block and every process, such as the perturbed route costs of the fine
    placement. Never for privacy noise: what it draws is public to anyone who reads the code."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(k) for k in key])))


def dp_sgd_gaussian(params, std: float, generator) -> list:
    """The Gaussian noise of one DP-SGD step (``duckmob.synth.dpsgd``'s one-process optimiser): for each tensor of
    ``params`` in turn, ``torch.normal(0, std)`` of its shape, device and dtype from the torch ``generator``; zeros
    when ``std`` is 0. These are exactly the draws of opacus's ``_generate_noise`` outside its secure mode, which
    every DP-SGD step drew before (tested bit for bit: tests/synth/test_dpsgd_steps.py). Floating-point Gaussian
    noise, as opacus draws it (docs/threat_model.md); the accounting is the subsampled Gaussian of
    ``duckmob.privacy.accounting.dp_sgd``."""
    import torch

    return [torch.zeros(p.shape, device=p.device, dtype=p.dtype) if std == 0 else
            torch.normal(mean=0, std=std, size=p.shape, device=p.device, generator=generator, dtype=p.dtype)
            for p in params]


__all__ = ["BITS", "MAX_SCALE", "NoiseSource", "public_generator", "granularity", "epsilon_rounded", "check_scale",
           "laplace_scale", "dp_sgd_gaussian"]

