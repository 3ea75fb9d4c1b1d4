"""PrivTrace's generation (Alg. 1) vectorised over all trajectories, with lengths that match the data.

Every walker is stepped at once: one numpy step moves all live walkers by inverse-CDF sampling on pre-computed
cumulative transition rows (no Python loop over trajectories; the loop runs over steps only).

Why the reference's walks end too early, and what is done instead. Length normalisation gives every
trajectory weight 1 / (L + 1) on each of its transitions, so the virtual-end row mass per trajectory is as
large as the mass of one of its moves; a short trajectory weighs as much as a long one, and its end is a large
share of its mass. In a walk driven by those counts, the per-step end probability is about
sum_T 1/(L_T+1) / sum_T L_T/(L_T+1), i.e. the walk's expected length is governed by the harmonic mean of the
lengths, which is far below their mean on real data (docs/methods/privtrace.md). Noise on the end column only
adds to that.

Our correction (documented choice): the length distribution is released directly as a noisy histogram of
sequence lengths (one count per trajectory: sensitivity k, part of the budget), and the walk ends at step L
with the hazard h(L) = P(len = L | len >= L) of that histogram — modulated per walker by the spatial end
propensity of its state, e(s) = P(end | s) from the noisy first-order model, relative to the mean propensity of
the live walkers: P(end now) = h(L) * ((1 - w) + w * e(s) / mean(e)). The expected number of walkers ending at
each step is therefore h(L) times the number alive (the length histogram is matched), while *where* walks end
still follows the model. Moves are drawn from the rows with the end column removed and renormalised.
"""

from __future__ import annotations

import numpy as np

FIRST_EXACT = 20        # lengths 1 .. 20 get a bin each; longer ones geometric bins (x RATIO)
RATIO = 1.3


def length_bins(max_len: int) -> np.ndarray:
    """Lower edges of the length histogram's bins plus the final exclusive edge max_len + 1 (public)."""
    max_len = int(max_len)
    edges = list(range(1, min(FIRST_EXACT, max_len) + 1))
    x = float(edges[-1])
    while edges[-1] < max_len:
        x *= RATIO
        edges.append(min(max(int(round(x)), edges[-1] + 1), max_len))
    edges.append(max_len + 1)
    return np.unique(np.asarray(edges, dtype=np.int64))


