"""Fine placement, shared by every method: where synthetic points go inside coarse cells, the street-level route
between consecutive coarse cells, and the spacing of points along it.

A method models trajectories on a coarse discretisation (PrivTrace's states, HRNet's grid). Left there, every
synthetic point is uniform inside a cell of a kilometre or more: a blob on the map, one point per cell. This stage
adds, as part of the method's fit, two private releases on a public fine grid (``fine_w`` x ``fine_w`` cells over
the public bbox, about ``fine_m`` metres each by default):

=========  ======================================================================  ============  ============
part       what is released                                                         sensitivity   budget
=========  ======================================================================  ============  ============
density    trajectory density on the fine grid: a trajectory passing W distinct     k             0.8 share
           fine cells (its fixes joined by the integer line walk) adds 1 / W to
           each (length-normalised: its mass is 1)
steps      histogram of the distance between consecutive fixes (public log bins):   k             0.2 share
           a trajectory with S steps adds 1 / S to the bin of each
=========  ======================================================================  ============  ============

Both go through ``duckmob.privacy.counting.normalised_release`` (the one counting mechanism): each trajectory's
mass 1 is split over its windows on the noise grid, so one trajectory moves each table by at most 1 in L1 and a
privacy unit of k trajectories by at most k; Laplace of scale ``k / (eps * share * part)`` on EVERY fine cell and
EVERY bin (data-independent supports) makes each part eps-DP; they compose into the method's ledger event. The
fine density is NormCut (non-negative, total kept); the step histogram too. Trajectories of one point have no
step and add nothing to the step histogram (dropping mass only lowers the sensitivity).

Sampling (post-processing of the released model, :class:`Placement`):

1. *Anchors*: the ``anchors`` fine cells of highest released density inside each coarse cell (a coarse cell with
   no mass keeps its central fine cell). A trajectory starts at an anchor of its first coarse cell, drawn in
   proportion to the density.
2. *Routes*: from the current anchor in coarse cell A to the next coarse cell B, the most probable path over the
   fine cells of A and B: the shortest path where entering a fine cell costs ``-log p`` (``p`` its share of the
   released density, floored) times the step length, ending at whichever anchor of B is cheapest to reach (the
   clean-slate paper's idea; one multi-source Dijkstra in ``scipy.sparse.csgraph`` over a block-diagonal graph
   of every coarse move used at once). The last leg runs inside the last cell, from where the route arrived to
   an anchor drawn by density (one Dijkstra per anchor number), so trajectories end where trips end, not at the
   border nearest the previous cell (GeoLife, eps 1: median diameter 3.4 km without it, 3.8 km with it, real
   4.4 km); a one-cell trajectory is that leg between two anchors of its cell. Two consecutive coarse cells
   that are not neighbours (HRNet's stays) are first joined by the cells on the straight line between them
   (:meth:`Placement.bridge`), so the route follows the released streets the whole way.
3. *Spacing*: points are laid along the route (each route vertex jittered uniformly inside its fine cell) at
   distances drawn from the released step histogram (uniform in log inside a bin), so there are about as many
   points per trajectory, as far apart, as in the real sampling; a trajectory gets at least its two end points.
   With little mass in noise scales the histogram is released on blocks of public bins (:func:`step_block`).
   A public ``step_m`` (metres) replaces the histogram: points every ``step_m`` along the route, and the density
   gets the whole share. A route longer than ``max_points`` draws cover has its steps stretched evenly.

``output := 'cells'`` (or ``fine_share := 0``) keeps the method's cell-level output and spends nothing here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import dijkstra

from duckmob.grid import BBox, cell_of
from duckmob.privacy import accounting
from duckmob.privacy.counting import normalised_sums, release_sums
from duckmob.privacy.noise import check_scale
from duckmob.privacy.normcut import normcut
from duckmob.source.batches import as_batches
from duckmob.synth.config import Config, param
from duckmob.trajectories import Trajectories, ragged_gather

# Each part's fraction of the fine stage's share of eps.
PARTS = {"density": 0.8, "steps": 0.2}
# Public bins of the distance between consecutive fixes (metres): [0, 1) then log-spaced up to 50 km; longer
# steps fall in the last bin.
STEP_EDGES_M = np.concatenate([[0.0], np.geomspace(1.0, 50_000.0, 48)])
# Blocks of the released step histogram: about STEP_BLOCKS_C sqrt(mass / noise scale) of them (step_block).
STEP_BLOCKS_C = 2.0
# The released step histogram's head and tail are cut where two consecutive blocks fall below STEP_TAU noise
# scales of a block when blocks are wider than a bin, below 1 scale on single bins (release_statistics). HRNet
# 'points', 1,000 GeoLife trajectories at eps 1 (blocks of 6), 3 fits: 2 gave step JSD 0.195 and 0.39-2.3 x
# the real points per trajectory, 1 gave 0.152 and 0.05-2.3 x. PrivTrace on 16,739 (single bins), 3 fits: 1
# gave 1.16 x, 2 gave 1.24 x.
STEP_TAU = 2.0
EARTH_M_PER_DEG = 111_195.0
# Floor of a fine cell's probability in the route costs, relative to the mean cell (so routes may cross cells
# the release left empty, at a high cost).
FLOOR = 1e-3
MAX_POINTS = 20_000
# Spread of the per-cell cost factors of the extra route draws (Placement.route_tables): log-normal sigma.
ROUTE_SPREAD = 1.0
# The data-driven bound on the fine width (fine_width): the public assumption that trajectories' mass concentrates
# on about 5% of the grid's cells (streets and centres), and 2 noise scales of signal per such cell.
SIGNAL_SHARE = 0.05
TAU = 2.0


@dataclass(frozen=True)
class PlacementConfig(Config):
    """The fine-placement parameters every method shares (mixed into each method's config)."""

    fine_share: float = param(0.2, float, low=0, high=0.9,
                              doc="share of eps spent on the fine density and the step histogram (0: cells only)")
    fine_w: int | None = param(None, int, low=4, high=1024,
                               doc="fine cells per side; null: the power of two giving cells nearest fine_m")
    fine_m: float = param(100.0, float, low=1, doc="target fine cell size (metres) when fine_w is null")
    anchors: int = param(8, int, low=1, high=64, doc="route end points per coarse cell (densest fine cells)")
    route_draws: int = param(4, int, low=1, high=16,
                             doc="route tables per coarse move: the most probable one and perturbed ones (spread)")
    output: str = param("points", str, choices=("points", "cells"),
                        doc="'points': routed, spaced points; 'cells': one uniform point per coarse cell")
    max_points: int = param(5000, int, low=2, high=MAX_POINTS, doc="cap on points per synthetic trajectory")
    step_m: float | None = param(None, float, low=0, low_open=True,
                                 doc="public spacing of consecutive points (metres), e.g. the devices' sampling "
                                     "interval times a typical speed; null: learned privately (the step histogram)")

    @property
    def placing(self) -> bool:
        """Whether the fine stage is released (every output but 'cells', with a positive share)."""
        return self.output != "cells" and self.fine_share > 0


def fine_width(bbox, config: PlacementConfig, n_noisy: float | None = None, eps: float | None = None,
               k: int = 1, at_least: int | None = None) -> int:
    """The public fine grid width: ``fine_w`` when given; else the power of two (8 .. 512) whose cells are nearest
    ``fine_m`` metres along the bbox's longer side, made coarser when the data cannot fill it: with ``n_noisy``
    (a DP count) and the method's ``eps``, no finer than ``sqrt(n eps_d / (k SIGNAL_SHARE TAU))`` cells per side,
    where ``eps_d`` is the density part's epsilon. That bound asks a cell of the ``SIGNAL_SHARE`` of the grid
    where the mass of n trajectories concentrates to hold ``TAU`` Laplace scales ``k / eps_d``: below it the
    release is mostly noise and a coarser grid places points better (GeoLife at eps 1: 400 m cells gave
    trajectory density JSD 0.21 against 0.25 at 100 m). ``at_least``: the cells per side of the method's finest
    coarse cells (public, or derived from DP releases); the automatic width is never coarser, so every coarse cell
    holds fine cells to place and route in (HRNet's 32 x 32 on 1,000 trajectories at eps 1 gave 16 without it, and
    a coarse cell without a fine cell has no anchor). A function of public parameters and DP releases only."""
    if config.fine_w is not None:
        return int(config.fine_w)
    b = BBox.of(bbox)
    mid = math.cos(math.radians((b.min_lat + b.max_lat) / 2))
    extent = max((b.max_lat - b.min_lat) * EARTH_M_PER_DEG, (b.max_lon - b.min_lon) * EARTH_M_PER_DEG * mid)
    exponent = round(math.log2(max(extent / config.fine_m, 1.0)))
    if n_noisy is not None and eps is not None and config.placing:
        eps_d = eps * config.fine_share * parts(config)["density"]
        signal = math.sqrt(max(float(n_noisy), 1.0) * eps_d / (k * SIGNAL_SHARE * TAU))
        exponent = min(exponent, math.floor(math.log2(max(signal, 1.0))))
    if at_least is not None:
        exponent = max(exponent, math.ceil(math.log2(max(int(at_least), 1))))
    return int(2 ** np.clip(exponent, 3, 9))


def parts(config: PlacementConfig) -> dict[str, float]:
    """The parts released and their fractions of the share: both (:data:`PARTS`), or the density alone (all of
    the share) for output 'stays', which places one point per visited cell and needs no spacing, and with a
    public ``step_m``, which spaces points without the step histogram."""
    return {"density": 1.0} if config.output == "stays" or config.step_m is not None else PARTS


def privacy_events(eps: float, config: PlacementConfig, k: int = 1) -> list:
    """The fine stage's accounting events at the method's eps (none when it is off); refuses (DuckmobError) an
    eps whose Laplace scales the noise sampler cannot honour, before any data is read."""
    if not config.placing:
        return []
    for s in scales(eps, config, k).values():
        check_scale(s)
    return [accounting.laplace(eps * config.fine_share * f) for f in parts(config).values()]


def scales(eps: float, config: PlacementConfig, k: int) -> dict[str, float]:
    """Laplace scale of each part: k / (eps * share * fraction)."""
    return {part: k / (eps * config.fine_share * f) for part, f in parts(config).items()}


# -- the private releases ---------------------------------------------------------------------------------------

def _local_xy(bbox: BBox, lat, lon) -> tuple[np.ndarray, np.ndarray]:
    """Metres east/north of the bbox's corner (equirectangular at the bbox's middle latitude: public)."""
    mid = math.cos(math.radians((bbox.min_lat + bbox.max_lat) / 2))
    return ((np.asarray(lon) - bbox.min_lon) * EARTH_M_PER_DEG * mid,
            (np.asarray(lat) - bbox.min_lat) * EARTH_M_PER_DEG)


def fine_cells(data: Trajectories, bbox, w: int, walk: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct fine cells each trajectory passes: ``(cell, owner, n_distinct per trajectory)``, owner sorted.

    With ``walk`` fixes are joined by the integer line walk (privtrace.states), so a sparsely sampled trajectory
    still marks the cells between its fixes; without it, only the cells of the points themselves (output
    'stays': where the modelled stays are). Each trajectory's cells depend on its own points only."""
    from duckmob.synth.privtrace.states import state_sequences, uniform_grid

    if walk:
        _, cells, owner = state_sequences(uniform_grid(bbox, w), data.offsets, data.lat, data.lon)
    else:
        cells, owner = cell_of(data.lat, data.lon, bbox, w), data.point_traj()
    key = np.sort(owner * (w * w) + cells)            # sorted by owner; distinct per trajectory below
    key = key[np.concatenate([[True], key[1:] != key[:-1]])] if len(key) else key   # (np.unique: 5x slower)
    owner, cells = np.divmod(key, w * w)
    return cells, owner, np.bincount(owner, minlength=data.n_trajectories)


def step_bins(data: Trajectories, bbox) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The bin of each step between consecutive fixes: ``(bin, owner, steps per trajectory)``, owner sorted."""
    box = BBox.of(bbox)
    x, y = _local_xy(box, data.lat, data.lon)
    owner = data.point_traj()
    same = owner[1:] == owner[:-1]
    d = np.hypot(np.diff(x), np.diff(y))[same]
    step_owner = owner[1:][same]
    b = np.clip(np.searchsorted(STEP_EDGES_M, d, side="right") - 1, 0, len(STEP_EDGES_M) - 2)
    return b, step_owner, np.bincount(step_owner, minlength=data.n_trajectories)


def release(data, bbox, eps: float, config: PlacementConfig, noise, k: int = 1,
            n_noisy: float | None = None, at_least: int | None = None) -> "FineStats":
    """The fine stage's two releases (module docstring): eps * fine_share in total, k trajectories per unit.
    ``data``: :class:`Trajectories` or :class:`duckmob.source.batches.Batches` (the statistics summed batch by
    batch)."""
    w = fine_width(bbox, config, n_noisy, eps, k, at_least)
    sc = scales(eps, config, k)
    walk = config.output != "stays"
    return release_statistics(as_batches(data).reduce(lambda d: statistics(d, bbox, w, sc, walk)), w, sc, noise,
                              n_noisy)


def statistics(data: Trajectories, bbox, w: int, sc: dict[str, float], walk: bool = True) -> dict[str, np.ndarray]:
    """The EXACT statistics of the parts in ``sc`` (never release them): whole noise-grid steps per fine cell and
    per step bin (``counting.normalised_sums``). Integers: the sums over batches of whole trajectories add up to
    the sums over all of them (``duckmob.source``). ``walk``: the density of the cells the fixes' line walk
    passes (False: of the fixes' own cells, output 'stays'; :func:`fine_cells`)."""
    cells, owner, n_cells = fine_cells(data, bbox, w, walk=walk)
    out = {"fine_density": normalised_sums(cells, owner, n_cells, w * w, sc["density"])}
    if "steps" in sc:
        b, step_owner, n_steps = step_bins(data, bbox)
        out["fine_steps"] = normalised_sums(b, step_owner, n_steps, len(STEP_EDGES_M) - 1, sc["steps"])
    return out


def release_statistics(sums: dict[str, np.ndarray], w: int, sc: dict[str, float], noise,
                       n_noisy: float | None = None) -> "FineStats":
    """The noise of the two parts on their exact statistics (:func:`statistics`), then post-processing.
    ``n_noisy`` (a DP count; None: the noisy step histogram's own total) sets the step histogram's blocks
    (:func:`step_block`)."""
    density = release_sums(sums["fine_density"], sc["density"], noise)
    if "steps" not in sc:     # output 'stays', or a public step_m: the density alone
        return FineStats(w=w, density=adaptive_density(density, w, sc["density"]).astype(np.float32),
                         steps=np.zeros(len(STEP_EDGES_M) - 1))
    steps = release_sums(sums["fine_steps"], sc["steps"], noise)
    from duckmob.synth.privtrace.walk import truncate_tail   # (privtrace imports this module)

    # post-processing: summed over blocks of public bins (step_block), the long tail past where the histogram
    # falls to the noise (STEP_TAU) is zeroed (noise there would make kilometre steps, and a trajectory few
    # points), and so is the short head before it rises above the noise (noise there, weighted by nothing but its
    # count, would make centimetre steps: seven times too many points on 1,000 trajectories at HRNet's share
    # before blocks), then NormCut, then each block's mass is spread evenly over its bins (uniform in log over
    # the block)
    m = step_block(float(n_noisy) if n_noisy is not None else float(steps.sum()), sc["steps"])
    n_bins = len(steps)
    padded = np.zeros(-(-n_bins // m) * m)
    padded[:n_bins] = steps
    blocks, bscale = padded.reshape(-1, m).sum(axis=1), sc["steps"] * math.sqrt(m)   # the block sums' spread
    tau = STEP_TAU if m > 1 else 1.0
    if steps_mostly_noise(blocks, n_noisy, bscale):
        # no spacing can be read from noise: steps all zero, and the sampler spaces points one fine cell apart
        # (a public length); the highest noisy block gave centimetre steps (5,000 points a trajectory) on 30
        # trajectories at eps 1
        return FineStats(w=w, density=adaptive_density(density, w, sc["density"]).astype(np.float32),
                         steps=np.zeros(n_bins))
    kept = truncate_tail(truncate_tail(blocks, bscale, tau)[::-1], bscale, tau)[::-1]
    if not (kept > 0).any():       # nothing above the noise: the highest block alone, not every bin evenly
        kept = (np.arange(len(blocks)) == np.argmax(blocks)).astype(np.float64)
    blocks = normcut(kept[None, :], axis=-1)[0]
    return FineStats(w=w, density=adaptive_density(density, w, sc["density"]).astype(np.float32),
                     steps=np.repeat(blocks / m, m)[:n_bins])


def steps_mostly_noise(blocks: np.ndarray, n_noisy: float | None, block_scale: float) -> bool:
    """Whether the released step histogram (summed over its blocks) is mostly noise, told from released values and
    the public noise scale alone (post-processing): the mass it describes -- its positive blocks' sum, and at most
    the DP trajectory count ``n_noisy`` (one unit of mass a trajectory) -- is below the 95% margin of one block's
    noise (``block_scale`` ln 20), so that even all of it in one block could be that block's noise."""
    mass = float(np.clip(blocks, 0, None).sum())
    if n_noisy is not None:
        mass = min(mass, float(n_noisy))
    return mass < block_scale * math.log(20)


def step_block(n_noisy: float, scale: float) -> int:
    """Public step bins per block of the released step histogram: ``ceil(bins / B)`` with
    ``B = STEP_BLOCKS_C sqrt(n~ / scale)`` blocks (``n~ / scale = n~ eps_steps / k``: the histogram's mass in
    noise scales; a function of a DP count and public parameters). A block of m bins holds m bins' mass under
    noise of spread sqrt(m) scales, so few trajectories or a small share get wide blocks. 1,000 GeoLife
    trajectories at eps 0.02 (HRNet's share at eps 1), 8 noise draws: single bins gave a median mean step of 18 m
    (real 110 m; JSD 0.48 with the exact histogram), blocks of 4-6 bins 160-270 m (JSD 0.13-0.16). Large tables
    keep every bin (PrivTrace on 16,739 trajectories at eps 1: B = 52 >= 48 bins)."""
    n_bins = len(STEP_EDGES_M) - 1
    blocks = STEP_BLOCKS_C * math.sqrt(max(float(n_noisy), 1.0) / scale)
    return int(min(max(math.ceil(n_bins / max(blocks, 1.0)), 1), n_bins))


def adaptive_density(noisy: np.ndarray, w: int, scale: float, tau: float = 2.0, levels: int = 4) -> np.ndarray:
    """Denoise the noisy fine density by a quadtree (post-processing): each fine cell takes, from the finest
    level up, the first block (2^l x 2^l fine cells, l = 0 .. levels) whose noisy sum exceeds ``tau`` standard
    deviations of its noise (sqrt(2) scale 2^l: the sum of 4^l Laplace draws), and shares evenly what of that
    sum the block's already resolved cells did not take; below that at every level it gets the same share of
    its top-level block, clipped at 0. Dense streets keep their fine
    detail; where the signal is below the noise, mass is spread instead of following noise peaks."""
    grid = np.asarray(noisy, dtype=np.float64).reshape(w, w)
    out = np.full((w, w), np.nan)

    def blocks(x, b):
        return x.reshape(w // b, b, w // b, b).sum(axis=(1, 3))

    def spread(x, b):
        return np.repeat(np.repeat(x, b, axis=0), b, axis=1)

    for lev in range(levels + 1):
        b = 1 << lev
        if w % b:
            break
        sums = blocks(grid, b)
        open_ = np.isnan(out)
        taken = blocks(np.where(open_, 0.0, out), b)          # mass already given to resolved cells
        n_open = blocks(open_.astype(np.float64), b)
        rest = np.maximum(sums - taken, 0.0) / np.maximum(n_open, 1.0)
        strong = sums > tau * math.sqrt(2.0) * scale * b
        value = spread(np.where(strong, rest, np.nan), b)
        fill = open_ & ~np.isnan(value)
        out[fill] = value[fill]
        last = spread(rest, b)
    out = np.where(np.isnan(out), last, out)
    return np.maximum(out, 0.0).reshape(-1)


@dataclass
class FineStats:
    """The released fine statistics (post-processed: non-negative)."""

    w: int
    density: np.ndarray     # (w * w,) float32
    steps: np.ndarray       # (len(STEP_EDGES_M) - 1,)

    def arrays(self, prefix: str = "fine_") -> dict[str, np.ndarray]:
        return {f"{prefix}w": np.array(self.w), f"{prefix}density": self.density, f"{prefix}steps": self.steps}

    @classmethod
    def from_arrays(cls, z, prefix: str = "fine_") -> "FineStats | None":
        if f"{prefix}w" not in z:
            return None
        return cls(int(z[f"{prefix}w"]), np.asarray(z[f"{prefix}density"]), np.asarray(z[f"{prefix}steps"]))


# -- sampling (post-processing) ----------------------------------------------------------------------------------

_DELTAS = np.array([(-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1)], dtype=np.int64)


class Placement:
    """Routes and points for coarse cell sequences, from :class:`FineStats` and the coarse partition.

    ``coarse_of_fine`` (w * w,) gives the coarse cell of each fine cell (by its centre), ``n_coarse`` their
    number. Everything here is post-processing of released statistics and public parameters."""

    def __init__(self, stats: FineStats, bbox, coarse_of_fine: np.ndarray, n_coarse: int, anchors: int = 8,
                 route_draws: int = 4, step_m: float | None = None):
        self.stats, self.bbox, self.w = stats, BBox.of(bbox), stats.w
        self.coarse = np.asarray(coarse_of_fine, dtype=np.int64)
        self.n_coarse = int(n_coarse)
        self.route_draws = int(route_draws)
        self.step_m = None if step_m is None else float(step_m)   # public spacing (else the released steps)
        self._neighbour_keys = None          # lazily: the coarse neighbour pairs (_neighbours)
        w = self.w
        d = np.maximum(np.asarray(stats.density, dtype=np.float64), 0.0)
        total = d.sum()
        self.p = d / total if total > 0 else np.full(w * w, 1.0 / (w * w))
        floor = FLOOR / (w * w)
        # entering a fine cell costs -log p up to a constant: log(peak / p) >= 0 (csgraph needs non-negative
        # weights and drops zero ones: + 1e-3 per step)
        q = self.p + floor
        self.cost = np.log(q.max() / q) + 1e-3
        # fine cells grouped by coarse cell, densest first; ties (cells of one evenly spread block) in a fixed
        # scrambled order, so anchors do not crowd into a block's corner
        scramble = (np.arange(w * w, dtype=np.uint64) * np.uint64(2654435761)) % np.uint64(1 << 32)
        order = np.lexsort((scramble, -self.p, self.coarse))
        self.cell_order = order
        counts = np.bincount(self.coarse, minlength=self.n_coarse)
        self.cell_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.rank = np.empty(w * w, dtype=np.int64)
        self.rank[order] = np.arange(w * w) - self.cell_offsets[self.coarse[order]]
        # anchors: the densest `anchors` fine cells of each coarse cell; probability in proportion to density
        h = int(anchors)
        n_anchor = np.minimum(counts, h)
        self.anchor_offsets = np.concatenate([[0], np.cumsum(n_anchor)]).astype(np.int64)
        owner = np.repeat(np.arange(self.n_coarse), n_anchor)
        pos = np.arange(len(owner)) - self.anchor_offsets[owner]
        self.anchor_cells = order[self.cell_offsets[owner] + pos]
        weight = self.p[self.anchor_cells]
        mass = np.bincount(owner, weights=weight, minlength=self.n_coarse)
        # a coarse cell without released mass: its anchors are equally likely
        self.anchor_weight = np.where(mass[owner] > 0, weight, 1.0)

    # -- anchors -----------------------------------------------------------------------------------------
    def draw_anchor(self, coarse: np.ndarray, rng: np.random.Generator, exclude: np.ndarray | None = None):
        """One anchor (global fine cell) per entry of ``coarse``, in proportion to its density; ``exclude`` (fine
        cells) is avoided where the coarse cell has another anchor."""
        coarse = np.asarray(coarse, dtype=np.int64)
        lo, hi = self.anchor_offsets[coarse], self.anchor_offsets[coarse + 1]
        wmax = int((hi - lo).max()) if len(coarse) else 0
        idx = lo[:, None] + np.arange(max(wmax, 1))[None, :]
        valid = idx < hi[:, None]
        wts = np.where(valid, self.anchor_weight[np.minimum(idx, len(self.anchor_cells) - 1)], 0.0)
        cells = self.anchor_cells[np.minimum(idx, len(self.anchor_cells) - 1)]
        if exclude is not None:
            other = valid & (cells != exclude[:, None])
            has_other = other.any(axis=1)
            wts = np.where(has_other[:, None] & ~other, 0.0, wts)
        cum = np.cumsum(wts, axis=1)
        u = rng.random(len(coarse)) * cum[:, -1]
        col = np.minimum((cum <= u[:, None]).sum(axis=1), np.maximum(hi - lo - 1, 0))
        return cells[np.arange(len(coarse)), col]

    def place(self, coarse: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One point per entry of ``coarse``: a fine cell inside that coarse cell drawn in proportion to the
        released density (uniformly among its fine cells where it has no mass), then a uniform position inside
        the fine cell. ``(lat, lon, placed)``, vectorised; ``placed`` is False where the coarse cell holds no fine
        cell centre (a fine grid coarser than the method's): the caller keeps its own point there."""
        coarse = np.asarray(coarse, dtype=np.int64)
        lo, hi = self.cell_offsets[coarse], self.cell_offsets[coarse + 1]
        cum = np.cumsum(self.p[self.cell_order])
        before = np.where(lo > 0, cum[np.maximum(lo - 1, 0)], 0.0)
        mass = np.where(hi > lo, cum[np.maximum(hi - 1, 0)] - before, 0.0)
        u = rng.random(len(coarse))
        by_mass = np.searchsorted(cum, before + u * mass, side="right")
        by_count = lo + np.floor(u * (hi - lo)).astype(np.int64)
        pos = np.clip(np.where(mass > 0, by_mass, by_count), lo, np.maximum(hi - 1, lo))
        fine = self.cell_order[np.minimum(pos, len(self.cell_order) - 1)]
        r, c = np.divmod(fine, self.w)
        v = rng.random((2, len(coarse)))
        box = self.bbox
        lat = box.min_lat + (r + v[0]) * (box.max_lat - box.min_lat) / self.w
        lon = box.min_lon + (c + v[1]) * (box.max_lon - box.min_lon) / self.w
        return lat, lon, hi > lo

    # -- routes ------------------------------------------------------------------------------------------
    def _route_table(self, pairs: np.ndarray, cost: np.ndarray, target: int | None = None):
        """Routes of the coarse moves ``pairs`` (k, 2) from every anchor of A to the cheapest anchor of B (or to
        B's anchor number ``target``, where B has it) over the fine cells of A and B under per-cell ``cost``: one
        multi-source Dijkstra over the block-diagonal graph of all moves. A pair with A = B is a leg inside one
        coarse cell (its graph: that cell's fine cells once)."""
        w = self.w
        a, b = pairs[:, 0], pairs[:, 1]
        size_a = np.diff(self.cell_offsets)[a]
        off_b = np.where(a == b, 0, size_a)                 # where B's nodes start inside the move's block
        size_b = np.diff(self.cell_offsets)[b]
        size = off_b + size_b
        base = np.concatenate([[0], np.cumsum(size)]).astype(np.int64)
        n_nodes = int(base[-1])
        move = np.repeat(np.arange(len(pairs)), size)
        local = np.arange(n_nodes) - base[move]
        in_a = local < off_b[move]
        coarse_of_node = np.where(in_a, a[move], b[move])
        fine = self.cell_order[self.cell_offsets[coarse_of_node] + np.where(in_a, local, local - off_b[move])]
        # edges u -> v between 8-neighbouring fine cells of the same move (both in A or B)
        r, c = np.divmod(fine, w)
        src, dst, wt = [], [], []
        for dr, dc in _DELTAS:
            rr, cc = r + dr, c + dc
            ok = (rr >= 0) & (rr < w) & (cc >= 0) & (cc < w)
            nb = np.where(ok, rr * w + cc, 0)
            cb = self.coarse[nb]
            ok &= (cb == a[move]) | (cb == b[move])
            # local index of the neighbour inside the move
            v = base[move] + np.where(cb == a[move], self.rank[nb], off_b[move] + self.rank[nb])
            u = np.flatnonzero(ok)
            src.append(u)
            dst.append(v[u])
            wt.append(cost[nb[u]] * math.hypot(dr, dc))
        src, dst, wt = np.concatenate(src), np.concatenate(dst), np.concatenate(wt)
        # reversed graph (search from B's anchors back): edge v -> u carries the cost of moving u -> v
        graph = sp.csr_matrix((wt, (dst, src)), shape=(n_nodes, n_nodes))
        # sources: the anchors of B in every move (their local ranks are < anchors of B), or its target-th one
        n_anchor_b = np.diff(self.anchor_offsets)[b]
        if target is None:
            src_nodes = ragged_gather(base[:-1] + off_b, n_anchor_b)
        else:
            src_nodes = (base[:-1] + off_b + target)[n_anchor_b > target]
        if n_nodes == 0 or len(src_nodes) == 0:
            pred = np.full(n_nodes, -9999, dtype=np.int64)
        else:
            _, pred = dijkstra(graph, directed=True, indices=src_nodes, return_predecessors=True, min_only=True)[:2]
        return base, fine, np.asarray(pred, dtype=np.int64)

    def route_table(self, moves: np.ndarray, cost: np.ndarray | None = None, target: int | None = None):
        """For the coarse moves ``moves`` (distinct, as ``a * n_coarse + b``): the route from every anchor of A,
        ``(first, offsets, cells, end)``: route ``first[i] + j`` starts at A's j-th anchor, its fine cells are
        ``cells[offsets[r]:offsets[r + 1]]`` (start included, ending at an anchor of B), and ``end[r]`` is that
        anchor's index in B. A move whose fine cells do not connect jumps to B's densest anchor. ``cost``: per
        fine cell (default: the released density's ``-log p`` costs). ``target``: end at B's anchor number
        ``target`` instead of the cheapest (every B must have it); with A = B, a leg inside A."""
        pairs = np.stack(np.divmod(np.asarray(moves, dtype=np.int64), self.n_coarse), axis=1)
        base, fine, pred = self._route_table(pairs, self.cost if cost is None else cost, target)
        a, b = pairs[:, 0], pairs[:, 1]
        n_anchor_a = np.diff(self.anchor_offsets)[a]
        first = np.concatenate([[0], np.cumsum(n_anchor_a)]).astype(np.int64)
        r_move = np.repeat(np.arange(len(pairs)), n_anchor_a)
        j = np.arange(len(r_move)) - first[r_move]
        # an anchor of A is among A's densest cells: its local rank is j
        cur = base[r_move] + j
        n = len(r_move)
        paths, owners = [cur], [np.arange(n)]
        alive = np.arange(n)
        for _ in range(len(fine) + 1):
            nxt = pred[cur]
            go = nxt >= 0
            if not go.any():
                break
            alive, cur = alive[go], nxt[go]
            paths.append(cur)
            owners.append(alive)
        nodes, owner = np.concatenate(paths), np.concatenate(owners)
        order = np.argsort(owner, kind="stable")
        cells, owner = fine[nodes[order]], owner[order]
        lengths = np.bincount(owner, minlength=n)
        last = np.cumsum(lengths) - 1
        # where each route must end: inside B, or at B's target-th anchor; one that cannot (its fine cells do not
        # connect) jumps there (B's densest anchor without a target)
        want = self.anchor_cells[self.anchor_offsets[b[r_move]] + (0 if target is None else target)]
        stuck = (self.coarse[cells[last]] != b[r_move]) if target is None else (cells[last] != want)
        if stuck.any():
            cells = np.concatenate([cells, want[stuck]])
            owner = np.concatenate([owner, np.flatnonzero(stuck)])
            order = np.argsort(owner, kind="stable")
            cells, owner = cells[order], owner[order]
            lengths = np.bincount(owner, minlength=n)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        end_cell = cells[offsets[1:] - 1]
        return first, offsets, cells, self.rank[end_cell]

    def route_tables(self, moves: np.ndarray, rng: np.random.Generator):
        """:meth:`route_table` under ``self.route_draws`` cost fields: the first with the released costs, the
        others with each fine cell's cost multiplied by an independent log-normal factor (sigma
        ``ROUTE_SPREAD``). Real trips between two areas use several streets; one most probable path per move
        sends every synthetic trip down the same one (GeoLife, eps 1: trajectory density JSD 0.23 with one
        route per move). Returns ``(first (draws, moves), offsets, cells, end)`` over all draws together."""
        firsts, offs, cells, ends = [], [], [], []
        n_routes = n_cells = 0
        for d in range(self.route_draws):
            cost = self.cost if d == 0 else self.cost * np.exp(ROUTE_SPREAD * rng.standard_normal(len(self.cost)))
            first, r_off, r_cells, r_end = self.route_table(moves, cost)
            firsts.append(first[:-1] + n_routes)
            offs.append(r_off[:-1] + n_cells)
            cells.append(r_cells)
            ends.append(r_end)
            n_routes += len(r_end)
            n_cells += len(r_cells)
        return (np.stack(firsts), np.concatenate(offs + [np.array([n_cells])]).astype(np.int64),
                np.concatenate(cells), np.concatenate(ends))

    def leg_paths(self, coarse: np.ndarray, start: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Most probable fine paths inside one coarse cell each: from the anchor cell ``start[i]`` of
        ``coarse[i]`` to that cell's anchor number ``target[i]``; ``(offsets, cells)``, both ends included. One
        :meth:`route_table` (a Dijkstra over the cells used) per distinct target number."""
        coarse, start, target = (np.asarray(x, dtype=np.int64) for x in (coarse, start, target))
        pieces, owners = [], []
        for t in np.unique(target):
            sel = np.flatnonzero(target == t)
            moves, move_of = np.unique(coarse[sel] * (self.n_coarse + 1), return_inverse=True)
            first, r_off, r_cells, _ = self.route_table(moves, target=int(t))
            r = first[move_of] + self.rank[start[sel]]
            n_r = np.diff(r_off)[r]
            pieces.append(r_cells[ragged_gather(r_off[r], n_r)])
            owners.append(np.repeat(sel, n_r))
        owner = np.concatenate(owners)
        order = np.argsort(owner, kind="stable")
        lengths = np.bincount(owner, minlength=len(coarse))
        return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), np.concatenate(pieces)[order]

    def _neighbours(self) -> np.ndarray:
        """Sorted keys ``a * n_coarse + b`` of the coarse cells a != b that hold 8-neighbouring fine cells (a route
        between them stays on their fine cells)."""
        if self._neighbour_keys is None:
            w = self.w
            r, c = np.divmod(np.arange(w * w), w)
            keys = []
            for dr, dc in _DELTAS:
                rr, cc = r + dr, c + dc
                ok = (rr >= 0) & (rr < w) & (cc >= 0) & (cc < w)
                a, b = self.coarse[ok], self.coarse[(rr * w + cc)[ok]]
                keys.append((a * self.n_coarse + b)[a != b])
            self._neighbour_keys = np.unique(np.concatenate(keys))
        return self._neighbour_keys

    def bridge(self, offsets: np.ndarray, coarse: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Coarse sequences whose consecutive cells can all be routed: between two consecutive cells that are
        not neighbours (HRNet's stays are often far apart), the cells met by the straight line between their
        fine cells' centroids (the integer line walk on the fine grid, privtrace.states) are inserted, so the
        route follows the released streets the whole way instead of jumping. ``(offsets, coarse, into)``:
        ``into[j]`` is the index, in its original sequence, of the original cell that cell j leads to (itself,
        or the next original cell for an inserted one). Post-processing; vectorised over moves."""
        from duckmob.synth.privtrace.states import state_sequences, uniform_grid

        offsets = np.asarray(offsets, dtype=np.int64)
        coarse = np.asarray(coarse, dtype=np.int64)
        n, nc = len(offsets) - 1, self.n_coarse
        owner = np.repeat(np.arange(n), np.diff(offsets))
        local = np.arange(len(coarse)) - offsets[owner]
        i = np.flatnonzero(owner[1:] == owner[:-1]) if len(coarse) else np.zeros(0, np.int64)
        a, b = coarse[i], coarse[i + 1]
        size = np.diff(self.cell_offsets)
        keys = a * nc + b
        nb = self._neighbours()
        near = a == b
        if len(nb):
            pos = np.minimum(np.searchsorted(nb, keys), len(nb) - 1)
            near |= nb[pos] == keys
        far = ~near & (size[a] > 0) & (size[b] > 0)
        if not far.any():
            return offsets, coarse, local
        moves, move_of = np.unique(keys[far], return_inverse=True)
        ma, mb = np.divmod(moves, nc)
        # the centroid of each coarse cell's fine cells (degrees)
        r, c = np.divmod(np.arange(self.w * self.w), self.w)
        cnt = np.maximum(size, 1)
        box = self.bbox
        cent_lat = box.min_lat + (np.bincount(self.coarse, r + 0.5, nc) / cnt) * (box.max_lat - box.min_lat) / self.w
        cent_lon = box.min_lon + (np.bincount(self.coarse, c + 0.5, nc) / cnt) * (box.max_lon - box.min_lon) / self.w
        ends = np.stack([ma, mb], axis=1).reshape(-1)
        w_off, w_cells, w_owner = state_sequences(uniform_grid(box, self.w), np.arange(0, 2 * len(moves) + 1, 2),
                                                  cent_lat[ends], cent_lon[ends])
        chain = self.coarse[w_cells]
        keep = np.ones(len(chain), dtype=bool)
        keep[1:] = (chain[1:] != chain[:-1]) | (w_owner[1:] != w_owner[:-1])
        chain, w_owner = chain[keep], w_owner[keep]
        # the inner cells: the walk's coarse cells less A at its start and B at its end
        first = np.concatenate([[True], w_owner[1:] != w_owner[:-1]])
        last = np.concatenate([w_owner[1:] != w_owner[:-1], [True]])
        inner = ~((first & (chain == ma[w_owner])) | (last & (chain == mb[w_owner])))
        chain, w_owner = chain[inner], w_owner[inner]
        n_inner = np.bincount(w_owner, minlength=len(moves))
        inner_start = np.concatenate([[0], np.cumsum(n_inner)[:-1]]).astype(np.int64)
        # splice: original cell p is followed by the inner cells of its move when that move is far
        at = i[far]
        extra = n_inner[move_of]
        counts = np.ones(len(coarse), dtype=np.int64)
        counts[at] += extra
        csum = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        out = np.empty(int(csum[-1]), dtype=np.int64)
        into = np.empty(int(csum[-1]), dtype=np.int64)
        out[csum[:-1]] = coarse
        into[csum[:-1]] = local
        dest = ragged_gather(csum[at] + 1, extra)
        out[dest] = chain[ragged_gather(inner_start[move_of], extra)]
        into[dest] = np.repeat(local[at] + 1, extra)
        return csum[offsets], out, into

    def fine_paths(self, offsets: np.ndarray, coarse: np.ndarray, rng: np.random.Generator, with_pos: bool = False):
        """Fine-cell paths of coarse cell sequences ``(offsets, coarse)``: ``(offsets, cells)``.

        Every move's routes come from one :meth:`route_table`; then a loop over the position in the sequence
        (integer lookups vectorised over trajectories) chains them: each route starts at the anchor where the
        previous one ended; the last leg (:meth:`leg_paths`) ends at an anchor of the last cell drawn by
        density, another than the start for a one-cell sequence. Non-neighbouring consecutive cells are joined
        first (:meth:`bridge`). ``with_pos``: also each fine cell's piece, an int64 array: 0 the start, j the
        route into the sequence's j-th coarse cell (the bridge before it included), L the last leg."""
        n_orig = np.diff(np.asarray(offsets, dtype=np.int64))
        offsets, coarse, into = self.bridge(offsets, coarse)
        n = len(offsets) - 1
        L = np.diff(offsets)
        if n == 0:
            empty = np.zeros(0, dtype=np.int64)
            return (np.zeros(1, dtype=np.int64), empty) + ((empty,) if with_pos else ())
        start = self.draw_anchor(coarse[offsets[:-1]], rng)
        # every move of every sequence, in order
        owner_pt = np.repeat(np.arange(n), L)
        has_next = np.zeros(len(coarse), dtype=bool)
        has_next[:-1] = owner_pt[1:] == owner_pt[:-1]
        i = np.flatnonzero(has_next)
        keys = coarse[i] * self.n_coarse + coarse[i + 1]
        moves, move_of = np.unique(keys, return_inverse=True)
        first, r_off, r_cells, r_end = self.route_tables(moves, rng) if len(moves) else (None,) * 4
        # chain: the route taken at each move (its anchor index in A follows from the previous route)
        route = np.empty(len(i), dtype=np.int64)
        step_pos = i - offsets[owner_pt[i]]                 # 0 for the first move of a sequence
        table = rng.integers(0, len(first), len(i)) if len(i) else np.zeros(0, np.int64)   # which route draw
        anchor = self.rank[start]                           # index among the first cell's anchors
        cur_anchor = anchor.copy()
        for t in range(int(step_pos.max()) + 1 if len(i) else 0):
            at = np.flatnonzero(step_pos == t)
            who = owner_pt[i[at]]
            r = first[table[at], move_of[at]] + cur_anchor[who]
            route[at] = r
            cur_anchor[who] = r_end[r]
        pieces_owner, pieces_cells, pieces_pos = [np.arange(n)], [start], [np.zeros(n)]
        if len(i):
            r_len = np.diff(r_off)[route]
            # the routes' cells, start cell dropped (it ends the previous piece)
            pieces_cells.append(r_cells[ragged_gather(r_off[route] + 1, r_len - 1)])
            pieces_owner.append(np.repeat(owner_pt[i], r_len - 1))
            pieces_pos.append(np.repeat(into[i + 1].astype(np.float64), r_len - 1))
        # the last leg, inside the last cell: from where the chain arrived (L > 1; the start for L = 1) to an
        # anchor drawn by density (another one for L = 1), so a trajectory ends where trips end rather than at
        # the border of its last cell nearest the previous one
        last_coarse = coarse[offsets[1:] - 1]
        arrived = self.anchor_cells[self.anchor_offsets[last_coarse] + cur_anchor]
        end = self.draw_anchor(last_coarse, rng, exclude=np.where(L == 1, start, -1))
        leg = np.flatnonzero(end != arrived)
        if len(leg):
            l_off, l_cells = self.leg_paths(last_coarse[leg], arrived[leg], self.rank[end[leg]])
            l_len = np.diff(l_off)
            pieces_cells.append(l_cells[ragged_gather(l_off[:-1] + 1, l_len - 1)])
            pieces_owner.append(np.repeat(leg, l_len - 1))
            pieces_pos.append(np.repeat(n_orig[leg].astype(np.float64), l_len - 1))
        owner = np.concatenate(pieces_owner)
        pos = np.concatenate(pieces_pos)
        order = np.lexsort((pos, owner))   # stable within a piece
        lengths = np.bincount(owner, minlength=n)
        out = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), np.concatenate(pieces_cells)[order]
        return out + ((pos[order].astype(np.int64),) if with_pos else ())

    def cell_m(self) -> float:
        """The side of a fine cell in metres (the mean of its two sides): the spacing of points when the released
        step histogram was mostly noise (:func:`steps_mostly_noise`)."""
        box = self.bbox
        x, y = _local_xy(box, np.array([box.min_lat, box.max_lat]), np.array([box.min_lon, box.max_lon]))
        return float((abs(x[1] - x[0]) + abs(y[1] - y[0])) / (2 * self.w))

    def points(self, offsets: np.ndarray, coarse: np.ndarray, rng: np.random.Generator,
               max_points: int = 5000, times: np.ndarray | None = None):
        """Synthetic points for coarse cell sequences: ``(lengths, lat, lon)`` (see the module docstring).

        ``times`` (int64 µs, non-decreasing within each sequence): the time at each coarse cell of every sequence
        (``max(L, 2)`` per sequence: a one-cell sequence gives the times of its first and last point); then
        ``(lengths, lat, lon, ts)``, each point timed by its distance along the route between the times of the two
        cells it runs between (constant speed on each route; the last leg ends at the last cell's time)."""
        f_off, f_cells, f_pos = self.fine_paths(offsets, coarse, rng, with_pos=True)
        n = len(f_off) - 1
        box, w = self.bbox, self.w
        # route vertices: each fine cell's position jittered uniformly inside it
        r, c = np.divmod(f_cells, w)
        u = rng.random((2, len(f_cells)))
        dlat, dlon = (box.max_lat - box.min_lat) / w, (box.max_lon - box.min_lon) / w
        vlat = box.min_lat + (r + u[0]) * dlat
        vlon = box.min_lon + (c + u[1]) * dlon
        x, y = _local_xy(box, vlat, vlon)
        v_owner = np.repeat(np.arange(n), np.diff(f_off))
        seg = np.hypot(np.diff(x), np.diff(y))
        seg = np.where(v_owner[1:] == v_owner[:-1], seg, 0.0)
        along = np.concatenate([[0.0], np.cumsum(seg)])          # synthetic data only: no privacy concern
        route_start = along[f_off[:-1]]
        route_len = along[f_off[1:] - 1] - route_start
        # steps from the released histogram (uniform in log inside a bin), or the public step_m; enough draws per
        # trajectory to cover its route, capped at max_points
        probs = np.asarray(self.stats.steps, dtype=np.float64)
        step_m = self.step_m if self.step_m is not None or probs.sum() > 0 else self.cell_m()
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
        s_owner = np.repeat(np.arange(n), want)
        if step_m is not None:
            step = np.full(len(s_owner), step_m)
        else:
            b = np.minimum(np.searchsorted(cdf, rng.random(len(s_owner)), side="right"), len(lo) - 1)
            t = rng.random(len(s_owner))
            lo_b = np.maximum(lo[b], 1e-12)
            step = np.where(lo[b] > 0, np.exp(np.log(lo_b) + t * np.log(hi[b] / lo_b)), hi[b] * t)
        # a route longer than max_points draws cover: its steps stretched to reach the end (evenly spaced, not a
        # jump from the last draw to the end)
        cover = np.bincount(s_owner, weights=step, minlength=n)
        stretch = np.where(cover < route_len, route_len / np.maximum(cover, 1e-300), 1.0)
        step = step * stretch[s_owner]
        s_first = np.concatenate([[0], np.cumsum(want)])[:-1]
        csum = np.cumsum(step)
        dist = csum - np.repeat(csum[s_first] - step[s_first], want)   # distance of each draw along its route
        keep = dist < route_len[s_owner]
        d_owner, d = s_owner[keep], dist[keep]
        # every trajectory: its start (distance 0), its kept draws (increasing), its end; placed without a sort
        kept = np.bincount(d_owner, minlength=n)
        lengths = kept + 2
        out_off = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        p_owner = np.repeat(np.arange(n), lengths)
        p_dist = np.empty(int(out_off[-1]))
        p_dist[out_off[:-1]] = 0.0
        p_dist[out_off[1:] - 1] = route_len
        p_dist[ragged_gather(out_off[:-1] + 1, kept)] = d           # d_owner is sorted, d increasing in it
        target = route_start[p_owner] + p_dist
        # interpolate on the owner's polyline
        idx = np.searchsorted(along, target, side="right") - 1
        idx = np.clip(idx, f_off[p_owner], np.maximum(f_off[p_owner + 1] - 2, f_off[p_owner]))
        nxt = np.minimum(idx + 1, f_off[p_owner + 1] - 1)
        span = along[nxt] - along[idx]
        frac = np.where(span > 0, np.clip((target - along[idx]) / np.where(span > 0, span, 1.0), 0, 1), 0.0)
        lat = vlat[idx] + (vlat[nxt] - vlat[idx]) * frac
        lon = vlon[idx] + (vlon[nxt] - vlon[idx]) * frac
        if times is None:
            return lengths, lat, lon
        return lengths, lat, lon, self._times(offsets, f_pos, v_owner, along, p_owner, nxt, target, times)

    @staticmethod
    def _times(offsets, f_pos, v_owner, along, p_owner, nxt, target, times) -> np.ndarray:
        """Each point's time (see :meth:`points`): piece q of a sequence (the route into its q-th cell; the last
        leg joins the last route, or is piece 1 of a one-cell sequence) runs from ``times[q - 1]`` to
        ``times[q]`` at constant speed along its vertices' (warped) distance."""
        L = np.diff(np.asarray(offsets, dtype=np.int64))
        n_piece = np.maximum(L - 1, 1)                      # pieces 1 .. n_piece; times has n_piece + 1 per sequence
        t = np.asarray(times, dtype=np.int64)
        if len(t) != int((n_piece + 1).sum()):
            raise ValueError("times must hold max(L, 2) entries per sequence")
        t_first = np.concatenate([[0], np.cumsum(n_piece + 1)[:-1]])
        q = np.minimum(f_pos, n_piece[v_owner])             # vertex -> piece (0: the start vertex)
        width = int(n_piece.max()) + 1 if len(n_piece) else 1
        key = v_owner * width + q                           # sorted: vertices are by (sequence, piece)
        pq = np.maximum(q[nxt], 1)                          # a point belongs to the piece of the vertex it runs to
        k = p_owner * width + pq
        # the distance where piece k - 1 ends and where piece k ends (its last vertex, or the one before it)
        d0 = along[np.searchsorted(key, k - 1, side="right") - 1]
        d1 = along[np.searchsorted(key, k, side="right") - 1]
        frac = np.where(d1 > d0, np.clip((target - d0) / np.where(d1 > d0, d1 - d0, 1.0), 0.0, 1.0), 1.0)
        a, b = t[t_first[p_owner] + pq - 1], t[t_first[p_owner] + pq]
        ts = a + np.round((b - a) * frac).astype(np.int64)
        # the first point is at the first cell's time and the last at the last's, whatever the route's length
        edge = np.concatenate([[True], p_owner[1:] != p_owner[:-1]]) if len(p_owner) else np.zeros(0, bool)
        ts[edge] = t[t_first[p_owner[edge]]]
        end = np.concatenate([edge[1:], [True]]) if len(p_owner) else edge
        ts[end] = t[t_first[p_owner[end]] + n_piece[p_owner[end]]]
        return ts


def coarse_of_fine(w: int, bbox, locate) -> np.ndarray:
    """The coarse cell of every fine cell's centre, by ``locate(lat, lon)`` (the method's own cell function)."""
    b = BBox.of(bbox)
    r, c = np.divmod(np.arange(w * w), w)
    lat = b.min_lat + (r + 0.5) * (b.max_lat - b.min_lat) / w
    lon = b.min_lon + (c + 0.5) * (b.max_lon - b.min_lon) / w
    return np.asarray(locate(lat, lon), dtype=np.int64)


__all__ = ["PlacementConfig", "FineStats", "Placement", "release", "privacy_events", "fine_width",
           "coarse_of_fine", "PARTS", "STEP_EDGES_M"]
