"""HRNet (Takagi et al., PVLDB 2024) and its DP-SGD baseline as duckmob synthesizers.

``HRNet(bbox, **params)`` plans (``plan(eps, delta, unit)``) and fits (``fit(source, plan, release)``) one model
under (eps, delta)-DP. The privacy unit is the trajectory (adding or removing one), or the user with at most
``k = unit.max_trajectories_per_user`` trajectories (already bounded by the source): every count and DPTRAN are
released at sensitivity k, and DP-SGD samples users and clips each user's summed gradient. ``model.sample(n,
rng)`` is free post-processing. ``Baseline`` is the paper's §2.3 baseline (embedding matrix + GRU + linear
scoring) trained the same way, without pre-training.

What ``fit`` spends, composed in one PLD accountant (:func:`duckmob.privacy.accounting.epsilon`), the budget
split by :func:`duckmob.privacy.accounting.split`:

1. a noisy trajectory count ``N~ = N + Laplace(1 / eps_count)`` (sensitivity 1), ``eps_count = eps * count_share``
   (user unit with at most k trajectories: N~ at sensitivity k and a noisy user count, splitting eps_count;
   :func:`duckmob.privacy.counting.noisy_unit_counts`); it sets the expected batch ``b = batch_factor sqrt(N~)``
   (paper: sqrt(N)), the sampling rate ``q = b / N~`` and the pre-training budget;
2. the length histogram, ``eps_lengths = eps * length_share``: each trajectory adds 1 to the bin of its (capped)
   number of cells, so one trajectory moves it by 1 in L1 and a user by k; Laplace(k / eps_lengths) on every one
   of the ``max_len`` bins (``counting.normalised_release``), NormCut. Samples draw their length from it and the
   generator runs to that length. ``length_share := 0`` keeps the model's own end token.
3. the fine-placement stage (:mod:`duckmob.synth.placement`) at ``eps * fine_share``: with ``output := 'stays'``
   the density alone, of the fine cells holding the modelled points (a trajectory's mass 1 split over its distinct
   fine cells: sensitivity k), Laplace on every fine cell; with ``output := 'points'`` placement's two parts on
   the raw fixes (the density of where trajectories go and the step histogram, sensitivity k each), so samples
   are routed points timed between their cells' slots; off with ``output := 'cells'`` or ``fine_share := 0``;
4. (HRNet with ``pretrain``) DPTRAN, ``eps_pretrain`` from HRNet eq. 9 with c = 0.018 on public parameters and
   ``N~`` (see :mod:`.pretrain`), within what 1-3 leave;
5. DP-SGD: ``steps = ceil(epochs / q)`` Poisson-sampled steps at rate ``q`` with clipping norm
   ``max_grad_norm``. **The noise multiplier is calibrated** (:func:`calibrate_noise_multiplier`; the number of
   steps is fixed by ``epochs``) so that the composition of 1-5 is (eps, delta)-DP by the PLD accountant. The
   optimiser is Adam; its learning rate follows a public schedule (``lr_final``), which costs nothing.

``plan(eps, delta, unit, prior)`` (asked before any data is read) is this schedule for the public ``n_hint``
trajectories; ``fit`` makes it again with the noisy counts in place of n_hint and settles it with the release
(``release.settle``): both are calibrated to epsilon <= eps at delta and, given the ledger's earlier releases,
within the budget; ``model.event`` is what was spent.

Only public parameters and DP releases shape the run: the bbox is declared, N is noisy, lengths are truncated
at the public ``max_len``, time slots are fixed fractions of the day. What the defaults were measured against
(GeoLife, benchmarks/hrnet.py) is in docs/methods/hrnet.md.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from duckmob.errors import DuckmobError
from duckmob.grid import BBox, assign_pois, cell_of, haversine_m, quadtree_depth
from duckmob.privacy import accounting
from duckmob.privacy.calibration import calibrate_noise_multiplier
from duckmob.privacy.counting import count_events, count_record, count_shares, normalised_release, noisy_unit_counts
from duckmob.privacy.noise import check_scale
from duckmob.privacy.normcut import normcut
from duckmob.privacy.unit import PrivacyUnit
from duckmob.source.batches import as_batches
from duckmob.synth import dpsgd, placement
from duckmob.synth.base import Plan, ReleaseContext, Synthesizer, trajectories_from_cells
from duckmob.synth.compute import cpu_threads, device as torch_device
from duckmob.synth.config import param
from duckmob.synth.neural import NeuralModel, upgrade_info_format_1
from duckmob.synth.hrnet.encoding import morton
from duckmob.synth.hrnet.generate import (DECODES, one_cell_twice, sample_sequences, slot_times, to_trajectories,
                                         zorder_to_grid)
from duckmob.synth.hrnet.model import INPUT_LEVELS, MULTITASK_LOSSES, BaselineModel, HRNetModel
from duckmob.synth.hrnet.pretrain import PRETRAIN_LEVEL, dptran, pretrain, pretraining_epsilon
from duckmob.synth.hrnet.train import dp_sgd_train, training_arrays
from duckmob.trajectories import CellSequences, Trajectories


@dataclass(frozen=True)
class HRNetConfig(placement.PlacementConfig):
    """HRNet's and the baseline's public hyper-parameters (``params := {...}`` in SQL), typed and validated.
    Defaults and the reasons for them are in each field's doc; benchmarks/hrnet.py measured the choices.
    The fine-placement fields (``fine_share``, ``fine_w``, ``fine_m``, ``anchors``, ``max_points``) are
    placement's; ``output`` adds 'stays', the default here (see :class:`FittedModel.sample`)."""

    method: ClassVar[str] = "hrnet"

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
    progress: bool | None = param(None, bool, doc="null: DUCKMOB_PROGRESS decides (on except in CI and pytest)")

    def check(self) -> None:
        torch_device(self.device, self.label())    # a device torch cannot name is refused with the parameters
        if self.pois is not None:
            poi_array(self.pois)
        if self.decode == "finest" and self.multitask and self.multitask_loss == "conditional":
            raise DuckmobError("decode 'finest' samples from the finest resolution's softmax over all cells, which "
                               "multitask_loss 'conditional' does not train: use decode 'coarse_to_fine' or "
                               "multitask_loss 'full'")


