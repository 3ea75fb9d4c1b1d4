"""The fine-placement stage's private releases: two tables on a public fine grid (``fine_w`` x ``fine_w`` cells
over the public bbox, about ``fine_m`` metres each by default), released as part of the method's fit:

=========  ======================================================================  ============  ============
part       what is released                                                         sensitivity   budget
=========  ======================================================================  ============  ============
density    trajectory density on the fine grid: a trajectory passing W distinct     k             0.8 share
           fine cells (its fixes joined by the integer line walk) adds 1 / W to
           each (length-normalised: its mass is 1)
steps      histogram of the distance between consecutive fixes (public log bins):   k             0.2 share
           a trajectory with S steps adds 1 / S to the bin of each
=========  ======================================================================  ============  ============

k is ``max_trajectories_per_user`` (1 under the trajectory unit). Both go through
``duckmob.privacy.counting.normalised_release`` (the one counting mechanism): each trajectory's mass 1 is split
over its windows on the noise grid, so one trajectory moves each table by at most 1 in L1 and a privacy unit of
k trajectories by at most k; Laplace of scale ``k / (eps * share * part)`` on EVERY fine cell and EVERY bin
(data-independent supports) makes each part eps-DP; they compose into the method's ledger event. The fine
density is denoised by a quadtree (:func:`adaptive_density`) and the step histogram cut to where it stands above
the noise, then NormCut (non-negative, total kept); both are post-processing. Trajectories of one point have no
step and add nothing to the step histogram (dropping mass only lowers the sensitivity). With little mass in
noise scales the step histogram is summed on blocks of public bins (:func:`step_block`). A public ``step_m``
replaces the step histogram, and the density gets the whole share.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from duckmob.grid import BBox, cell_of
from duckmob.privacy import accounting
from duckmob.privacy.counting import normalised_sums, release_sums
from duckmob.privacy.noise import check_scale
from duckmob.privacy.normcut import normcut
from duckmob.source.batches import as_batches
from duckmob.synth.cells import state_sequences, truncate_tail, uniform_grid
from duckmob.synth.config import Config, param
from duckmob.trajectories import Trajectories, distinct_pairs

# Each part's fraction of the fine stage's share of eps.
PARTS = {"density": 0.8, "steps": 0.2}
# Public bins of the distance between consecutive fixes (metres): [0, 1) then log-spaced up to 50 km; longer
# steps fall in the last bin.
STEP_EDGES_M = np.concatenate([[0.0], np.geomspace(1.0, 50_000.0, 48)])
# Blocks of the released step histogram: about STEP_BLOCKS_C sqrt(mass / noise scale) of them (step_block).
STEP_BLOCKS_C = 2.0
# The released step histogram's head and tail are cut where two consecutive blocks fall below STEP_TAU noise
# scales of a block when blocks are wider than a bin, below 1 scale on single bins (release_statistics; chosen on
# GeoLife, docs/methods/privtrace.md).
STEP_TAU = 2.0
# With a public road network the density is released per street piece: the segments that continue one another
# within cells of this many metres (duckmob.roads.Roads.pieces; measurements in docs/roads.md).
ROAD_PIECE_M = 400.0
EARTH_M_PER_DEG = 111_195.0
MAX_POINTS = 20_000
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
    road_piece_m: float = param(ROAD_PIECE_M, float, low=10, high=100_000,
                                doc="with roads: the density is released per street piece, the segments that "
                                    "continue one another within cells of this many metres")
    step_m: float | None = param(None, float, low=0, low_open=True,
                                 doc="public spacing of consecutive points (metres), e.g. the devices' sampling "
                                     "interval times a typical speed; null: learned privately (the step histogram)")

    @property
    def placing(self) -> bool:
        """Whether the fine stage is released (every output but 'cells', with a positive share)."""
        return self.output != "cells" and self.fine_share > 0


def fine_width(bbox, config: PlacementConfig, n_noisy: float | None = None, eps: float | None = None,
               max_trajectories_per_user: int = 1, at_least: int | None = None) -> int:
    """The public fine grid width: ``fine_w`` when given; else the power of two (8 .. 512) whose cells are nearest
    ``fine_m`` metres along the bbox's longer side, made coarser when the data cannot fill it: with ``n_noisy``
    (a DP count) and the method's ``eps``, no finer than ``sqrt(n eps_d / (k SIGNAL_SHARE TAU))`` cells per side,
    where ``eps_d`` is the density part's epsilon and k is ``max_trajectories_per_user``. That bound asks a cell
    of the ``SIGNAL_SHARE`` of the grid where the mass of n trajectories concentrates to hold ``TAU`` Laplace
    scales ``k / eps_d``: below it the release is mostly noise and a coarser grid places points better.
    ``at_least``: the cells per side of the method's finest coarse cells (public, or derived from DP releases);
    the automatic width is never coarser, so every coarse cell holds fine cells to place and route in (a coarse
    cell without a fine cell has no anchor). A function of public parameters and DP releases only; the
    measurements behind both bounds are in docs/methods/privtrace.md."""
    if config.fine_w is not None:
        return int(config.fine_w)
    b = BBox.of(bbox)
    mid = math.cos(math.radians((b.min_lat + b.max_lat) / 2))
    extent = max((b.max_lat - b.min_lat) * EARTH_M_PER_DEG, (b.max_lon - b.min_lon) * EARTH_M_PER_DEG * mid)
    exponent = round(math.log2(max(extent / config.fine_m, 1.0)))
    if n_noisy is not None and eps is not None and config.placing:
        eps_d = part_eps(eps, config)["density"]
        signal = math.sqrt(max(float(n_noisy), 1.0) * eps_d / (max_trajectories_per_user * SIGNAL_SHARE * TAU))
        exponent = min(exponent, math.floor(math.log2(max(signal, 1.0))))
    if at_least is not None:
        exponent = max(exponent, math.ceil(math.log2(max(int(at_least), 1))))
    return int(2 ** np.clip(exponent, 3, 9))


def parts(config: PlacementConfig) -> dict[str, float]:
    """The parts released and their fractions of the share: both (:data:`PARTS`), or the density alone (all of
    the share) for output 'stays', which places one point per visited cell and needs no spacing, and with a
    public ``step_m``, which spaces points without the step histogram."""
    return {"density": 1.0} if config.output == "stays" or config.step_m is not None else PARTS


def part_eps(eps: float, config: PlacementConfig) -> dict[str, float]:
    """Each released part's epsilon at the method's ``eps``: ``eps * fine_share * fraction``."""
    return accounting.split(eps * config.fine_share, parts(config))


def privacy_events(eps: float, config: PlacementConfig, max_trajectories_per_user: int = 1) -> list:
    """The fine stage's accounting events at the method's eps (none when it is off): one Laplace release per
    part, eps-DP at :func:`part_eps` each. Refuses (DuckmobError) an eps whose Laplace scales the noise sampler
    cannot honour, before any data is read."""
    if not config.placing:
        return []
    for scale in scales(eps, config, max_trajectories_per_user).values():
        check_scale(scale)
    return [accounting.laplace(e) for e in part_eps(eps, config).values()]


def scales(eps: float, config: PlacementConfig, max_trajectories_per_user: int) -> dict[str, float]:
    """Laplace scale of each part: k / (eps * share * fraction), k = ``max_trajectories_per_user``."""
    return {part: max_trajectories_per_user / e for part, e in part_eps(eps, config).items()}


# -- the private releases ---------------------------------------------------------------------------------------

def local_xy(bbox: BBox, lat, lon) -> tuple[np.ndarray, np.ndarray]:
    """Metres east/north of the bbox's corner (equirectangular at the bbox's middle latitude: public)."""
    mid = math.cos(math.radians((bbox.min_lat + bbox.max_lat) / 2))
    return ((np.asarray(lon) - bbox.min_lon) * EARTH_M_PER_DEG * mid,
            (np.asarray(lat) - bbox.min_lat) * EARTH_M_PER_DEG)


def fine_cells(data: Trajectories, bbox, w: int, walk: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct fine cells each trajectory passes: ``(cell, owner, n_distinct per trajectory)``, owner sorted.

    With ``walk`` fixes are joined by the integer line walk (:mod:`duckmob.synth.cells`), so a sparsely sampled
    trajectory still marks the cells between its fixes; without it, only the cells of the points themselves
    (output 'stays': where the modelled stays are). Each trajectory's cells depend on its own points only."""
    if walk:
        _, cells, owner = state_sequences(uniform_grid(bbox, w), data.offsets, data.lat, data.lon)
    else:
        cells, owner = cell_of(data.lat, data.lon, bbox, w), data.point_traj()
    owner, cells = distinct_pairs(owner, cells, w * w)   # (np.unique: 5x slower)
    return cells, owner, np.bincount(owner, minlength=data.n_trajectories)


