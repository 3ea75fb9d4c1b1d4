"""Cells and cell sequences shared by PrivTrace and the fine-placement stage: the two-layer grid of PrivTrace
(§4.2), trajectories as sequences of neighbouring cells (the integer line walk between fixes), and the cut of a
noisy histogram's tail. PrivTrace's Markov states are this grid's cells; the fine placement
(:mod:`duckmob.synth.placement`) uses its one-layer form (:func:`uniform_grid`) as the public fine grid.

The first layer is a uniform K x K grid over the public bounding box. A first-layer cell that many trajectories
pass through is split into kappa x kappa second-layer cells; both the unsplit first-layer cells and the
second-layer cells are the states of the Markov models (§4.2, "Difference from AdaTrace").

Choice made here (the paper allows any kappa): kappa is a power of two, kappa = 2**e with 0 <= e <= D. Every
state is then a square block of a fine *base grid* of W = K * 2**D cells per side, which makes three things
exact and vectorised: a point's state is a formula of its base cell; two states are neighbours when any of
their base cells touch (8-neighbourhood: an edge or a corner); and a chain of 8-neighbouring base cells visits
a chain of neighbouring (or equal) states, which is how gaps between consecutive fixes are filled in (PrivTrace
interpolates between non-adjacent cells so that every transition of a state sequence is between neighbours —
that is what lets the transition support be restricted to neighbours, a data-independent set).

The line walk (:func:`line_cells`): a fix's base cell is (floor(row), floor(col)) of its base coordinates; the
gap from base cell (R0, C0) to the next fix's (R1, C1), with dR = R1 - R0, dC = C1 - C0 and
n = max(|dR|, |dC|), is filled with the cells k = 0 .. n - 1 of
    (R0 + round(k dR / n), C0 + round(k dC / n)),   round(x) = floor(x + 1/2) = floor((2 k d + n) / (2 n)),
computed in integers (the digital differential analyser, i.e. Bresenham's line up to tie-breaking). The major
axis moves exactly one cell a step and the minor axis 0 or 1, so consecutive cells are 8-neighbours, and k = n
is (R1, C1) exactly; the next gap starts there. Floating point is used only for a fix's own base coordinates.

Each trajectory's output depends on its own points only: a fix's base cell is an element-wise function of the
fix, a gap's cells a function of its two end cells, and runs are collapsed within the trajectory, so a
trajectory's state sequence is bit-identical whatever other trajectories are processed with it and wherever it
lies in the arrays (and whichever chunk it falls in).

The grid is public: a function of the bbox, K, D and the per-cell exponents, which are themselves
post-processing of noisy densities; a trajectory's cells are never released as they are.
"""

from __future__ import annotations

import numpy as np

from duckmob.errors import DuckmobError
from duckmob.grid import BBox


