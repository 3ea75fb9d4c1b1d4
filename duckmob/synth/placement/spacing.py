"""Spacing of synthetic points along routes (post-processing of the released step histogram, or the public
``step_m``): how many steps each route gets and how long they are (:func:`drawn_steps`), and where they put the
points along the route's polyline (:func:`spaced`). Shared by the fine placement (routes.py) and clean-slate."""

from __future__ import annotations

import numpy as np

from duckmob.synth.placement.releases import STEP_EDGES_M, guided_searchsorted
from duckmob.trajectories import ragged_gather


def drawn_steps(steps: np.ndarray, route_len: np.ndarray, rng: np.random.Generator, max_points: int,
                step_m: float | None, fallback_m: float) -> tuple[np.ndarray, np.ndarray]:
    """Step lengths (metres) for routes of lengths ``route_len``: ``(step, want)``, ``want[i]`` steps for route i
    in turn, enough to cover it (1.2 times the expected count plus three standard deviations, plus 4; at most
    ``max_points - 2``). Drawn from the released step histogram ``steps`` (a bin by its share, then uniform in log
    inside it; the first bin, from 0, uniform), or all ``step_m`` when given; a histogram with no mass (mostly
    noise, cut to zero) spaces points every ``fallback_m`` (the fine cell's side)."""
    probs = np.asarray(steps, dtype=np.float64)
    step_m = step_m if step_m is not None or probs.sum() > 0 else fallback_m
    if probs.sum() <= 0:
        probs = np.ones_like(probs)
    cdf = np.cumsum(probs) / probs.sum()
    lo, hi = STEP_EDGES_M[:-1], STEP_EDGES_M[1:]
    if step_m is not None:
        mean_step = step_m
    else:
        mid = np.where(lo > 0, np.sqrt(lo * hi), hi / 2)
        mean_step = max(float(np.diff(np.concatenate([[0.0], cdf])) @ mid), 1e-3)
    expect = route_len / mean_step
    want = np.minimum(np.ceil(expect * 1.2 + 3 * np.sqrt(expect)).astype(np.int64) + 4, max_points - 2)
    n_steps = int(want.sum())
    if step_m is not None:
        return np.full(n_steps, step_m), want
    b = np.minimum(_bins(cdf, rng.random(n_steps)), len(lo) - 1)
    t = rng.random(n_steps)
    lo_1 = np.maximum(lo, 1e-12)                 # per bin, then gathered: the same values per step
    step = hi[b] * t
    log_bin = lo[b] > 0
    bl = b[log_bin]
    step[log_bin] = np.exp(np.log(lo_1)[bl] + t[log_bin] * np.log(hi / lo_1)[bl])
    return step, want


def _bins(cdf: np.ndarray, u: np.ndarray) -> np.ndarray:
    """``np.searchsorted(cdf, u, side="right")`` for many ``u`` in [0, 1) and a short non-decreasing ``cdf``,
    exactly (:func:`~.releases.guided_searchsorted` over 4096 equal buckets of [0, 1): u * 4096 and the bucket
    edges are exact in floating point)."""
    k = 4096
    guide = np.searchsorted(cdf, np.arange(k + 1, dtype=np.float64) / k, side="right")
    return guided_searchsorted(cdf, u, np.minimum((u * k).astype(np.int64), k - 1), guide)


