"""How long ``duckmob.privacy.accounting.epsilon`` takes on the events the product produces, the cache cleared before
each call, at delta 1e-5. Prints seconds, the epsilon, the basic-composition sum and which bound won.
``--old`` also times the previous rule (PLD of the whole, ungrouped composition) where it can finish (it needed
88 s for Laplace 1000, 2.9 TiB for Laplace 1e9 and 632 s for 3,000 Laplace events, so those are skipped).
Run ``python benchmarks/accounting.py [--old]``."""

import math
import sys
import time

from dp_accounting import pld

from duckmob.privacy import accounting as acc, composition

DELTA = 1e-5
SGD = acc.dp_sgd(1.0, 0.00256, 4000)  # ENGINEERING.md's example run


def recorded_laplace(eps):
    """A ledger row written before MAX_EPSILON existed."""
    return acc.Event.from_json(f'{{"kind":"laplace","eps":{eps!r}}}')


CASES = [
    ("Laplace 0.5", acc.laplace(0.5)),
    ("Laplace 100 (MAX_EPSILON)", acc.laplace(acc.MAX_EPSILON)),
    ("recorded Laplace 1000", recorded_laplace(1000.0)),
    ("recorded Laplace 1e9", recorded_laplace(1e9)),
    ("PrivTrace: 3 Laplace shares of 1.0", acc.compose([acc.laplace(f) for f in (0.1, 0.45, 0.45)])),
    ("50 x Laplace 0.1", acc.compose([acc.laplace(0.1)] * 50)),
    ("5,000 x Laplace 0.001", acc.compose([acc.laplace(0.001)] * 5000)),
    ("200 distinct Laplace 0.05 .. 0.07", acc.compose([acc.laplace(0.05 + i * 1e-4) for i in range(200)])),
    ("20 Laplace: 8 distinct ~1, sum 19.4 (PLD limits)",
     acc.compose([acc.laplace(e) for e in [1.0 - i * 0.01 for i in range(8)] * 2 + [1.0, 0.99, 0.98, 0.97]])),
    ("1,000 PrivTrace releases (3,000 Laplace)",
     acc.compose([acc.laplace(f * e) for e in [0.5 + i * 1e-3 for i in range(1000)] for f in (0.1, 0.45, 0.45)])),
    ("DP-SGD (sigma 1, q 0.00256, 4000 steps)", SGD),
    ("Laplace 0.5 + DP-SGD", acc.compose([acc.laplace(0.5), SGD])),
    ("HRNet: counts 0.25 + 0.05, pre-training 1.0, DP-SGD",
     acc.compose([acc.laplace(0.25), acc.laplace(0.05), acc.laplace(1.0), SGD])),
    ("Laplace 50 + DP-SGD", acc.compose([acc.laplace(50.0), SGD])),
]


def old_epsilon(event):
    """The previous rule: PLD of the whole ungrouped composition (and the sum for pure Laplace)."""
    accountant = pld.PLDAccountant()
    accountant.compose(event.to_dp_event())
    value = float(accountant.get_epsilon(DELTA))
    pure = acc.pure_epsilon(event)
    return value if pure is None else min(value, pure)


def which(value, event):
    """The bound epsilon() returned (recomputed after the timing)."""
    laplace = [e.param("eps") for e in event.leaves() if e.kind == "laplace"]
    rest = [e for e in event.leaves() if e.kind != "laplace"]
    if not rest:
        if value == math.fsum(laplace):
            return "sum"
        if value == acc.advanced_composition(laplace, DELTA):
            return "advanced composition"
        return "PLD (+ sum of those above 1)"
    if laplace and value == math.fsum(laplace) + acc.epsilon(acc.compose(rest), DELTA):
        return "sum + PLD of the rest"
    return "PLD"


def main(old: bool) -> None:
    print(f"epsilon() at delta {DELTA:g}, cache cleared before each call")
    head = f"{'event':<52} {'seconds':>8} {'epsilon':>10} {'sum':>10}  bound"
    print(head + ("   old seconds  old epsilon" if old else ""))
    for label, event in CASES:
        composition._epsilon.cache_clear()
        t0 = time.perf_counter()
        value = acc.epsilon(event, DELTA)
        dt = time.perf_counter() - t0
        pure = acc.pure_epsilon(event)
        line = (f"{label:<52} {dt:8.3f} {value:10.5g} {pure if pure is not None else math.nan:10.5g}  "
                f"{which(value, event)}")
        if old and len(event.leaves()) > 1000:
            line += "   (skipped: 3,000 Laplace events took 632 s)"
        elif old and not any(e.kind == "laplace" and e.param("eps") > 20 for e in event.leaves()):
            t0 = time.perf_counter()
            before = old_epsilon(event)
            line += f"   {time.perf_counter() - t0:11.3f}  {before:11.5g}"
        elif old:
            line += "   (skipped: a Laplace event above 20)"
        print(line, flush=True)


if __name__ == "__main__":
    main("--old" in sys.argv[1:])
