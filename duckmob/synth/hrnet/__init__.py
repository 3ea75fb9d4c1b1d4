"""HRNet (Takagi et al., PVLDB 2024) and its DP-SGD baseline as duckmob synthesizers.

``HRNet(bbox, **params).fit(trajectories, eps, delta, noise)`` releases one model under (eps, delta)-DP, with
the trajectory as the privacy unit (adding or removing one trajectory), or the user when the SQL layer sets
``contribution_bound = k`` (at most k trajectories per user, already bounded: counts and DPTRAN scale by k,
DP-SGD samples users and clips each user's summed gradient); ``model.sample(n, rng)`` is free
post-processing. ``Baseline`` is the paper's §2.3 baseline (embedding matrix + GRU + linear scoring) trained
the same way, without pre-training.

What ``fit`` spends, composed in one PLD accountant (:func:`duckmob.privacy.accounting.epsilon`) and meant to be
recorded in the ledger once (``model.event``):

1. a noisy trajectory count ``N~ = N + Laplace(1 / eps_count)`` (sensitivity 1), ``eps_count = count_share * eps``
   (user unit with at most k trajectories: N~ at sensitivity k and a noisy user count, splitting eps_count);
   it sets the expected batch ``b = batch_factor sqrt(N~)`` (paper: sqrt(N); default factor 2 for HRNet, 1 for the
   baseline: each method's better setting in benchmarks/hrnet.py), the sampling
   rate ``q = b / N~`` and the pre-training budget;
2. the length histogram, ``eps_len = length_share * eps``: each trajectory adds 1 to the bin of its (capped)
   number of cells, so one trajectory moves it by 1 in L1 and a user by k; Laplace(k / eps_len) on every one of
   the ``max_len`` bins (``counting.normalised_release``), NormCut. Samples draw their length from it and the
   generator runs to that length (the model's own end token made one-cell sequences 1.75 times too frequent and
   sequences of >= 4 cells 2.7 times too rare on GeoLife). ``length_share := 0`` keeps the end token.
3. the fine-placement stage (``duckmob/synth/placement.py``) at ``eps * fine_share``: with ``output := 'stays'``
   the density alone, of the fine cells holding the modelled points (a trajectory's mass 1 split over its distinct
   fine cells: sensitivity k), Laplace on every fine cell; with ``output := 'points'`` placement.py's two parts on
   the raw fixes (the density of where trajectories go and the step histogram, sensitivity k each), so samples
   are routed points timed between their cells' slots; off with ``output := 'cells'`` or ``fine_share := 0``;
4. (HRNet with ``pretrain``) DPTRAN, ``eps_pre`` from HRNet eq. 9 with c = 0.018 on public parameters and ``N~``
   (see :mod:`.pretrain`), within what 1-3 leave;
5. DP-SGD: ``steps = ceil(epochs / q)`` Poisson-sampled steps at rate ``q`` with clipping norm
   ``max_grad_norm``. **The noise multiplier is calibrated** (:func:`calibrate_noise_multiplier`; the number of
   steps is fixed by ``epochs``) so that the composition of 1-5 is (eps, delta)-DP by the PLD accountant. The
   optimiser is Adam; its learning rate follows a public schedule (``lr_final``), which costs nothing.

``privacy_event(eps, delta)`` (asked before any data is read) is the same plan for the public ``n_hint``
trajectories; the fit's own event (with the noisy count) is ``model.event``. Both are calibrated to epsilon
<= eps at delta (and, given the ledger's earlier releases, within the budget); the ledger records
``model.event``.

Only public parameters and DP releases shape the run: the bbox is declared, N is noisy, lengths are truncated
at the public ``max_len``, time slots are fixed fractions of the day.
"""

from __future__ import annotations

