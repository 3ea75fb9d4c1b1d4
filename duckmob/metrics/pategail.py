"""PateGail's statistical evaluation metrics (Wang et al., pategail.txt "Statistical Evaluation Metrics").

Each is a distribution compared by JSD (nats): radius of gyration and DailyLoc per trajectory, per-step
distance per record, G-rank and I-rank visit-frequency profiles. Locations are cells of the w x w grid and a
visit is one entry of the collapsed cell sequence.
"""

from __future__ import annotations

import numpy as np

from duckmob.metrics.common import Metric, Options, Side, integer_histograms, jsd, shared_histograms

SOURCE = "PateGail, Statistical Evaluation Metrics"


def grank_profile(side: Side, w: int, k: int) -> np.ndarray:
    """G-rank: visits to the r-th most visited location over all trajectories, r = 1..k, over all visits."""
    counts = np.bincount(side.cells(w).cells, minlength=w * w).astype(np.float64)
    top = np.sort(counts)[::-1][:k]
    return np.pad(top, (0, k - len(top))) / max(counts.sum(), 1.0)


def irank_profile(side: Side, w: int, k: int) -> np.ndarray:
    """I-rank: for each trajectory, the share of its visits to its r-th most visited location (r = 1..k),
    averaged over trajectories (PateGail averages over users; synthetic tables carry no users)."""
    cs = side.cells(w)
    c = w * w
    keys, counts = np.unique(cs.owner * c + cs.cells, return_counts=True)
    owner = keys // c
    order = np.lexsort((-counts, owner))
    owner, counts = owner[order], counts[order]
    first = np.searchsorted(owner, owner, side="left")
    rank = np.arange(len(owner)) - first
    share = counts / cs.lengths[owner]
    keep = rank < k
    return np.bincount(rank[keep], weights=share[keep], minlength=k) / side.n


def metrics(real: Side, synth: Side, opts: Options, generator=None) -> list[Metric]:
    w, b = opts.w, opts.bins
    out = [
        Metric("pategail_radius_jsd", jsd(*shared_histograms(real.gyration_m, synth.gyration_m, b)), True,
               SOURCE, f"JSD of the radius of gyration (metres), {b} bins to the real max, nats"),
        Metric("pategail_dailyloc_jsd",
               jsd(*integer_histograms(real.visits(w).getnnz(axis=1), synth.visits(w).getnnz(axis=1))), True,
               SOURCE, f"JSD of distinct {w}x{w} cells per trajectory (a bin per count), nats"),
        Metric("pategail_distance_jsd", jsd(*shared_histograms(real.step_m, synth.step_m, b)), True, SOURCE,
               f"JSD of the distance between consecutive points (metres), {b} bins to the real max, nats"),
        Metric("pategail_grank_jsd", jsd(grank_profile(real, w, opts.top_k), grank_profile(synth, w, opts.top_k)),
               True, SOURCE, f"JSD of the visit shares of each table's top {opts.top_k} {w}x{w} cells, by rank, "
                             "nats"),
        Metric("pategail_irank_jsd",
               jsd(irank_profile(real, w, opts.irank_k), irank_profile(synth, w, opts.irank_k)), True, SOURCE,
               f"JSD of the mean visit shares of each trajectory's top {opts.irank_k} cells, by rank, nats"),
    ]
    return out
