"""PrivTrace (Wang et al., USENIX Security 2023) with every step private, scalable and vectorised.

Pipeline of :meth:`PrivTrace.fit` (one eps-DP release in total; the parts compose sequentially, Thm. 1):

===========  =======================================================================  ============  ==========
part         what is released                                                          sensitivity   budget
===========  =======================================================================  ============  ==========
count        number of trajectories N (for K, the trip total and the default n)      k             0.02
level1       length-normalised density of the K x K first-layer cells (§4.2, B.1)      k             0.08
level2       length-normalised density of every state of the two-layer grid           k             0.04
lengths      histogram of state-sequence lengths (the length correction, walk.py)     k             0.06
first        length-normalised first-order counts with virtual start/end (§4.3)      k             0.40
second       length-normalised second-order counts on the neighbour-triple support   k             0.40
fine         fine placement: density and step histogram (duckmob.synth.placement)     k             fine_share
===========  =======================================================================  ============  ==========

k is ``max_trajectories_per_user``, the number of trajectories one privacy unit may contribute (1 when the unit
is a trajectory). The budget column is each part's fraction of PrivTrace's own epsilon, ``eps (1 - fine_share)``
(all of eps with ``output := 'cells'``), split by ``duckmob.privacy.accounting.split``; the fine stage spends
``eps fine_share``. Each release is a Laplace mechanism with scale k / eps_part on every entry of a
data-independent support; the paper's eps1 = 0.2 eps is shared by the first four parts. Everything after is
post-processing: NormCut (App. B.6), the split of dense first-layer cells, pruning of states whose noisy level-2
density is below ``prune`` Laplace scales (default 0: a state with no data survives with probability 1/2; the
reference computed the level-2 densities without noise and did not use them), the model choice (§4.6), the trip
distribution (§4.4, trips.py), the random walk (Alg. 1, walk.py) and the placement of points. Every count table
goes through ``duckmob.privacy.counting.normalised_release``, the one counting mechanism shared with
``mob_transitions`` and HRNet: each trajectory's mass 1 is split into whole steps of the noise grid, so the noisy
release needs no input rounding and each trajectory still adds at most 1.

Where the paper is vague or the reference leaks, the choices are (each documented where it is made; the
measurements behind them are in docs/methods/privtrace.md):
* K = round(sqrt(N_noisy / c)) with the paper's c = 500 (§5.1, its GeoLife setting), clipped to [2, K_max];
  or the user's K. The reference used the true point count.
* kappa: the paper's formula needs a city population (and its two printings differ by a factor 1000); we use
  the reference implementation's rule, a cell with noisy density d above ``split_threshold`` x the mean
  density N_noisy / K^2 is split into kappa = sqrt(d / kappa_c) per side, rounded to a power of two, at most
  2**max_depth, with kappa_c = 100 (the reference: 200).
* State sequences are filled in between non-adjacent fixes (straight line), so transitions are between
  neighbours; the second-order support is the neighbour triples (duckmob.synth.cells, markov.py).
* theta1 = theta1_factor * sqrt(2) * k / eps2 * (row support size); theta2 = 5 (§5.1).
* Lengths: sampled through the noisy length histogram's hazard, modulated by the model's end probability
  (walk.py); the trip distribution gives the start state (trips.py): a gravity model whose one free
  parameter (decay, or a detour constant) is fixed by the noisy total N, as the paper's constraint sum t = N.
* The length histogram (geometric bins past 20 states, up to ``max_len``) is zeroed from where it falls to
  the noise floor and made non-increasing past its mode (walk.py), so noise in the long tail does not
  lengthen the walks.
* The first move uses the second-order context (virtual start, s_1) (Alg. 1 uses the first order there); a
  state whose noisy row lost all mass to NormCut moves to a live neighbour in proportion to its noisy density.
* Points: with ``output := 'points'`` (the default) routed and spaced by the fine placement; with 'cells', one
  uniform point per trajectory and state (a walk that returns to a state returns to its point).
* n: the caller's n, or the noisy count.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from duckmob.errors import DuckmobError
from duckmob.privacy import accounting
from duckmob.privacy.counting import count_record, noisy_count, normalised_sums, release_sums
from duckmob.privacy.noise import check_scale
from duckmob.privacy.unit import PrivacyUnit
from duckmob.source.batches import as_batches
from duckmob.synth import placement
from duckmob.synth.base import Model, Plan, ReleaseContext, Synthesizer, trajectories_from_cells
from duckmob.synth.cells import StateGrid, state_sequences, truncate_tail, uniform_grid
from duckmob.synth.config import param
from duckmob.synth.placement import PlacementConfig
from duckmob.synth.privtrace.markov import (Support, density_sums, normcut_rows, release_transition_sums,
                                            select_second_order, transition_sums)
from duckmob.synth.privtrace.trips import trip_distribution
from duckmob.synth.privtrace.walk import (cumulative_rows, decreasing_tail, hazard, length_bin, length_bins,
                                          random_walks, stacked_cumulative)
from duckmob.trajectories import Trajectories

BUDGET_SPLIT = {"count": 0.02, "level1": 0.08, "level2": 0.04, "lengths": 0.06, "first": 0.40, "second": 0.40}

@dataclass(frozen=True)
class PrivTraceConfig(PlacementConfig):
    """PrivTrace's public hyper-parameters (``params := {...}`` in SQL), typed and validated."""

    method: ClassVar[str] = "privtrace"

    K: int | None = param(None, int, low=1, high=1024,
                          doc="first-layer cells per side; null: round(sqrt(N_noisy / c)) clipped to [2, K_max]")
    c: float = param(500.0, float, low=0, low_open=True, doc="§5.1: K = sqrt(|D| / c) (500 for GeoLife)")
    K_max: int = param(64, int, low=2, high=1024, doc="largest automatic K")
    kappa_c: float = param(100.0, float, low=0, low_open=True,
                           doc="kappa = sqrt(noisy density / kappa_c) (the reference implementation uses 200)")
    split_threshold: float = param(0.05, float, low=0,
                                   doc="split cells whose noisy density exceeds this fraction of the mean density")
    max_depth: int = param(4, int, low=0, high=6, doc="kappa <= 2**max_depth")
    max_len: int = param(400, int, low=2, high=100_000,
                         doc="longest generated sequence (states); longer real ones count in the last bin")
    theta1_factor: float = param(1.0, float, low=0, low_open=True, doc="§4.6 / App. F")
    theta2: float = param(5.0, float, low=0, low_open=True, doc="§4.6 / App. F")
    prune: float = param(0.0, float, low=0, doc="drop states whose noisy level-2 density < prune * its Laplace scale")
    end_bias: float = param(1.0, float, low=0, high=1,
                            doc="0: lengths from the histogram only; 1: modulated by the model's end probability")
    backtrack: float = param(1.0, float, low=0, high=1,
                             doc="share of immediate returns (a -> b -> a) kept in the walks; the rest are redrawn")
    trip_decay: float | None = param(None, float, low=0,
                                     doc="gravity exponent of the trip distribution; null: fitted to N (trips.py)")
    budget_split: dict | None = param(None, dict, doc=f"fractions of eps for the parts {sorted(BUDGET_SPLIT)}")
    road_release: str = param("pieces", str, choices=("pieces", "flows"),
                              doc="with roads: 'pieces' releases the density of the street pieces the fixes match; "
                                  "'flows' the moves between touching pieces along each trip's matched path, "
                                  "whose marginals give the density and which weigh the routes (road_flows.py)")
    road_weight: float = param(0.5, float, low=0, high=0.9,
                               doc="with roads: 0 joins the output's positions by shortest road paths; s > 0 by "
                                   "the cheapest, each street costing its length times up to 1 / (1 - s) as "
                                   "its released traffic falls (road_costs.py; post-processing); 0.5, halfway "
                                   "(a quiet street costs twice its length), is not tuned to a city; a model "
                                   "stored before it existed reads 0")

    @classmethod
    def parse(cls, params=None, **defaults):
        params = dict(params or {})
        if isinstance(params.get("budget_split"), str):
            try:
                params["budget_split"] = json.loads(params["budget_split"])
            except ValueError:
                raise DuckmobError("PrivTrace parameter budget_split must be a JSON object of fractions, got "
                                   f"{params['budget_split']!r}") from None
        return super().parse(params, **defaults)

    def check(self) -> None:
        self.fractions()  # raises on a bad split

    def fractions(self) -> dict[str, float]:
        """Each part's fraction of eps (the default :data:`BUDGET_SPLIT` or the user's, validated)."""
        split = self.budget_split
        if split is None:
            return dict(BUDGET_SPLIT)
        if set(split) != set(BUDGET_SPLIT):
            raise DuckmobError(f"budget_split must give a fraction for each of {sorted(BUDGET_SPLIT)}, got {split!r}")
        try:
            fractions = {part: float(value) for part, value in split.items()}
        except (TypeError, ValueError):
            raise DuckmobError(f"budget_split fractions must be numbers, got {split!r}") from None
        if (not all(math.isfinite(v) and v > 0 for v in fractions.values())
                or abs(sum(fractions.values()) - 1.0) > 1e-9):
            raise DuckmobError(f"budget_split fractions must be positive and sum to 1, got {fractions}")
        return fractions