def step_bins(data: Trajectories, bbox) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The bin of each step between consecutive fixes: ``(bin, owner, steps per trajectory)``, owner sorted. A
    trajectory of L fixes has L - 1 steps; the steps across trajectories are the differences at each trajectory's
    last fix, left out."""
    box = BBox.of(bbox)
    x, y = local_xy(box, data.lat, data.lon)
    m, lengths = data.n_points, data.lengths
    same = np.ones(max(m - 1, 0), dtype=bool)
    ends = data.offsets[1:-1]
    same[ends[(ends > 0) & (ends < m)] - 1] = False
    d = np.hypot(np.diff(x), np.diff(y))[same]
    n_steps = np.maximum(lengths - 1, 0)
    return step_bin(d), np.repeat(np.arange(data.n_trajectories, dtype=np.int64), n_steps), n_steps


def step_bin(d: np.ndarray) -> np.ndarray:
    """The bin of each step length ``d`` (metres, >= 0) in :data:`STEP_EDGES_M`, the last bin open above: exactly
    ``clip(searchsorted(STEP_EDGES_M, d, 'right') - 1, 0, bins - 1)``, without its binary search (slow on millions
    of unsorted values). A non-negative double's bits, read as an integer, are in the order of its value, so their
    top 20 bits (sign, exponent, 8 bits of mantissa) name a bucket of values (:func:`guided_searchsorted`'s rule,
    with the guide of :func:`_step_guide`): where no edge cuts a bucket its values' bin is a table's, the others
    are searched."""
    d = np.ascontiguousarray(d, dtype=np.float64)
    bins, cut = _step_tables()
    bucket = d.view(np.int64) >> _GUIDE_SHIFT
    out = bins[bucket]
    search = np.flatnonzero(cut[bucket])
    if len(search):
        found = np.searchsorted(STEP_EDGES_M, d[search], side="right")
        out[search] = np.clip(found - 1, 0, len(STEP_EDGES_M) - 2)
    return out.astype(np.int64)


def guided_searchsorted(edges: np.ndarray, x: np.ndarray, bucket: np.ndarray, guide: np.ndarray) -> np.ndarray:
    """``np.searchsorted(edges, x, side="right")``, exactly, for many unsorted ``x`` and short sorted ``edges``: each
    ``x`` lies in bucket ``bucket`` (between that bucket's smallest value and the next one's), and ``guide[k]`` is
    the searchsorted of bucket k's smallest value (one entry past the last bucket). Where the guide does not change
    from a bucket to the next, the answer is the guide's; only the ``x`` in the few buckets an edge cuts are
    searched."""
    out = guide[bucket].astype(np.int64)
    search = np.flatnonzero(guide[bucket + 1] != out)
    if len(search):
        out[search] = np.searchsorted(edges, x[search], side="right")
    return out


_GUIDE_SHIFT = 44     # 64 - 20 bits


@functools.cache
def _step_guide() -> np.ndarray:
    """:func:`step_bin`'s guide: the searchsorted in :data:`STEP_EDGES_M` of the smallest value of each of its 2^19
    buckets of non-negative doubles, and one past them. Public constants."""
    n = 1 << (63 - _GUIDE_SHIFT)
    low = (np.arange(n + 1, dtype=np.int64) << _GUIDE_SHIFT).view(np.float64)   # each bucket's smallest value
    low = np.where(np.isnan(low), np.inf, low)
    return np.searchsorted(STEP_EDGES_M, low, side="right").astype(np.int16)


@functools.cache
def _step_tables() -> tuple[np.ndarray, np.ndarray]:
    """:func:`step_bin`'s tables over its buckets: the bin of each bucket's values where no edge cuts it, and
    whether an edge cuts it (the guide changes to the next bucket). Public constants."""
    guide = _step_guide().astype(np.int64)
    return np.clip(guide[:-1] - 1, 0, len(STEP_EDGES_M) - 2).astype(np.int16), guide[1:] != guide[:-1]


def release(data, bbox, eps: float, config: PlacementConfig, noise, max_trajectories_per_user: int = 1,
            n_noisy: float | None = None, at_least: int | None = None) -> "FineStats":
    """The fine stage's two releases (module docstring): eps * fine_share in total, ``max_trajectories_per_user``
    trajectories per unit. ``data``: :class:`Trajectories` or :class:`duckmob.source.batches.Batches` (the
    statistics summed batch by batch)."""
    w = fine_width(bbox, config, n_noisy, eps, max_trajectories_per_user, at_least)
    part_scales = scales(eps, config, max_trajectories_per_user)
    walk = config.output != "stays"
    sums = as_batches(data).reduce(lambda d: statistics(d, bbox, w, part_scales, walk))
    return release_statistics(sums, w, part_scales, noise, n_noisy)


def statistics(data: Trajectories, bbox, w: int, part_scales: dict[str, float],
               walk: bool = True, roads=None, piece_m: float = ROAD_PIECE_M,
               flows: bool = False) -> dict[str, np.ndarray]:
    """The EXACT statistics of the parts in ``part_scales`` (never release them): whole noise-grid steps per fine
    cell and per step bin (``counting.normalised_sums``). Integers: the sums over batches of whole trajectories
    add up to the sums over all of them (``duckmob.source``). ``walk``: the density of the cells the fixes' line
    walk passes (False: of the fixes' own cells, output 'stays'; :func:`fine_cells`). With a public road network
    ``roads`` (:class:`duckmob.roads.Roads`) the density is one of road segments instead (:func:`road_sums`), or
    with ``flows`` the flows between its street pieces (:func:`duckmob.road_flows.flow_sums`: each trajectory's
    mass 1 over the moves of its matched path)."""
    if roads is not None and flows:
        from duckmob.road_flows import flow_sums     # loaded only for a release that uses it

        out = {"road_flows": flow_sums(data, roads, part_scales["density"], piece_m)}
    elif roads is not None:
        out = {"road_density": road_sums(data, roads, part_scales["density"], piece_m)}
    else:
        cells, owner, n_cells = fine_cells(data, bbox, w, walk=walk)
        out = {"fine_density": normalised_sums(cells, owner, n_cells, w * w, part_scales["density"])}
    if "steps" in part_scales:
        b, step_owner, n_steps = step_bins(data, bbox)
        out["fine_steps"] = normalised_sums(b, step_owner, n_steps, len(STEP_EDGES_M) - 1, part_scales["steps"])
    return out


def release_statistics(sums: dict[str, np.ndarray], w: int, part_scales: dict[str, float], noise,
                       n_noisy: float | None = None, roads=None, bbox=None, piece_m: float = ROAD_PIECE_M) -> "FineStats":
    """The noise of the two parts on their exact statistics (:func:`statistics`), then post-processing.
    ``n_noisy`` (a DP count; None: the noisy step histogram's own total) sets the step histogram's blocks
    (:func:`step_block`). With ``roads`` (and the public ``bbox``) the density is released on every street piece of
    the network (:func:`road_sums`; Laplace on each, zero or not: a data-independent support); its non-negative
    part is spread along each piece's segments by their lengths (``FineStats.road``: where points go on the
    streets) and summed into the fine cells of the segments' midpoints (the density the routes follow): both
    post-processing. With flows (``sums["road_flows"]``) the released flows between street pieces take the
    density's place (:func:`duckmob.road_flows.release_flows`, the same budget); the traffic through each piece
    comes from them (:func:`duckmob.road_flows.segment_density`) and they are kept for the routes
    (``FineStats.flow``)."""
    density_scale = part_scales["density"]
    road, extra = None, {}
    if roads is not None and "road_flows" in sums:
        from duckmob.road_flows import release_flows, segment_density

        noisy, cut = release_flows(sums["road_flows"], density_scale, noise)
        road = segment_density(noisy, roads, piece_m)
        extra = dict(flow=cut, flow_links=roads.piece_links(piece_m), piece=roads.pieces(piece_m).astype(np.int32))
    elif roads is not None:
        road = release_road_density(sums["road_density"], roads, density_scale, noise, piece_m)
    if roads is not None:
        mid = cell_of((roads.lat1 + roads.lat2) / 2, (roads.lon1 + roads.lon2) / 2, bbox, w)
        inside = mid >= 0
        density = np.bincount(mid[inside], weights=road[inside], minlength=w * w).astype(np.float32)
        road = road.astype(np.float32)
    else:
        density = release_sums(sums["fine_density"], density_scale, noise)
        density = adaptive_density(density, w, density_scale).astype(np.float32)
    if "steps" not in part_scales:     # output 'stays', or a public step_m: the density alone
        return FineStats(w=w, density=density, road=road, **extra,
                         steps=np.zeros(len(STEP_EDGES_M) - 1))
    steps_scale = part_scales["steps"]
    steps = release_sums(sums["fine_steps"], steps_scale, noise)
    # post-processing: summed over blocks of public bins (step_block), the long tail past where the histogram
    # falls to the noise (STEP_TAU) is zeroed (noise there would make kilometre steps, and a trajectory few
    # points), and so is the short head before it rises above the noise (noise there, weighted by nothing but its
    # count, would make centimetre steps), then NormCut, then each block's mass is spread evenly over its bins
    # (uniform in log over the block)
    m = step_block(float(n_noisy) if n_noisy is not None else float(steps.sum()), steps_scale)
    n_bins = len(steps)
    padded = np.zeros(-(-n_bins // m) * m)
    padded[:n_bins] = steps
    blocks, block_scale = padded.reshape(-1, m).sum(axis=1), steps_scale * math.sqrt(m)   # the block sums' spread
    tau = STEP_TAU if m > 1 else 1.0
    if steps_mostly_noise(blocks, n_noisy, block_scale):
        # no spacing can be read from noise (the highest noisy block gives centimetre steps): steps all zero, and
        # the sampler spaces points one fine cell apart (a public length)
        return FineStats(w=w, density=density, road=road, **extra,
                         steps=np.zeros(n_bins))
    kept = truncate_tail(truncate_tail(blocks, block_scale, tau)[::-1], block_scale, tau)[::-1]
    if not (kept > 0).any():       # nothing above the noise: the highest block alone, not every bin evenly
        kept = (np.arange(len(blocks)) == np.argmax(blocks)).astype(np.float64)
    blocks = normcut(kept[None, :], axis=-1)[0]
    return FineStats(w=w, density=density, road=road, **extra,
                     steps=np.repeat(blocks / m, m)[:n_bins])


def road_sums(data: Trajectories, roads, scale: float, piece_m: float = ROAD_PIECE_M) -> np.ndarray:
    """EXACT length-normalised density of the network's street pieces (never release it). Each fix is matched to
    its nearest segment of the public network (:func:`duckmob.roads.snap`, a transformation of the trajectory's
    own points), each segment belongs to one street piece (:meth:`duckmob.roads.Roads.pieces`: segments that
    continue one another within a public ``piece_m`` grid cell, a function of the network alone), and a trajectory
    adds ``1 / P`` to each of the P distinct pieces its fixes match, in whole noise-grid steps
    (``counting.normalised_sums``).

    Sensitivity: one trajectory moves the table by at most 1 in L1 (k for a user of k), as the fine-cell density
    does; the support (every piece) is data-independent. Integers, so batch sums add up exactly.

    Why pieces and not segments: a city's network has tens of thousands of segments, and a table of 20,000 trips
    puts well under one trajectory of mass on most of them, far below a Laplace scale of 1 / eps; the same mass
    released on the few thousand pieces stands above the noise, and traffic is nearly even along a street piece
    (measurements: docs/roads.md)."""
    piece = roads.pieces(piece_m)
    n_pieces = int(piece.max()) + 1 if len(piece) else 0
    if data.n_points == 0:
        return np.zeros(n_pieces, np.int64)
    from duckmob.roads import snap

    matched = piece[snap(roads, data.lat, data.lon)[0]]
    owner = np.repeat(np.arange(data.n_trajectories, dtype=np.int64), data.lengths)
    key = np.unique(owner * n_pieces + matched)              # distinct (trajectory, piece), by trajectory
    owner, matched = key // n_pieces, key % n_pieces
    n_matched = np.bincount(owner, minlength=data.n_trajectories)
    return normalised_sums(matched, owner, n_matched, n_pieces, scale)


def release_road_density(sums: np.ndarray, roads, scale: float, noise,
                         piece_m: float = ROAD_PIECE_M) -> np.ndarray:
    """The released road density on each segment: Laplace of ``scale`` on every street piece's exact sum
    (:func:`road_sums`; a data-independent support, so eps-DP at sensitivity k for scale k / eps), then
    post-processing: each piece's positive part spread along its segments in proportion to their public lengths.
    One non-negative weight per segment of ``roads``."""
    return roads.spread_over_pieces(np.maximum(release_sums(sums, scale, noise), 0.0), piece_m)


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
    noise of spread sqrt(m) scales, so few trajectories or a small share get wide blocks, and large tables keep
    every bin (measurements: docs/methods/privtrace.md)."""
    n_bins = len(STEP_EDGES_M) - 1
    blocks = STEP_BLOCKS_C * math.sqrt(max(float(n_noisy), 1.0) / scale)
    return int(min(max(math.ceil(n_bins / max(blocks, 1.0)), 1), n_bins))


def adaptive_density(noisy: np.ndarray, w: int, scale: float, tau: float = 2.0, levels: int = 4) -> np.ndarray:
    """Denoise the noisy fine density by a quadtree (post-processing): each fine cell takes, from the finest
    level up, the first block (2^l x 2^l fine cells, l = 0 .. levels) whose noisy sum exceeds ``tau`` standard
    deviations of its noise (sqrt(2) scale 2^l: the sum of 4^l Laplace draws), and shares evenly what of that
    sum the block's already resolved cells did not take; below that at every level it gets the same share of
    its top-level block, clipped at 0. Dense streets keep their fine detail; where the signal is below the
    noise, mass is spread instead of following noise peaks."""
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
    road: np.ndarray | None = None   # (segments,) float32: the released road-segment density, with roads
    # with roads and road_release 'flows' (PrivTrace): the released piece-to-piece flows (duckmob.road_flows), their
    # pairs' keys and each segment's piece (both public: functions of the network)
    flow: np.ndarray | None = None
    flow_links: np.ndarray | None = None
    piece: np.ndarray | None = None

    def arrays(self, prefix: str = "fine_") -> dict[str, np.ndarray]:
        out = {f"{prefix}w": np.array(self.w), f"{prefix}density": self.density, f"{prefix}steps": self.steps}
        for name in ("road", "flow", "flow_links", "piece"):
            if getattr(self, name) is not None:
                out[f"{prefix}{name}"] = getattr(self, name)
        return out

    @classmethod
    def from_arrays(cls, z, prefix: str = "fine_") -> "FineStats | None":
        if f"{prefix}w" not in z:
            return None
        extra = {name: np.asarray(z[f"{prefix}{name}"]) for name in ("road", "flow", "flow_links", "piece")
                 if f"{prefix}{name}" in z}
        return cls(int(z[f"{prefix}w"]), np.asarray(z[f"{prefix}density"]), np.asarray(z[f"{prefix}steps"]), **extra)
