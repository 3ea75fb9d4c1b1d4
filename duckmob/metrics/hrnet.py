"""HRNet's evaluation metrics (Shibata et al., hrnet.txt §5.1.4 and App. A.3), on the w x w grid (w = 32).

Trajectories are compared as cell sequences (consecutive duplicates collapsed), as HRNet compares its
stay-point sequences; feed stay-point tables (``mob_staypoints``) on both sides to reproduce its setting.
L_start is the ``top_starts`` (30) cells where the most REAL trajectories start (App. A.3.1); a start cell
where no synthetic trajectory starts scores ln 2, the maximum, for that start.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from duckmob.metrics.common import (DAY_US, LN2, Metric, Options, Side, are, bernoulli_jsd, diameters_m, jsd,
                                     path_lengths_m, pattern_counts, require_time)
from duckmob.metrics.queries import query_counts
from duckmob.metrics.summary import Column, KeyCounts, Summary, keyed_are, shared_counts

SOURCE = "HRNet §5.1.4, App. A.3"


def _start_index(side: Side, w: int, starts: np.ndarray) -> np.ndarray:
    lut = np.full(w * w, -1, dtype=np.int64)
    lut[starts] = np.arange(len(starts))
    return lut[side.cells(w).start]


def conditional_counts(side: Side, w: int, starts: np.ndarray, what: str) -> np.ndarray:
    """(len(starts) x w*w) counts of trajectories starting in each start cell, by a cell-valued outcome.

    ``destination``: the last cell (Eq. 11); ``transition``: the second cell (Eq. 12; trajectories of one cell
    have none); ``waypoint``: every cell visited (Eq. 10); ``route``: every cell the straight-segment route
    passes (Eq. 15)."""
    cs = side.cells(w)
    sidx = _start_index(side, w, starts)
    c = w * w
    k = len(starts)
    if what in ("destination", "transition"):
        if what == "destination":
            outcome, ok = cs.end, sidx >= 0
        else:
            has_next = cs.lengths >= 2
            outcome = cs.cells[np.minimum(cs.offsets[:-1] + 1, len(cs.cells) - 1)]
            ok = (sidx >= 0) & has_next
        return np.bincount(sidx[ok] * c + outcome[ok], minlength=k * c).reshape(k, c).astype(np.float64)
    mat = side.visits(w) if what == "waypoint" else side.routes(w)
    rows = np.flatnonzero(sidx >= 0)
    pick = sp.csr_matrix((np.ones(len(rows), dtype=np.float32), (sidx[rows], rows)), shape=(k, side.n))
    return np.asarray((pick @ mat).todense(), dtype=np.float64)


def location_at_times(side: Side, w: int, n_times: int) -> np.ndarray:
    """(n_times x w*w) counts of trajectories in each cell at the instants t_k = k * 24 h / n_times of the day.

    A trajectory is at cell v[i] at time t when t[i] <= t < t[i+1] (HRNet App. A.3 "density at t"; the end is the
    time of its last point). Times are time of day, unwrapped across midnight from the trajectory's first
    point, so a trajectory crossing midnight is seen at the early-morning instants too."""
    cs = side.cells(w)
    t = side.traj
    own = cs.owner
    first_ts = t.ts[t.offsets[:-1]]
    base = np.mod(first_ts, DAY_US) - first_ts
    big = np.int64(1) << 40  # µs, about 12.7 days: longer stretches are not looked at
    rel = np.minimum(cs.ts + base[own], big - 1)
    end_rel = t.ts[t.offsets[1:] - 1] + base
    keys = own * big + rel
    instants = np.arange(n_times, dtype=np.int64) * (DAY_US // n_times)
    when = (instants[:, None] + np.array([0, DAY_US], dtype=np.int64)[None, :]).ravel()  # today, tomorrow
    traj = np.repeat(np.arange(side.n, dtype=np.int64), len(when))
    tq = np.tile(when, side.n)
    pos = np.searchsorted(keys, traj * big + tq, side="right") - 1
    ok = (pos >= cs.offsets[traj]) & (tq < end_rel[traj]) & (tq < big)
    slot = np.tile(np.repeat(np.arange(n_times), 2), side.n)
    c = w * w
    return np.bincount(slot[ok] * c + cs.cells[pos[ok]], minlength=n_times * c).reshape(n_times, c)


def summary(side: Side, plan, parts: dict) -> None:
    """What ``side`` adds to HRNet's metrics (:mod:`duckmob.metrics.summary`): start-cell counts, (start cell,
    outcome cell) counts of the destination, the second cell, each cell visited and each cell the route passes,
    travel distance and diameter between cell centres (per trajectory), trajectories at each cell at each instant,
    hits of the random cell sets and per-trajectory pattern counts."""
    opts = plan.opts
    w = opts.w
    c = w * w
    cs = side.cells(w)
    start = cs.start
    parts["hrnet.starts"] = np.bincount(start, minlength=c).astype(np.int64)
    parts["hrnet.destination"] = KeyCounts.of(start * c + cs.end)
    has_next = cs.lengths >= 2
    second = cs.cells[np.minimum(cs.offsets[:-1] + 1, max(len(cs.cells) - 1, 0))] if len(cs.cells) else start
    parts["hrnet.transition"] = KeyCounts.of(start[has_next] * c + second[has_next])
    for what, mat in (("waypoint", side.visits(w)), ("route", side.routes(w))):
        rows = np.repeat(np.arange(side.n, dtype=np.int64), np.diff(mat.indptr))
        parts[f"hrnet.{what}"] = KeyCounts.of(start[rows] * c + mat.indices)
    path = side.cell_path(w)
    parts["hrnet.distance"] = Column([path_lengths_m(*path)])
    parts["hrnet.diameter"] = Column([diameters_m(*path)])
    if side.has_time:
        parts["hrnet.times"] = location_at_times(side, w, opts.n_times).astype(np.int64)
    parts["hrnet.sets"] = query_counts(side.visits(w), plan.hrnet_sets)
    parts["hrnet.patterns"] = KeyCounts(*pattern_counts(cs, 3, pattern_max_len(w, 6), True))


def start_cells(real: Summary, w: int, k: int) -> np.ndarray:
    """L_start: the ``k`` cells where the most real trajectories start (ties: smaller cell id), only cells with
    starts, from a summary's start-cell counts."""
    counts = real.parts["hrnet.starts"]
    order = np.lexsort((np.arange(w * w), -counts))[:k]
    return order[counts[order] > 0]


