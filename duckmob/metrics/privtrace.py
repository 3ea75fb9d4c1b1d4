"""PrivTrace's evaluation metrics (Wang et al., privtrace.txt §5.1 and App. B.4).

Length and diameter are measured on the points as given (metres); trajectory density counts trajectories
whose route passes through random circles; transition patterns are counted on a 20 x 20 grid.
"""

from __future__ import annotations

from duckmob.metrics.common import Metric, Options, Side, are, bbox_sides_m, jsd, pattern_counts
from duckmob.metrics.queries import circle_counts
from duckmob.metrics.summary import Column, KeyCounts, Summary, keyed_are, shared_counts

SOURCE = "PrivTrace §5.1, App. B.4"


def summary(side: Side, plan, parts: dict) -> None:
    """What ``side`` adds (:mod:`duckmob.metrics.summary`): length and diameter of each trajectory, trajectories
    passing each of the plan's circles, occurrences of 2-5 cell patterns on the pattern grid."""
    opts = plan.opts
    parts.setdefault("length_m", Column([side.length_m]))
    parts.setdefault("diameter_m", Column([side.diameter_m]))
    parts["privtrace.circles"] = circle_counts(side.routes(opts.query_w), plan.privtrace_inside)
    parts["privtrace.patterns"] = KeyCounts(*pattern_counts(side.cells(opts.pattern_w), 2, 5, False))


def compare(real: Summary, synth: Summary, opts: Options, generator=None) -> list[Metric]:
    """PrivTrace's rows between two summaries (:func:`summary`); the circles are the plan's."""
    out = []
    b = opts.bins
    out.append(Metric("privtrace_length_jsd", jsd(*shared_counts(real, synth, "length_m", b)), True,
                      SOURCE, f"JSD of trajectory length (metres along its points), {b} bins to the real max, nats"))
    out.append(Metric("privtrace_diameter_jsd", jsd(*shared_counts(real, synth, "diameter_m", b)),
                      True, SOURCE, f"JSD of trajectory diameter (metres), {b} bins to the real max, nats"))

    phi = opts.phi * real.n
    scale = real.n / synth.n
    longer = max(bbox_sides_m(real.bbox))
    lo, hi = opts.radius_range
    out.append(Metric("privtrace_density_are",
                      are(real.parts["privtrace.circles"], scale * synth.parts["privtrace.circles"], phi), True,
                      SOURCE, f"ARE of trajectories passing {opts.n_queries} random circles of radius "
                              f"{lo * longer:.0f}-{hi * longer:.0f} m; phi {phi:g}"))

    pw = opts.pattern_w
    value, n_top = keyed_are(real.parts["privtrace.patterns"], synth.parts["privtrace.patterns"],
                             opts.top_patterns, scale, phi)
    out.append(Metric("privtrace_pattern_are", value, True, SOURCE,
                      f"ARE of occurrences of the top {n_top} real 2-5 cell patterns, {pw}x{pw} grid; phi {phi:g}"))
    return out
