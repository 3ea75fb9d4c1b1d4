"""``cleanslate_paper``: Lestyan et al.'s trip-size metric in the paper's own unit.

No reference code is published; the definitions are the paper's text (cleanslate-lestyan.txt §8.4, "Trip size
distribution"): the trip size is the number of cells of a trip, compared by JSD between the original and the
synthetic distribution in each hour of the day, "bounded between 0 (identical distributions) and 1": log base 2,
bits. duckmob's ``lestyan`` family computes the same distributions in nats (bound ln 2); this family reports them
in bits, so the paper's Figure 3 reads on its own scale. Cells are the w x w grid over the bbox, a trip's cells
with consecutive repeats collapsed (the paper's trips are cell sequences), the hour that of its first point.
The paper plots one value per hour; the row here is the mean over the hours with real trips (1 bit where an
hour has no synthetic trip) and, as a second row, all hours pooled.

The paper's other two metrics are duckmob's ``lestyan`` rows, whose definitions the paper's text fixes as
well: EMD in metres between source-destination distributions of up to 2000 sampled trips (``lestyan_od_emd_m``:
both samples of one size, so that the EMD is an exact assignment), and the top-K true-positive ratio
(``lestyan_pattern_tp_ratio``).
"""

from __future__ import annotations

import numpy as np

from duckmob.metrics.common import LN2, Metric, Options, Side, integer_histograms, jsd, require_time
from duckmob.metrics.lestyan import start_hours

SOURCE = "Lestyan et al. §8.4 (the paper's text; no reference code published)"


def hourly_sizes(side: Side, w: int, cap: int) -> np.ndarray:
    """(24 x cap + 1) counts of trips by start hour and size (sizes above ``cap`` in the last column)."""
    size = np.minimum(side.cells(w).lengths, cap)
    return np.bincount(start_hours(side) * (cap + 1) + size, minlength=24 * (cap + 1)).reshape(24, cap + 1)


def metrics(real: Side, synth: Side, opts: Options, generator=None) -> list[Metric]:
    w = opts.w
    size_o, size_s = real.cells(w).lengths, synth.cells(w).lengths
    out = []
    why = require_time(real, synth)
    if why:
        out.append(Metric("cleanslate_paper_trip_size_jsd_bits", None, True, SOURCE, f"{why}: hourly trip size"))
    else:
        cap = int(size_o.max())
        ho, hs = hourly_sizes(real, w, cap), hourly_sizes(synth, w, cap)
        used = ho.sum(axis=1) > 0
        out.append(Metric("cleanslate_paper_trip_size_jsd_bits", float(np.mean(jsd(ho[used], hs[used]))) / LN2,
                          True, SOURCE, f"JSD of trip size ({w}x{w} cells) per start hour, mean over "
                                        f"{int(used.sum())} real hours, bits (bound 1)"))
    out.append(Metric("cleanslate_paper_trip_size_pooled_jsd_bits", jsd(*integer_histograms(size_o, size_s)) / LN2,
                      True, SOURCE, f"JSD of trip size ({w}x{w} cells), all hours pooled, bits (bound 1)"))
    return out