def conditional_matrix(summary: Summary, what: str, w: int, starts: np.ndarray) -> np.ndarray:
    """:func:`conditional_counts` from a summary's (start cell, outcome cell) counts: (len(starts) x w*w)."""
    c, k = w * w, len(starts)
    pairs = summary.parts[f"hrnet.{what}"]
    lut = np.full(c, -1, dtype=np.int64)
    lut[starts] = np.arange(k)
    row = lut[pairs.keys // c]
    ok = row >= 0
    return np.bincount(row[ok] * c + pairs.keys[ok] % c, weights=pairs.counts[ok],
                       minlength=k * c).reshape(k, c)


def conditional_jsd(real: Summary, synth: Summary, w: int, starts: np.ndarray, what: str) -> float:
    """Mean over L_start of JSD(p_start || q_start) (App. A.3.1).

    destination / transition: the distributions over all cells. waypoint / route: for each cell l the
    Bernoulli "l is in the trajectory" given the start, JSD averaged over all w*w cells, then over starts.
    Nats, in [0, ln 2]."""
    if len(starts) == 0:
        return float("nan")
    po = conditional_matrix(real, what, w, starts)
    ps = conditional_matrix(synth, what, w, starts)
    if what in ("destination", "transition"):
        return float(np.mean(jsd(po, ps)))
    n_o = real.parts["hrnet.starts"][starts].astype(np.float64)
    n_s = synth.parts["hrnet.starts"][starts].astype(np.float64)
    p = po / np.maximum(n_o, 1)[:, None]
    q = ps / np.maximum(n_s, 1)[:, None]
    per_start = bernoulli_jsd(p, q).mean(axis=1)
    per_start = np.where(n_s > 0, per_start, LN2)
    return float(np.mean(per_start))


def compare(real: Summary, synth: Summary, opts: Options, generator=None) -> list[Metric]:
    """HRNet's rows between two summaries (:func:`summary`); the random cell sets are the plan's."""
    w = opts.w
    out = []
    starts = start_cells(real, w, opts.top_starts)
    k = len(starts)
    eq = {"waypoint": "Eq. 10", "destination": "Eq. 11", "transition": "Eq. 12", "route": "Eq. 15"}
    what_is = {  # waypoint and route: Bernoulli JSD per cell, averaged over all cells (conditional_jsd)
        "waypoint": "'cell visited'",
        "destination": "the last cell",
        "transition": "the second cell",
        "route": "'cell on the route'",
    }
    for what in ("waypoint", "destination", "transition", "route"):
        out.append(Metric(f"hrnet_{what}_jsd", conditional_jsd(real, synth, w, starts, what), True,
                          f"{SOURCE} ({eq[what]})",
                          f"JSD of {what_is[what]} given the start cell; top {k} real starts, {w}x{w} grid, nats"))
    out.append(Metric("hrnet_travel_distance_jsd", jsd(*shared_counts(real, synth, "hrnet.distance", opts.bins)),
                      True, f"{SOURCE} (Eq. 13)",
                      f"JSD of travel distance via {w}x{w} cell centres (m), {opts.bins} bins to the real max, "
                      "nats"))
    out.append(Metric("hrnet_diameter_jsd", jsd(*shared_counts(real, synth, "hrnet.diameter", opts.bins)), True,
                      f"{SOURCE} (Eq. 14)",
                      f"JSD of diameter between {w}x{w} cell centres (m), {opts.bins} bins to the real max, nats"))

    why = require_time(real, synth)
    if why:
        out.append(Metric("hrnet_density_t_jsd", None, True, SOURCE, f"{why}: density at t needs time"))
    else:
        lo_, ls_ = real.parts["hrnet.times"], synth.parts["hrnet.times"]
        used = lo_.sum(axis=1) > 0
        value = float(np.mean(jsd(lo_[used], ls_[used]))) if used.any() else float("nan")
        out.append(Metric("hrnet_density_t_jsd", value, True, SOURCE,
                          f"JSD of where trajectories are at {opts.n_times} instants a day, mean over "
                          f"{int(used.sum())} with real ones under way, nats"))

    phi = opts.phi * real.n
    scale = real.n / synth.n
    value = are(real.parts["hrnet.sets"], scale * synth.parts["hrnet.sets"], phi)
    out.append(Metric("hrnet_traj_density_are", value, True, SOURCE,
                      f"ARE of trajectories visiting {opts.n_queries} random sets of 1-"
                      f"{max(1, round(opts.max_set_fraction * w * w))} {w}x{w} cells; phi {phi:g}"))

    n_max = pattern_max_len(w, 6)
    value, n_top = keyed_are(real.parts["hrnet.patterns"], synth.parts["hrnet.patterns"], opts.top_patterns, scale,
                             phi)
    out.append(Metric("hrnet_traj_pattern_are", value, True, SOURCE,
                      f"ARE of trajectories containing each top-{n_top} real pattern of 3-{n_max} cells; "
                      f"phi {phi:g}"))
    return out


def pattern_max_len(w: int, wanted: int) -> int:
    """The longest pattern (<= wanted) whose 64-bit key fits on a w x w grid (a longer pattern is never more
    frequent than its prefix, so it rarely reaches a top-200 list)."""
    return max(2, min(wanted, int(62 // np.log2(w * w + 1))))
