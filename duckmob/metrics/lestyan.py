"""Lestyan et al.'s utility metrics (cleanslate-lestyan.txt §8.4) on the w x w grid.

Trip size (number of cells of the collapsed sequence) JSD; Earth Mover's Distance in metres between the
source-destination distributions; true-positive ratio of the top-K frequent patterns. The paper reports the
first two per hour of the day; the pooled values are also given so that timeless synthetic tables (the paper's
NGRAM case) get a number. The paper's JSD is base 2 (bound 1); ours is natural log (bound ln 2).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

from duckmob.metrics.common import (DAY_US, Metric, Options, Side, integer_histograms, jsd, pattern_counts,
                                     require_time, rng, top_patterns)
from duckmob.grid import cell_center, haversine_m
from duckmob.metrics.summary import Column, KeyCounts, Summary

SOURCE = "Lestyan et al. §8.4"


def start_hours(side: Side) -> np.ndarray:
    """Hour of the day (0-23) of each trajectory's first point."""
    ts = side.traj.ts[side.traj.offsets[:-1]]
    return (np.mod(ts, DAY_US) // 3_600_000_000).astype(np.int64)


def summary(side: Side, plan, parts: dict) -> None:
    """What ``side`` adds (:mod:`duckmob.metrics.summary`): each trajectory's size, start and end cell on the
    w x w grid and start hour, and per-trajectory counts of 2-5 cell patterns."""
    w = plan.opts.w
    cs = side.cells(w)
    parts["lestyan.size"] = Column([cs.lengths.astype(np.int64)])
    parts["lestyan.start"] = Column([cs.start.astype(np.int64)])
    parts["lestyan.end"] = Column([cs.end.astype(np.int64)])
    parts["lestyan.hour"] = Column([start_hours(side)])
    parts["lestyan.patterns"] = KeyCounts(*pattern_counts(cs, 2, 5, per_trajectory=True))


def od_emd_m(real: tuple[np.ndarray, np.ndarray], synth: tuple[np.ndarray, np.ndarray], bbox, w: int,
             rows_o: np.ndarray, rows_s: np.ndarray, cap: int, seed: int) -> float:
    """Earth Mover's Distance (metres) between the source-destination distributions of two sets of trips.

    ``real`` and ``synth`` are (start cells, end cells) of every trajectory, in the in-memory order; ``rows_o`` and
    ``rows_s`` pick the trips compared. Ground distance between trips (s, d) and (s', d'): d(s, s') + d(d, d')
    between cell centres (metres). As in the paper, at most ``cap`` trips are sampled from each side: a bounded,
    seeded sample whatever the table's size; here both samples have the same size n = min(|A|, |B|, cap), and the
    EMD between two uniform distributions of n points each is the optimal one-to-one matching cost divided by n
    (Birkhoff), solved exactly by ``linear_sum_assignment``. Each side is sampled by its own generator seeded
    alike, so identical tables draw identical samples (EMD 0)."""
    n = min(len(rows_o), len(rows_s), cap)
    if n == 0:
        return float("nan")
    pick_o = np.sort(rng(seed).permutation(len(rows_o))[:n])
    pick_s = np.sort(rng(seed).permutation(len(rows_s))[:n])
    so, eo = real[0][rows_o[pick_o]], real[1][rows_o[pick_o]]
    ss, es = synth[0][rows_s[pick_s]], synth[1][rows_s[pick_s]]
    # Distances between the few cells involved, once (haversine), then looked up for every pair of trips.
    cells, inv = np.unique(np.concatenate([so, eo, ss, es]), return_inverse=True)
    lat, lon = cell_center(cells, bbox, w)
    dist = haversine_m(lat[:, None], lon[:, None], lat[None, :], lon[None, :])
    so, eo, ss, es = np.split(inv, 4)
    cost = dist[so][:, ss] + dist[eo][:, es]
    r, col = linear_sum_assignment(cost)
    return float(cost[r, col].mean())


def compare(real: Summary, synth: Summary, opts: Options, generator) -> list[Metric]:
    """Lestyan's rows between two summaries (:func:`summary`, columns in the in-memory order:
    :meth:`Summary.ordered`)."""
    w = opts.w
    seed = int(generator.integers(2**31))
    out = []
    size_o, size_s = real.column("lestyan.size"), synth.column("lestyan.size")
    out.append(Metric("lestyan_trip_size_jsd", jsd(*integer_histograms(size_o, size_s)), True, SOURCE,
                      f"JSD of trip size ({w}x{w} cells, repeats collapsed), all hours, nats"))
    why = require_time(real, synth)
    ho = hs = None
    if why:
        out.append(Metric("lestyan_trip_size_jsd_hourly", None, True, SOURCE, f"{why}: hourly trip size"))
    else:
        ho, hs = real.column("lestyan.hour"), synth.column("lestyan.hour")
        cap = int(size_o.max())
        mo = np.bincount(ho * (cap + 1) + np.minimum(size_o, cap), minlength=24 * (cap + 1)).reshape(24, -1)
        ms = np.bincount(hs * (cap + 1) + np.minimum(size_s, cap), minlength=24 * (cap + 1)).reshape(24, -1)
        used = mo.sum(axis=1) > 0
        out.append(Metric("lestyan_trip_size_jsd_hourly", float(np.mean(jsd(mo[used], ms[used]))), True, SOURCE,
                          f"JSD of trip size per start hour, mean over {int(used.sum())} real hours (ln 2 where "
                          "no synthetic trip), nats"))

    od_o = real.column("lestyan.start"), real.column("lestyan.end")
    od_s = synth.column("lestyan.start"), synth.column("lestyan.end")
    all_o, all_s = np.arange(real.n), np.arange(synth.n)
    out.append(Metric("lestyan_od_emd_m", od_emd_m(od_o, od_s, real.bbox, w, all_o, all_s, opts.emd_sample, seed),
                      True, SOURCE, f"EMD (metres) of start-end cell pairs, up to {opts.emd_sample} trips a side, "
                                    "all hours"))
    if why:
        out.append(Metric("lestyan_od_emd_hourly_m", None, True, SOURCE, f"{why}: hourly EMD"))
    else:
        values, missing = [], 0
        for hour in range(24):  # 24 hours, not a loop over trajectories
            ro, rs = np.flatnonzero(ho == hour), np.flatnonzero(hs == hour)
            if len(ro) and len(rs):
                values.append(od_emd_m(od_o, od_s, real.bbox, w, ro, rs, opts.emd_sample, seed + hour))
            elif len(ro):
                missing += 1
        value = float(np.mean(values)) if values else float("nan")
        out.append(Metric("lestyan_od_emd_hourly_m", value, True, SOURCE,
                          f"EMD (metres) of start-end pairs per start hour, mean of {len(values)} hours; "
                          f"{missing} real hours lack synthetic trips"))

    k = opts.top_k
    po, ps = real.parts["lestyan.patterns"], synth.parts["lestyan.patterns"]
    top_o, top_s = po.keys[top_patterns(po.keys, po.counts, k)], ps.keys[top_patterns(ps.keys, ps.counts, k)]
    value = len(np.intersect1d(top_o, top_s)) / len(top_o) if len(top_o) else float("nan")
    out.append(Metric("lestyan_pattern_tp_ratio", value, False, SOURCE,
                      f"share of the top {len(top_o)} real 2-5 cell patterns ({w}x{w}) in the synthetic top {k}; "
                      "1 is best"))
    return out
