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
from functools import cached_property

import numpy as np

from duckmob.privacy.counting import normalised_sums, release_sums
from duckmob.privacy.normcut import normcut

# Entries per block of rows in scattered_normcut (bounds its float64 temporaries to a few MB).
SCATTER_BLOCK = 1 << 20


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

    @cached_property
    def entries1(self) -> np.ndarray:
        """The first-order table's support entries, flat: the start row (``0 .. m - 1``), then ``m +`` the True
        entries of :meth:`mask1` (row-major). Computed once per support, not once per batch of a fit."""
        return np.concatenate([np.arange(self.m), self.m + np.flatnonzero(self.mask1().reshape(-1))])

    @cached_property
    def entries2(self) -> np.ndarray:
        """The second-order table's support entries, flat: the True entries of :meth:`mask2` (row-major)."""
        return np.flatnonzero(self.mask2().reshape(-1))

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


@dataclass(frozen=True)
class Windows:
    """The first- and second-order windows of state sequences, ready for ``counting.normalised_release``.

    First order: the table is ``[start (m) | first (m, D + 1) flattened]`` (one release: start and state rows
    together); a sequence of L states has L + 1 windows (start, L - 1 moves, end). Second order: the table is
    ``second (m + E, D + 1)`` flattened; L windows (one per state: its context and its next state or end).
    Windows are listed trajectory by trajectory (``owner`` non-decreasing)."""

    first_index: np.ndarray
    first_owner: np.ndarray
    second_index: np.ndarray
    second_owner: np.ndarray
    lengths: np.ndarray      # L per trajectory

    @property
    def n_first(self) -> np.ndarray:
        return self.lengths + 1

    @property
    def n_second(self) -> np.ndarray:
        return self.lengths


def transition_windows(support: Support, seq_offsets: np.ndarray, states: np.ndarray) -> Windows:
    """Every window of the augmented sequences (start, s_1 .. s_L, end) on the sparse support (§4.3, App. B.2).

    ``seq_offsets`` (n + 1) cut ``states`` into n non-empty sequences of neighbouring states. Each trajectory owns
    L + 1 first-order and L second-order windows; with mass 1 spread over them (``counting.normalised_release``)
    it adds at most 1 to the L1 norm of each table."""
    m, D = support.m, support.width
    seq_offsets = np.asarray(seq_offsets, dtype=np.int64)
    states = np.asarray(states, dtype=np.int64)
    n = len(seq_offsets) - 1
    L = np.diff(seq_offsets)
    if n and L.min() < 1:
        raise ValueError("every state sequence needs at least one state")
    owner = np.repeat(np.arange(n, dtype=np.int64), L)
    pos = np.arange(len(states), dtype=np.int64) - seq_offsets[owner]
    last_idx = seq_offsets[1:] - 1
    inner = np.ones(len(states), dtype=bool)
    inner[last_idx] = False
    i = np.flatnonzero(inner)                      # moves s_i -> s_{i+1}
    col = np.full(len(states), D, dtype=np.int64)  # column of the next state, or the end
    edge = support.edge_index(states[i], states[i + 1])
    col[i] = edge - support.offsets[states[i]]

    # first order: the window into each state (start -> s_1, or s_{i-1} -> s_i), then the end window; placed so
    # that each trajectory's windows stay together (state p at p + owner, T's end at its last state's slot + 1)
    into = np.where(pos == 0, states, 0)
    prev = np.flatnonzero(pos > 0)
    into[prev] = m + states[prev - 1] * (D + 1) + col[prev - 1]
    first_index = np.empty(len(states) + n, dtype=np.int64)
    first_index[np.arange(len(states)) + owner] = into
    first_index[last_idx + np.arange(n) + 1] = m + states[last_idx] * (D + 1) + D
    first_owner = np.repeat(np.arange(n, dtype=np.int64), L + 1)

    # second order: context (start, s_1) or (s_{i-1}, s_i), then the next state's column (or the end)
    row = np.where(pos == 0, states, 0)
    row[prev] = m + edge                           # prev is i + 1: the move into each state after the first
    return Windows(first_index, first_owner, row * (D + 1) + col, owner, L)


