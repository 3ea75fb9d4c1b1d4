"""Noise sampler speed: duckmob's grid Laplace (NoiseSource.laplace) against numpy's textbook Laplace (fast, not
Mironov-safe) and OpenDP 0.16's make_laplace (exact, vetted; ``pip install opendp==0.16.0``, optional).
Prints samples per second and ratios; run ``python benchmarks/noise.py`` (one core: numpy is single-threaded)."""

import numpy as np

from duckmob.privacy.noise import NoiseSource
from timing import best_of



def main():
    n = 10_000_000
    src = NoiseSource(1)
    rng = np.random.default_rng(1)
    ours = n / best_of(lambda: src.laplace(1.0, n))
    textbook = n / best_of(lambda: rng.laplace(0.0, 1.0, n))
    x = np.arange(n, dtype=np.float64)
    release = n / best_of(lambda: src.add_laplace(x, 1.0))
    print(f"duckmob NoiseSource.laplace:      {ours / 1e6:8.1f} M samples/s (goal >= 10 M/s)")
    print(f"duckmob add_laplace (snap + add): {release / 1e6:8.1f} M samples/s")
    print(f"numpy Generator.laplace:          {textbook / 1e6:8.1f} M samples/s   "
          f"ours / numpy = {ours / textbook:.2f}x")
    try:
        import opendp.prelude as dp
    except ImportError:
        print("OpenDP not installed (pip install opendp==0.16.0): skipped")
        return
    dp.enable_features("contrib")
    space = dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.l1_distance(T=float)
    meas = dp.m.make_laplace(*space, scale=1.0)
    m = 200_000
    data = [0.0] * m
    opendp = m / best_of(lambda: meas(data), repeat=1)
    print(f"OpenDP 0.16 make_laplace (float): {opendp / 1e6:8.3f} M samples/s   ours / OpenDP = {ours / opendp:.0f}x")


if __name__ == "__main__":
    main()
