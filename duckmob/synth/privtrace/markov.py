"""PrivTrace's first- and second-order Markov models (§4.3, App. B.2) on a data-independent sparse support.

Trajectories are state sequences (s_1 .. s_L) whose consecutive states are neighbours (states.py), augmented
with a virtual start and a virtual end. Transition supports, fixed before any data is read:

* first order: (start, s) for every state s; (s, t) for t a neighbour of s; (s, end) for every s;
* second order: every triple (a, b, c) whose two steps are first-order support pairs:
  (start, s, t | end) and (s, t, u | end) with t a neighbour of s and u a neighbour of t.

Layout: a *row* is a conditioning context, a *column* a next state. First-order state rows are ``(m, D + 1)``
arrays: column j < deg(s) is the j-th neighbour of s (sorted), column D (= the widest neighbour list) is the
virtual end, other columns are outside the support and stay exactly zero. The virtual-start row is a separate
vector of length m. Second-order rows are ``(m + E, D + 1)``: row s < m is the context (start, s); row
m + e is the context (a, b) of the e-th directed neighbour pair (CSR order), with the columns of b's row.

Counts are length-normalised (App. B.2, Theorem 2): a trajectory of L states has L + 1 first-order transitions
(start and end included), each counted 1 / (L + 1), and L second-order transitions, each counted 1 / L, so one
trajectory adds exactly 1 to the L1 norm of each count table. A privacy unit that may contribute up to k
trajectories changes each table by at most k in L1: Laplace noise of scale k / eps on every support entry is
eps-DP (Laplace mechanism). The whole support is noised — never only the non-zero counts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Support:
    """The data-independent transition support of ``m`` states with CSR neighbour lists ``(offsets, dst)``."""

    m: int
    offsets: np.ndarray     # int64[m + 1]
    dst: np.ndarray         # int64[E], neighbours of each state, sorted
    width: int              # D = widest neighbour list; column D is the virtual end

    @classmethod
    def of(cls, m: int, offsets: np.ndarray, dst: np.ndarray) -> "Support":
        deg = np.diff(offsets)
        return cls(int(m), np.asarray(offsets, dtype=np.int64), np.asarray(dst, dtype=np.int64),
                   int(deg.max()) if len(deg) else 0)

    @property
    def n_edges(self) -> int:
        return len(self.dst)

    @property
    def deg(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def end(self) -> int:
        """Column index of the virtual end."""
        return self.width

    def padded_neighbours(self) -> np.ndarray:
        """``(m, D)`` neighbour ids, -1 outside the support."""
        deg = self.deg
        out = np.full((self.m, self.width), -1, dtype=np.int64)
        rows = np.repeat(np.arange(self.m), deg)
        cols = np.arange(self.n_edges) - self.offsets[rows]
        out[rows, cols] = self.dst
        return out

    def mask1(self) -> np.ndarray:
        """Support of the first-order state rows, ``(m, D + 1)`` bool (neighbours and the end)."""
        mask = np.arange(self.width + 1)[None, :] < self.deg[:, None]
        mask[:, self.width] = True
        return mask

    def row_state2(self) -> np.ndarray:
        """The current state of each second-order row: ``int64[m + E]``."""
        return np.concatenate([np.arange(self.m, dtype=np.int64), self.dst])

    def mask2(self) -> np.ndarray:
        """Support of the second-order rows, ``(m + E, D + 1)`` bool."""
        return self.mask1()[self.row_state2()]

    def edge_index(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Index (CSR order) of the directed neighbour pair (a, b); every pair must be in the support.

        A pair outside the support is an internal error, unreachable from state sequences (states.py fills every
        gap with 8-neighbouring base cells): it raises RuntimeError, whose message names no state or count.
        """
        keys = np.repeat(np.arange(self.m, dtype=np.int64), self.deg) * self.m + self.dst
        want = np.asarray(a, dtype=np.int64) * self.m + np.asarray(b, dtype=np.int64)
        e = np.searchsorted(keys, want)
        if len(want) and (e.max() >= len(keys) or not np.array_equal(keys[e], want)):
            raise RuntimeError("internal invariant broken: a transition between non-neighbouring states "
                               "reached the counts")
        return e


def on_grid(weights: np.ndarray, quantum: float | None) -> np.ndarray:
    """Weights rounded DOWN to multiples of ``quantum`` (the noise grid, ``duckmob.privacy.noise.granularity``).

    Rounding each trajectory's contribution down keeps its L1 norm <= 1 and puts every sum of contributions
    exactly on the grid, so the safe Laplace mechanism needs no rounding of its input (no epsilon increase).
    """
    w = np.asarray(weights, dtype=np.float64)
    return w if quantum is None else np.floor(w / quantum) * quantum


