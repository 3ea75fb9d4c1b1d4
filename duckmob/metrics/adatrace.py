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

from duckmob.metrics.common import (Metric, Options, Side, are, bbox_sides_m, jsd, kendall_tau, pattern_counts,
                                     top_patterns)
from duckmob.metrics.queries import circle_counts
from duckmob.metrics.summary import Column, KeyCounts, Summary, shared_counts

SOURCE = "AdaTrace (Gursoy et al. 2018), as in PrivTrace §5.1"


def trip_distribution(side: Side, w: int) -> np.ndarray:
    """Counts of (start cell, end cell) pairs on the w x w grid, flattened (w^4 entries)."""
    cs = side.cells(w)
    return np.bincount(cs.start * (w * w) + cs.end, minlength=(w * w) ** 2).astype(np.float64)


def summary(side: Side, plan, parts: dict) -> None:
    """What ``side`` adds (:mod:`duckmob.metrics.summary`): trajectories passing each of the plan's circles, routes
    per coverage cell, occurrences of 2-8 cell patterns, (start, end) cell pairs, length and diameter of each
    trajectory."""
    opts = plan.opts
    parts["adatrace.circles"] = circle_counts(side.routes(opts.query_w), plan.adatrace_inside)
    parts["adatrace.coverage"] = side.routes(opts.adatrace_coverage_w).getnnz(axis=0).astype(np.int64)
    aw = opts.adatrace_w
    parts["adatrace.patterns"] = KeyCounts(*pattern_counts(side.cells(aw), 2, 8, per_trajectory=False))
    parts["adatrace.trips"] = trip_distribution(side, aw)
    parts.setdefault("length_m", Column([side.length_m]))
    parts.setdefault("diameter_m", Column([side.diameter_m]))


def compare(real: Summary, synth: Summary, opts: Options, generator=None) -> list[Metric]:
    """AdaTrace's rows between two summaries (:func:`summary`); the circles are the plan's."""
    out = []
    phi = opts.phi * real.n
    radius = opts.adatrace_radius * max(bbox_sides_m(real.bbox))
    co, cs = real.parts["adatrace.circles"], synth.parts["adatrace.circles"]
    out.append(Metric("adatrace_query_avre", are(co, real.n / synth.n * cs, phi), True, SOURCE,
                      f"ARE of trajectories passing {opts.adatrace_queries} circles of radius {radius:.0f} m; "
                      f"phi {phi:g}"))

    cw = opts.adatrace_coverage_w
    out.append(Metric("adatrace_location_kendall_tau",
                      kendall_tau(real.parts["adatrace.coverage"], synth.parts["adatrace.coverage"]), False, SOURCE,
                      f"Kendall tau-b of trajectories passing each {cw}x{cw} cell (1: same ranking of places)"))

    aw, k = opts.adatrace_w, opts.adatrace_top_k
    po, ps = real.parts["adatrace.patterns"], synth.parts["adatrace.patterns"]
    top_o, top_s = po.keys[top_patterns(po.keys, po.counts, k)], ps.keys[top_patterns(ps.keys, ps.counts, k)]
    hit = len(np.intersect1d(top_o, top_s))
    f1 = 2 * hit / (len(top_o) + len(top_s)) if len(top_o) + len(top_s) else float("nan")
    out.append(Metric("adatrace_pattern_f1", f1, False, SOURCE,
                      f"F1 of the two tables' top-{k} patterns of 2-8 {aw}x{aw} cells, by occurrences; 1 is best"))

    out.append(Metric("adatrace_trip_jsd", jsd(real.parts["adatrace.trips"], synth.parts["adatrace.trips"]), True,
                      SOURCE, f"trip error: JSD of (start cell, end cell) on a {aw}x{aw} grid, nats"))
    b = opts.adatrace_bins
    out.append(Metric("adatrace_length_jsd", jsd(*shared_counts(real, synth, "length_m", b)), True,
                      SOURCE, f"length error: JSD of travel distance (metres), {b} bins to the real max, nats"))
    out.append(Metric("adatrace_diameter_jsd", jsd(*shared_counts(real, synth, "diameter_m", b)),
                      True, SOURCE, f"diameter error: JSD of diameter (metres), {b} bins to the real max, nats"))
    return out