@dataclass(frozen=True, kw_only=True)
class PrivTracePlan(Plan):
    """PrivTrace's spend at (eps, unit), from public parameters only: ``part_eps`` is each of its own parts'
    epsilon (module docstring), ``scales`` their Laplace scales ``k / part_eps`` (k the contribution bound), and
    ``fine_scales`` the fine stage's (None with ``output := 'cells'``). ``event`` composes all of them."""

    part_eps: dict[str, float]
    scales: dict[str, float]
    fine_scales: dict[str, float] | None


def upgrade_format_1_meta(meta: dict) -> dict:
    """A format-1 model's meta (config and info) in format 2's layout. Format 1 kept the fit's ``eps`` and
    ``contribution_bound`` in the config (format 2: ``eps`` in the info; the bound is the stored row's
    ``max_trajectories_per_user``), and models stored before ``route_draws`` existed drew one route per move."""
    config, info = dict(meta["config"]), dict(meta["info"])
    eps = config.pop("eps", None)
    config.pop("contribution_bound", None)
    config.setdefault("route_draws", 1)
    if eps is not None:
        info = {"eps": eps, **info}
    return {"config": config, "info": info}


class PrivTraceModel(Model):
    """A fitted PrivTrace: the public grid and NormCut noisy statistics; sampling is free post-processing.
    ``config`` is the fit's :class:`PrivTraceConfig`; ``info`` what the fit released about itself (public)."""

    method = "privtrace"
    format_version = 2
    # sample() reads the released arrays and its own generator; what it builds lazily (the walk's tables, the
    # placement and its route cache) is assigned whole, so a concurrent reader sees the old or the new one
    concurrent_sample = True

    def __init__(self, *, grid: StateGrid, alive, density, first, second, start, use2, len_edges, len_probs,
                 n_noisy: float, config: PrivTraceConfig, info: dict, fine: placement.FineStats | None = None):
        self.grid, self.alive, self.fine = grid, np.asarray(alive, dtype=bool), fine
        self.density = np.asarray(density, dtype=np.float64)
        self.first, self.second = np.asarray(first), np.asarray(second)
        self.start, self.use2 = np.asarray(start, dtype=np.float64), np.asarray(use2, dtype=bool)
        self.len_edges, self.len_probs = np.asarray(len_edges, dtype=np.int64), np.asarray(len_probs, float)
        self.n_noisy, self.config, self.info = float(n_noisy), config, dict(info)
        self._prepared = None
        self._placement = None
        self._link = None

    @property
    def default_n(self) -> int:
        """The noisy trajectory count (what is generated when no n is given)."""
        return max(int(round(self.n_noisy)), 0)

    def _prepare(self):
        if self._prepared is None:
            support = Support.of(self.grid.m, *self.grid.neighbours())
            D = support.width
            nbr = support.padded_neighbours()
            col_alive1 = (nbr >= 0) & self.alive[np.maximum(nbr, 0)]
            rows1 = np.where(col_alive1, self.first[:, :D], 0.0)
            # a state whose noisy row lost all its mass moves to a live neighbour in proportion to the
            # neighbour's noisy density (post-processing), rather than ending the walk early
            empty = rows1.sum(axis=1) <= 0
            fallback = np.where(col_alive1, self.density[np.maximum(nbr, 0)] + 1e-9, 0.0)
            rows1[empty] = fallback[empty]
            cum1, ok1 = cumulative_rows(rows1)
            row_state = support.row_state2()
            # the second-order rows then the first-order ones, in one table (walk.stacked_rows), block by block
            cum, ok2 = stacked_cumulative(lambda a, b: np.where(col_alive1[row_state[a:b]], self.second[a:b, :D], 0.0),
                                          len(row_state), D, cum1)
            row_total = self.first.sum(axis=1)
            end_prop = self.first[:, D] / np.where(row_total > 0, row_total, 1.0)
            p_start = np.where(self.alive, self.start, 0.0)
            if p_start.sum() <= 0:
                p_start = self.alive.astype(float)
            probs = self.len_probs if self.len_probs.sum() > 0 else np.ones(len(self.len_probs))
            self._prepared = dict(p_start=p_start, cum=cum, ok1=ok1, ok2=ok2, use2=self.use2,
                                  neighbours=np.maximum(nbr, 0), edge_offsets=support.offsets,
                                  end_propensity=end_prop,
                                  hazard_by_len=hazard(self.len_edges, probs / probs.sum()))
        return self._prepared

    @property
    def max_points(self) -> int:
        """Placement's ``max_points`` with the fine stage; else ``max_len`` (one point per visited state)."""
        return int(self.config.max_points) if self.fine is not None else int(self.config.max_len)

    def sample_states(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` synthetic state sequences: (offsets (n+1), states)."""
        return random_walks(int(n), rng, end_bias=float(self.config.end_bias), backtrack=float(self.config.backtrack),
                            **self._prepare())

    def sample(self, n: int, rng: np.random.Generator) -> Trajectories:
        """Draw ``n`` trajectories: random walks over the states, then points.

        With the fine stage (the default), points follow the most probable fine route between consecutive
        states, spaced like the real sampling (:mod:`duckmob.synth.placement`). Without it (``output :=
        'cells'``), one point uniformly inside each visited state's cell; a trajectory that comes back to a state
        comes back to the same point (one uniform point per trajectory and state), so the back-and-forth moves
        that GPS jitter puts in real sequences retrace one segment instead of criss-crossing both cells.
        """
        offsets, states = self.sample_states(n, rng)
        if self.fine is not None:       # released only when output is 'points' (models before it have none)
            # with roads, steps stretched by how the routes wind (a straight-line spacing like the real fixes')
            lengths, lat, lon = self.placement().points(offsets, states, rng, int(self.config.max_points),
                                                        chord=self.fine.road is not None)
            return trajectories_from_cells(lengths, lat, lon)
        lengths = np.diff(offsets)
        owner = np.repeat(np.arange(n, dtype=np.int64), lengths)
        visits, inverse = np.unique(owner * self.grid.m + states, return_inverse=True)
        lat, lon = self.grid.sample_points(visits % self.grid.m, rng)
        return trajectories_from_cells(lengths, lat[inverse], lon[inverse])

    @property
    def road_density(self) -> np.ndarray | None:
        """The released density of the road network's segments (fitted with ``roads :=``), else None."""
        return None if self.fine is None else self.fine.road

    @property
    def road_link(self):
        """The released piece-to-piece flows as route weights (:class:`duckmob.road_flows.FlowLink`; fitted with
        ``roads :=``), else None. Post-processing, built once."""
        fine = self.fine
        if fine is None or fine.flow is None:
            return None
        if self._link is None:
            from duckmob.road_flows import FlowLink

            self._link = FlowLink.of(fine.piece, fine.flow_links, fine.flow)
        return self._link

    def placement(self) -> placement.Placement:
        """The fine placement over this model's states (built once; post-processing)."""
        if self._placement is None:
            w, bbox = self.fine.w, self.grid.bbox
            self._placement = placement.Placement(
                self.fine, bbox, placement.coarse_of_fine(w, bbox, self.grid.state_of), self.grid.m,
                self.config.anchors, self.config.route_draws, self.config.step_m, centres=self.grid.centres())
        return self._placement

    def describe(self) -> dict[str, Any]:
        return {**self.config.as_dict(), "budget_split": self.config.fractions(), **self.info,
                "n_noisy": round(self.n_noisy, 1)}

    def payload(self) -> bytes:
        """An ``.npz`` of the grid, the noisy statistics and the fine stage's, with the config and info as JSON."""
        buf = io.BytesIO()
        g = self.grid
        np.savez_compressed(
            buf, bbox=np.array(g.bbox.as_list()), K=g.K, depth=g.depth, split=g.split, alive=self.alive,
            density=self.density,
            first=self.first, second=self.second, start=self.start, use2=self.use2, len_edges=self.len_edges,
            len_probs=self.len_probs, n_noisy=self.n_noisy, **(self.fine.arrays() if self.fine is not None else {}),
            meta=np.frombuffer(json.dumps({"config": self.config.as_dict(), "info": self.info}).encode(),
                               dtype=np.uint8))
        return buf.getvalue()

    @classmethod
    def load(cls, payload: bytes, version: int, method: str) -> "PrivTraceModel":
        z = np.load(io.BytesIO(bytes(payload)), allow_pickle=False)
        meta = json.loads(z["meta"].tobytes().decode())
        if version == 1:
            meta = upgrade_format_1_meta(meta)
        grid = StateGrid(z["bbox"].tolist(), int(z["K"]), int(z["depth"]), z["split"])
        return cls(grid=grid, alive=z["alive"], density=z["density"], first=z["first"], second=z["second"],
                   start=z["start"], use2=z["use2"], len_edges=z["len_edges"], len_probs=z["len_probs"],
                   n_noisy=float(z["n_noisy"]), info=meta["info"],
                   config=PrivTraceConfig.parse(meta["config"], road_weight=0.0),   # stored before it: off
                   fine=placement.FineStats.from_arrays(z))


class PrivTrace(Synthesizer):
    """PrivTrace with public hyper-parameters (:class:`PrivTraceConfig`); ``fit`` is one eps-DP release."""

    method = "privtrace"
    config_class = PrivTraceConfig
    model_class = PrivTraceModel
    default_delta = 0.0
    needs_time = False       # points are ordered by time when there is time, else by seq
    config: PrivTraceConfig

    def plan(self, eps: float, delta: float = 0.0, unit: PrivacyUnit = PrivacyUnit(), prior=None) -> PrivTracePlan:
        """Six Laplace releases at PrivTrace's own eps times each part's fraction, and the fine stage's, composed
        (pure eps-DP in total; delta unused). Refuses an eps whose smallest part the noise sampler cannot honour
        (scale k / eps_part too large)."""
        config = self.config
        k = unit.max_trajectories_per_user
        # PrivTrace's own parts share what the fine-placement stage leaves (all of eps when it is off)
        own_eps = accounting.split(eps, {"privtrace": 1.0 - config.fine_share})["privtrace"] if config.placing \
            else eps
        part_eps = accounting.split(own_eps, config.fractions())
        scales = {part: k / e for part, e in part_eps.items()}
        for scale in scales.values():
            check_scale(scale)
        fine_events = placement.privacy_events(eps, config, k)
        event = accounting.compose([accounting.laplace(e) for e in part_eps.values()] + fine_events)
        return PrivTracePlan(eps=eps, delta=delta, unit=unit, event=event, bbox=self.bbox, needs_time=self.needs_time,
                             max_points=int(config.max_points if config.placing else config.max_len),
                             part_eps=part_eps, scales=scales,
                             fine_scales=placement.scales(eps, config, k) if config.placing else None)

    def fit(self, source, plan: PrivTracePlan, release: ReleaseContext) -> PrivTraceModel:
        """Fit PrivTrace under eps-DP (delta unused) on trajectories inside ``self.bbox``; see the module doc.

        ``source``: :class:`duckmob.source.batches.Batches` of whole trajectories (out of core), or
        :class:`~duckmob.trajectories.Trajectories`: every table is an exact sum over the batches, so both give
        the same model. Zero trajectories is a valid input (the model is noise alone)."""
        config, scale, noise = self.config, plan.scales, release.noise
        k = plan.unit.max_trajectories_per_user
        batches = as_batches(source)
        # count: N + Lap(k / eps_count); one trajectory changes N by 1, a privacy unit by at most k
        n_noisy = noisy_count(batches.n_trajectories, plan.part_eps["count"], noise, sensitivity=k)
        K = config.K if config.K is not None else int(np.clip(round(np.sqrt(max(n_noisy, 1.0) / config.c)), 2,
                                                              config.K_max))

        # level1: length-normalised densities on K x K (B.1): each trajectory adds 1 in total (L1). Every table
        # is summed exactly over the batches (integer noise-grid steps) and noised once (counting.release_sums)
        first_layer = uniform_grid(self.bbox, K)
        sums1 = batches.reduce(lambda d: {"level1": density_sums(
            *state_sequences(first_layer, d.offsets, d.lat, d.lon)[:2], K * K, scale["level1"])})
        noisy1 = normcut_rows(release_sums(sums1["level1"], scale["level1"], noise)[None, :])[0]
        release.check_interrupt()

        # split dense cells (post-processing): kappa = 2**exponent
        mean_density = max(n_noisy, 1.0) / (K * K)
        kappa = np.sqrt(np.maximum(noisy1, 0.0) / config.kappa_c)
        exponent = np.clip(np.round(np.log2(np.maximum(kappa, 1.0))), 0, config.max_depth).astype(np.int64)
        exponent = np.where(noisy1 > config.split_threshold * mean_density, exponent, 0)
        grid = StateGrid(self.bbox, K, int(exponent.max()), exponent)
        m = grid.m
        support = Support.of(m, *grid.neighbours())
        edges = length_bins(config.max_len)
        # no coarser than the finest states (K 2^depth per side: from DP releases), so every state holds fine cells
        fine_w = placement.fine_width(self.bbox, config, n_noisy, plan.eps, k, at_least=K << int(exponent.max())) \
            if config.placing else None
        sums = batches.reduce(lambda d: self._statistics(d, grid, support, edges, scale, fine_w, plan.fine_scales))
        release.check_interrupt()

        # level2: length-normalised densities of the states; states below the noise are pruned
        noisy2 = release_sums(sums["level2"], scale["level2"], noise)
        alive = noisy2 > config.prune * scale["level2"]
        if not alive.any():
            alive = noisy2 >= noisy2.max()

        # lengths: each trajectory adds 1 to one bin (L1 sensitivity 1, k per unit)
        noisy_len = truncate_tail(release_sums(sums["lengths"], scale["lengths"], noise), scale["lengths"])
        len_probs = decreasing_tail(normcut_rows(noisy_len[None, :])[0], edges)

        # first order (start row and state rows together: one release) and second order, each of sensitivity
        # k in L1; Laplace noise on every entry of their supports (markov.release_transition_sums)
        start_n, first_n, second_n = release_transition_sums(support, sums["first"], sums["second"], scale["first"],
                                                             scale["second"], noise)

        use2 = select_second_order(first_n, support, scale["first"], config.theta2, config.theta1_factor)
        p_start, info = trip_distribution(start_n * alive, first_n[:, support.end] * alive, n_noisy,
                                          support.offsets, support.dst, decay=config.trip_decay)
        info = {"eps": plan.eps, **info, **count_record(plan.part_eps["count"], k)}
        info.update(K=K, states=m, alive_states=int(alive.sum()), depth=grid.depth, edges=support.n_edges,
                    second_order_states=int(use2.sum()))
        # fine placement: the fine density and the step histogram, eps * fine_share
        # with a public road network, the fine density is one of its street pieces (placement.road_sums)
        fine = placement.release_statistics(sums, fine_w, plan.fine_scales, noise, n_noisy, self.roads, self.bbox,
                                            config.road_piece_m) if config.placing else None
        return PrivTraceModel(grid=grid, alive=alive, fine=fine, density=np.maximum(noisy2, 0.0),
                              first=first_n.astype(np.float32), second=np.asarray(second_n, np.float32), start=p_start,
                              use2=use2, len_edges=edges, len_probs=len_probs, n_noisy=n_noisy, config=config,
                              info=info)

    def _statistics(self, d: Trajectories, grid: StateGrid, support: Support, edges, scale: dict, fine_w,
                    fine_scales):
        """The EXACT tables of one batch of whole trajectories (integer noise-grid steps; never released as they
        are): level-2 density, length bins, first- and second-order transitions and the fine stage's two."""
        off, states, _ = state_sequences(grid, d.offsets, d.lat, d.lon)
        lengths = np.diff(off)
        n = len(lengths)
        out = {"level2": density_sums(off, states, grid.m, scale["level2"]),
               "lengths": normalised_sums(length_bin(lengths, edges), np.arange(n), np.ones(n, np.int64),
                                          len(edges) - 1, scale["lengths"]),
               **transition_sums(support, off, states, scale["first"], scale["second"])}
        if fine_w is not None:
            out.update(placement.statistics(d, self.bbox, fine_w, fine_scales, roads=self.roads,
                                            piece_m=self.config.road_piece_m,
                                            flows=self.config.road_release == "flows"))
        return out