@dataclass(frozen=True, kw_only=True)
class HRNetPlan(Plan):
    """HRNet's (or the baseline's) schedule at (eps, delta) for a unit and a number of trajectories (module
    docstring, 1-5): each Laplace release's epsilon (0: not released), then DP-SGD's expected batch, number of
    steps and calibrated noise multiplier (its rate is the base's ``sample_rate``). ``event`` composes them."""

    eps_count: float
    eps_lengths: float
    eps_fine: float
    eps_pretrain: float
    expected_batch: float
    steps: int
    noise_multiplier: float

    def dp_sgd(self, config: HRNetConfig) -> dpsgd.Schedule:
        """The DP-SGD run's schedule: this plan's rate, steps, noise multiplier and expected batch, the config's
        clipping norm and optimiser settings."""
        return dpsgd.Schedule(sample_rate=self.sample_rate, steps=self.steps, noise_multiplier=self.noise_multiplier,
                              max_grad_norm=config.max_grad_norm, expected_batch_size=self.expected_batch,
                              lr=config.lr, lr_final=config.lr_final, ema=config.ema)


def poi_array(pois) -> np.ndarray:
    """The public POIs as a float64 (m, 2) array of (lat, lon)."""
    try:
        return np.asarray(pois, dtype=np.float64).reshape(-1, 2)
    except (TypeError, ValueError):
        raise DuckmobError("HRNet parameter pois must be a list of [lat, lon] pairs") from None


def zorder(method: str) -> bool:
    """Whether ``method`` numbers the cells in Z-order (HRNet's quadtree) rather than row by row (the baseline)."""
    return method == "hrnet"


def build_network(method: str, config: HRNetConfig) -> torch.nn.Module:
    """The untrained generator of ``method`` ('hrnet': :class:`HRNetModel`, 'baseline': :class:`BaselineModel`)
    for ``config`` (its weights drawn from torch's global generator)."""
    depth = quadtree_depth(config.w)
    if method == "hrnet":
        return HRNetModel(depth, config.n_time, config.loc_dim, config.time_dim, config.hidden, config.key_dim,
                          multitask=config.multitask, deconv_activation=bool(config.deconv_activation),
                          finest_weight=config.finest_weight, multitask_loss=config.multitask_loss,
                          input_levels=config.input_levels)
    return BaselineModel(depth, config.n_time, config.loc_dim, config.time_dim, config.hidden)