class StateGrid:
    """Two-layer grid: ``K`` x ``K`` first-layer cells over ``bbox``, cell ``c`` split into 2**split[c] squared.

    Attributes (all derived, numpy): ``m`` states; ``row0``, ``col0``, ``size`` — each state's block on the base
    grid (base cells, W = K * 2**depth per side); ``first`` — the first state id of each first-layer cell.
    States are numbered first-layer cell by cell (row-major), then row-major inside a split cell.
    """

    def __init__(self, bbox, K: int, depth: int, split: np.ndarray):
        self.bbox = BBox.of(bbox)
        self.K, self.depth = int(K), int(depth)
        split = np.asarray(split, dtype=np.int64).reshape(-1)
        if self.K < 1 or len(split) != self.K * self.K:
            raise DuckmobError(f"a {K}x{K} grid needs {K * K} split exponents, got {len(split)}")
        if split.min() < 0 or split.max() > self.depth:
            raise DuckmobError(f"split exponents must lie in 0..{depth}")
        self.split = split
        self.W = self.K << self.depth
        per_cell = np.left_shift(1, 2 * split)                      # 4**e states per first-layer cell
        self.first = np.concatenate([[0], np.cumsum(per_cell)]).astype(np.int64)
        self.m = int(self.first[-1])
        cell = np.repeat(np.arange(self.K * self.K), per_cell)
        local = np.arange(self.m) - self.first[cell]
        e = split[cell]
        side = np.left_shift(1, e)
        self.size = np.left_shift(1, self.depth - e)                 # block side in base cells
        self.row0 = (cell // self.K << self.depth) + (local // side) * self.size
        self.col0 = (cell % self.K << self.depth) + (local % side) * self.size
        self._neighbours = None
        self._table = None

    # -- points -> states -------------------------------------------------------------------------------
    def base_coords(self, lat, lon) -> tuple[np.ndarray, np.ndarray]:
        """Continuous base-grid coordinates (row, col) of points, clipped into [0, W)."""
        b = self.bbox
        r = (np.asarray(lat, dtype=np.float64) - b.min_lat) / (b.max_lat - b.min_lat) * self.W
        c = (np.asarray(lon, dtype=np.float64) - b.min_lon) / (b.max_lon - b.min_lon) * self.W
        top = np.nextafter(float(self.W), 0.0)
        return np.clip(r, 0.0, top), np.clip(c, 0.0, top)

    def state_of_base(self, R: np.ndarray, C: np.ndarray) -> np.ndarray:
        """State id of integer base cells (R, C)."""
        R, C = np.asarray(R, dtype=np.int64), np.asarray(C, dtype=np.int64)
        if self.depth == 0:        # no split cell: state = first-layer cell, row-major (the formula below, simplified)
            return R * self.K + C
        cell = (R >> self.depth) * self.K + (C >> self.depth)
        e = self.split[cell]
        mask = (1 << self.depth) - 1
        shift = self.depth - e
        return self.first[cell] + ((R & mask) >> shift << e) + ((C & mask) >> shift)

    def state_of(self, lat, lon) -> np.ndarray:
        """State id of each point (points must lie inside the bbox; edges fall in the last row/column)."""
        r, c = self.base_coords(lat, lon)
        return self.state_of_base(np.floor(r).astype(np.int64), np.floor(c).astype(np.int64))

    def state_table(self) -> np.ndarray:
        """The state of every base cell, int64[W * W], indexed by R W + C (computed once, then kept)."""
        if self._table is None:
            R, C = np.divmod(np.arange(self.W * self.W, dtype=np.int64), self.W)
            self._table = self.state_of_base(R, C)
        return self._table

    # -- geometry ---------------------------------------------------------------------------------------
    def neighbours(self) -> tuple[np.ndarray, np.ndarray]:
        """CSR adjacency of the states (8-neighbourhood on the base grid): (offsets int64[m+1], dst int64[E]).

        Neighbour lists are sorted ascending; a state is not its own neighbour. Data-independent.
        """
        if self._neighbours is None:
            R, C = np.meshgrid(np.arange(self.W), np.arange(self.W), indexing="ij")
            S = self.state_of_base(R, C)
            pairs = []
            for a, b in ((S[:, :-1], S[:, 1:]), (S[:-1, :], S[1:, :]), (S[:-1, :-1], S[1:, 1:]),
                         (S[:-1, 1:], S[1:, :-1])):
                diff = a != b
                pairs.append(a[diff] * self.m + b[diff])
                pairs.append(b[diff] * self.m + a[diff])
            keys = np.unique(np.concatenate(pairs))
            src, dst = keys // self.m, keys % self.m
            offsets = np.concatenate([[0], np.cumsum(np.bincount(src, minlength=self.m))]).astype(np.int64)
            self._neighbours = (offsets, dst.astype(np.int64))
        return self._neighbours

    def bounds(self, states) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(min_lat, min_lon, max_lat, max_lon) of each state, degrees."""
        s = np.asarray(states, dtype=np.int64)
        b = self.bbox
        dlat = (b.max_lat - b.min_lat) / self.W
        dlon = (b.max_lon - b.min_lon) / self.W
        r0, c0, sz = self.row0[s], self.col0[s], self.size[s]
        return (b.min_lat + r0 * dlat, b.min_lon + c0 * dlon,
                b.min_lat + (r0 + sz) * dlat, b.min_lon + (c0 + sz) * dlon)

    def centres(self) -> tuple[np.ndarray, np.ndarray]:
        """(lat, lon) of every state's centre, degrees."""
        a, b, c, d = self.bounds(np.arange(self.m))
        return (a + c) / 2, (b + d) / 2

    def sample_points(self, states, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """A point drawn uniformly (in degrees) inside each state's cell (PrivTrace Alg. 1, step 3)."""
        a, b, c, d = self.bounds(states)
        u = rng.random((2, len(a)))
        return a + (c - a) * u[0], b + (d - b) * u[1]


def uniform_grid(bbox, K: int) -> StateGrid:
    """The first layer alone: K x K states."""
    return StateGrid(bbox, K, 0, np.zeros(K * K, dtype=np.int64))


CHUNK_POINTS = 1 << 21   # points per chunk: bounds the temporaries of state_sequences (at most about 40 bytes a point)


def state_sequences(grid: StateGrid, offsets: np.ndarray, lat: np.ndarray,
                    lon: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Discretise trajectories into state sequences whose consecutive states are neighbours.

    ``offsets`` (n + 1) cut the points ``lat``, ``lon`` (degrees, inside the bbox) into n trajectories.
    Between two consecutive fixes the gap is filled with the integer line walk between their base cells
    (:func:`line_cells`, module docstring), whose consecutive cells are 8-neighbours, so consecutive states are
    neighbours or equal; then runs of one state are collapsed to one visit. Returns
    ``(seq_offsets int64[n+1], states int64[total], traj int64[total])``; every trajectory keeps at least one
    state. Vectorised over points (no loop over trajectories); long inputs are cut at trajectory boundaries into
    chunks of about CHUNK_POINTS points to bound the memory used (a trajectory's states do not depend on its
    chunk).
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    if offsets[-1] > CHUNK_POINTS:
        cuts = np.unique(np.searchsorted(offsets, np.arange(0, offsets[-1], CHUNK_POINTS), side="right") - 1)
        cuts = np.unique(np.concatenate([cuts, [len(offsets) - 1]]))
        parts = []
        for a, b in zip(cuts[:-1], cuts[1:]):
            lo, hi = offsets[a], offsets[b]
            o, st, own = _state_sequences(grid, offsets[a:b + 1] - lo, lat[lo:hi], lon[lo:hi])
            parts.append((np.diff(o), st, own + a))
        lengths = np.concatenate([p[0] for p in parts])
        return (np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), np.concatenate([p[1] for p in parts]),
                np.concatenate([p[2] for p in parts]))
    return _state_sequences(grid, offsets, lat, lon)


def line_cells(R0: np.ndarray, C0: np.ndarray, R1: np.ndarray,
               C1: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The integer line walk of each segment from base cell (R0, C0) to (R1, C1), end cell excluded.

    Segment i gives n_i = max(|R1 - R0|, |C1 - C0|, 1) cells: k = 0 .. n_i - 1 of
    (R0 + floor((2 k dR + n) / (2 n)), C0 + floor((2 k dC + n) / (2 n))), n = max(|dR|, |dC|) (module
    docstring); a segment with R0 = R1 and C0 = C1 gives its one cell. Consecutive cells of a segment, and its
    last cell and (R1, C1), differ by at most 1 in row and in column. Integers only; each segment's cells depend
    on its two end cells only. Returns ``(segment int64[T], R int64[T], C int64[T])``, segments in order.
    """
    R0, C0 = np.asarray(R0, dtype=np.int64), np.asarray(C0, dtype=np.int64)
    dR = np.asarray(R1, dtype=np.int64) - R0
    dC = np.asarray(C1, dtype=np.int64) - C0
    n = np.maximum(np.maximum(np.abs(dR), np.abs(dC)), 1)
    seg = np.repeat(np.arange(len(n), dtype=np.int64), n)
    R, C = np.repeat(R0, n), np.repeat(C0, n)
    long, more, k, pos = _inner_cells(n)
    if len(long):
        nl = np.repeat(n[long], more)
        R[pos] += _walk_offset(k, np.repeat(dR[long], more), nl)
        C[pos] += _walk_offset(k, np.repeat(dC[long], more), nl)
    return seg, R, C


def _inner_cells(n: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Where the walk formula is needed, for segments of ``n`` cells each (concatenated in order): cell k = 0 of
    every segment is its start cell (floor(n / 2n) = 0), so only the cells k >= 1 of the segments longer than one
    cell (most fixes are one cell from the next) are computed. Returns ``(long, more, k, pos)``: the segments
    longer than one cell, their cell counts less one, and for each of their cells k >= 1 (segment by segment) its
    k and its position in the concatenation (all int64)."""
    long = np.flatnonzero(n > 1)
    more = n[long].astype(np.int64) - 1
    ends = np.cumsum(more)
    k = np.arange(1, int(ends[-1]) + 1 if len(ends) else 1, dtype=np.int64) - np.repeat(ends - more, more)
    starts = np.cumsum(n, dtype=np.int64)[long] - more - 1     # each long segment's cell k = 0
    return long, more, k, np.repeat(starts, more) + k


def _walk_offset(k: np.ndarray, d: np.ndarray, n: np.ndarray) -> np.ndarray:
    """floor((2 k d + n) / (2 n)): the walk's offset along one axis at cell k (module docstring), in int64."""
    n = n.astype(np.int64)
    return np.floor_divide(2 * k * d + n, 2 * n)


def _base_cells(grid: StateGrid, lat: np.ndarray, lon: np.ndarray, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Each fix's base cell (row, col) as :meth:`StateGrid.state_of` finds it: floor of :meth:`StateGrid.base_coords`,
    the same floating-point operations in the same order, done in place (the coordinates are clipped to
    [0, W), where truncation is the floor)."""
    b, W = grid.bbox, grid.W
    top = np.nextafter(float(W), 0.0)
    out = []
    for x, low, high in ((lat, b.min_lat, b.max_lat), (lon, b.min_lon, b.max_lon)):
        v = np.subtract(np.asarray(x, dtype=np.float64), low)
        v /= high - low
        v *= W
        out.append(np.clip(v, 0.0, top, out=v).astype(dtype))
    return out[0], out[1]


LUT_CELLS = 1 << 22   # a grid of at most this many base cells finds states in a table of them (StateGrid.state_table)
INT32_CELLS = 1 << 31  # a grid of at most this many base cells codes them as int32 (the walk's formula is int64)


def _state_sequences(grid: StateGrid, offsets: np.ndarray, lat: np.ndarray,
                     lon: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`state_sequences` of one chunk. Base cells are coded R W + C (int32 where W**2 fits), fixes in the
    same base cell as the fix before them (same trajectory) are dropped first (they add nothing: the walk from
    that cell to the next fix's starts where its own one-cell walk ended; GPS sampling puts most consecutive fixes
    in one cell), and only the walk's cells k >= 1 of gaps longer than one cell are computed."""
    offsets = np.asarray(offsets, dtype=np.int64)
    n, n_pts, W = len(offsets) - 1, int(offsets[-1]), grid.W
    if n_pts == 0:
        return np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    dtype = np.int32 if W * W <= INT32_CELLS else np.int64
    R, C = _base_cells(grid, lat, lon, dtype)
    code = R * dtype(W)
    code += C
    starts = offsets[:-1][offsets[:-1] < n_pts]                       # each non-empty trajectory's first fix
    new = np.empty(n_pts, dtype=bool)
    new[0] = True
    np.not_equal(code[1:], code[:-1], out=new[1:])
    new[starts] = True
    kept = np.flatnonzero(new)
    R, C, code = R[kept], C[kept], code[kept]
    first = np.searchsorted(kept, offsets)                             # offsets into the kept fixes
    # the gap from each kept fix to the next one of its trajectory; a trajectory's last fix: its own cell
    dR, dC = np.zeros(len(kept), dtype=dtype), np.zeros(len(kept), dtype=dtype)
    np.subtract(R[1:], R[:-1], out=dR[:-1])
    np.subtract(C[1:], C[:-1], out=dC[:-1])
    last = first[1:][first[1:] > first[:-1]] - 1
    dR[last], dC[last] = 0, 0
    steps = np.maximum(np.abs(dR), np.abs(dC))
    np.maximum(steps, 1, out=steps)
    cells = np.repeat(code, steps)                                     # the walk (line_cells), as codes
    long, more, k, pos = _inner_cells(steps)
    if len(long):
        nl = np.repeat(steps[long], more)
        step = _walk_offset(k, np.repeat(dR[long], more), nl) * W
        step += _walk_offset(k, np.repeat(dC[long], more), nl)
        cells[pos] += step.astype(dtype)
    cell_off = np.concatenate([[0], np.cumsum(steps, dtype=np.int64)])[first]
    if grid.depth == 0:
        # state = base cell, and consecutive cells of a trajectory's walk always differ: no run to collapse
        states, seq_offsets = cells.astype(np.int64), cell_off
    else:
        states = grid.state_table()[cells] if W * W <= LUT_CELLS else grid.state_of_base(cells // W, cells % W)
        new = np.empty(len(states), dtype=bool)
        new[0] = True
        np.not_equal(states[1:], states[:-1], out=new[1:])
        new[cell_off[:-1][cell_off[:-1] < len(states)]] = True
        kept = np.flatnonzero(new)
        states, seq_offsets = states[kept], np.searchsorted(kept, cell_off)
    return seq_offsets, states, np.repeat(np.arange(n, dtype=np.int64), np.diff(seq_offsets))


def truncate_tail(noisy: np.ndarray, scale: float, tau: float = 1.0) -> np.ndarray:
    """Zero a noisy histogram from the first two consecutive bins after its highest bin that are both below
    ``tau`` Laplace scales: past that point the counts are indistinguishable from noise, and noise kept in a long
    tail (PrivTrace's sequence lengths, placement's step lengths) would lengthen what is drawn from it.
    Post-processing only."""
    noisy = np.asarray(noisy, dtype=np.float64).copy()
    mode = int(np.argmax(noisy))
    low = noisy < tau * scale
    both = low[mode:-1] & low[mode + 1:]
    if both.any():
        noisy[mode + int(np.argmax(both)):] = 0.0
    return noisy