def length_bin(lengths: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The bin of each sequence length (lengths above the last bin fall in it)."""
    clipped = np.minimum(np.asarray(lengths, dtype=np.int64), edges[-1] - 1)
    return np.searchsorted(edges, clipped, side="right") - 1


def length_histogram(lengths: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Exact counts of sequence lengths per bin (not for release; tests and diagnostics)."""
    return np.bincount(length_bin(lengths, edges), minlength=len(edges) - 1).astype(float)


def decreasing_tail(counts: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Post-process a non-negative (NormCut) noisy length histogram: non-increasing density after its mode.

    Noise on the many sparse bins of the tail survives NormCut as spurious mass at long lengths, which would
    lengthen the generated walks. Sequence-length distributions are unimodal; beyond the highest bin the
    per-length density count / width is made non-increasing by weighted isotonic regression (pool adjacent
    violators, weights = bin widths), which keeps the total count. Post-processing only; ~50 bins, so the
    pooling loop is not a hot path.
    """
    counts = np.asarray(counts, dtype=np.float64)
    if counts.sum() <= 0:
        return counts
    widths = np.diff(edges).astype(np.float64)
    dens = counts / widths
    mode = int(np.argmax(dens))
    values, weights, sizes = [], [], []
    for y, w in zip(dens[mode:], widths[mode:]):
        values.append(y), weights.append(w), sizes.append(1)
        while len(values) > 1 and values[-2] < values[-1]:
            w_new = weights[-2] + weights[-1]
            v_new = (values[-2] * weights[-2] + values[-1] * weights[-1]) / w_new
            s_new = sizes[-2] + sizes[-1]
            del values[-1], weights[-1], sizes[-1]
            values[-1], weights[-1], sizes[-1] = v_new, w_new, s_new
    out = counts.copy()
    out[mode:] = np.repeat(values, sizes) * widths[mode:]
    return out


def hazard(edges: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """h[L] = P(len = L | len >= L) for L = 0 .. max_len (h[0] unused), spreading each bin evenly."""
    max_len = int(edges[-1] - 1)
    widths = np.diff(edges)
    pmf = np.zeros(max_len + 2)
    pmf[edges[0]:edges[-1]] = np.repeat(probs / widths, widths)
    surv = np.cumsum(pmf[::-1])[::-1]
    h = np.where(surv > 1e-300, pmf / np.maximum(surv, 1e-300), 1.0)
    h[max_len:] = 1.0
    return np.clip(h, 0.0, 1.0)


def cumulative_rows(probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative distribution of every row of non-negative weights (rows, D): (cum, has_mass).

    cum[r, j] = P(column <= j); it is exactly 1 from the last positive column on, so that
    ``(cum[r] < u).sum()`` for u in (0, 1] is a column with positive weight (inverse-CDF sampling).
    """
    probs = np.asarray(probs, dtype=np.float64)
    total = probs.sum(axis=1)
    ok = total > 0
    cum = np.cumsum(probs, axis=1) / np.where(ok, total, 1.0)[:, None]
    last = probs.shape[1] - 1 - np.argmax((probs > 0)[:, ::-1], axis=1)
    cum = np.where(np.arange(probs.shape[1])[None, :] >= last[:, None], 1.0, cum)
    return cum, ok


def stacked_cumulative(weights, rows: int, width: int, below: np.ndarray,
                       block_entries: int = 1 << 20) -> tuple[np.ndarray, np.ndarray]:
    """``stacked_rows(cumulative_rows(W)[0], below)`` and ``cumulative_rows(W)[1]`` for the (rows, width) weights
    W whose rows ``a:b`` are ``weights(a, b)``, built a block of rows at a time into the one float64 table (the
    same numbers: every step is row by row). A fine model's second-order weights hold (m + E) x D entries (60,451
    states: 35 M); the whole-table form kept about 1 GB of copies at once."""
    out = np.empty((rows + len(below), width))
    ok = np.empty(rows, dtype=bool)
    step = max(1, int(block_entries) // max(1, width))
    for a in range(0, rows, step):
        b = min(rows, a + step)
        out[a:b], ok[a:b] = cumulative_rows(weights(a, b))
    out[rows:] = below
    return out, ok


def stacked_rows(cum1: np.ndarray, cum2: np.ndarray) -> np.ndarray:
    """The cumulative rows :func:`random_walks` draws from: the second-order rows ``cum2`` (m + E, D), then the
    first-order ones ``cum1`` (m, D), so that every walker draws from one table whichever model it follows."""
    return np.concatenate([cum2, cum1])


def _draw(cum_rows: np.ndarray, u: np.ndarray) -> np.ndarray:
    return (cum_rows < u[:, None]).sum(axis=1)


def random_walks(n: int, rng: np.random.Generator, *, p_start: np.ndarray, cum: np.ndarray, ok1: np.ndarray,
                 ok2: np.ndarray, use2: np.ndarray, neighbours: np.ndarray,
                 edge_offsets: np.ndarray, end_propensity: np.ndarray, hazard_by_len: np.ndarray,
                 end_bias: float = 1.0, backtrack: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Generate ``n`` state sequences (PrivTrace Alg. 1 with the length correction above), all walkers at once.

    ``p_start`` (m,) start-state distribution (the trip distribution's row margins); ``cum`` (2m + E, D) the
    cumulative next-state rows of the second-order model (m + E rows, end removed) then of the first-order one
    (m rows: :func:`stacked_rows`), ``ok1``/``ok2`` marking the first- and second-order rows that have mass;
    ``use2`` (m,) the §4.6 model choice per state; ``neighbours`` (m, D) padded neighbour ids; ``edge_offsets`` CSR offsets (second-order row of the move
    a -> j-th neighbour is m + edge_offsets[a] + j); ``end_propensity`` (m,); ``hazard_by_len`` (max_len + 2,).
    The first move uses the second-order context (virtual start, s_1). ``backtrack`` in [0, 1] keeps that share
    of the immediate returns (a -> b -> a) the model draws; the others are redrawn (up to 4 times), which removes
    the A-B-A-B ping-pong that first-order noise produces between two cells. Returns ``(offsets (n+1), states)``.
    """
    m = len(p_start)
    first_rows = len(cum) - m                # where the first-order rows start in `cum`
    if n == 0:
        return np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    max_len = len(hazard_by_len) - 2
    cdf = np.cumsum(p_start) / p_start.sum()
    cdf[-1] = 1.0
    cur = np.minimum(np.searchsorted(cdf, 1.0 - rng.random(n)), m - 1)
    ctx = cur.copy()                         # second-order context row: (virtual start, s_1)
    prev = np.full(n, -1, dtype=np.int64)
    ids = np.arange(n, dtype=np.int64)
    out_ids, out_states = [], []
    step = 1
    while len(ids):
        out_ids.append(ids)
        out_states.append(cur)
        if step >= max_len:
            break
        e = end_propensity[cur]
        mean_e = e.mean()
        mod = (1.0 - end_bias) + end_bias * (e / mean_e) if mean_e > 0 else 1.0
        p_end = np.clip(hazard_by_len[step] * mod, 0.0, 1.0)
        second = use2[cur] & ok2[ctx]
        movable = second | ok1[cur]
        go = (rng.random(len(ids)) >= p_end) & movable
        ids, cur, ctx, second, prev = ids[go], cur[go], ctx[go], second[go], prev[go]
        col = np.empty(len(ids), dtype=np.int64)
        redo = np.arange(len(ids))
        # each walker's row of `cum`: its second-order context, or its state's first-order row after them
        row = np.where(second, ctx, first_rows + cur)
        for attempt in range(5):
            u = 1.0 - rng.random(len(redo))   # in (0, 1]
            col[redo] = _draw(cum[row[redo]], u)
            if backtrack >= 1.0 or attempt == 4:
                break
            back = neighbours[cur[redo], col[redo]] == prev[redo]
            redo = redo[back & (rng.random(len(redo)) >= backtrack)]
            if not len(redo):
                break
        prev = cur
        ctx = m + edge_offsets[cur] + col
        cur = neighbours[cur, col]
        step += 1
    all_ids = np.concatenate(out_ids)
    all_states = np.concatenate(out_states)
    order = np.argsort(all_ids, kind="stable")
    lengths = np.bincount(all_ids, minlength=n)
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), all_states[order]
