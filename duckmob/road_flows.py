"""Flows between street pieces: the release that spends the budget on the roads people drive (issue 39, item 4).

With a public road network, a method's road statistics are released on the network's street pieces
(:meth:`duckmob.roads.Roads.pieces`: segments that continue one another inside a public ``piece_m`` cell; segment
groups that exist in the network) as piece-to-piece transitions, not as a density of pieces:

1. **Matching** (:func:`matched_pieces`), a transformation of each trajectory's own points: each fix goes to its
   nearest segment (:func:`duckmob.roads.snap`, exact), consecutive fixes are joined by their shortest road path
   (:func:`duckmob.road_paths.leg_chains`, the same paths the synthetic walk takes; searched up to
   ``ROUTE_LIMIT_M``, farther fixes are not joined), and the path is read every :data:`MATCH_STEP_M` metres. The
   trajectory's piece sequence is the pieces met in that order, repeats removed.
2. **Counting** (:func:`flow_sums`): a trajectory adds ``1 / T`` to each of the T distinct ordered pairs of
   consecutive pieces in its sequence that touch in the network (:meth:`~duckmob.roads.Roads.piece_links`; the
   pair of a piece with itself for a trajectory that meets one piece, or whose pieces never touch). So one
   trajectory moves the table by at most 1 in L1, a privacy unit of k trajectories by at most k.
3. **Release** (:func:`release_flows`): Laplace of scale ``k / eps`` on every pair of touching pieces (the support
   is a function of the public network alone, zero or not): eps-DP. The rest is post-processing.
4. **Use** (post-processing): the density of each segment is the released flow through its piece (half its flow
   in plus half its flow out, then its positive part), spread along the piece's segments by length
   (:func:`segment_density`: where the points go); and :class:`FlowLink` weighs a move between two touching pieces
   by how much more the NormCut flows (negative entries to 0, the smallest positive ones cut so the total is kept)
   use it than the pieces' own traffic predicts (the routes' choice between candidate positions:
   :func:`duckmob.road_paths.route`'s ``link``).

One release serves both uses: its marginals are the piece density, so the budget is not split between a density
and transitions (the measurements in issue 39 show what a split costs). PrivTrace uses it with
``road_release := 'flows'``; its default, ``'pieces'`` (the pieces the fixes themselves match,
:func:`duckmob.synth.placement.road_sums`), measured better on simulated taxi trips (docs/roads.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from duckmob.privacy.counting import normalised_sums, release_sums
from duckmob.privacy.normcut import normcut
from duckmob.privacy.steps import positions
from duckmob.road_paths import ROUTE_LIMIT_M, chains_of, leg_chains
from duckmob.roads import snap
from duckmob.trajectories import Trajectories

# A matched path is read every this many metres (at least once per stretch of chain), so no street piece it runs
# along is missed: a piece is a block or more, and a junction-to-junction chain is one block.
MATCH_STEP_M = 25.0
# FlowLink's log-weights are clipped to +-this (a move the flows never saw still stays possible).
LINK_CLIP = 3.0


def matched_pieces(data: Trajectories, roads, piece_m: float, limit_m: float = ROUTE_LIMIT_M,
                   step_m: float = MATCH_STEP_M) -> tuple[np.ndarray, np.ndarray]:
    """Each trajectory's piece sequence on the network (module docstring, 1): ``(owner, piece)``, owner (the
    trajectory's index in ``data``) sorted, consecutive repeats removed. Each trajectory's pieces depend on its own
    fixes and the public roads only."""
    piece = roads.pieces(piece_m)
    seg, t = snap(roads, data.lat, data.lon)[:2]
    point, chain, o0, o1 = leg_chains(roads, data.offsets, seg, t, limit_m)
    on = chain >= 0
    point, chain, o0, o1 = point[on], chain[on], o0[on], o1[on]
    reads = np.maximum(np.ceil(np.abs(o1 - o0) / step_m), 1).astype(np.int64)
    stretch = np.repeat(np.arange(len(chain)), reads)
    within = np.arange(len(stretch)) - np.repeat(np.cumsum(reads) - reads, reads)
    f = (within + 0.5) / reads[stretch]
    along = chains_of(roads).segment_at(roads.graph, chain[stretch], o0[stretch] + f * (o1[stretch] - o0[stretch]))
    found = along >= 0
    # each fix's own piece, then the pieces its leg to the next fix runs along, in order
    at_point = np.concatenate([np.arange(data.n_points), point[stretch][found]])
    rank = np.concatenate([np.zeros(data.n_points), 1.0 + np.flatnonzero(found)])
    pieces = np.concatenate([piece[seg], piece[along[found]]])
    order = np.lexsort((rank, at_point))
    owner, pieces = data.point_traj()[at_point[order]], pieces[order]
    keep = np.ones(len(owner), bool)
    keep[1:] = (owner[1:] != owner[:-1]) | (pieces[1:] != pieces[:-1])
    return owner[keep], pieces[keep]


def flow_sums(data: Trajectories, roads, scale: float, piece_m: float) -> np.ndarray:
    """EXACT length-normalised piece-to-piece flows (never release them): int64 noise-grid steps on each pair of
    :meth:`~duckmob.roads.Roads.piece_links` (module docstring, 2). Sensitivity: one trajectory moves the table by
    at most 1 in L1 (its mass 1 split evenly over its distinct pairs), k for a user of k; the support is the
    public network's. Integers, so sums over batches of whole trajectories add up exactly."""
    links = roads.piece_links(piece_m)
    if data.n_points == 0:
        return np.zeros(len(links), np.int64)
    n_pieces = int(roads.pieces(piece_m).max()) + 1
    owner, pieces = matched_pieces(data, roads, piece_m)
    same = owner[1:] == owner[:-1]
    move_owner = owner[1:][same]
    pos = positions(links, pieces[:-1][same] * n_pieces + pieces[1:][same])
    move_owner, pos = move_owner[pos >= 0], pos[pos >= 0]
    # a trajectory with no move between touching pieces: its pieces, each paired with itself
    still = np.bincount(move_owner, minlength=data.n_trajectories)[owner] == 0
    pos = np.concatenate([pos, positions(links, pieces[still] * (n_pieces + 1))])
    move_owner = np.concatenate([move_owner, owner[still]])
    key = np.unique(move_owner * len(links) + pos)          # distinct (trajectory, pair), by trajectory
    move_owner, pos = key // len(links), key % len(links)
    n_pairs = np.bincount(move_owner, minlength=data.n_trajectories)
    return normalised_sums(pos, move_owner, n_pairs, len(links), scale)