def spaced(along: np.ndarray, offsets: np.ndarray, route_start: np.ndarray, route_len: np.ndarray,
           step: np.ndarray, want: np.ndarray):
    """Points along polylines at drawn steps (post-processing, vectorised over polylines).

    ``along``: each vertex's cumulative distance (metres; polyline i is vertices ``offsets[i]:offsets[i + 1]``,
    starting at ``route_start[i]``, ``route_len[i]`` long); ``step``: ``want[i]`` drawn step lengths for each
    polyline in turn. A polyline whose draws do not cover it has its steps stretched to reach the end (evenly
    spaced, not a jump from the last draw to the end); draws past the end are dropped. Each polyline gives its
    start, the kept draws (increasing) and its end. Returns ``(lengths, owner, distance along, target, idx, nxt,
    frac)``: a point lies ``frac`` of the way from vertex ``idx`` to ``nxt``."""
    n = len(route_len)
    s_owner = np.repeat(np.arange(n), want)
    cover = np.bincount(s_owner, weights=step, minlength=n)
    step = step * np.where(cover < route_len, route_len / np.maximum(cover, 1e-300), 1.0)[s_owner]
    s_first = np.concatenate([[0], np.cumsum(want)])[:-1]
    csum = np.cumsum(step)
    dist = csum - np.repeat(csum[s_first] - step[s_first], want)   # distance of each draw along its polyline
    keep = dist < route_len[s_owner]
    kept = np.bincount(s_owner[keep], minlength=n)
    lengths = kept + 2
    out_off = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    p_owner = np.repeat(np.arange(n), lengths)
    p_dist = np.empty(int(out_off[-1]))
    p_dist[out_off[:-1]] = 0.0
    p_dist[out_off[1:] - 1] = route_len
    p_dist[ragged_gather(out_off[:-1] + 1, kept)] = dist[keep]     # owners sorted, distances increasing in each
    target = route_start[p_owner] + p_dist
    idx = np.searchsorted(along, target, side="right") - 1
    first, last = offsets[p_owner], offsets[p_owner + 1] - 1
    idx = np.minimum(np.maximum(idx, first), np.maximum(last - 1, first))
    nxt = np.minimum(idx + 1, last)
    span = along[nxt] - along[idx]
    frac = np.where(span > 0, np.clip((target - along[idx]) / np.where(span > 0, span, 1.0), 0, 1), 0.0)
    return lengths, p_owner, p_dist, target, idx, nxt, frac


# chord_stretch measures the winding over at most this many fine cells: the wiggle of route vertices jittered
# inside their cells (an artefact of the placement), not the course of the walk itself, whose detours are the model's
# (on sparse simulated taxi fixes, 240-360 s apart, the stretch over a whole step cut the points per trajectory from
# 1.34x to 0.99x the real but worsened the length JSD from .064 to .109; over 4 cells: 1.18x and .080).
CHORD_SPAN_CELLS = 4.0


def chord_stretch(x: np.ndarray, y: np.ndarray, along: np.ndarray, offsets: np.ndarray, step_m: float,
                  cell_m: float = np.inf) -> np.ndarray:
    """How much longer each polyline is than its chords over spans of about ``span_m`` metres (the typical step
    ``step_m``, at most :data:`CHORD_SPAN_CELLS` fine cells of ``cell_m``): per polyline,
    the summed distance along it over the summed straight distance, between each vertex and the one about
    ``span_m`` further on (at least 1, at most 3, which a polyline that comes back on itself gets; 1 for a polyline
    too short to measure). Steps drawn as distances
    between consecutive fixes (straight lines) and laid along a winding polyline would put the points closer than
    the fixes they stand for; multiplied by this, their straight-line spacing is about the drawn one.
    Post-processing of synthetic polylines (vectorised)."""
    span_m = min(float(step_m), CHORD_SPAN_CELLS * float(cell_m))
    offsets = np.asarray(offsets, dtype=np.int64)
    n = len(offsets) - 1
    counts = np.diff(offsets)
    total = along[offsets[1:] - 1] - along[offsets[:-1]] if n else np.zeros(0)
    gap = total / np.maximum(counts - 1, 1)
    k = np.clip(np.rint(float(span_m) / np.maximum(gap, 1e-9)), 1, np.maximum(counts - 1, 1)).astype(np.int64)
    owner = np.repeat(np.arange(n), counts)
    i = np.arange(len(along))
    j = i + k[owner]
    ok = j < offsets[owner + 1]
    i, j, o = i[ok], j[ok], owner[ok]
    arc = np.bincount(o, weights=along[j] - along[i], minlength=n)
    chord = np.bincount(o, weights=np.hypot(x[j] - x[i], y[j] - y[i]), minlength=n)
    ratio = np.where(chord > 0, arc / np.where(chord > 0, chord, 1.0), np.where(arc > 0, np.inf, 1.0))
    return np.clip(ratio, 1.0, 3.0)