import io
import math
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from duckmob.errors import BudgetError, DuckmobError
from duckmob.grid import BBox, assign_pois, cell_of, haversine_m, quadtree_depth
from duckmob.synth import placement
from duckmob.synth.base import Model, Synthesizer, trajectories_from_cells
from duckmob.synth.compute import cpu_threads, device as torch_device
from duckmob.synth.config import param
from duckmob.synth.placement import PlacementConfig
from duckmob.privacy import accounting
from duckmob.privacy.accounting import calibrate_noise_multiplier
from duckmob.privacy.counting import count_record, count_shares, normalised_release, noisy_unit_counts
from duckmob.privacy.noise import check_scale
from duckmob.privacy.normcut import normcut
from duckmob.source.batches import as_batches
from duckmob.synth.hrnet.encoding import morton
from duckmob.synth.hrnet.generate import (DECODES, one_cell_twice, sample_sequences, slot_times, to_trajectories,
                                         zorder_to_grid)
from duckmob.synth.hrnet.model import INPUT_LEVELS, MULTITASK_LOSSES, BaselineModel, HRNetModel
from duckmob.synth.hrnet.pretrain import PRETRAIN_LEVEL, dptran, pretrain, pretraining_epsilon
from duckmob.synth.hrnet.train import dp_sgd_train, training_arrays
from duckmob.trajectories import CellSequences, Trajectories

