"""The clean-slate method (Lestyan et al., "In search of lost utility: private location data", §7-8) as a
duckmob synthesizer: a private model of where and when trips start and end, plus most probable paths.

``CleanSlate(bbox, **params)`` plans from public values alone (:meth:`CleanSlate.plan` -> :class:`CleanSlatePlan`)
and ``fit(source, plan, release)`` releases one model under (eps, delta)-DP with the trajectory as the privacy unit
(or the user with at most k = ``unit.max_trajectories_per_user`` trajectories); ``model.sample(n, rng)`` is free
post-processing:

- data (per trajectory, no budget): every fix on the public w x w grid over the declared bbox, repeats collapsed,
  hops longer than r cells filled along the straight line (:mod:`.trips`); source = first cell, destination =
  last cell, slot = the start's slot of the day (n_time public slots);
- **prior** (:mod:`.prior`): noisy histograms of the trips' end cells (sources and destinations pooled, or
  apart), of the start slot, of the Chebyshev distance between the two ends and of (that distance, the detour:
  hops beyond the fewest) in power-of-two buckets;
- **TI** (:mod:`.initialiser`): a VAE over (source, destination, slot), one example per trajectory, on the public
  coarse grid (``ti_coarse`` x ``ti_coarse`` fine cells per coarse cell), its heads' fixed biases the log of the
  prior (so DP-SGD learns only the correlation of source, destination and slot); a sampled coarse source becomes
  a fine cell drawn from the prior's fine histogram inside it, and the destination is drawn given it from TI's
  destination head, the fine histogram and a distance factor fitted to the distance histogram
  (:func:`.prior.destinations`);
- **TPG** (:mod:`.transitions`): next hop among the (2r+1)^2 cells within r cells given (current, destination,
  slot); one example per trajectory, its gradient the mean over its grams (at most ``max_grams``);
- **trace generator** (:mod:`.paths`): (s, d, t) from TI, the most probable path s -> d under TPG (Dijkstra on
  -log p plus the public ``hop_cost`` per hop, one search per (d, t) on the reversed graph, kept for reuse); each
  trip draws a detour from the prior and takes the path that makes it: the most probable path, the most probable
  of the shortest paths (detour 0), or -- when the drawn detour exceeds the most probable path's -- a chain of up
  to ``MAX_WAYPOINTS`` waypoints joined by shortest legs (:func:`chain_waypoints`, :func:`.prior.waypoints`);
  cut at the public ``max_path`` cells; one point per cell, uniform inside it, then (with a step histogram) the
  output's points spaced along the polyline through them by steps drawn from it (:mod:`.spacing`); times from a
  uniform instant in the slot plus the distance along the path at the public ``speed_mps``.

What ``fit`` spends, composed by the PLD accountant into ONE event (``model.event``, recorded in the ledger once):

1. a noisy trajectory count ``N~ = N + Laplace(1 / eps_count)`` (sensitivity 1; users: (trajectories at
   sensitivity k, users), as HRNet), ``eps_count = count_share * eps``: the default n of ``sample`` and the
   expected batch ``q N~`` that DP-SGD divides its noisy sums by;
2. the prior: H histograms (ends, slot, distance, detour: H = 4; with ``prior_endpoints = 'separate'`` source
   and destination apart: H = 5; with ``prior_refine`` one more, the ends on the fine cells), each trajectory
   adding mass 1 to each (L1 sensitivity 1 per histogram, k for a user), Laplace(H k / eps_prior) on every bin,
   ``eps_prior = prior_share (eps - eps_count)`` (H ``laplace(eps_prior / H)`` events; none when ``prior_share``
   is 0);
3. the step histogram (:func:`.spacing.release_steps`): Laplace(k / eps_steps) on every public bin,
   ``eps_steps = step_share (eps - eps_count)`` (one ``laplace(eps_steps)`` event; none when ``step_share`` is 0);
   with a public road network (``roads :=``), also the density of its street pieces
   (:func:`duckmob.synth.placement.road_sums`, sensitivity k): Laplace(k / eps_roads) on every piece,
   ``eps_roads = road_share (eps - eps_count)`` (one ``laplace(eps_roads)`` event; none without roads);
4. DP-SGD of TI: ``ceil(ti_epochs / q)`` Poisson-sampled steps at rate q, clip ``max_grad_norm``, noise
   multiplier ``sigma_TI`` calibrated so that (1) + ... + (4) reach ``s + ti_share (eps - s)`` with
   ``s = eps_count + eps_prior + eps_steps``;
5. DP-SGD of TPG: ``ceil(tpg_epochs / q)`` steps at rate q, ``sigma_TPG`` calibrated so that (1) + ... + (5)
   is (eps, delta)-DP by the PLD accountant (and, given the ledger's earlier releases, within the budget).

The shares are :func:`duckmob.privacy.accounting.split`; the noise multipliers are
:func:`duckmob.privacy.accounting.calibrate_noise_multiplier` (the smallest sigma, to 0.5 %, that fits).

Sensitivity: one trajectory is one example of each DP-SGD run (TI: its own (s, d, t); TPG: the mean over its
own grams), its gradient clipped to ``max_grad_norm`` per step by ghost clipping
(:func:`duckmob.synth.dpsgd.train_ghost`); with the user unit each trajectory is clipped to ``max_grad_norm / k``
and users are sampled with all their (at most k) trajectories, so a user moves a step's sum by at most
``max_grad_norm``. The sampling rate the accountant uses is the rate the Poisson sampler draws with.
The whole plan is public: the Poisson rate is ``q = b / u`` with ``u = n_hint / k`` units and ``b = batch_size
or batch_factor sqrt(u)`` (``n_hint``: the public guess of the number of trajectories; with a different true N
the batches are ``q N`` on average), so the plan's event is exactly what ``fit`` spends -- the same on
neighbouring tables -- and the noise multipliers are calibrated once, before any data is read (within the
ledger's budget when the release core gives the source's prior); ``fit`` trains with the plan it is handed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import time
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import numpy as np
import torch

from duckmob.errors import DuckmobError
from duckmob.grid import cell_center, haversine_m
from duckmob.privacy import accounting
from duckmob.privacy.counting import count_events, count_record, count_shares, noisy_unit_counts
from duckmob.privacy.noise import check_scale
from duckmob.privacy.unit import PrivacyUnit
from duckmob.source.batches import as_batches
from duckmob.synth import dpsgd, placement
from duckmob.synth.base import (Model, Plan, ReleaseContext, Synthesizer, points_in_cells,
                                trajectories_from_cells)
from duckmob.synth.cleanslate.initialiser import Initialiser, categorical, sample_endpoints
from duckmob.synth.cleanslate.paths import Router, replace, through
from duckmob.synth.cleanslate.prior import (ENDPOINTS, coarse_of, coarse_probabilities, coarse_width, destinations,
                                            detours, draw_detours, gravity, hops, log_bias, prior_block,
                                            prior_events, refine, release_prior, waypoints)
from duckmob.synth.cleanslate.spacing import corner_vertices, release_steps, space
from duckmob.synth.cleanslate.transitions import Transitions, by_width
from duckmob.synth.cleanslate.trips import grams, trips, visits
from duckmob.synth.compute import cpu_threads, device as torch_device
from duckmob.synth.config import Config, param
from duckmob.synth.neural import NeuralModel, upgrade_info_format_1
from duckmob.trajectories import Trajectories

US_PER_DAY = 86_400_000_000


@dataclass(frozen=True)
class CleanSlateConfig(Config):
    """The clean-slate method's public hyper-parameters (``params := {...}`` in SQL), typed and validated."""

    method: ClassVar[str] = "cleanslate"

    w: int = param(32, int, low=2, high=256, doc="grid width (cells per side over the bbox; the paper's 32 x 32)")
    r: int = param(1, int, low=1, high=8, doc="next hops within r cells: (2r+1)^2 classes (§8.3.2)")
    n_time: int = param(24, int, low=1, high=1440, doc="time slots of the day (the paper: hours)")
    max_grams: int = param(32, int, low=1, high=4096, doc="grams per trajectory kept for TPG (evenly spaced)")
    max_path: int | None = param(None, int, low=2, high=100_000,
                                 doc="public cap on cells per generated path (null: 3 w)")
    hop_cost: float = param(1.0, float, low=0, doc="nats added to each hop's -log p in the path search (0: the "
                                                   "most probable path, the paper; more: fewer hops)")
    ti_hidden: int = param(32, int, low=1, high=8192, doc="TI dense layer size")
    ti_heads: str = param("cells", str, choices=("cells", "rowcol"),
                          doc="TI's cell heads: one softmax over w^2 cells (the paper), or 'rowcol': logits "
                              "a[row] + b[col] (2w outputs)")
    ti_latent: int = param(8, int, low=1, high=1024, doc="TI latent size")
    ti_coarse: int | None = param(None, int, low=1, high=256,
                                  doc="TI's cells: ti_coarse x ti_coarse fine cells each (1: the fine cells, the "
                                      "paper; null: ceil(w / 8), an 8 x 8 TI grid)")
    prior_share: float = param(0.8, float, low=0, high=1, high_open=True,
                               doc="share of eps (after the count) for the prior histograms (0: no prior)")
    step_share: float = param(0.05, float, low=0, high=1, high_open=True,
                              doc="share of eps (after the count) for the step-length histogram that spaces the "
                                  "points along each path (0: one point per path cell, the paper)")
    road_share: float = param(0.05, float, low=0, high=1, high_open=True,
                              doc="with roads := only: share of eps (after the count) for the density of the "
                                  "road network's street pieces that places the points on the streets people use "
                                  "(0: each point to its nearest road)")
    road_weight: float = param(0.5, float, low=0, high=0.9,
                               doc="with roads := and road_share > 0: the walk's paths cost each street its "
                                   "length times up to 1 / (1 - road_weight) as its released traffic falls "
                                   "(road_costs.py; post-processing; 0: shortest paths; 0.5, halfway, is not "
                                   "tuned to a city; a model stored before it existed reads 0)")
    prior_cells: int | None = param(None, int, low=1, high=256,
                                    doc="cells per side of the end and distance histograms (null: from the noisy "
                                        "count, prior.prior_block; at most w)")
    prior_refine: bool | None = param(None, bool, doc="also release the ends on the fine cells, to spread the "
                                                      "blocks (null: when w > 64)")
    prior_endpoints: str = param("shared", str, choices=ENDPOINTS,
                                 doc="'shared': one histogram of sources and destinations pooled; 'separate': one "
                                     "of each")
    tpg_embed: int = param(32, int, low=1, high=4096, doc="TPG location embedding size")
    tpg_hidden: int = param(64, int, low=1, high=8192, doc="TPG dense layer size")
    ti_share: float = param(0.5, float, low=0, high=1, low_open=True, high_open=True,
                            doc="share of eps (after the count and the prior) calibrated for TI; TPG gets "
                                "the rest")
    count_share: float = param(0.01, float, low=0, high=0.5, low_open=True, doc="share of eps for the noisy count")
    ti_epochs: int = param(20, int, low=1, high=100_000, doc="TI DP-SGD epochs")
    tpg_epochs: int = param(10, int, low=1, high=100_000, doc="TPG DP-SGD epochs")
    batch_size: int | None = param(None, int, low=1, doc="batch at N = n_hint; null: batch_factor * sqrt(n_hint)")
    batch_factor: float = param(4.0, float, low=0, low_open=True, doc="batch per sqrt(n_hint)")
    lr: float = param(5e-3, float, low=0, low_open=True, doc="Adam learning rate")
    lr_final: float = param(0.1, float, low=0, high=1, low_open=True, doc="cosine decay to lr_final * lr")
    max_grad_norm: float = param(1.0, float, low=0, low_open=True, doc="DP-SGD clipping norm (per trajectory)")
    speed_mps: float = param(5.0, float, low=0, low_open=True, doc="public speed that spaces the times (m/s)")
    n_hint: int = param(10_000, int, low=1, doc="public guess of N: sets the Poisson rate q = batch / n_hint")
    base_date: str = param("2008-01-01", str, date=True, doc="public date of the synthetic times")
    device: str | None = param(None, str, doc="null: CUDA when available, else CPU")
    threads: int | None = param(None, int, low=1, high=1024, doc="torch CPU threads; null: 1 (duckmob.synth.compute)")
    progress: bool | None = param(None, bool, doc="null: DUCKMOB_PROGRESS decides (on except in CI and pytest)")

    def check(self) -> None:
        torch_device(self.device, self.label())    # a device torch cannot name is refused with the parameters
        if self.r >= self.w:
            raise DuckmobError(f"cleanslate parameter r must be below w (got r = {self.r}, w = {self.w})")
        if self.prior_share + self.step_share + self.road_share >= 1:
            raise DuckmobError(f"cleanslate parameters prior_share + step_share + road_share must be below 1, what "
                               f"DP-SGD gets is the rest (got {self.prior_share:g} + {self.step_share:g} + "
                               f"{self.road_share:g})")


