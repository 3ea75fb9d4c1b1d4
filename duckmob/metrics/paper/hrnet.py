"""``hrnet_paper``: HRNet's Table 1 metrics that its reference evaluation computes, as it computes them.

Reference: Emory-AIMS/priv_traj_gen, ``evaluation.py`` (line numbers below are of that file unless another
file is named), with its published evaluation settings (``conf/evaluation/baseline.yaml``). Its metric code
covers destination, transition (``emp_next``), route and travel distance; density at t has code whose call path
is disabled (``evaluate_global: False``) and waypoint, diameter, trajectory density and trajectory pattern have
none: for those the paper's written definitions are duckmob's ``hrnet`` family.

Preprocessing as the reference's: trajectories are cell sequences on the w x w grid over the bbox (w = 32 in
Table 1), consecutive repeats collapsed; feed stay-point tables (``mob_staypoints``) for HRNet's setting. The
REAL table loses its trajectories of one cell (``data_pre_processing.py`` 185: the training and evaluation data
hold none); the synthetic table is taken as generated.

* Start cells: among real trajectories of 2+ cells, the start cells of MORE than 20 of them (``test_threshold``
  20, baseline.yaml 22), the 20 most frequent if more qualify, the single most frequent if none does (777-795);
  most frequent first, ties to the smaller cell id (the reference: dictionary order).
* Destination: for each start s, the last cell of the trajectories starting in s, of any length
  (``compute_destination_count``, 563-570); transition: the second cell of those of 2+ cells
  (``count_first_next_locations``, 637-644); route: the distinct cells of each trajectory starting in s other
  than s itself (``count_route_locations``, 602-611; its route data is the trajectory itself unless routes are
  given, dataset.py 211-218, and generated routes are the generated trajectories without compensation, 172-173).
  Each: count vectors over the w*w cells, ``jensenshannon(p, q) ** 2`` (natural log; :func:`scipy_js2`); a
  synthetic side with no count for s is the uniform distribution over all cells (425-428); the mean over start
  cells (322).
* Travel distance: the sum of the distances between consecutive cells of each trajectory (``compute_distances``,
  619-626), a cell at the grid NODE ``min + i * (max - min) / (w - 1)`` on each axis (``my_utils.make_gps``),
  great-circle metres here (the reference: geodesic metres, within 0.5 %); histograms of 30 bins
  (``n_bins_for_distance``, dataset.py 209) by ``np.histogram(d, bins=30)``, i.e. over EACH SIDE'S OWN range
  (628-634): the real table's over all its trajectories, the synthetic table's summed over batches of
  min(1000, n_real) trajectories (232-233), each batch binned over its own range; JSD over the 30 bin indices.
  Bins that do not line up between the sides (or between batches) make this number hard to read: duckmob's
  ``hrnet_travel_distance_jsd`` bins both sides on one range.
"""

from __future__ import annotations

import numpy as np

from duckmob.grid import BBox, haversine_m
from duckmob.metrics.common import Metric, Options, Side
from duckmob.metrics.hrnet import conditional_counts
from duckmob.metrics.paper import scipy_js2

SOURCE = "HRNet reference code (Emory-AIMS/priv_traj_gen evaluation.py), Table 1"
TEST_THRESHOLD = 20    # conf/evaluation/baseline.yaml 22
MAX_STARTS = 20        # evaluation.py 786
DISTANCE_BINS = 30     # dataset.py 209
BATCH = 1000           # evaluation.py 233


def real_kept(real: Side, w: int) -> Side:
    """The real trajectories of 2+ cells (the reference's preprocessed data)."""
    return real.take(np.flatnonzero(real.cells(w).lengths > 1), f"{real.name} (2+ cells)")


def start_cells(real: Side, w: int) -> np.ndarray:
    """The reference's test start cells (777-795), most frequent first; ``real`` already holds 2+ cells only."""
    counts = np.bincount(real.cells(w).start, minlength=w * w)
    order = np.lexsort((np.arange(w * w), -counts))
    chosen = order[counts[order] > TEST_THRESHOLD][:MAX_STARTS]
    return chosen if len(chosen) else order[:1][counts[order[:1]] > 0]


