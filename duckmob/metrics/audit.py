"""Privacy audit of a synthetic table by attacks (PateGail, pategail.txt "Privacy Risk Analysis").

Empirical attacks complement the formal (epsilon, delta) guarantee: they can show a leak, never prove its
absence. Like the rest of duckmob.evaluate this reads the real tables exactly and is for the data owner.

* Membership inference: ``members`` are real trajectories the synthesizer was trained on, ``non_members``
  real trajectories it never saw. The attacker scores a trajectory by minus its distance to the nearest
  synthetic trajectory (closer = "was in training"). Reported: ROC AUC and the accuracy of the best threshold
  on balanced sets (0.5 = the attacker does no better than a coin). PateGail trains a random forest on its
  model's rewards (white box); this distance attack needs only the synthetic table (black box).
* Uniqueness: for each real trajectory, the highest overlap with any synthetic trajectory, where the overlap
  of r with s is the share of r's (cell, hour-of-day slot) visits that s also makes (cells only, when either
  table has no time). Reported for members and, as the baseline a synthesizer that memorises nothing still
  reaches, for non-members.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.stats import rankdata

from duckmob.errors import DuckmobError
from duckmob.metrics.common import DAY_US, Metric, Side, binary_matrix, rng
from duckmob.grid import EARTH_RADIUS_M

SOURCE = "PateGail, Privacy Risk Analysis"


def resampled(side: Side, k: int) -> np.ndarray:
    """(n x 2k) float32: each trajectory as ``k`` points equally spaced along its path (by length), in metres
    east/north of the bbox centre (equirectangular; a city-sized box distorts distances by well under 1 %).
    A trajectory that never moves repeats its point."""
    t = side.traj
    box = side.bbox
    lat0 = np.radians((box.min_lat + box.max_lat) / 2)
    lon0 = np.radians((box.min_lon + box.max_lon) / 2)
    x = (np.radians(t.lon) - lon0) * np.cos(lat0) * EARTH_RADIUS_M
    y = (np.radians(t.lat) - lat0) * EARTH_RADIUS_M
    own = side.owner
    step = np.zeros(t.n_points)
    if t.n_points > 1:
        step[1:] = np.where(own[1:] == own[:-1], np.hypot(np.diff(x), np.diff(y)), 0.0)
    cum = np.cumsum(step)
    cum -= cum[t.offsets[:-1]][own]
    total = cum[t.offsets[1:] - 1]
    index = np.arange(t.n_points) - t.offsets[:-1][own]
    span = np.maximum(t.lengths - 1, 1)[own]
    frac = np.where(total[own] > 0, cum / np.where(total[own] > 0, total[own], 1.0), index / span)
    key = own * 2.0 + frac
    targets = np.linspace(0.0, 1.0, k)
    q = (np.arange(side.n)[:, None] * 2.0 + targets[None, :]).ravel()
    traj = np.repeat(np.arange(side.n), k)
    first, last = t.offsets[:-1][traj], t.offsets[1:][traj] - 1
    pos = np.clip(np.searchsorted(key, q, side="right") - 1, first, np.maximum(last - 1, first))
    nxt = np.minimum(pos + 1, last)
    gap = key[nxt] - key[pos]
    u = np.clip(np.where(gap > 0, (q - key[pos]) / np.where(gap > 0, gap, 1.0), 0.0), 0.0, 1.0)
    px = x[pos] + u * (x[nxt] - x[pos])
    py = y[pos] + u * (y[nxt] - y[pos])
    return np.stack([px, py], axis=1).reshape(side.n, k, 2).reshape(side.n, 2 * k).astype(np.float32)


def nearest_distance_m(queries: np.ndarray, pool: np.ndarray, chunk: int = 1024) -> np.ndarray:
    """For each row of ``queries``, the RMS point-to-point distance (metres) to the closest row of ``pool``
    (both from :func:`resampled`): ``min_s ||q - s|| / sqrt(k)``. Chunked matrix products, no Python loop over
    trajectories beyond the chunks."""
    k = queries.shape[1] // 2
    pool64 = pool.astype(np.float64)
    pn = (pool64 ** 2).sum(axis=1)
    out = np.empty(len(queries))
    for start in range(0, len(queries), chunk):
        qc = queries[start:start + chunk].astype(np.float64)
        d2 = (qc ** 2).sum(axis=1)[:, None] + pn[None, :] - 2 * qc @ pool64.T
        out[start:start + chunk] = np.sqrt(np.maximum(d2.min(axis=1), 0.0) / k)
    return out


def auc_and_accuracy(member_scores: np.ndarray, other_scores: np.ndarray) -> tuple[float, float]:
    """ROC AUC (Mann-Whitney, ties count half) and the best-threshold accuracy of "member if score >= t" on the
    two score sets (which the caller balances)."""
    scores = np.concatenate([member_scores, other_scores])
    labels = np.concatenate([np.ones(len(member_scores)), np.zeros(len(other_scores))])
    n1, n0 = len(member_scores), len(other_scores)
    ranks = rankdata(scores)
    auc = (ranks[:n1].sum() - n1 * (n1 + 1) / 2) / (n1 * n0)
    order = np.argsort(-scores, kind="stable")
    s, lab = scores[order], labels[order]
    tp = np.cumsum(lab)
    fp = np.cumsum(1 - lab)
    last_of_tie = np.concatenate([s[1:] != s[:-1], [True]])  # a threshold cannot split equal scores
    correct = tp[last_of_tie] + (n0 - fp[last_of_tie])
    best = max(float(correct.max()), float(n0))  # also "nobody is a member"
    return float(auc), best / (n1 + n0)


def location_slots(side: Side, w: int, with_time: bool) -> sp.csr_matrix:
    """Binary (n x keys) matrix of each trajectory's (cell, hour of day) visits, or of its cells."""
    cs = side.cells(w)
    key = cs.cells
    n_keys = w * w
    if with_time:
        hour = (np.mod(cs.ts, DAY_US) // 3_600_000_000).astype(np.int64)
        key = key * 24 + hour
        n_keys *= 24
    return binary_matrix(cs.owner, key, side.n, n_keys)


def uniqueness(real: Side, synth: Side, w: int, chunk: int = 512) -> np.ndarray:
    """For each real trajectory, max over synthetic trajectories of |visits(r) & visits(s)| / |visits(r)|."""
    with_time = real.has_time and synth.has_time
    a = location_slots(real, w, with_time)
    b = location_slots(synth, w, with_time).T.tocsr()
    size = np.asarray(a.getnnz(axis=1), dtype=np.float64)
    best = np.zeros(real.n)
    for start in range(0, real.n, chunk):  # chunks of real trajectories bound the memory of the product
        shared = (a[start:start + chunk] @ b)
        best[start:start + chunk] = shared.max(axis=1).toarray().ravel()
    return best / np.maximum(size, 1)


def audit(members: Side, non_members: Side, synth: Side, w: int = 32, k: int = 16,
          seed: int | None = None) -> list[Metric]:
    """The audit rows: membership-inference AUC and accuracy, uniqueness of members and non-members."""
    if int(k) != k or k < 2:
        raise DuckmobError(f"k (points each trajectory is resampled to) must be an integer >= 2, got {k!r}")
    generator = rng(seed)
    n = min(members.n, non_members.n)
    pick_m = generator.permutation(members.n)[:n]
    pick_n = generator.permutation(non_members.n)[:n]
    pool = resampled(synth, k)
    score_m = -nearest_distance_m(resampled(members, k)[pick_m], pool)
    score_n = -nearest_distance_m(resampled(non_members, k)[pick_n], pool)
    auc, acc = auc_and_accuracy(score_m, score_n)
    u_m = uniqueness(members, synth, w)
    u_n = uniqueness(non_members, synth, w)
    slots = "(cell, hour of day)" if members.has_time and synth.has_time else "cell (no time on a side)"
    return [
        Metric("audit_mia_auc", auc, True, SOURCE,
               f"ROC AUC of a membership attack scoring -(RMS metres to the nearest synthetic trajectory, {k} "
               f"points each) on {n} members vs {n} non-members; 0.5 = no better than chance"),
        Metric("audit_mia_accuracy", acc, True, SOURCE,
               "accuracy of the same attack at its best threshold on the balanced sets; 0.5 = chance"),
        Metric("audit_mia_median_distance_m", float(np.median(-score_m)), None, SOURCE,
               "median RMS distance (metres) from a member to its nearest synthetic trajectory"),
        Metric("audit_uniqueness_members", float(u_m.mean()), True, SOURCE,
               f"mean over members of the highest share of their {slots} visits found in one synthetic "
               f"trajectory ({w}x{w} grid)"),
        Metric("audit_uniqueness_non_members", float(u_n.mean()), None, SOURCE,
               "the same for non-members: the level reached without memorisation (compare with members)"),
        Metric("audit_full_overlap_members", float((u_m >= 1.0).mean()), True, SOURCE,
               f"share of members all of whose {slots} visits appear in a single synthetic trajectory"),
    ]