@dataclass(frozen=True)
class HRNetConfig(PlacementConfig):
    """HRNet's and the baseline's public hyper-parameters (``params := {...}`` in SQL), typed and validated.
    Defaults and the reasons for them are in each field's doc; benchmarks/hrnet.py measured the choices.
    The fine-placement fields (``fine_share``, ``fine_w``, ``fine_m``, ``anchors``, ``max_points``) are
    placement.py's; ``output`` adds 'stays', the default here (see :class:`FittedModel.sample`)."""

    method: ClassVar[str] = "HRNet"

    fine_share: float = param(0.1, float, low=0, high=0.9,
                              doc="share of eps spent on the fine density and the step histogram (0: cells only)")
    output: str = param("stays", str, choices=("stays", "points", "cells"),
                        doc="'stays': one point per visited cell, placed by the fine density; 'points': routed "
                            "points between the cells, spaced like the real fixes and timed between the stays; "
                            "'cells': one uniform point per cell")
    length_share: float = param(0.05, float, low=0, high=0.5,
                                doc="share of eps for the length histogram the samples follow (0: the model's own "
                                    "end token)")
    threads: int | None = param(None, int, low=1, high=1024, doc="torch CPU threads; null: 1 (duckmob.synth.compute)")
    workers: int = param(1, int, low=1, high=1024,
                         doc="DP-SGD data-parallel processes (gloo on CPU, NCCL with one GPU each; "
                             "duckmob.synth.distributed), each with `threads` threads; 1: in this process")

    w: int = param(32, int, low=2, high=1024, doc="grid width, a power of two (HRNet's GeoLife setting)")
    n_time: int = param(5, int, low=1, high=1440, doc="time slots of the day (the reference's 5 bins)")
    max_len: int = param(16, int, low=1, high=10_000, doc="public cap on cells per trajectory")
    stay_points: bool = param(True, bool, doc="Li et al. 2008 stay points (HRNet §5.1.2)")
    radius_m: float = param(200.0, float, low=0, low_open=True, doc="stay-point radius (metres)")
    min_minutes: float = param(30.0, float, low=0, doc="stay-point minimum duration (minutes)")
    loc_dim: int = param(32, int, low=1, high=4096, doc="location encoding size (Table 2's growth per depth)")
    time_dim: int = param(16, int, low=1, high=4096, doc="time embedding size")
    hidden: int = param(64, int, low=1, high=8192, doc="GRU hidden size")
    key_dim: int = param(32, int, low=1, high=4096, doc="attention key size")
    deconv_activation: bool = param(True, bool, doc="tanh after each quad deconvolution (the paper: linear)")
    epochs: int = param(30, int, low=1, high=100_000, doc="DP-SGD epochs")
    batch_size: int | None = param(None, int, low=1, doc="expected batch; null: batch_factor * sqrt(noisy N)")
    batch_factor: float | None = param(None, float, low=0, low_open=True,
                                       doc="null: the method's own (hrnet 2, baseline 1 = the paper's sqrt(N))")
    lr: float = param(3e-3, float, low=0, low_open=True, doc="Adam learning rate (the paper's 1e-3 did worse)")
    max_grad_norm: float = param(1.0, float, low=0, low_open=True, doc="DP-SGD clipping norm")
    lr_final: float | None = param(None, float, low=0, high=1, low_open=True,
                                   doc="cosine decay to lr_final * lr (1: constant); null: the method's own")
    count_share: float = param(0.01, float, low=0, high=0.5, low_open=True, doc="share of eps for the noisy count")
    pretrain: bool = param(True, bool, doc="private pre-training on DPTRAN (HRNet §4.1)")
    multitask: bool = param(True, bool, doc="multi-resolution multi-task loss (HRNet §4.2)")
    c: float = param(0.018, float, low=0, low_open=True, doc="pre-training budget constant (HRNet eq. 9)")
    pretrain_max_share: float = param(0.5, float, low=0, high=1, doc="cap on pre-training's share of eps")
    ema: float = param(0.0, float, low=0, high=1, high_open=True, doc="moving average of the DP-SGD iterates (0: last)")
    finest_weight: float = param(1.0, float, low=0, low_open=True, doc="weight of the finest resolution's loss")
    multitask_loss: str = param("conditional", str, choices=MULTITASK_LOSSES,
                                doc="each resolution over the children of the true coarser cell, or 'full'")
    input_levels: str = param("all", str, choices=INPUT_LEVELS,
                              doc="GRU input: encodings at every resolution summed, or 'finest' (the paper)")
    pretrain_iterations: int = param(3000, int, low=0, high=10_000_000, doc="pre-training iterations")
    pretrain_batch: int = param(100, int, low=1, doc="pre-training batch")
    pretrain_lr: float = param(1e-3, float, low=0, low_open=True, doc="pre-training learning rate")
    n_hint: int = param(10_000, int, low=1, doc="public guess of N, used only before any data is read")
    pois: list | None = param(None, list, doc="public POIs [[lat, lon], ...] (HRNet §3.2.2); sets w")
    decode: str = param("coarse_to_fine", str, choices=DECODES, doc="or 'finest' (the paper's finest head only)")
    temperature: float = param(1.0, float, low=0, low_open=True, doc="sampling temperature (1: the model's)")
    base_date: str = param("2008-01-01", str, date=True, doc="public date of the synthetic times")
    device: str | None = param(None, str, doc="null: CUDA when available, else CPU")
    progress: bool | None = param(None, bool, doc="null: a progress bar in a terminal, off in CI")

    def check(self) -> None:
        if self.decode == "finest" and self.multitask and self.multitask_loss == "conditional":
            raise DuckmobError("decode 'finest' samples from the finest resolution's softmax over all cells, which "
                               "multitask_loss 'conditional' does not train: use decode 'coarse_to_fine' or "
                               "multitask_loss 'full'")



def counts_events(eps_count: float, k: int) -> list:
    """The accounting events of the noisy counts released with :func:`count_shares`."""
    return [accounting.laplace(e) for e in count_shares(eps_count, k)]


