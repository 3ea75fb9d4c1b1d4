"""PateGail's statistical evaluation metrics (Wang et al., pategail.txt "Statistical Evaluation Metrics").

Each is a distribution compared by JSD (nats): radius of gyration and DailyLoc per trajectory, per-step
distance per record, G-rank and I-rank visit-frequency profiles. Locations are cells of the w x w grid and a
visit is one entry of the collapsed cell sequence.
"""

from __future__ import annotations

import numpy as np

from duckmob.metrics.common import Metric, Options, Side, integer_histograms, jsd
from duckmob.metrics.summary import Column, Points, Summary, shared_counts

SOURCE = "PateGail, Statistical Evaluation Metrics"


def summary(side: Side, plan, parts: dict) -> None:
    """What ``side`` adds (:mod:`duckmob.metrics.summary`): radius of gyration and distinct cells of each
    trajectory, the distance of every step (per point), visits per cell and the I-rank shares of each
    trajectory."""
    opts = plan.opts
    w = opts.w
    parts["pategail.gyration"] = Column([side.gyration_m])
    parts["pategail.dailyloc"] = Column([side.visits(w).getnnz(axis=1).astype(np.int64)])
    parts["pategail.step"] = Points(side.step_m)
    parts["pategail.visits"] = np.bincount(side.cells(w).cells, minlength=w * w).astype(np.int64)
    for r, shares in enumerate(irank_shares(side, w, opts.irank_k).T):
        parts[f"pategail.irank.{r}"] = Column([shares])


def grank_profile(counts: np.ndarray, k: int) -> np.ndarray:
    """G-rank: visits to the r-th most visited location over all trajectories, r = 1..k, over all visits
    (``counts``: visits per cell)."""
    counts = np.asarray(counts, dtype=np.float64)
    top = np.sort(counts)[::-1][:k]
    return np.pad(top, (0, k - len(top))) / max(counts.sum(), 1.0)


def irank_shares(side: Side, w: int, k: int) -> np.ndarray:
    """(n x k): for each trajectory, the share of its visits to its r-th most visited location, r = 1..k (0 where
    it has fewer than r locations)."""
    cs = side.cells(w)
    c = w * w
    keys, counts = np.unique(cs.owner * c + cs.cells, return_counts=True)
    owner = keys // c
    order = np.lexsort((-counts, owner))
    owner, counts = owner[order], counts[order]
    first = np.searchsorted(owner, owner, side="left")
    rank = np.arange(len(owner)) - first
    keep = rank < k
    out = np.zeros((side.n, k))
    out[owner[keep], rank[keep]] = counts[keep] / cs.lengths[owner[keep]]
    return out


def irank_profile(shares: np.ndarray) -> np.ndarray:
    """I-rank: :func:`irank_shares` averaged over the trajectories (rows in the in-memory order). Summed trajectory
    by trajectory, in that order, as one ``bincount``: the same float sums whatever batches the shares came in."""
    n, k = shares.shape
    rank = np.broadcast_to(np.arange(k), shares.shape)
    held = shares > 0
    return np.bincount(rank[held], weights=shares[held], minlength=k) / max(n, 1)


def compare(real: Summary, synth: Summary, opts: Options, generator=None) -> list[Metric]:
    """PateGail's rows between two summaries (:func:`summary`). I-rank: the shares of each trajectory's top
    locations averaged over trajectories (PateGail averages over users; synthetic tables carry no users)."""
    w, b = opts.w, opts.bins
    r, s = real.parts, synth.parts
    out = [
        Metric("pategail_radius_jsd", jsd(*shared_counts(real, synth, "pategail.gyration", b)), True,
               SOURCE, f"JSD of the radius of gyration (metres), {b} bins to the real max, nats"),
        Metric("pategail_dailyloc_jsd",
               jsd(*integer_histograms(real.column("pategail.dailyloc"), synth.column("pategail.dailyloc"))), True,
               SOURCE, f"JSD of distinct {w}x{w} cells per trajectory (a bin per count), nats"),
        Metric("pategail_distance_jsd", jsd(*shared_counts(real, synth, "pategail.step", b)), True, SOURCE,
               f"JSD of the distance between consecutive points (metres), {b} bins to the real max, nats"),
        Metric("pategail_grank_jsd",
               jsd(grank_profile(r["pategail.visits"], opts.top_k), grank_profile(s["pategail.visits"], opts.top_k)),
               True, SOURCE, f"JSD of the visit shares of each table's top {opts.top_k} {w}x{w} cells, by rank, "
                             "nats"),
        Metric("pategail_irank_jsd", jsd(*(irank_profile(np.column_stack(
            [t.column(f"pategail.irank.{i}") for i in range(opts.irank_k)])) for t in (real, synth))), True,
               SOURCE, f"JSD of the mean visit shares of each trajectory's top {opts.irank_k} cells, by rank, nats"),
    ]
    return out
