"""AdaTrace's five utility metrics (Gursoy et al., CCS 2018), as PrivTrace compares against it (privtrace.txt
§5.1): query AvRE, location coverage, frequent-pattern F1, trip error, length and diameter errors.

Settings follow AdaTrace's published experiment code (200 circular queries with sanity bound 1 % of the real
trajectories, 6 x 6 grid for trips and patterns of 2-8 cells, top-100 patterns, 15 x 15 grid for location
coverage, 20 bins) with these deliberate differences: the grids and queries lie on the declared bbox rather
than on the data's extent; the query radius is 1/10 of the bbox's longer side (AdaTrace's code uses 1/2.5 of
the data's extent for GeoLife, which on a city bbox covers nearly every trajectory); a query never matches a
trajectory just because it holds two identical consecutive points (a quirk of that code); Kendall's tau is
tau-b (ties counted properly).
"""

from __future__ import annotations

import numpy as np

from duckmob.metrics.common import (Metric, Options, Side, bbox_sides_m, jsd, kendall_tau, pattern_counts,
                                     shared_histograms, top_patterns)
from duckmob.metrics.queries import circle_queries, circle_query_are

SOURCE = "AdaTrace (Gursoy et al. 2018), as in PrivTrace §5.1"


def trip_distribution(side: Side, w: int) -> np.ndarray:
    """Counts of (start cell, end cell) pairs on the w x w grid, flattened (w^4 entries)."""
    cs = side.cells(w)
    return np.bincount(cs.start * (w * w) + cs.end, minlength=(w * w) ** 2).astype(np.float64)


def metrics(real: Side, synth: Side, opts: Options, generator) -> list[Metric]:
    out = []
    phi = opts.phi * real.n
    radius = opts.adatrace_radius * max(bbox_sides_m(real.bbox))
    circles = circle_queries(real.bbox, opts.adatrace_queries, radius, generator)
    out.append(Metric("adatrace_query_avre", circle_query_are(real, synth, circles, opts.query_w, phi), True, SOURCE,
                      f"ARE of trajectories passing {opts.adatrace_queries} circles of radius {radius:.0f} m; "
                      f"phi {phi:g}"))

    cw = opts.adatrace_coverage_w
    cov_o = real.routes(cw).getnnz(axis=0)
    cov_s = synth.routes(cw).getnnz(axis=0)
    out.append(Metric("adatrace_location_kendall_tau", kendall_tau(cov_o, cov_s), False, SOURCE,
                      f"Kendall tau-b of trajectories passing each {cw}x{cw} cell (1: same ranking of places)"))

    aw, k = opts.adatrace_w, opts.adatrace_top_k
    ko, cnt_o = pattern_counts(real.cells(aw), 2, 8, per_trajectory=False)
    ks, cnt_s = pattern_counts(synth.cells(aw), 2, 8, per_trajectory=False)
    top_o, top_s = ko[top_patterns(ko, cnt_o, k)], ks[top_patterns(ks, cnt_s, k)]
    hit = len(np.intersect1d(top_o, top_s))
    f1 = 2 * hit / (len(top_o) + len(top_s)) if len(top_o) + len(top_s) else float("nan")
    out.append(Metric("adatrace_pattern_f1", f1, False, SOURCE,
                      f"F1 of the two tables' top-{k} patterns of 2-8 {aw}x{aw} cells, by occurrences; 1 is best"))

    out.append(Metric("adatrace_trip_jsd", jsd(trip_distribution(real, aw), trip_distribution(synth, aw)), True,
                      SOURCE, f"trip error: JSD of (start cell, end cell) on a {aw}x{aw} grid, nats"))
    b = opts.adatrace_bins
    out.append(Metric("adatrace_length_jsd", jsd(*shared_histograms(real.length_m, synth.length_m, b)), True,
                      SOURCE, f"length error: JSD of travel distance (metres), {b} bins to the real max, nats"))
    out.append(Metric("adatrace_diameter_jsd", jsd(*shared_histograms(real.diameter_m, synth.diameter_m, b)),
                      True, SOURCE, f"diameter error: JSD of diameter (metres), {b} bins to the real max, nats"))
    return out
