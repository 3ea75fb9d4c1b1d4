"""Shared by the benchmark scripts: the best wall time of a few repeats (the machines are shared and noisy)."""

import time


def best_of(fn, repeat: int = 3) -> float:
    """The smallest wall time, in seconds, of ``repeat`` calls of ``fn()``."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)