def release_lengths(lengths: np.ndarray, max_len: int, eps: float, noise, k: int = 1) -> np.ndarray | None:
    """The eps-DP length distribution over 1 .. ``max_len`` cells (module docstring, release 2).

    Privacy map: each trajectory is one window of mass 1 in the bin of its length (``lengths`` are already capped
    at the public ``max_len``), so adding or removing a trajectory moves the histogram by at most 1 in L1 and a
    user of at most k trajectories by k; ``normalised_release`` adds Laplace(k / eps) to every bin (a
    data-independent support): eps-DP, accounted as ``accounting.laplace(eps)``. NormCut and normalisation are
    post-processing. None when nothing survives NormCut (the model's end token is used then)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    noisy = normalised_release(lengths - 1, np.arange(n, dtype=np.int64), np.ones(n, dtype=np.int64), int(max_len),
                               k / eps, noise)
    kept = np.maximum(normcut(noisy[None, :], axis=-1)[0], 0.0)
    total = kept.sum()
    return kept / total if total > 0 else None


class _Base(Synthesizer):
    method: ClassVar[str]
    uses_pretraining: ClassVar[bool]
    default_delta: ClassVar[float] = 1e-5
    streams = True     # fit takes duckmob.source.batches.Batches: stay points batch by batch, the fine stage summed

    def __init__(self, bbox, **params):
        config = HRNetConfig.parse(params, batch_factor=self.default_batch_factor, lr_final=self.default_lr_final)
        super().__init__(bbox, **params)
        self.pois = None
        if config.pois is not None:
            try:
                pois = np.asarray(config.pois, dtype=np.float64).reshape(-1, 2)
            except (TypeError, ValueError):
                raise DuckmobError("HRNet parameter pois must be a list of [lat, lon] pairs") from None
            depth = max(1, math.ceil(math.log(max(len(pois), 2), 4)))
            # points sit on the POIs themselves: no fine stage to release
            config = config.replace(w=1 << depth, output="cells")
            self.pois = pois
            self.poi_leaf = assign_pois(pois[:, 0], pois[:, 1], self.bbox, config.w)
        self.depth = quadtree_depth(config.w)
        self.cfg = config

    # -- accounting ---------------------------------------------------------------------------------
    def _check_budget(self, eps, delta):
        if not (eps > 0 and math.isfinite(eps)):
            raise DuckmobError(f"eps must be a positive number, got {eps}")
        if not 0 < delta < 1:
            raise DuckmobError(f"{self.method} trains with DP-SGD and needs 0 < delta < 1 (e.g. delta := 1e-5), "
                               f"got {delta}")

    def plan(self, eps: float, delta: float, n_noisy: float, units_noisy: float | None = None, *, k: int = 1,
             prior=None) -> dict[str, Any]:
        """The run's privacy parameters from public parameters and the noisy counts (see module docstring):
        ``n_noisy`` trajectories, ``units_noisy`` privacy units (users when k > 1; default n_noisy), k trajectories
        per unit, calibrated within ``prior`` (the source's budget and other releases) when given."""
        cfg = self.cfg
        eps_count = cfg.count_share * eps
        eps_len = cfg.length_share * eps
        eps_fine = eps * cfg.fine_share if cfg.placing else 0.0
        n = max(float(n_noisy), 1.0)
        units = n if units_noisy is None else max(float(units_noisy), 1.0)
        eps_pre = 0.0
        if self.uses_pretraining and cfg.pretrain:
            eps_pre = pretraining_epsilon(eps - eps_count - eps_len - eps_fine, n, cfg.w, PRETRAIN_LEVEL, cfg.c,
                                          cfg.pretrain_max_share, sensitivity=k)
        batch = float(cfg.batch_size or cfg.batch_factor * math.sqrt(units))
        q = min(1.0, batch / units)
        steps = int(math.ceil(cfg.epochs / q))
        if eps_len > 0:
            check_scale(k / eps_len)
        fixed = (counts_events(eps_count, k) + ([accounting.laplace(eps_len)] if eps_len > 0 else [])
                 + placement.privacy_events(eps, cfg, k)
                 + ([accounting.laplace(eps_pre)] if eps_pre > 0 else []))
        sigma = calibrate_noise_multiplier(fixed, q, steps, eps, delta, prior=prior)
        event = accounting.compose(fixed + [accounting.dp_sgd(sigma, q, steps)])
        return dict(eps_count=eps_count, eps_len=eps_len, eps_fine=eps_fine, eps_pre=eps_pre, batch=q * units,
                    sample_rate=q, steps=steps, noise_multiplier=sigma, event=event)

    def privacy_event(self, eps: float, delta: float, *, contribution_bound: int = 1, prior=None):
        """The planned spend for ``n_hint`` trajectories (public), reserved before data is read. ``fit`` re-plans
        with the noisy count in place of n_hint (``release.settle``); both have epsilon <= eps at delta and fit
        the budget with ``prior`` by calibration."""
        self._check_budget(eps, delta)
        n, k = self.cfg.n_hint, contribution_bound
        return self.plan(eps, delta, n, n / k if k > 1 else None, k=k, prior=prior)["event"]

    # -- data ------------------------------------------------------------------------------------------
    def stays(self, data: Trajectories) -> Trajectories:
        """The points HRNet models (§5.1.2): first fix, stay points, last fix of each trajectory (Li et al. 2008),
        or every fix without ``stay_points``. Per trajectory: each output depends on its own points only."""
        from duckmob.staypoints import stay_trajectories

        cfg = self.cfg
        return stay_trajectories(data, cfg.radius_m, cfg.min_minutes) if cfg.stay_points else data

    def cell_sequences(self, stays: Trajectories) -> CellSequences:
        """Cell sequences of :meth:`stays` (duplicates collapsed) on the grid, or on the leaves assigned to the
        public POIs (each point snapped to its nearest POI)."""
        from duckmob.staypoints import cell_sequences, collapse_repeats

        cfg = self.cfg
        if self.pois is None:
            return cell_sequences(stays, self.bbox, cfg.w, stay_points=False)
        traj = stays
        nearest = np.empty(traj.n_points, dtype=np.int64)
        for lo in range(0, traj.n_points, 4096):
            d = haversine_m(traj.lat[lo:lo + 4096, None], traj.lon[lo:lo + 4096, None],
                            self.pois[None, :, 0], self.pois[None, :, 1])
            nearest[lo:lo + 4096] = d.argmin(1)
        cells = self.poi_leaf[nearest]
        keep = collapse_repeats(traj.offsets, cells)
        counts = np.bincount(traj.point_traj()[keep], minlength=traj.n_trajectories)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return CellSequences(offsets, traj.traj_id, traj.user_id, cells[keep], traj.ts[keep])

    def build(self) -> torch.nn.Module:
        raise NotImplementedError

    # -- fit -------------------------------------------------------------------------------------------
    def fit(self, data, eps: float, delta: float, noise, *, contribution_bound: int = 1,
            release=None) -> "FittedModel":
        """Fit under (eps, delta)-DP for one trajectory (or one user of at most ``contribution_bound``
        trajectories); see the module docstring for the privacy map. With a ``release`` (the release core's),
        the plan made with the noisy counts is settled against the ledger as it is then, and training stops at
        Ctrl-C; without one (direct use) it is calibrated to (eps, delta) alone."""
        self._check_budget(eps, delta)
        cfg = self.cfg
        t0 = time.perf_counter()
        device = torch_device(cfg.device, self.method)
        rng = noise.generator()
        # Trajectories, or batches read out of core (duckmob.source): stay points per batch of whole trajectories,
        # gathered in the in-memory order, so memory follows the stays (a few per trajectory), not the fixes
        src = as_batches(data)
        stays = src.gather(self.stays)
        seqs = self.cell_sequences(stays)
        arrays = training_arrays(seqs, cfg.w, cfg.n_time, cfg.max_len, zorder=self.zorder)
        has_time = stays.has_time     # a trajectory's stays keep its first fix, so its time or its lack of it
        k = int(contribution_bound)
        eps_count = cfg.count_share * eps
        # (1) the noisy trajectory count (and user count when k > 1)
        n_noisy, units_noisy = noisy_unit_counts(arrays.user_id, eps_count, noise, k)
        if release is None:
            plan = self.plan(eps, delta, n_noisy, units_noisy, k=k)
        else:
            # re-planned with the noisy counts against the ledger as it is now; if the plan does not fit (or eps
            # is too small for DP-SGD after the counts), the counts alone stay spent and the release is refused
            def settle(prior):
                p = self.plan(eps, delta, n_noisy, units_noisy, k=k, prior=prior)
                return p["event"], p
            plan = release.settle(settle, drawn=accounting.compose(counts_events(eps_count, k)))
        check_interrupt = None if release is None else release.check_interrupt
        # (2) lengths and (3) the fine stage: plain Laplace releases
        extra = {}
        if plan["eps_len"] > 0:
            len_probs = release_lengths(arrays.lengths, cfg.max_len, plan["eps_len"], noise, k)
            if len_probs is not None:
                extra["len_probs"] = len_probs
        if cfg.placing:
            # 'stays': the fine density of where the modelled points (stays) are; 'points': the density of where
            # the trajectories' fixes go (the line walk between them) and their step histogram
            fixes = stays if cfg.output == "stays" else src
            extra.update(placement.release(fixes, self.bbox, eps, cfg, noise, k, n_noisy, at_least=cfg.w).arrays())
        with cpu_threads(cfg.threads):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(rng.integers(2 ** 62)))
                model = self.build()
            timings = {"prepare_s": time.perf_counter() - t0}
            # (4) pre-training on DPTRAN
            if plan["eps_pre"] > 0:
                t1 = time.perf_counter()
                noisy = dptran(seqs, cfg.w, plan["eps_pre"], noise, k=k)
                pretrain(model, noisy, iterations=cfg.pretrain_iterations,
                         batch=cfg.pretrain_batch, lr=cfg.pretrain_lr, rng=rng, device=device,
                         progress=cfg.progress, check_interrupt=check_interrupt)
                timings["pretrain_s"] = time.perf_counter() - t1
            # (5) DP-SGD
            log = dp_sgd_train(model, arrays, sample_rate=plan["sample_rate"], steps=plan["steps"],
                               noise_multiplier=plan["noise_multiplier"], max_grad_norm=cfg.max_grad_norm,
                               lr=cfg.lr, expected_batch_size=plan["batch"], rng=rng, device=device,
                               progress=cfg.progress, by_user=k > 1, ema=cfg.ema,
                               lr_final=cfg.lr_final, check_interrupt=check_interrupt, workers=cfg.workers)
        timings.update(dp_sgd_s=log.seconds, epoch_s=log.epoch_seconds, total_s=time.perf_counter() - t0)
        event = plan["event"]
        info = dict(method=self.method, eps=eps, delta=delta,
                    epsilon_accounted=accounting.epsilon(event, delta), n_noisy=n_noisy,
                    units_noisy=units_noisy, eps_count=plan["eps_count"], eps_lengths=plan["eps_len"],
                    **count_record(count_shares(plan["eps_count"], k)[0], k),
                    eps_fine=plan["eps_fine"], eps_pretrain=plan["eps_pre"],
                    sample_rate=plan["sample_rate"],
                    steps=plan["steps"], noise_multiplier=plan["noise_multiplier"], expected_batch=plan["batch"],
                    has_time=has_time, seeded=bool(noise.seeded), contribution_bound=k,
                    n_parameters=sum(p.numel() for p in model.parameters()))
        config = {key: v for key, v in cfg.as_dict().items()
                  if key not in ("device", "progress", "pois", "threads", "workers")}
        pois = None if self.pois is None else self.pois.tolist()
        return FittedModel(self.method, self.bbox.as_list(), config, pois,
                           {key: v.detach().cpu() for key, v in model.state_dict().items()},
                           event.to_json(), info, timings, extra)


