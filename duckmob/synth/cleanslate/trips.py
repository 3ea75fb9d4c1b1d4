"""Trips on the public grid: cell sequences with gaps filled, their (source, destination, time slot), and the
1-grams the transition model learns from (Lestyan et al. §7.3, §8.2).

Every function here is a per-trajectory transformation (each output row depends on one trajectory's own
points and on public parameters), so it needs no budget; the mechanisms downstream bound each trajectory's
contribution. Vectorised over points: no Python loop over trajectories.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from duckmob.grid import cell_of, time_slot
from duckmob.staypoints import cell_sequences, collapse_repeats
from duckmob.trajectories import NO_TIME, Trajectories


def neighbour_offsets(r: int) -> tuple[np.ndarray, np.ndarray]:
    """(drow, dcol) of the (2r+1)^2 next-hop classes, class k = (drow + r) (2r + 1) + (dcol + r) (§8.3.2)."""
    side = np.arange(-r, r + 1)
    return np.repeat(side, 2 * r + 1), np.tile(side, 2 * r + 1)


def valid_moves(w: int, r: int) -> np.ndarray:
    """(w^2, (2r+1)^2) bool: class k leads from cell c to a cell inside the w x w grid other than c itself
    (repeats are collapsed, so staying is never a hop). Public."""
    dr, dc = neighbour_offsets(r)
    row, col = np.divmod(np.arange(w * w), w)
    tr, tc = row[:, None] + dr[None], col[:, None] + dc[None]
    return (tr >= 0) & (tr < w) & (tc >= 0) & (tc < w) & ((dr != 0) | (dc != 0))[None]


def fill_gaps(offsets: np.ndarray, cells: np.ndarray, w: int, r: int) -> tuple[np.ndarray, np.ndarray]:
    """Cell sequences where consecutive cells are at most ``r`` apart (Chebyshev distance, in cells).

    A hop of ``D > r`` cells becomes ``m = ceil(D / r)`` hops along the straight line between the two cells
    (cells rounded from ``a + j (b - a) / m``, j = 1..m-1), as the paper's linear interpolation of gaps (§8.2).
    Each hop of the line is at most ``r`` cells and moves at least one. Returns (offsets, cells)."""
    cells = np.asarray(cells, dtype=np.int64)
    n = len(offsets) - 1
    if len(cells) == 0:
        return np.zeros(n + 1, dtype=np.int64), cells
    lengths = np.diff(offsets)
    owner = np.repeat(np.arange(n, dtype=np.int64), lengths)
    row, col = np.divmod(cells, w)
    same = np.zeros(len(cells), dtype=bool)              # point i and i + 1 in one trajectory
    same[:-1] = owner[1:] == owner[:-1]
    d = np.zeros(len(cells), dtype=np.int64)
    d[:-1] = np.maximum(np.abs(row[1:] - row[:-1]), np.abs(col[1:] - col[:-1]))
    d = np.where(same, d, 0)
    extra = np.where(d > r, -(-d // r) - 1, 0)           # cells inserted after point i
    reps = 1 + extra
    base = np.repeat(np.arange(len(cells)), reps)
    j = np.arange(int(reps.sum())) - np.repeat(np.cumsum(reps) - reps, reps)   # 0 = the point, 1.. inserted
    m = np.repeat(extra + 1, reps)
    nxt = np.minimum(base + 1, len(cells) - 1)
    frac = j / m
    out_row = np.rint(row[base] + frac * (row[nxt] - row[base])).astype(np.int64)
    out_col = np.rint(col[base] + frac * (col[nxt] - col[base])).astype(np.int64)
    out = out_row * w + out_col
    out_owner = owner[base]
    counts = np.bincount(out_owner, minlength=n)
    new_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    keep = collapse_repeats(new_offsets, out)
    counts = np.bincount(out_owner[keep], minlength=n)
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), out[keep]


@dataclass(frozen=True)
class Trips:
    """One row per trajectory: ``source``, ``dest`` (cells), ``slot`` (time slot of the start), ``user_id``;
    and the ragged gap-filled cell sequences (``offsets``, ``cells``)."""

    source: np.ndarray
    dest: np.ndarray
    slot: np.ndarray
    user_id: np.ndarray
    offsets: np.ndarray
    cells: np.ndarray

    @property
    def n(self) -> int:
        return len(self.source)


def visits(data: Trajectories, bbox, w: int) -> Trajectories:
    """The fixes :func:`trips` reads: the first fix of each run of fixes in one cell of the w x w grid. ``trips``
    of them equals ``trips`` of ``data`` (so out of core, batch by batch, memory follows the cell visits, not the
    fixes). Per trajectory: each output from its own points only."""
    return data.take_points(collapse_repeats(data.offsets, cell_of(data.lat, data.lon, bbox, w)))


def trips(data: Trajectories, bbox, w: int, r: int, n_time: int) -> Trips:
    """Every trajectory's cell sequence on the w x w grid (all fixes, repeats collapsed, gaps over ``r`` cells
    filled), its first cell (source), last cell (destination) and the slot of its first fix (0 without time)."""
    seqs = cell_sequences(data, bbox, w, stay_points=False)
    alive = seqs.lengths > 0
    offsets, cells = fill_gaps(seqs.offsets, seqs.cells, w, r)
    first, last = offsets[:-1], offsets[1:] - 1
    starts = seqs.ts[seqs.offsets[:-1][alive]]
    slot = np.zeros(len(starts), dtype=np.int64)
    if len(starts) and not (starts == NO_TIME).any():
        slot = time_slot(starts, n_time)
    keep_offsets = np.concatenate([[0], np.cumsum(np.diff(offsets)[alive])]).astype(np.int64)
    return Trips(cells[first[alive]], cells[last[alive]], slot, np.asarray(seqs.user_id)[alive], keep_offsets,
                 cells)


@dataclass(frozen=True)
class Grams:
    """The transition model's training examples, one row per trajectory (§7.3.2): ``current`` (N, G) cells,
    ``label`` (N, G) next-hop classes, ``count`` (N,) grams used (<= G, the public cap), ``dest``, ``slot``."""

    current: np.ndarray
    label: np.ndarray
    count: np.ndarray
    dest: np.ndarray
    slot: np.ndarray


def grams(t: Trips, w: int, r: int, max_grams: int) -> Grams:
    """The 1-grams ``(c_j, d, t) -> c_{j+1}`` of every trajectory, at most ``max_grams`` of them: a trajectory
    with more keeps ``max_grams`` evenly spaced ones (a per-record choice from public parameters)."""
    lengths = np.diff(t.offsets)
    total = np.maximum(lengths - 1, 0)                     # grams of each trajectory
    count = np.minimum(total, max_grams)
    g = np.arange(max_grams)[None, :]
    # gram index j of slot g: evenly spaced over 0..total-1 (all of them when total <= max_grams)
    j = np.where(total[:, None] > max_grams, (g * total[:, None]) // max(max_grams, 1), g)
    used = g < count[:, None]
    pos = np.where(used, t.offsets[:-1, None] + j, 0)
    if len(t.cells) == 0:
        return Grams(pos, pos.copy(), count.astype(np.int64), t.dest, t.slot)
    a, b = t.cells[pos], t.cells[np.minimum(pos + 1, len(t.cells) - 1)]
    ar, ac = np.divmod(a, w)
    br, bc = np.divmod(b, w)
    label = (br - ar + r) * (2 * r + 1) + (bc - ac + r)
    current = np.where(used, a, 0)
    label = np.where(used, label, 0)
    return Grams(current, label, count.astype(np.int64), t.dest, t.slot)
