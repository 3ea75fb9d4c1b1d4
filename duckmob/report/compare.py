"""The owner's comparison: every ``mob_evaluate`` metric with its real-vs-real reference and a plain verdict.

NOT differentially private: every number here reads the real table exactly (the reference too). Only the owner's
page (``real :=``) holds them, under a banner saying it must not be published.

Verdict per row (:func:`verdict`): a metric where lower is better is "close to real" when the synthetic value is
at most twice the reference (two halves of the real table against each other), else "a gap" with the ratio;
where higher is better, when it is at least half the reference; a row without a reference or a direction is
"compare by eye".
"""

from __future__ import annotations

import math

FACTOR = 2.0   # within this factor of the real-vs-real reference reads as "close to real"


def verdict(value, reference, lower_is_better) -> str:
    """A plain verdict on one metric row (see the module docstring)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "not measured"
    if lower_is_better is None or reference is None or (isinstance(reference, float) and math.isnan(reference)):
        return "compare by eye"
    if lower_is_better:
        if value <= FACTOR * reference:
            return "close to real"
        return f"a gap ({value / reference:,.1f}x the reference)" if reference > 0 else "a gap (reference 0)"
    if reference <= 0 or value >= reference / FACTOR:
        return "close to real"
    return f"a gap ({value / reference:.2f} of the reference)"


def comparison(real, synth, bbox) -> list[dict]:
    """The rows of ``mob_evaluate(real, synth, bbox)`` (every family, reference on) with a ``verdict`` each.
    ``real`` and ``synth``: :class:`duckmob.metrics.common.Side` (or Arrow points)."""
    from duckmob.metrics import evaluate

    rows = evaluate(real, synth, bbox)
    for row in rows:
        row["verdict"] = verdict(row["value"], row["reference"], row["lower_is_better"])
    return rows