# Nats per hop of the shortest-path router: far above any path's summed -log p, so the fewest hops come first and
# the probabilities only choose among the shortest paths.
SHORTEST = 1e6
# Waypoints a trip's detour may take (public).
MAX_WAYPOINTS = 3


def chain_waypoints(source, dest, detour, p_mid, w: int, r: int, rng) -> list[np.ndarray]:
    """Up to ``MAX_WAYPOINTS`` waypoints per trip (arrays of cells, -1 where a trip has no more) whose extra hops add
    up to about ``detour``: each inserted between the previous one (the source first) and the destination, adding
    an even share of what is still missing (its ceiling over the waypoints left; :func:`.prior.waypoints`), until
    nothing is missing or a waypoint adds nothing: a long detour becomes a few moderate turns rather than one far
    loop (which one waypoint on a small grid cannot always make). Post-processing, vectorised over trips."""
    prev, missing = np.asarray(source, dtype=np.int64).copy(), np.asarray(detour, dtype=np.int64).copy()
    stops: list[np.ndarray] = []
    for j in range(MAX_WAYPOINTS):
        m = waypoints(prev, dest, -(-missing // (MAX_WAYPOINTS - j)), p_mid, w, r, rng)
        has = m >= 0
        if not has.any():
            break
        extra = np.where(has, hops(prev, m, w, r) + hops(m, dest, w, r) - hops(prev, dest, w, r), 0)
        missing = np.where(has & (extra > 0), np.maximum(missing - extra, 0), 0)
        stops.append(m)
        prev = np.where(has, m, prev)
    return stops


def chained_paths(router: "Router", source, dest, slot, stops: list[np.ndarray], cap: int):
    """Paths source -> stops[0] -> stops[1] ... -> dest (a stop of -1 and those after it skipped), each leg
    ``router``'s path, joined and cut at ``cap`` cells. Returns (lengths, cells)."""
    cur = np.asarray(source, dtype=np.int64)
    path = None
    for m in [*stops, np.asarray(dest, dtype=np.int64)]:
        go = m >= 0
        leg = router.paths(cur[go], m[go], slot[go], cap)
        path = leg if path is None else through(*path, *leg, go, cap)
        cur = np.where(go, m, cur)
    return path


# Points per path cell that the spacing may place on average (public): steps far below a cell (GeoLife's fixes every
# few seconds) need many; a cap of one point per cell stretched them over long paths until they skipped cells.
POINTS_PER_CELL = 16


def max_points(config: CleanSlateConfig) -> int:
    """The public cap on the points of one sampled trajectory: ``max_path`` (default ``3 w``) cells, one point per
    cell (a one-cell path gets two); with a step histogram the spaced points, at most ``POINTS_PER_CELL`` per cell
    of ``max_path``."""
    cells = max(int(config.max_path or 3 * config.w), 2)
    return cells * POINTS_PER_CELL if config.step_share > 0 else cells


def budget_parts(eps: float, config: CleanSlateConfig, roads: bool = False) -> tuple[float, float, float, float]:
    """``(eps_count, eps_prior, eps_steps, eps_roads)``: the count's share of eps, and the prior's, the step
    histogram's and (with a public road network, ``roads``) the road density's shares of what the count leaves
    (module docstring, 1-3). Without roads ``eps_roads`` is 0 and the others are what they were before roads."""
    eps_count = accounting.split(eps, {"count": config.count_share})["count"]
    rest = accounting.split(eps - eps_count, {"prior": config.prior_share, "steps": config.step_share,
                                              "roads": config.road_share if roads else 0.0})
    return eps_count, rest["prior"], rest["steps"], rest["roads"]


@dataclass(frozen=True, kw_only=True)
class CleanSlatePlan(Plan):
    """The schedule of one clean-slate fit (module docstring, 1-4), from public values only: the count's and the
    prior's and the step histogram's epsilons, and each DP-SGD run's steps and noise multiplier (both at
    ``sample_rate``)."""

    eps_count: float
    eps_prior: float
    eps_steps: float
    eps_roads: float
    steps_ti: int
    steps_tpg: int
    sigma_ti: float
    sigma_tpg: float

    def dp_sgd(self, run: int, config: CleanSlateConfig, expected_batch: float) -> dpsgd.Schedule:
        """The schedule of DP-SGD run ``run`` (0: TI, 1: TPG): this plan's rate and that run's steps and noise
        multiplier, the config's clipping norm and optimiser settings, the public ``expected_batch`` (the rate
        times the noisy count of units)."""
        steps, sigma = (self.steps_ti, self.sigma_ti) if run == 0 else (self.steps_tpg, self.sigma_tpg)
        return dpsgd.Schedule(sample_rate=self.sample_rate, steps=steps, noise_multiplier=sigma,
                              max_grad_norm=config.max_grad_norm, expected_batch_size=expected_batch, lr=config.lr,
                              lr_final=config.lr_final)


def build_networks(config: CleanSlateConfig) -> tuple[Initialiser, Transitions]:
    """TI and TPG of a (resolved) config, freshly initialised from torch's RNG; TI over the coarse cells of
    ``ti_coarse``."""
    cw = coarse_width(config.w, config.ti_coarse)
    ti = Initialiser(cw * cw, config.n_time, config.ti_hidden, config.ti_latent,
                     cw if config.ti_heads == "rowcol" else None)
    tpg = Transitions(config.w, config.r, config.n_time, config.tpg_embed, config.tpg_hidden)
    return ti, tpg


# What a stored model's info must hold for sampling (checked when an older format is read: nothing is filled in)
_INFO_NEEDED = ("n_noisy", "has_time")
# Config fields added after format 2, which upgrade_format_2 sets (the older models' behaviour)
_SINCE_FORMAT_3 = ("step_share",)
# Config fields added later without a format change: a model stored before them reads their default (road_share
# acts only in a fit with roads), but road_weight 0 (restore: the shortest paths it walked then)
_LATER = ("road_share", "road_weight")


def upgrade_format_1(stored: dict) -> dict:
    """A format-1 model (duckmob before stored models carried a version: ``torch.save`` of bbox, config, state,
    event_json and info, no header) in format 2's layout: the info's ``contribution_bound`` is named
    ``max_trajectories_per_user``. Nothing is filled in: a format-1 model lacking a parameter its sampling reads
    (e.g. ``hop_cost``, which the very first ones did not store) is refused, not given today's default."""
    config, info = dict(stored["config"]), upgrade_info_format_1(stored["info"])
    fields = ({f.name for f in dataclasses.fields(CleanSlateConfig)} - set(CleanSlateConfig.MACHINE)
              - set(_SINCE_FORMAT_3) - set(_LATER))
    missing = sorted(fields - set(config)) + [f"info.{key}" for key in _INFO_NEEDED if key not in info]
    if missing:
        raise DuckmobError(f"this cleanslate model was stored by an older duckmob and lacks {', '.join(missing)}, "
                           "which sampling needs: fit the model again")
    return {**stored, "config": config, "info": info}


def upgrade_format_2(stored: dict) -> dict:
    """A format-2 model (before the step histogram) in format 3's layout: ``step_share`` 0, what it did: no step
    histogram was released, and sampling keeps one point per path cell."""
    return {**stored, "config": {**stored["config"], "step_share": 0.0}}


class CleanSlateModel(NeuralModel):
    """A fitted clean-slate model: public configuration, DP weights of TI and TPG, the spent event."""

    method = "cleanslate"
    format_version: ClassVar[int] = 3

    def __init__(self, bbox: list, config: CleanSlateConfig, state: dict, event_json: str, info: dict,
                 timings: dict):
        self.bbox, self.config, self.state = bbox, config, state
        self.event_json, self.info, self.timings = event_json, info, timings
        self._nets = None
        self._routers: dict[tuple, Router] = {}

    def networks(self) -> tuple[Initialiser, Transitions]:
        if self._nets is None:
            with torch.random.fork_rng(devices=[]):
                ti, tpg = build_networks(self.config)
            ti.load_state_dict(self.state["ti"])
            tpg.load_state_dict(self.state["tpg"], strict=False)   # log_mask is public structure, rebuilt
            self._nets = (ti.eval(), tpg.eval())
        return self._nets

    @property
    def road_density(self) -> np.ndarray | None:
        """The released density of the road network's segments (fitted with ``roads :=``), else None."""
        road = self.state.get("road")
        return None if road is None else road.numpy()

    @property
    def max_points(self) -> int:
        """``max_path`` cells, one point each (every path is cut there, waypoint chains included)."""
        return max_points(self.config)

    def sample(self, n: int, rng: np.random.Generator) -> Trajectories:
        """Draw ``n`` synthetic trajectories (post-processing; vectorised over trajectories) on the config's
        device, with its ``threads``."""
        with cpu_threads(self.config.threads):
            return self._sample(n, rng)

    def _sample(self, n: int, rng: np.random.Generator) -> Trajectories:
        config = self.config
        device = torch_device(config.device)
        ti, tpg = self.networks()
        tpg.to(device)
        source, dest, slot = self._endpoints(ti, int(n), rng, device)

        w, r, cap = config.w, config.r, config.max_path
        router = self._router(tpg, device, config.hop_cost)
        lengths, cells = router.paths(source, dest, slot, cap)
        prior = {h: v.numpy() for h, v in self.state.get("prior", {}).items()}
        if "detour" in prior:
            # each trip draws a detour (hops beyond the fewest) and gets the path that makes it: the most probable
            # path when its own detour is the nearest; the most probable of the shortest paths (detour 0) when 0 is
            # nearer; through waypoints adding the detour (s -> m1 -> ... -> d along shortest legs, so that the
            # legs add no detour of their own) when the drawn detour is beyond the most probable path's
            detour = draw_detours(source, dest, prior["detour"], w, cap, rng)
            own = lengths - 1 - hops(source, dest, w, r)
            shortest = self._router(tpg, device, SHORTEST)
            flat = detour < own - detour
            lengths, cells = replace(lengths, cells, flat, *shortest.paths(source[flat], dest[flat], slot[flat], cap))
            stops = chain_waypoints(source, dest, np.where(detour > own, detour, 0),
                                    (prior["source"] + prior["dest"]) / 2, w, r, rng)
            if stops:
                via = stops[0] >= 0
                path = chained_paths(shortest, source[via], dest[via], slot[via], [m[via] for m in stops], cap)
                lengths, cells = replace(lengths, cells, via, *path)
        return self._points(lengths, cells, slot, rng)

    def _router(self, tpg: Transitions, device: torch.device, hop_cost: float) -> Router:
        """This model's router for ``hop_cost``, kept across sampling calls (an output's blocks search each
        (destination, slot) group once: :class:`.paths.Router`)."""
        def log_probs(d, t):
            out = tpg.log_probs_for(torch.as_tensor(d, device=device), torch.as_tensor(t, device=device))
            return out.cpu().numpy()

        key = (float(hop_cost), str(device))
        if key not in self._routers:
            self._routers.setdefault(key, Router(log_probs, self.config.w, self.config.r, hop_cost=hop_cost))
        return self._routers[key]

    def _endpoints(self, ti, n: int, rng, device, chunk: int = 4096) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(fine source, fine destination, slot) of ``n`` samples: TI's decoder at z ~ N(0, I); the coarse source
        refined by the released histogram; the destination given the source (:func:`.prior.destinations`), or,
        without a prior, TI's destination refined uniformly."""
        w, coarse = self.config.w, self.config.ti_coarse
        prior = {h: v.numpy() for h, v in self.state.get("prior", {}).items()}
        if not prior:
            source, dest, slot = sample_endpoints(ti, n, rng, device)
            return refine(source, None, w, coarse, rng), refine(dest, None, w, coarse, rng), slot
        out = [], [], []
        ti.to(device).eval()
        with torch.no_grad():
            for lo in range(0, n, chunk):
                m = min(chunk, n - lo)
                z = torch.as_tensor(rng.standard_normal((m, ti.latent)), dtype=torch.float32, device=device)
                ls, ld, lt = ti.decode(z)
                source = refine(categorical(ls, rng.random(m)), prior["source"], w, coarse, rng)
                slot = categorical(lt, rng.random(m))
                dest = destinations(source, ld.cpu().numpy(), prior["dest"], prior["g"], prior["f"], w, coarse, rng)
                for part, value in zip(out, (source, dest, slot)):
                    part.append(value)
        return tuple(np.concatenate(p).astype(np.int64) for p in out)

    def _points(self, lengths, cells, slot, rng) -> Trajectories:
        """One point per cell, uniform inside it (a one-cell path gets two points there, so every trajectory
        has the input contract's two points); with a released step histogram those points are the vertices of a
        polyline along which the output's points are spaced by steps drawn from it (:func:`.spacing.space`, at
        most ``max_points``). Times from the slot and the public speed along the path (cell centres without
        the step histogram)."""
        config = self.config
        first = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        reps = np.ones(len(cells), dtype=np.int64)
        reps[first[lengths == 1]] = 2
        cells = np.repeat(cells, reps)
        lengths = np.maximum(lengths, 2)
        lat, lon = points_in_cells(cells, self.bbox, config.w, rng)
        steps = self.state.get("steps")
        spaced = steps is not None and float(steps.sum()) > 0
        if spaced:
            vertices = corner_vertices(lengths, cells, lat, lon, self.bbox, config.w)
            lengths, lat, lon, along_m = space(*vertices, steps.numpy(), self.bbox, max_points(config), rng)
        if not self.info["has_time"]:
            return trajectories_from_cells(lengths, lat, lon)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        if spaced:
            elapsed = along_m / config.speed_mps
        else:
            clat, clon = cell_center(cells, self.bbox, config.w)
            step_s = np.zeros(len(cells))
            step_s[1:] = haversine_m(clat[:-1], clon[:-1], clat[1:], clon[1:]) / config.speed_mps
            step_s[offsets[:-1]] = 0.0
            elapsed = np.cumsum(step_s)
            elapsed -= np.repeat(elapsed[offsets[:-1]], lengths)
        slot_us = US_PER_DAY // config.n_time
        base = int(np.datetime64(config.base_date, "us").astype(np.int64))
        start = base + slot * slot_us + (rng.random(len(slot)) * slot_us).astype(np.int64)
        ts = np.repeat(start, lengths) + np.round(elapsed * 1e6).astype(np.int64)
        return trajectories_from_cells(lengths, lat, lon, ts)

    def stored(self) -> dict[str, Any]:
        """bbox, config (without the machine's settings: :meth:`~duckmob.synth.config.Config.stored_dict`), state,
        event_json and info; no timings: wall-clock durations are not part of the release."""
        return dict(bbox=self.bbox, config=self.config.stored_dict(), state=self.state,
                    event_json=self.event_json, info=self.info)

    @classmethod
    def restore(cls, stored: dict[str, Any], version: int, method: str) -> "CleanSlateModel":
        if version == 1:
            stored = upgrade_format_1(stored)
        if version <= 2:
            stored = upgrade_format_2(stored)
        config = CleanSlateConfig.restored({"road_weight": 0.0, **stored["config"]})    # _LATER
        return cls(stored["bbox"], config, stored["state"], stored["event_json"], stored["info"], {})

    def describe(self) -> dict[str, Any]:
        return {**self.info, **self.config.stored_dict()}


class CleanSlate(Synthesizer):
    """Lestyan et al.'s clean-slate synthesizer (see the module docstring for the privacy map)."""

    method = "cleanslate"
    config_class: ClassVar[type[Config]] = CleanSlateConfig
    model_class: ClassVar[type[Model]] = CleanSlateModel
    default_delta: ClassVar[float] = 1e-5
    needs_delta: ClassVar[bool] = True
    mechanism: ClassVar[str] = "trains with DP-SGD"
    config: CleanSlateConfig

    def configure(self, config: CleanSlateConfig) -> CleanSlateConfig:
        """Defaults that follow the public grid width, resolved (and stored so in the model's config)."""
        return config.replace(max_path=config.max_path or 3 * config.w,
                              ti_coarse=config.ti_coarse or -(-config.w // 8),
                              prior_refine=config.w > 64 if config.prior_refine is None else config.prior_refine)

    def plan(self, eps: float, delta: float, unit: PrivacyUnit = PrivacyUnit(), prior=None) -> CleanSlatePlan:
        """The fit's schedule from public values only (module docstring, 1-4): the Poisson rate from ``n_hint``,
        TI's noise multiplier calibrated to its target alone, TPG's to (eps, delta) and within ``prior`` (the
        source's budget and other releases) when given."""
        config, k = self.config, unit.max_trajectories_per_user
        eps_count, eps_prior, eps_steps, eps_roads = budget_parts(eps, config, roads=self.roads is not None)
        units = max(config.n_hint / k, 1.0)
        batch = float(config.batch_size or config.batch_factor * math.sqrt(units))
        q = min(1.0, batch / units)
        steps_ti, steps_tpg = int(math.ceil(config.ti_epochs / q)), int(math.ceil(config.tpg_epochs / q))
        fixed = count_events(eps_count, k) + prior_events(eps_prior, config.prior_endpoints, config.prior_refine)
        if eps_steps > 0:
            check_scale(k / eps_steps)
            fixed.append(accounting.laplace(eps_steps))
        if eps_roads > 0:
            check_scale(k / eps_roads)
            fixed.append(accounting.laplace(eps_roads))
        spent = eps_count + eps_prior + eps_steps + eps_roads
        target_ti = spent + config.ti_share * (eps - spent)
        sigma_ti = accounting.calibrate_noise_multiplier(fixed, q, steps_ti, target_ti, delta)
        ti = accounting.dp_sgd(sigma_ti, q, steps_ti)
        sigma_tpg = accounting.calibrate_noise_multiplier(fixed + [ti], q, steps_tpg, eps, delta, prior=prior)
        event = accounting.compose(fixed + [ti, accounting.dp_sgd(sigma_tpg, q, steps_tpg)])
        return CleanSlatePlan(eps=eps, delta=delta, unit=unit, event=event, bbox=self.bbox,
                              needs_time=self.needs_time, max_points=max_points(config), sample_rate=q,
                              default_size=config.n_hint,
                              eps_count=eps_count, eps_prior=eps_prior, eps_steps=eps_steps, eps_roads=eps_roads,
                              steps_ti=steps_ti,
                              steps_tpg=steps_tpg, sigma_ti=sigma_ti, sigma_tpg=sigma_tpg)

    def fit(self, source, plan: CleanSlatePlan, release: ReleaseContext) -> CleanSlateModel:
        """One release of ``plan`` (module docstring): the count and the prior from ``release.noise``, then TI and
        TPG by DP-SGD with the plan's rate, steps and noise multipliers, with the config's ``threads``."""
        with cpu_threads(self.config.threads), _collector_frozen():
            return self._fit(source, plan, release)

    def _fit(self, source, plan: CleanSlatePlan, release: ReleaseContext) -> CleanSlateModel:
        config = self.config
        t0 = time.perf_counter()
        device = torch_device(config.device)
        noise = release.noise
        rng = noise.generator()
        # out of core: the first fix of each cell visit of every trajectory, in the in-memory order
        data = as_batches(source).gather(lambda d: visits(d, self.bbox, config.w))
        tr = trips(data, self.bbox, config.w, config.r, config.n_time)
        gr = grams(tr, config.w, config.r, config.max_grams)
        k = plan.unit.max_trajectories_per_user
        out = self._noisy_releases(source, plan, tr, noise)
        batch = plan.sample_rate * max(float(out.n_noisy if out.units_noisy is None else out.units_noisy), 1.0)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(rng.integers(2 ** 62)))
            ti, tpg = build_networks(config)
        if out.hist is not None:
            ti.set_prior(*(log_bias(coarse_probabilities(out.hist[h], config.w, config.ti_coarse))
                           for h in ("source", "dest")), log_bias(out.hist["slot"]))
        run = _Runs(plan, release, rng, device, batch, dict(unit_of_row=tr.user_id if k > 1 else None,
                                                            max_trajectories_per_user=k))
        timings = {"prepare_s": time.perf_counter() - t0}
        timings["ti_s"] = self._train_ti(ti, tr, run)
        timings.update(tpg_s=self._train_tpg(tpg, tr, gr, run), total_s=time.perf_counter() - t0)
        info = dict(method=self.method, eps=plan.eps, delta=plan.delta,
                    epsilon_accounted=accounting.epsilon(plan.event, plan.delta),
                    n_noisy=out.n_noisy, units_noisy=out.units_noisy, eps_count=plan.eps_count,
                    eps_prior=plan.eps_prior, eps_steps=plan.eps_steps, eps_roads=plan.eps_roads,
                    **count_record(count_shares(plan.eps_count, k)[0], k),
                    prior_block=out.block, sample_rate=plan.sample_rate, expected_batch=batch,
                    steps_ti=plan.steps_ti, steps_tpg=plan.steps_tpg, noise_multiplier_ti=plan.sigma_ti,
                    noise_multiplier_tpg=plan.sigma_tpg, has_time=data.has_time, seeded=bool(noise.seeded),
                    max_trajectories_per_user=k)
        return CleanSlateModel(self.bbox.as_list(), config, _state(ti, tpg, out, config.w), plan.event.to_json(),
                               info, timings)

    def _noisy_releases(self, source, plan: CleanSlatePlan, tr, noise) -> "_Releases":
        """Parts 1-3b of the module docstring's spend, from ``noise`` in this order: the noisy count, the prior
        (when ``eps_prior > 0``), the step histogram (``eps_steps > 0``) and the road density (``eps_roads > 0``)."""
        config = self.config
        k = plan.unit.max_trajectories_per_user
        eps_prior = plan.eps_prior
        n_noisy, units_noisy = noisy_unit_counts(tr.user_id, plan.eps_count, noise, k)
        # (2) the prior: H noisy histograms, each trajectory adding mass 1 to each (module docstring)
        detour = detours(tr.source, tr.dest, np.diff(tr.offsets), config.w, config.r, config.max_path)
        block = prior_block(config.w, n_noisy, eps_prior, k, config.prior_endpoints, config.prior_cells,
                            config.prior_refine)
        hist = release_prior(tr.source, tr.dest, tr.slot, config.w, config.n_time, eps_prior, noise, k,
                             config.prior_endpoints, detour, config.max_path, block, config.prior_refine) \
            if eps_prior > 0 else None
        # (3) the step histogram that spaces the points along the paths (.spacing)
        steps = release_steps(source, self.bbox, plan.eps_steps, noise, k, n_noisy) if plan.eps_steps > 0 else None
        # (3b) with a public road network: the density of its street pieces, where the points go on the streets
        # (placement.road_sums: each trajectory's mass 1 over the pieces its fixes match, sensitivity k; Laplace of
        # k / eps_roads on every piece; the output's points drawn near their path by it, duckmob.synth.onroads)
        road = None
        if plan.eps_roads > 0:
            road_scale = k / plan.eps_roads
            road_sums = as_batches(source).reduce(lambda d: {"road": placement.road_sums(d, self.roads, road_scale)})
            road = placement.release_road_density(road_sums["road"], self.roads, road_scale, noise)
        return _Releases(n_noisy, units_noisy, block, hist, steps, road)

    def _train_ti(self, ti: Initialiser, tr, run: "_Runs") -> float:
        """(3) TI by DP-SGD (run 0): one example per trajectory (its coarse cells); the VAE's reparameterisation
        noise is an input. Returns the seconds it took."""
        config, device = self.config, run.device
        ti_source, ti_dest = (torch.as_tensor(coarse_of(a, config.w, config.ti_coarse)) for a in (tr.source, tr.dest))
        slot = torch.as_tensor(tr.slot, dtype=torch.long)
        latent_gen = dpsgd.torch_generator(run.rng, torch.device("cpu"))

        def ti_losses(module, rows):
            idx = torch.as_tensor(rows, dtype=torch.long)
            eps_z = torch.randn((len(rows), config.ti_latent), generator=latent_gen)
            return module(ti_source[idx].to(device), ti_dest[idx].to(device), slot[idx].to(device),
                          eps_z.to(device))

        # a failure or Ctrl-C in a run is charged the steps that ran (dpsgd.charged_as_run): TI is DP-SGD part 0
        with dpsgd.charged_as_run(run.release, run.plan.event, run=0) as ran:
            log = dpsgd.train_ghost(ti, ti_losses, tr.n, run.plan.dp_sgd(0, config, run.batch),
                                    run.context(ran, "cleanslate TI", config), **run.units)
        return log.seconds

    def _train_tpg(self, tpg: Transitions, tr, gr, run: "_Runs") -> float:
        """(4) TPG by DP-SGD (run 1): one example per trajectory, its loss the mean over its grams. Returns the
        seconds it took."""
        config, device = self.config, run.device
        current, label = torch.as_tensor(gr.current), torch.as_tensor(gr.label)
        dest = torch.as_tensor(tr.dest, dtype=torch.long)
        slot = torch.as_tensor(tr.slot, dtype=torch.long)
        count = torch.as_tensor(gr.count)

        def tpg_losses(module, rows):
            idx = torch.as_tensor(rows, dtype=torch.long)
            cnt = count[idx]
            width = max(1, int(cnt.max()))   # the batch's own gram width, not the data's
            return module(current[idx, :width].to(device), dest[idx].to(device), slot[idx].to(device),
                          label[idx, :width].to(device), cnt.to(device))

        with dpsgd.charged_as_run(run.release, run.plan.event, run=1) as ran:
            log = dpsgd.train_ghost(tpg, tpg_losses, tr.n, run.plan.dp_sgd(1, config, run.batch),
                                    run.context(ran, "cleanslate TPG", config), split_rows=by_width(gr.count),
                                    **run.units)
        return log.seconds


class _Releases(NamedTuple):
    """What :meth:`CleanSlate._noisy_releases` released: the noisy counts, the prior's block and histograms (None
    without a prior), the step histogram and the road density (None when not released)."""

    n_noisy: float
    units_noisy: float | None
    block: Any
    hist: dict | None
    steps: np.ndarray | None
    road: np.ndarray | None


@dataclass(frozen=True)
class _Runs:
    """What both DP-SGD runs of one :meth:`CleanSlate.fit` share: the plan, the release, the numpy generator, the
    torch device, the expected batch and the privacy unit's keyword arguments of :func:`dpsgd.train_ghost`."""

    plan: CleanSlatePlan
    release: ReleaseContext
    rng: np.random.Generator
    device: torch.device
    batch: float
    units: dict

    def context(self, ran: dpsgd.StepsRun, desc: str, config: CleanSlateConfig) -> dpsgd.RunContext:
        return dpsgd.RunContext(self.rng, self.device, config.progress, self.release.check_interrupt,
                                steps_run=ran, desc=desc)


@contextlib.contextmanager
def _collector_frozen():
    """Python's cyclic garbage collector told to leave alone every object that exists when a fit starts
    (``gc.freeze``; unfrozen after): the DP-SGD steps allocate many short-lived objects, and each full collection
    they set off walked every object of the imported libraries (10% of a fit's CPU on 20,000 trips). Speed only:
    what the fit computes is unchanged."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _state(ti: Initialiser, tpg: Transitions, out: _Releases, w: int) -> dict:
    """The fitted model's tensors: both networks (TPG without its public mask), the released fine histograms that
    refine TI's cells with the distance factors, the step histogram and the road density (those released)."""
    state = {"ti": {name: v.detach().cpu() for name, v in ti.state_dict().items()},
             "tpg": {name: v.detach().cpu() for name, v in tpg.state_dict().items() if name != "log_mask"}}
    hist = out.hist
    if hist is not None:
        g, f = gravity(hist["source"], hist["dest"], hist["distance"], w)
        state["prior"] = {h: torch.as_tensor(v, dtype=torch.float64) for h, v in
                          (("source", hist["source"]), ("dest", hist["dest"]), ("g", g), ("f", f),
                           ("detour", hist["detour"]))}
    if out.steps is not None:
        state["steps"] = torch.as_tensor(out.steps, dtype=torch.float64)
    if out.road is not None:
        state["road"] = torch.as_tensor(out.road, dtype=torch.float32)
    return state


__all__ = ["CleanSlate", "CleanSlateConfig", "CleanSlateModel", "CleanSlatePlan"]
