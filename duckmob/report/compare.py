"""The owner's comparison: every ``mob_evaluate`` metric with its two anchors and a plain verdict.

NOT differentially private: every number here reads the real table exactly (the anchors too). Only the owner's
page (``real :=``) holds them, under a banner saying it must not be published.

Each row has two anchors (:mod:`duckmob.metrics`): ``reference``, two halves of the real table against each other
(as good as real data gets), and ``baseline``, real half 0 against a naive table of straight trips between
uniformly random places in the bbox (what a synthesizer that learnt nothing about places scores). The synthetic
value is placed between them (:func:`position`): 0 at the reference, 1 at the baseline, in either direction of
the metric. Verdict per row (:func:`verdict`): "close to real" at most :data:`CLOSE` of the way to the baseline,
"no better than the baseline" at 1 or beyond, "between" with the share of the way otherwise; "not telling" where
the naive table scores within a quarter of the reference (:data:`TELLING`: the metric hardly separates real data
from it on this table); "compare by eye" for a row without a direction or an anchor; "not measured" without a
value.
"""

from __future__ import annotations

import math

CLOSE = 0.2   # at most this share of the way from the reference to the baseline reads as "close to real"
# The baseline must be worse than the reference by at least this share of the reference for the way between them to
# measure anything: closer, the metric hardly tells real data from the naive table on this real table (e.g. HRNet's
# destination JSD at its ln 2 maximum between the real halves when few start cells hold enough trajectories).
TELLING = 0.25
VERDICTS = ("close to real", "between", "no better than the baseline")   # the judged verdicts, best first


def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def position(value, reference, baseline, lower_is_better) -> float | None:
    """Where ``value`` falls between the anchors: ``(value - reference) / (baseline - reference)``, 0 as good as
    real data, 1 as bad as the naive baseline, below 0 better than the reference. None when something is
    missing, the metric has no direction, or the baseline is no worse than the reference in the metric's
    direction by more than :data:`TELLING` of the reference (nothing to measure the way by)."""
    if lower_is_better is None or any(_missing(x) for x in (value, reference, baseline)):
        return None
    way = baseline - reference
    if (way if lower_is_better else -way) <= TELLING * abs(reference):
        return None
    return (value - reference) / way


def verdict(value, reference, baseline, lower_is_better) -> str:
    """A plain verdict on one metric row (see the module docstring)."""
    if _missing(value):
        return "not measured"
    if lower_is_better is None or _missing(reference) or _missing(baseline):
        return "compare by eye"
    where = position(value, reference, baseline, lower_is_better)
    if where is None:
        return "not telling (the naive baseline scores about as well as real data)"
    if where <= CLOSE:
        return "close to real"
    if where >= 1:
        return "no better than the baseline"
    return f"between ({100 * where:.0f}% of the way to the baseline)"


def counts(verdicts: list[str]) -> dict[str, int]:
    """How many rows got each judged verdict (:data:`VERDICTS`)."""
    return {v: sum(x.startswith(v) for x in verdicts) for v in VERDICTS}


def comparison(real, synth, bbox) -> list[dict]:
    """The rows of ``mob_evaluate(real, synth, bbox)`` (every family, both anchors on) with a ``verdict`` each.
    ``real`` and ``synth``: :class:`duckmob.metrics.common.Side` (or Arrow points)."""
    from duckmob.metrics import evaluate

    rows = evaluate(real, synth, bbox)
    for row in rows:
        row["verdict"] = verdict(row["value"], row["reference"], row["baseline"], row["lower_is_better"])
    return rows
