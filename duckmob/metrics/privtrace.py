"""PrivTrace's evaluation metrics (Wang et al., privtrace.txt §5.1 and App. B.4).

Length and diameter are measured on the points as given (metres); trajectory density counts trajectories
whose route passes through random circles; transition patterns are counted on a 20 x 20 grid.
"""

from __future__ import annotations

from duckmob.metrics.common import Metric, Options, Side, bbox_sides_m, jsd, pattern_are, shared_histograms
from duckmob.metrics.queries import circle_queries, circle_query_are

SOURCE = "PrivTrace §5.1, App. B.4"


def metrics(real: Side, synth: Side, opts: Options, generator) -> list[Metric]:
    out = []
    b = opts.bins
    out.append(Metric("privtrace_length_jsd", jsd(*shared_histograms(real.length_m, synth.length_m, b)), True,
                      SOURCE, f"JSD of trajectory length (metres along its points), {b} bins to the real max, nats"))
    out.append(Metric("privtrace_diameter_jsd", jsd(*shared_histograms(real.diameter_m, synth.diameter_m, b)),
                      True, SOURCE, f"JSD of trajectory diameter (metres), {b} bins to the real max, nats"))

    phi = opts.phi * real.n
    scale = real.n / synth.n
    longer = max(bbox_sides_m(real.bbox))
    lo, hi = opts.radius_range
    circles = circle_queries(real.bbox, opts.n_queries, (lo * longer, hi * longer), generator)
    out.append(Metric("privtrace_density_are", circle_query_are(real, synth, circles, opts.query_w, phi), True, SOURCE,
                      f"ARE of trajectories passing {opts.n_queries} random circles of radius "
                      f"{lo * longer:.0f}-{hi * longer:.0f} m; phi {phi:g}"))

    pw = opts.pattern_w
    value, n_top = pattern_are(real.cells(pw), synth.cells(pw), 2, 5, False, opts.top_patterns, scale, phi)
    out.append(Metric("privtrace_pattern_are", value, True, SOURCE,
                      f"ARE of occurrences of the top {n_top} real 2-5 cell patterns, {pw}x{pw} grid; phi {phi:g}"))
    return out