class HRNet(_Base):
    """HRNet: hierarchical location encoding, multi-resolution multi-task loss, private pre-training."""

    method = "hrnet"
    uses_pretraining = True
    zorder = True
    default_batch_factor = 2.0  # 2 sqrt(N~): with the conditional multi-task loss, better than 4 and than the
                                # paper's sqrt(N~) on most Table 1 metrics here (benchmarks/hrnet.py)
    default_lr_final = 0.1      # cosine decay to 0.1 lr: better trajectory density and density at t (3 seeds)

    def build(self) -> HRNetModel:
        c = self.cfg
        return HRNetModel(self.depth, c.n_time, c.loc_dim, c.time_dim, c.hidden, c.key_dim,
                          multitask=c.multitask, deconv_activation=bool(c.deconv_activation),
                          finest_weight=c.finest_weight, multitask_loss=c.multitask_loss,
                          input_levels=c.input_levels)


class Baseline(_Base):
    """The paper's baseline (§2.3): embedding matrices + GRU + linear scoring, DP-SGD, no pre-training."""

    method = "baseline"
    uses_pretraining = False
    zorder = False
    default_batch_factor = 1.0  # the paper's sqrt(N~), the baseline's better setting here
    default_lr_final = 1.0      # constant (the paper's): decay to 0.1 lr did worse on destination, transition,
                                # travel distance and diameter (2 seeds)

    def build(self) -> BaselineModel:
        c = self.cfg
        return BaselineModel(self.depth, c.n_time, c.loc_dim, c.time_dim, c.hidden)