def route_counts(side: Side, w: int, starts: np.ndarray) -> np.ndarray:
    """(len(starts) x w*w): trajectories starting in each start cell with each OTHER cell among theirs."""
    counts = conditional_counts(side, w, starts, "waypoint")
    counts[np.arange(len(starts)), starts] = 0
    return counts


def conditional_js2(real_counts: np.ndarray, synth_counts: np.ndarray) -> float:
    """Mean over start cells of ``jensenshannon(p, q) ** 2``, a synthetic row without counts uniform."""
    out = []
    for p, q in zip(real_counts, synth_counts):   # one per start cell (at most 20)
        out.append(scipy_js2(p, q if q.sum() > 0 else np.ones_like(q)))
    return float(np.mean(out)) if out else float("nan")


def node_travel_m(side: Side, w: int) -> np.ndarray:
    """Travel distance of each trajectory between the grid nodes of its cells (``my_utils.make_gps``), metres."""
    cs = side.cells(w)
    box = BBox.of(side.bbox)
    row, col = cs.cells // w, cs.cells % w
    lat = box.min_lat + row * (box.max_lat - box.min_lat) / (w - 1)
    lon = box.min_lon + col * (box.max_lon - box.min_lon) / (w - 1)
    own = cs.owner
    d = haversine_m(lat[:-1], lon[:-1], lat[1:], lon[1:])
    same = own[1:] == own[:-1]
    return np.bincount(own[1:][same], weights=d[same], minlength=side.n)


def distance_histograms(real_d: np.ndarray, synth_d: np.ndarray, n_real: int) -> tuple[np.ndarray, np.ndarray]:
    """The reference's travel-distance counts: 30 bins over each side's own range; the synthetic side in
    batches of min(1000, n_real), each over its own range, summed."""
    h_real = np.histogram(real_d, bins=DISTANCE_BINS)[0].astype(np.float64)
    batch = max(1, min(BATCH, n_real))
    h_synth = np.zeros(DISTANCE_BINS)
    for lo in range(0, len(synth_d), batch):   # one histogram per 1000 trajectories, not per trajectory
        h_synth += np.histogram(synth_d[lo:lo + batch], bins=DISTANCE_BINS)[0]
    return h_real, h_synth


def metrics(real: Side, synth: Side, opts: Options, generator=None) -> list[Metric]:
    w = opts.w
    kept = real_kept(real, w)
    if kept.n == 0:
        why = "NULL: the real table has no trajectory of 2 or more cells"
        return [Metric(f"hrnet_paper_{n}_jsd", None, True, SOURCE, why)
                for n in ("destination", "transition", "route", "travel_distance")]
    starts = start_cells(kept, w)
    k = len(starts)
    out = []
    for name, what in (("destination", "the last cell"), ("transition", "the second cell")):
        value = conditional_js2(conditional_counts(kept, w, starts, name), conditional_counts(synth, w, starts, name))
        out.append(Metric(f"hrnet_paper_{name}_jsd", value, True, SOURCE,
                          f"mean over {k} real start cells (> {TEST_THRESHOLD} trajectories) of jensenshannon^2 "
                          f"of {what}, {w}x{w} grid, nats"))
    value = conditional_js2(route_counts(kept, w, starts), route_counts(synth, w, starts))
    out.append(Metric("hrnet_paper_route_jsd", value, True, SOURCE,
                      f"mean over {k} real start cells of jensenshannon^2 of the other cells visited, {w}x{w} "
                      "grid, nats"))
    h_real, h_synth = distance_histograms(node_travel_m(kept, w), node_travel_m(synth, w), kept.n)
    out.append(Metric("hrnet_paper_travel_distance_jsd", scipy_js2(h_real, h_synth), True, SOURCE,
                      f"jensenshannon^2 of travel distance between {w}x{w} grid nodes, {DISTANCE_BINS} bins over "
                      "each side's own range (synthetic: per batch of 1000), nats"))
    return out