def transition_counts(support: Support, seq_offsets: np.ndarray, states: np.ndarray,
                      weight: np.ndarray | None = None, quantum1: float | None = None,
                      quantum2: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """EXACT length-normalised transition counts (§4.3, App. B.2) on the sparse support.

    ``seq_offsets`` (n + 1) cut ``states`` into n non-empty sequences of neighbouring states. Returns
    ``(start (m,), first (m, D + 1), second (m + E, D + 1))``: start[s] = sum over trajectories starting at s of
    1 / (L + 1); first[s, j] the same weights summed over the transitions s -> j-th neighbour (or -> end in column
    D); second[r, j] = sum of 1 / L over the triples in context r followed by column j. Each trajectory adds
    exactly 1 to the L1 norm of (start, first) together and exactly 1 to that of second. ``weight`` (one per
    trajectory, default 1) multiplies a trajectory's contribution; ``quantum1``/``quantum2`` round the
    per-transition weights of the first/second-order tables down to the noise grid (:func:`on_grid`), after
    which each trajectory adds at most 1.
    """
    m, D = support.m, support.width
    seq_offsets = np.asarray(seq_offsets, dtype=np.int64)
    states = np.asarray(states, dtype=np.int64)
    n = len(seq_offsets) - 1
    L = np.diff(seq_offsets)
    if n and L.min() < 1:
        raise ValueError("every state sequence needs at least one state")
    w = np.ones(n) if weight is None else np.asarray(weight, dtype=np.float64)
    owner = np.repeat(np.arange(n), L)
    first_idx, last_idx = seq_offsets[:-1], seq_offsets[1:] - 1
    w1 = on_grid(w / (L + 1.0), quantum1)
    w2 = on_grid(w / L, quantum2)

    start = np.bincount(states[first_idx], weights=w1, minlength=m)

    # interior first-order transitions s_i -> s_{i+1}
    inner = np.ones(len(states), dtype=bool)
    inner[last_idx] = False
    i = np.flatnonzero(inner)
    a, b = states[i], states[i + 1]
    e = support.edge_index(a, b)
    col = e - support.offsets[a]
    flat = np.concatenate([a * (D + 1) + col, states[last_idx] * (D + 1) + D])
    wt = np.concatenate([w1[owner[i]], w1])
    first = np.bincount(flat, weights=wt, minlength=m * (D + 1)).reshape(m, D + 1)

    # second-order triples: context row of (s_{i-1}, s_i) (or (start, s_1)), column of s_{i+1} (or end)
    pos = np.arange(len(states)) - seq_offsets[owner]
    row = np.where(pos == 0, states, 0)
    has_prev = pos > 0
    j = np.flatnonzero(has_prev)
    row[j] = m + support.edge_index(states[j - 1], states[j])
    col2 = np.full(len(states), D, dtype=np.int64)
    col2[i] = col
    second = np.bincount(row * (D + 1) + col2, weights=w2[owner],
                         minlength=(m + support.n_edges) * (D + 1)).reshape(m + support.n_edges, D + 1)
    return start, first, second


def add_laplace(counts: np.ndarray, mask: np.ndarray | None, scale: float, noise) -> np.ndarray:
    """Counts plus Laplace(scale) noise on every support entry (``mask``; all entries when None); zero elsewhere.

    With ``scale = sensitivity / eps`` this is the eps-DP Laplace mechanism on the whole support. The noise is
    duckmob's safe Laplace (``NoiseSource.add_laplace``: input and output on a power-of-two grid); counts built
    with :func:`on_grid` at ``granularity(scale)`` are on that grid already.
    """
    counts = np.asarray(counts, dtype=np.float64)
    if mask is None:
        return noise.add_laplace(counts, scale)
    out = np.zeros_like(counts)
    out[mask] = noise.add_laplace(counts[mask], scale)
    return out


def quantum(scale: float) -> float:
    """The noise grid step for Laplace noise of ``scale`` (``duckmob.privacy.noise.granularity``)."""
    from duckmob.privacy.noise import granularity

    return granularity(scale)


def normcut_rows(noisy: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """NormCut (App. B.6, Alg. 2) on every row; entries outside ``mask`` stay zero."""
    from duckmob.privacy.normcut import normcut

    out = normcut(np.asarray(noisy, dtype=np.float64), axis=-1)
    if mask is not None:
        out = np.where(mask, out, 0.0)
    return np.maximum(out, 0.0)


def select_second_order(first: np.ndarray, support: Support, scale: float, theta2: float = 5.0,
                        theta1_factor: float = 1.0) -> np.ndarray:
    """PrivTrace's model selection (§4.6) for every state: True where the second-order model is used.

    ``first`` are the NormCut first-order counts of the state rows. For state i, N_i are its counts to next
    states (neighbour columns), N_i1 >= N_i2 the two largest; N_i,sum is the whole row (next states and end).
    Rule: first order when N_i,sum < theta1 or N_i1 / N_i2 >= theta2, else second order. theta1 follows §5.1,
    (sqrt(2) / eps2) * (number of noisy entries the row sums), with the Laplace scale k / eps2 in place of
    1 / eps2 and the row's support size (neighbours + end) in place of the number of states m, because only
    the support is noised here; ``theta1_factor`` scales it (App. F tries 1, 3, 5). Post-processing only.
    """
    D = support.width
    mask = support.mask1()
    nxt = np.where(mask[:, :D], first[:, :D], 0.0)
    total = first.sum(axis=1)
    top2 = -np.sort(-nxt, axis=1)[:, :2] if D >= 2 else np.pad(nxt, ((0, 0), (0, 2 - D)))
    n1, n2 = top2[:, 0], top2[:, 1]
    theta1 = theta1_factor * np.sqrt(2.0) * scale * mask.sum(axis=1)
    dominant = n1 >= theta2 * n2          # also true when n2 == 0
    return (total >= theta1) & ~dominant