_KINDS = {"hrnet": HRNet, "baseline": Baseline}


class FittedModel(Model):
    """A fitted HRNet or baseline: public configuration, DP weights, the DP length distribution and fine
    statistics (``extra``: numpy arrays), the spent event and timings."""

    method = "hrnet"

    def __init__(self, method: str, bbox: list, config: dict, pois, state: dict, event_json: str,
                 info: dict, timings: dict, extra: dict | None = None):
        self.method = method
        self.bbox, self.config, self.pois = bbox, config, pois
        self.state, self.event_json, self.info, self.timings = state, event_json, info, timings
        self.extra = {k: np.asarray(v) for k, v in (extra or {}).items()}
        self.fine = placement.FineStats.from_arrays(self.extra)
        self._net = None
        self._placement = None

    @property
    def default_n(self) -> int:
        """The noisy trajectory count of the training data (the SQL layer's default n)."""
        return max(1, int(round(self.info["n_noisy"])))

    @property
    def event(self):
        """The accounting event this fit spent (record it in the ledger once)."""
        return accounting.Event.from_json(self.event_json)

    def network(self) -> torch.nn.Module:
        if self._net is None:
            # models saved before multitask_loss / input_levels existed were trained with the paper's loss / input
            old = {"multitask_loss": "full", "input_levels": "finest"}
            synth = _KINDS[self.method](self.bbox, **{**old, **self.config, "pois": self.pois})
            with torch.random.fork_rng(devices=[]):
                net = synth.build()
            net.load_state_dict(self.state)
            self._net = net
        return self._net

    def placement(self) -> placement.Placement:
        """The fine placement over this model's grid (built once; post-processing of the released density)."""
        if self._placement is None:
            w, bbox = int(self.config["w"]), BBox.of(self.bbox)
            fine_w = self.fine.w
            self._placement = placement.Placement(
                self.fine, bbox, placement.coarse_of_fine(fine_w, bbox, lambda la, lo: cell_of(la, lo, bbox, w)),
                w * w, int(self.config.get("anchors", 8)), int(self.config.get("route_draws", 1)),
                self.config.get("step_m"))
        return self._placement

    def sample(self, n: int, rng: np.random.Generator, device=None) -> Trajectories:
        """Draw ``n`` synthetic trajectories (post-processing; vectorised over trajectories).

        Each draws its number of cells from the released length distribution (when the fit released one) and
        the generator runs to exactly that length; its cells and time slots come from the network. Points:
        ``output`` 'stays' (the default) places each visited cell's point on the released fine density inside
        the cell (placement.py), and gives a one-cell trajectory two points there (its first and last fix, at
        times of its slot); 'points' routes between the cells (:meth:`_routed`); 'cells' (or a model without a
        fine stage) puts one uniform point in each cell."""
        if int(n) != n or n < 1:
            raise DuckmobError(f"n must be a positive integer number of trajectories, got {n!r}")
        cfg = self.config
        dev = torch_device(device, self.method)
        allowed = None
        if self.pois is not None:
            pois = np.asarray(self.pois)
            leaf = assign_pois(pois[:, 0], pois[:, 1], BBox.of(self.bbox), cfg["w"])
            allowed = np.zeros(cfg["w"] ** 2, dtype=bool)
            allowed[morton(leaf, cfg["w"]) if self.method == "hrnet" else leaf] = True
        target = None
        if "len_probs" in self.extra:
            probs = self.extra["len_probs"].astype(np.float64)
            target = 1 + rng.choice(len(probs), size=int(n), p=probs / probs.sum())
        with cpu_threads(cfg.get("threads")):
            lengths, cells, slots = sample_sequences(self.network(), int(n), cfg["max_len"], rng, dev,
                                                     allowed=allowed, decode=cfg.get("decode", "finest"),
                                                     temperature=float(cfg.get("temperature", 1.0)),
                                                     target=target)
        if self.method == "hrnet":
            cells = zorder_to_grid(cells, cfg["w"])
        base = int(np.datetime64(cfg["base_date"], "us").astype(np.int64))
        output = cfg.get("output", "cells")
        if self.fine is not None and output == "stays" and self.pois is None:
            # two points in a one-cell sequence's cell, at times of its slot: no trajectory has one point
            lengths, cells, slots = one_cell_twice(lengths, cells, slots)
        slots = slots if self.info.get("has_time", True) else None
        if self.fine is not None and output == "points" and self.pois is None:
            return self._routed(lengths, cells, slots, base, rng)
        traj = to_trajectories(lengths, cells, slots, self.bbox, cfg["w"], cfg["n_time"], base, rng)
        if self.pois is not None:
            # leaves without a POI are masked at sampling, so every cell maps back to its POI's position
            lookup = np.full(cfg["w"] ** 2, -1, dtype=np.int64)
            lookup[leaf] = np.arange(len(leaf))
            which = lookup[cells]
            return Trajectories(traj.offsets, traj.traj_id, traj.user_id, traj.ts,
                                pois[which, 0].copy(), pois[which, 1].copy())
        if self.fine is None or output == "cells":
            return traj
        lat, lon, placed = self.placement().place(cells, rng)
        lat, lon = np.where(placed, lat, traj.lat), np.where(placed, lon, traj.lon)
        return Trajectories(traj.offsets, traj.traj_id, traj.user_id, traj.ts, lat, lon)

    def _routed(self, lengths, cells, slots, base: int, rng: np.random.Generator) -> Trajectories:
        """Output 'points': the cells' routes over the released fine density, points spaced by the released step
        histogram (placement.py), timed between the times of the cells' slots (a one-cell sequence: two times
        of its slot) at constant speed along each route. Post-processing."""
        cfg = self.config
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        times = None
        if slots is not None:
            times = slot_times(*one_cell_twice(lengths, slots), cfg["n_time"], base, rng)
        out = self.placement().points(offsets, cells, rng, int(cfg.get("max_points", 5000)), times=times)
        return trajectories_from_cells(*out)

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        # no timings: wall-clock durations are not part of the release (they vary with the data and the machine)
        torch.save(dict(method=self.method, bbox=self.bbox, config=self.config, pois=self.pois,
                        state=self.state, event_json=self.event_json, info=self.info,
                        extra={k: torch.as_tensor(v) for k, v in self.extra.items()}), buf)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, blob: bytes) -> "FittedModel":
        d = torch.load(io.BytesIO(blob), weights_only=True)
        extra = {k: v.numpy() for k, v in d.get("extra", {}).items()}
        return cls(d["method"], d["bbox"], d["config"], d["pois"], d["state"], d["event_json"], d["info"], {},
                   extra)

    def describe(self) -> dict[str, Any]:
        return {**self.info, **{k: v for k, v in self.config.items()}}


HRNet.model_class = FittedModel
Baseline.model_class = FittedModel

__all__ = ["HRNet", "Baseline", "HRNetConfig", "FittedModel", "calibrate_noise_multiplier"]