def release_flows(sums: np.ndarray, scale: float, noise) -> tuple[np.ndarray, np.ndarray]:
    """The released flows (module docstring, 3): Laplace of ``scale`` (k / eps) on every pair's exact sum
    (:func:`flow_sums`; a data-independent support: eps-DP at sensitivity k). Returns ``(noisy, cut)``: the noisy
    table (float64; the piece traffic is read from it, :func:`segment_density`) and its NormCut over the whole
    table (float32, non-negative; the routes' weights, :class:`FlowLink`): post-processing, one per pair of
    :meth:`~duckmob.roads.Roads.piece_links`."""
    noisy = release_sums(sums, scale, noise)
    if not len(noisy):
        return noisy, noisy.astype(np.float32)
    return noisy, normcut(noisy[None, :])[0].astype(np.float32)


def piece_mass(flows: np.ndarray, links: np.ndarray, n_pieces: int) -> np.ndarray:
    """Each piece's released traffic: half the flow into it plus half the flow out of it (a pair of a piece with
    itself counts whole)."""
    p, q = links // max(n_pieces, 1), links % max(n_pieces, 1)
    flows = np.asarray(flows, dtype=np.float64)
    return (np.bincount(p, weights=flows, minlength=n_pieces) + np.bincount(q, weights=flows, minlength=n_pieces)) / 2


def segment_density(noisy: np.ndarray, roads, piece_m: float) -> np.ndarray:
    """The released density of each segment (module docstring, 4): its piece's mass (:func:`piece_mass` of the
    noisy flows, then its positive part: summing before cutting lets the noise of a piece's pairs cancel; cutting
    each pair first, as NormCut does, measured worse in docs/roads.md) spread along the piece's segments in
    proportion to their public lengths. Post-processing."""
    piece = roads.pieces(piece_m)
    n_pieces = int(piece.max()) + 1 if len(piece) else 0
    mass = np.maximum(piece_mass(noisy, roads.piece_links(piece_m), n_pieces), 0.0)
    return roads.spread_over_pieces(mass, piece_m)


@dataclass(frozen=True, eq=False)
class FlowLink:
    """How much a move from one segment's piece to another's is favoured by the released flows, as a log-weight
    (``__call__``): ``log((F[p, q] + a) / (out(p) in(q) / M + a))`` for touching pieces p != q, where F is the
    released flow, out and in its row and column sums, M its total and ``a = M / pairs`` (a released flow's
    mean: smoothing, so a pair the noise zeroed is not forbidden), clipped to +-:data:`LINK_CLIP`; 0 within one
    piece and between pieces that do not touch. Post-processing of the released flows and the public network.

    ``piece``: each segment's piece; ``links``: the sorted pair keys ``p * P + q``; ``log_weight``: one a pair."""

    piece: np.ndarray
    n_pieces: int
    links: np.ndarray
    log_weight: np.ndarray

    @classmethod
    def of(cls, piece, links, flows) -> "FlowLink":
        piece = np.asarray(piece, dtype=np.int64)
        links = np.asarray(links, dtype=np.int64)
        flows = np.asarray(flows, dtype=np.float64)
        n_pieces = int(piece.max()) + 1 if len(piece) else 0
        p, q = links // max(n_pieces, 1), links % max(n_pieces, 1)
        total = float(flows.sum())
        out = np.bincount(p, weights=flows, minlength=n_pieces)
        into = np.bincount(q, weights=flows, minlength=n_pieces)
        a = max(total / max(len(links), 1), 1e-12)
        lw = np.log((flows + a) / (out[p] * into[q] / max(total, 1e-12) + a))
        lw = np.where(p == q, 0.0, np.clip(lw, -LINK_CLIP, LINK_CLIP))
        return cls(piece=piece, n_pieces=n_pieces, links=links, log_weight=lw)

    def __call__(self, seg_from, seg_to) -> np.ndarray:
        """The log-weight of each move from segment ``seg_from[i]`` to ``seg_to[i]`` (any shape, the same)."""
        seg_from, seg_to = np.asarray(seg_from, dtype=np.int64), np.asarray(seg_to, dtype=np.int64)
        pos = positions(self.links, (self.piece[seg_from] * self.n_pieces + self.piece[seg_to]).ravel())
        return np.where(pos >= 0, self.log_weight[np.maximum(pos, 0)], 0.0).reshape(seg_from.shape)


__all__ = ["FlowLink", "MATCH_STEP_M", "flow_sums", "matched_pieces", "piece_mass", "release_flows",
           "segment_density"]