def max_points(config: HRNetConfig) -> int:
    """The public cap on the points of one sampled trajectory: placement's ``max_points`` when points are routed
    (``output := 'points'``); else ``max_len`` cells, one point each (a one-cell sequence gets two)."""
    routed = config.placing and config.pois is None and config.output == "points"
    return int(config.max_points) if routed else max(int(config.max_len), 2)


def release_lengths(lengths: np.ndarray, max_len: int, eps: float, noise,
                    max_trajectories_per_user: int = 1) -> np.ndarray | None:
    """The eps-DP length distribution over 1 .. ``max_len`` cells (module docstring, release 2).

    Privacy map: each trajectory is one window of mass 1 in the bin of its length (``lengths`` are already capped
    at the public ``max_len``), so adding or removing a trajectory moves the histogram by at most 1 in L1 and a
    user of at most k = ``max_trajectories_per_user`` trajectories by k; ``normalised_release`` adds
    Laplace(k / eps) to every bin (a data-independent support): eps-DP, accounted as ``accounting.laplace(eps)``.
    NormCut and normalisation are post-processing. None when nothing survives NormCut (the model's end token is
    used then)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    noisy = normalised_release(lengths - 1, np.arange(n, dtype=np.int64), np.ones(n, dtype=np.int64), int(max_len),
                               max_trajectories_per_user / eps, noise)
    kept = np.maximum(normcut(noisy[None, :], axis=-1)[0], 0.0)
    total = kept.sum()
    return kept / total if total > 0 else None


# What the sampling code of format 1 (duckmob before models carried a version) used for a config field its model
# was stored without (the field came later); some differ from today's defaults, so they are stated, not inherited.
FORMAT_1_FALLBACKS = {"multitask_loss": "full", "input_levels": "finest", "decode": "finest", "temperature": 1.0,
                      "output": "cells", "anchors": 8, "route_draws": 1, "step_m": None, "max_points": 5000}


def upgrade_format_1(stored: dict) -> dict:
    """A format-1 payload (the same torch dict, with ``method`` and ``pois`` beside the config) in format 2's
    words: ``pois`` moves into the config, a config field the model was stored without takes
    :data:`FORMAT_1_FALLBACKS`, ``info`` names the contribution bound ``max_trajectories_per_user`` (format 1:
    ``contribution_bound``) and says ``has_time`` (True where absent, as format 1's sampling assumed)."""
    config = {**FORMAT_1_FALLBACKS, **stored["config"], "pois": stored["pois"]}
    info = {"has_time": True, **upgrade_info_format_1(stored["info"])}
    return {**stored, "config": config, "info": info}


class FittedModel(NeuralModel):
    """A fitted HRNet or baseline (``kind``): public configuration, DP weights, the DP length distribution and
    fine statistics (``extra``: numpy arrays), the spent event and timings.

    Payload (format 2): ``torch.save`` of a dict ``bbox`` (list), ``config`` (the config's fields but the
    machine's settings, :meth:`~duckmob.synth.config.Config.stored_dict`), ``state`` (the network's weights),
    ``event_json``, ``info`` and ``extra`` (as tensors); no timings (wall-clock durations vary with the data and
    the machine: not part of the release)."""

    method = "hrnet"
    methods = ("hrnet", "baseline")
    format_version = 2

    def __init__(self, kind: str, bbox: list, config: HRNetConfig, state: dict, event_json: str, info: dict,
                 timings: dict, extra: dict | None = None):
        self.kind = kind
        # the machine's settings at their defaults: a model samples on whatever machine it is used
        self.bbox, self.config = bbox, config.off_machine()
        self.state, self.event_json, self.info, self.timings = state, event_json, info, timings
        self.extra = {k: np.asarray(v) for k, v in (extra or {}).items()}
        self.fine = placement.FineStats.from_arrays(self.extra)
        self._net = None
        self._placement = None

    def stored_method(self) -> str:
        return self.kind

    def network(self) -> torch.nn.Module:
        if self._net is None:
            with torch.random.fork_rng(devices=[]):
                net = build_network(self.kind, self.config)
            net.load_state_dict(self.state)
            self._net = net
        return self._net

    def placement(self) -> placement.Placement:
        """The fine placement over this model's grid (built once; post-processing of the released density)."""
        if self._placement is None:
            config, bbox = self.config, BBox.of(self.bbox)
            w = config.w
            self._placement = placement.Placement(
                self.fine, bbox, placement.coarse_of_fine(self.fine.w, bbox, lambda la, lo: cell_of(la, lo, bbox, w)),
                w * w, config.anchors, config.route_draws, config.step_m, centres=placement.cell_centres(w, bbox))
        return self._placement

    @property
    def max_points(self) -> int:
        """:func:`max_points` of the config; ``max_len`` (at least 2) for a model without a fine stage."""
        return max_points(self.config) if self.fine is not None else max(int(self.config.max_len), 2)

    def sample(self, n: int, rng: np.random.Generator) -> Trajectories:
        """Draw ``n`` synthetic trajectories (post-processing; vectorised over trajectories).

        Each draws its number of cells from the released length distribution (when the fit released one) and
        the generator runs to exactly that length; its cells and time slots come from the network. Points:
        ``output`` 'stays' (the default) places each visited cell's point on the released fine density inside
        the cell (placement), and gives a one-cell trajectory two points there (its first and last fix, at
        times of its slot); 'points' routes between the cells (:meth:`_routed`); 'cells' (or a model without a
        fine stage) puts one uniform point in each cell."""
        config = self.config
        w = config.w
        device = torch_device(config.device, self.kind)
        allowed = None
        if config.pois is not None:
            pois = poi_array(config.pois)
            leaf = assign_pois(pois[:, 0], pois[:, 1], BBox.of(self.bbox), w)
            allowed = np.zeros(w ** 2, dtype=bool)
            allowed[morton(leaf, w) if zorder(self.kind) else leaf] = True
        target = None
        if "len_probs" in self.extra:
            probs = self.extra["len_probs"].astype(np.float64)
            target = 1 + rng.choice(len(probs), size=int(n), p=probs / probs.sum())
        with cpu_threads(config.threads):
            lengths, cells, slots = sample_sequences(self.network(), int(n), config.max_len, rng, device,
                                                     allowed=allowed, decode=config.decode,
                                                     temperature=config.temperature, target=target)
        if zorder(self.kind):
            cells = zorder_to_grid(cells, w)
        base = int(np.datetime64(config.base_date, "us").astype(np.int64))
        placed_fine = self.fine is not None and config.pois is None
        if placed_fine and config.output == "stays":
            # two points in a one-cell sequence's cell, at times of its slot: no trajectory has one point
            lengths, cells, slots = one_cell_twice(lengths, cells, slots)
        slots = slots if self.info["has_time"] else None
        if placed_fine and config.output == "points":
            return self._routed(lengths, cells, slots, base, rng)
        traj = to_trajectories(lengths, cells, slots, self.bbox, w, config.n_time, base, rng)
        if config.pois is not None:
            # leaves without a POI are masked at sampling, so every cell maps back to its POI's position
            lookup = np.full(w ** 2, -1, dtype=np.int64)
            lookup[leaf] = np.arange(len(leaf))
            which = lookup[cells]
            return Trajectories(traj.offsets, traj.traj_id, traj.user_id, traj.ts,
                                pois[which, 0].copy(), pois[which, 1].copy())
        if self.fine is None or config.output == "cells":
            return traj
        lat, lon, placed = self.placement().place(cells, rng)
        lat, lon = np.where(placed, lat, traj.lat), np.where(placed, lon, traj.lon)
        return Trajectories(traj.offsets, traj.traj_id, traj.user_id, traj.ts, lat, lon)

    def _routed(self, lengths, cells, slots, base: int, rng: np.random.Generator) -> Trajectories:
        """Output 'points': the cells' routes over the released fine density, points spaced by the released step
        histogram (placement), timed between the times of the cells' slots (a one-cell sequence: two times of its
        slot) at constant speed along each route. Post-processing."""
        config = self.config
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        times = None
        if slots is not None:
            times = slot_times(*one_cell_twice(lengths, slots), config.n_time, base, rng)
        out = self.placement().points(offsets, cells, rng, config.max_points, times=times)
        return trajectories_from_cells(*out)

    def stored_config(self) -> dict[str, Any]:
        """The config's fields but the machine's settings (what the payload stores)."""
        return self.config.stored_dict()

    def stored(self) -> dict[str, Any]:
        return dict(bbox=self.bbox, config=self.stored_config(), state=self.state, event_json=self.event_json,
                    info=self.info, extra={k: torch.as_tensor(v) for k, v in self.extra.items()})

    @classmethod
    def restore(cls, stored: dict[str, Any], version: int, method: str) -> "FittedModel":
        if version == 1:
            # a format-1 payload names its method itself (its stored row may not have: HRNet's and the
            # baseline's models share this class)
            stored, method = upgrade_format_1(stored), stored["method"]
        extra = {k: v.numpy() for k, v in stored["extra"].items()}
        return cls(method, stored["bbox"], HRNetConfig.restored(stored["config"]), stored["state"],
                   stored["event_json"], stored["info"], {}, extra)

    def describe(self) -> dict[str, Any]:
        return {**self.info, **{k: v for k, v in self.stored_config().items() if k != "pois"}}


class _Base(Synthesizer):
    """What HRNet and the baseline share: the data preparation, the schedule and the fit (module docstring)."""

    config_class = HRNetConfig
    model_class = FittedModel
    needs_delta = True
    mechanism = "trains with DP-SGD"
    uses_pretraining: ClassVar[bool]
    default_batch_factor: ClassVar[float]
    default_lr_final: ClassVar[float]

    def __init__(self, bbox, **params):
        super().__init__(bbox, **params)
        config = self.config
        self.zorder = zorder(self.method)
        self.depth = quadtree_depth(config.w)
        self.pois = None if config.pois is None else poi_array(config.pois)
        if self.pois is not None:
            self.poi_leaf = assign_pois(self.pois[:, 0], self.pois[:, 1], self.bbox, config.w)

    def configure(self, config: HRNetConfig) -> HRNetConfig:
        """The method's own ``batch_factor`` and ``lr_final`` where none is given; with public POIs, the grid
        whose leaves hold them (``w``) and one point per POI (``output`` 'cells': no fine stage to release)."""
        config = config.replace(
            batch_factor=self.default_batch_factor if config.batch_factor is None else config.batch_factor,
            lr_final=self.default_lr_final if config.lr_final is None else config.lr_final)
        if config.pois is not None:
            pois = poi_array(config.pois)
            depth = max(1, math.ceil(math.log(max(len(pois), 2), 4)))
            config = config.replace(pois=pois.tolist(), w=1 << depth, output="cells")
        return config

    # -- the schedule --------------------------------------------------------------------------------------------
    def schedule(self, eps: float, delta: float, unit: PrivacyUnit, n_trajectories: float, n_units: float | None,
                 prior=None, default_size: int | None = None) -> HRNetPlan:
        """The schedule (module docstring) for ``n_trajectories`` trajectories in ``n_units`` privacy units (users
        under the user unit; None: as many as trajectories), both public or DP counts, calibrated within
        ``prior`` (the source's budget and other releases) when given."""
        config = self.config
        k = unit.max_trajectories_per_user
        shares = accounting.split(eps, {"count": config.count_share, "lengths": config.length_share,
                                        "fine": config.fine_share if config.placing else 0.0})
        eps_count, eps_lengths, eps_fine = shares["count"], shares["lengths"], shares["fine"]
        n = max(float(n_trajectories), 1.0)
        units = n if n_units is None else max(float(n_units), 1.0)
        eps_pretrain = 0.0
        if self.uses_pretraining and config.pretrain:
            eps_pretrain = pretraining_epsilon(eps - eps_count - eps_lengths - eps_fine, n, config.w, PRETRAIN_LEVEL,
                                               config.c, config.pretrain_max_share, sensitivity=k)
        batch = float(config.batch_size or config.batch_factor * math.sqrt(units))
        q = min(1.0, batch / units)
        steps = int(math.ceil(config.epochs / q))
        if eps_lengths > 0:
            check_scale(k / eps_lengths)
        fixed = (count_events(eps_count, k) + ([accounting.laplace(eps_lengths)] if eps_lengths > 0 else [])
                 + placement.privacy_events(eps, config, k)
                 + ([accounting.laplace(eps_pretrain)] if eps_pretrain > 0 else []))
        sigma = calibrate_noise_multiplier(fixed, q, steps, eps, delta, prior=prior)
        event = accounting.compose(fixed + [accounting.dp_sgd(sigma, q, steps)])
        return HRNetPlan(eps=eps, delta=delta, unit=unit, event=event, bbox=self.bbox, needs_time=self.needs_time,
                         max_points=max_points(config), sample_rate=q, default_size=default_size,
                         eps_count=eps_count, eps_lengths=eps_lengths, eps_fine=eps_fine, eps_pretrain=eps_pretrain,
                         expected_batch=q * units, steps=steps, noise_multiplier=sigma)

    def plan(self, eps: float, delta: float, unit: PrivacyUnit = PrivacyUnit(), prior=None) -> HRNetPlan:
        """The schedule for the public ``n_hint`` trajectories (``n_hint / k`` users under the user unit),
        reserved before data is read; ``fit`` makes it again with the noisy counts (``release.settle``)."""
        n, k = self.config.n_hint, unit.max_trajectories_per_user
        return self.schedule(eps, delta, unit, n, n / k if k > 1 else None, prior, default_size=n)

    # -- data ------------------------------------------------------------------------------------------
    def stays(self, data: Trajectories) -> Trajectories:
        """The points HRNet models (§5.1.2): first fix, stay points, last fix of each trajectory (Li et al. 2008),
        or every fix without ``stay_points``. Per trajectory: each output depends on its own points only."""
        from duckmob.staypoints import stay_trajectories

        config = self.config
        return stay_trajectories(data, config.radius_m, config.min_minutes) if config.stay_points else data

    def cell_sequences(self, stays: Trajectories) -> CellSequences:
        """Cell sequences of :meth:`stays` (duplicates collapsed) on the grid, or on the leaves assigned to the
        public POIs (each point snapped to its nearest POI)."""
        from duckmob.staypoints import cell_sequences, collapse_repeats

        if self.pois is None:
            return cell_sequences(stays, self.bbox, self.config.w, stay_points=False)
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
        """This method's untrained generator (:func:`build_network`)."""
        return build_network(self.method, self.config)

    # -- fit -------------------------------------------------------------------------------------------
    def fit(self, source, plan: HRNetPlan, release: ReleaseContext) -> FittedModel:
        """One release of ``plan`` (module docstring for the privacy map): the noisy counts, then the schedule
        made again with them and settled with the release (against the ledger as it is then; if it does not
        fit, or eps is too small for DP-SGD after the counts, the counts alone stay spent and the release is
        refused), then the lengths, the fine stage, DPTRAN and DP-SGD. All noise from ``release.noise``."""
        config = self.config
        eps, delta, unit = plan.eps, plan.delta, plan.unit
        k = unit.max_trajectories_per_user
        noise = release.noise
        t0 = time.perf_counter()
        device = torch_device(config.device, self.method)
        rng = noise.generator()
        # Trajectories, or batches read out of core (duckmob.source): stay points per batch of whole trajectories,
        # gathered in the in-memory order, so memory follows the stays (a few per trajectory), not the fixes
        src = as_batches(source)
        stays = src.gather(self.stays)
        seqs = self.cell_sequences(stays)
        arrays = training_arrays(seqs, config.w, config.n_time, config.max_len, zorder=self.zorder)
        has_time = stays.has_time     # a trajectory's stays keep its first fix, so its time or its lack of it
        # (1) the noisy trajectory count (and user count when k > 1)
        n_noisy, units_noisy = noisy_unit_counts(arrays.user_id, plan.eps_count, noise, k)

        def settle(prior):
            settled = self.schedule(eps, delta, unit, n_noisy, units_noisy, prior)
            return settled.event, settled
        plan = release.settle(settle, drawn=accounting.compose(count_events(plan.eps_count, k)))
        # From here a failure or Ctrl-C is charged what ran (dpsgd.charged_as_run): every Laplace part, drawn or
        # about to be, and the DP-SGD steps that began
        with dpsgd.charged_as_run(release, plan.event) as ran:
            # (2) lengths and (3) the fine stage: plain Laplace releases
            extra = {}
            if plan.eps_lengths > 0:
                len_probs = release_lengths(arrays.lengths, config.max_len, plan.eps_lengths, noise, k)
                if len_probs is not None:
                    extra["len_probs"] = len_probs
            if config.placing:
                # 'stays': the fine density of where the modelled points (stays) are; 'points': the density of where
                # the trajectories' fixes go (the line walk between them) and their step histogram
                fixes = stays if config.output == "stays" else src
                extra.update(placement.release(fixes, self.bbox, eps, config, noise, k, n_noisy,
                                               at_least=config.w).arrays())
            with cpu_threads(config.threads):
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(int(rng.integers(2 ** 62)))
                    model = self.build()
                timings = {"prepare_s": time.perf_counter() - t0}
                # (4) pre-training on DPTRAN
                if plan.eps_pretrain > 0:
                    t1 = time.perf_counter()
                    noisy = dptran(seqs, config.w, plan.eps_pretrain, noise, k=k)
                    pretrain(model, noisy, iterations=config.pretrain_iterations, batch=config.pretrain_batch,
                             lr=config.pretrain_lr, rng=rng, device=device, progress=config.progress,
                             check_interrupt=release.check_interrupt)
                    timings["pretrain_s"] = time.perf_counter() - t1
                # (5) DP-SGD
                context = dpsgd.RunContext(rng, device, config.progress, release.check_interrupt, steps_run=ran,
                                           desc="hrnet DP-SGD")
                log = dp_sgd_train(model, arrays, plan.dp_sgd(config), context, by_user=k > 1,
                                   workers=config.workers)
        timings.update(dp_sgd_s=log.seconds, epoch_s=log.epoch_seconds, total_s=time.perf_counter() - t0)
        info = dict(method=self.method, eps=eps, delta=delta, epsilon_accounted=accounting.epsilon(plan.event, delta),
                    n_noisy=n_noisy, units_noisy=units_noisy, eps_count=plan.eps_count,
                    eps_lengths=plan.eps_lengths, **count_record(count_shares(plan.eps_count, k)[0], k),
                    eps_fine=plan.eps_fine, eps_pretrain=plan.eps_pretrain, sample_rate=plan.sample_rate,
                    steps=plan.steps, noise_multiplier=plan.noise_multiplier, expected_batch=plan.expected_batch,
                    has_time=has_time, seeded=bool(noise.seeded), max_trajectories_per_user=k,
                    n_parameters=sum(p.numel() for p in model.parameters()))
        return FittedModel(self.method, self.bbox.as_list(), config,
                           {key: v.detach().cpu() for key, v in model.state_dict().items()},
                           plan.event.to_json(), info, timings, extra)


class HRNet(_Base):
    """HRNet: hierarchical location encoding, multi-resolution multi-task loss, private pre-training."""

    method = "hrnet"
    uses_pretraining = True
    default_batch_factor = 2.0  # 2 sqrt(N~) (docs/methods/hrnet.md: better than 4 and than the paper's sqrt(N~))
    default_lr_final = 0.1      # cosine decay to 0.1 lr (docs/methods/hrnet.md)


class Baseline(_Base):
    """The paper's baseline (§2.3): embedding matrices + GRU + linear scoring, DP-SGD, no pre-training."""

    method = "baseline"
    uses_pretraining = False
    default_batch_factor = 1.0  # the paper's sqrt(N~), the baseline's better setting (docs/methods/hrnet.md)
    default_lr_final = 1.0      # constant, the paper's (docs/methods/hrnet.md)


__all__ = ["HRNet", "Baseline", "HRNetConfig", "HRNetPlan", "FittedModel", "release_lengths"]