def transition_counts(support: Support, seq_offsets: np.ndarray,
                      states: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """EXACT length-normalised counts (never release these): ``(start (m,), first (m, D + 1), second (m + E,
    D + 1))``, each window weighted 1 / W of its trajectory; each trajectory adds exactly 1 to the L1 norm of
    (start, first) together and exactly 1 to that of second. For tests and diagnostics."""
    m, D = support.m, support.width
    win = transition_windows(support, seq_offsets, states)
    f = np.bincount(win.first_index, weights=1.0 / win.n_first[win.first_owner], minlength=m + m * (D + 1))
    second = np.bincount(win.second_index, weights=1.0 / win.n_second[win.second_owner],
                         minlength=(m + support.n_edges) * (D + 1)).reshape(m + support.n_edges, D + 1)
    return f[:m], f[m:].reshape(m, D + 1), second


def release_transitions(support: Support, seq_offsets: np.ndarray, states: np.ndarray, scale_first: float,
                        scale_second: float, noise) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The first- and second-order releases through ``counting.normalised_release`` (the one counting mechanism),
    NormCut per row. Privacy map: each table has L1 sensitivity k (k trajectories per privacy unit); Laplace of
    ``scale = k / eps_part`` on every support entry (start row, neighbour columns and end of each state row;
    second-order rows likewise) is eps_part-DP per table. Returns ``(start, first, second)``, zero outside the
    support, non-negative."""
    sums = transition_sums(support, seq_offsets, states, scale_first, scale_second)
    return release_transition_sums(support, sums["first"], sums["second"], scale_first, scale_second, noise)


def transition_sums(support: Support, seq_offsets: np.ndarray, states: np.ndarray, scale_first: float,
                    scale_second: float) -> dict[str, np.ndarray]:
    """The EXACT statistics of :func:`release_transitions` (never release them): int64 noise-grid steps on every
    support entry of the first-order table (start row, then state rows) and of the second-order one
    (``counting.normalised_sums``); integers, so sums over batches of whole trajectories are exact."""
    win = transition_windows(support, seq_offsets, states)
    return {"first": normalised_sums(win.first_index, win.first_owner, win.n_first, support.entries1, scale_first),
            "second": normalised_sums(win.second_index, win.second_owner, win.n_second, support.entries2,
                                      scale_second)}


def release_transition_sums(support: Support, first_sums: np.ndarray, second_sums: np.ndarray, scale_first: float,
                            scale_second: float, noise) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The noise of :func:`release_transitions` on its exact statistics (:func:`transition_sums`), NormCut per
    row; first order noised before second order."""
    m, D = support.m, support.width
    mask1 = support.mask1()
    values1 = release_sums(first_sums, scale_first, noise)
    flat1 = np.zeros(m + m * (D + 1))
    flat1[support.entries1] = values1
    values2 = release_sums(second_sums, scale_second, noise)
    start = normcut_rows(flat1[None, :m])[0]
    first = normcut_rows(flat1[m:].reshape(m, D + 1), mask1)
    second = scattered_normcut(values2, support.mask2(), np.float32)
    return start, first, second


def scattered_normcut(values: np.ndarray, mask: np.ndarray, dtype=np.float64,
                      block_entries: int = SCATTER_BLOCK) -> np.ndarray:
    """``normcut_rows`` of the dense table that holds ``values`` at the True entries of ``mask`` (row-major) and
    zeros elsewhere, built a block of rows at a time into an array of ``dtype``: the same numbers (every step is
    row by row; cast once at the end of each row's float64 work), without the table's float64 copies. The
    second-order table of a fine model at scale is (m + E) x (D + 1) entries (60,451 states: 37 M), so the
    whole-table form held about 1 GB of float64 copies at once; this holds the float32 result and one block."""
    rows, width = mask.shape
    out = np.zeros((rows, width), dtype=dtype)
    ends = np.concatenate([[0], np.cumsum(mask.sum(axis=1))])
    step = max(1, int(block_entries) // max(1, width))
    for a in range(0, rows, step):
        b = min(rows, a + step)
        block = np.zeros((b - a, width))
        block[mask[a:b]] = values[ends[a]:ends[b]]
        out[a:b] = normcut_rows(block, mask[a:b])
    return out


def density_sums(seq_offsets: np.ndarray, states: np.ndarray, size: int, scale: float) -> np.ndarray:
    """The EXACT statistics of the length-normalised visit density over ``size`` states (PrivTrace B.1): a
    trajectory of L states adds 1 / L to each state it visits (L1 sensitivity 1; k per privacy unit), as int64
    noise-grid steps per state; never release them: :func:`release_sums` adds Laplace of ``scale`` on every
    state (noisy, not NormCut-ed)."""
    L = np.diff(np.asarray(seq_offsets, dtype=np.int64))
    owner = np.repeat(np.arange(len(L), dtype=np.int64), L)
    return normalised_sums(states, owner, L, int(size), scale)


def normcut_rows(noisy: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """NormCut (App. B.6, Alg. 2) on every row; entries outside ``mask`` stay zero."""
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
