"""The one contract every synthesizer implements (the smartnoise-synth / scikit-learn shape), and nothing probes.

A :class:`Synthesizer` is created with its public hyper-parameters, parsed into ``self.config`` (an instance of
its ``config_class``). ``plan(eps, delta, unit, prior)`` says, from public parameters alone, everything ``fit``
will do that the release core needs to know before any data is read: the accounting event it will spend, the
bounding box and whether it needs time (what it reads of a trajectory), the DP-SGD sampling rate and the size it
assumes. ``fit(source, plan, release)`` spends that plan once and returns a :class:`Model`;
``Model.sample(n, rng)`` is free post-processing and can be called again. A model serialises itself to bytes
that carry its method and format version (:func:`pack` / :func:`unpack`), so a stored model is read back by the
version of duckmob that stored it or a later one, and refused clearly by an older one.

Data flows one way: checked, bounded batches (:mod:`duckmob.source`) -> the method's own discretisation ->
privatised statistics or a trained model -> sampled cells -> points (uniform within cells) -> Trajectories.
"""

from __future__ import annotations

import json
import struct
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Protocol, TypeVar

import numpy as np

from duckmob.errors import DuckmobError
from duckmob.grid import BBox, cell_bounds
from duckmob.privacy.events import Event
from duckmob.privacy.noise import NoiseSource
from duckmob.privacy.unit import PrivacyUnit
from duckmob.synth.config import Config
from duckmob.trajectories import NO_TIME, Trajectories

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What a fit will do, made from public parameters only (and the ledger's prior), before any data is read.

    ``event``: the accounting event to reserve; ``bbox`` and ``needs_time``: what the method reads of a trajectory
    (the source drops points outside the bbox and, with ``needs_time``, points without a time); ``sample_rate``:
    DP-SGD's Poisson sampling rate (None for a method without DP-SGD); ``default_size``: the public number of
    trajectories the plan assumes before its noisy count is known (None when the spend does not depend on it);
    ``max_points``: the public cap on the points of one sampled trajectory, from the config (the model's
    :attr:`Model.max_points`), so that an output's size (``n * max_points``) is checked before anything is spent.
    A method subclasses it with the rest of its schedule (noise multipliers, steps, budget shares). The one plan type
    of a fit: :meth:`Synthesizer.plan` makes it, the release protocol reserves its (grouped) event and carries it
    (``release.plan``, :class:`duckmob.release.protocol.Request`'s ``price``), and ``fit`` follows it."""

    eps: float
    delta: float
    unit: PrivacyUnit
    event: Event
    bbox: BBox
    needs_time: bool
    max_points: int
    sample_rate: float | None = None
    default_size: int | None = None


class ReleaseContext(Protocol):
    """What a fit may do with the release it runs in (:class:`duckmob.release.protocol.Release` implements it for a
    recorded release, :class:`Unrecorded` for a fit outside any ledger)."""

    noise: NoiseSource

    def check_interrupt(self) -> None:
        """Raise if the release was interrupted (Ctrl-C); long loops call it once a step."""

    def settle(self, price: Callable[[Any], tuple[Event, T]], drawn: Event) -> T:
        """Price the spend again after reading data (``price(prior) -> (event, result)``, ``result`` typically a
        new :class:`Plan` made with the noisy counts); returns ``result``."""

    def stopped(self, drawn: Event) -> None:
        """The fit is stopping (an exception propagates) having drawn the noise of ``drawn`` only, a part of its
        event (the DP-SGD steps that ran): a failed release is recorded with it."""


@dataclass
class Unrecorded:
    """A fit outside any ledger (tests, benchmarks, :func:`fit_unrecorded`): never interrupted, and a re-plan is
    made against no earlier release. Not a release: nothing is recorded, so nothing may be published from it."""

    noise: NoiseSource

    def check_interrupt(self) -> None:
        return None

    def settle(self, price, drawn):
        return price(None)[1]

    def stopped(self, drawn) -> None:
        return None


class Model(ABC):
    """A fitted synthesizer: everything in it is differentially private (or public configuration).

    ``format_version`` is the version of :meth:`payload`'s layout that this code writes; :meth:`from_bytes` reads
    it and every older one (:meth:`load` upgrades them explicitly) and refuses a newer or unknown one."""

    method: ClassVar[str]
    methods: ClassVar[tuple[str, ...]] = ()   # the methods whose fits this class holds (default: (method,))
    format_version: ClassVar[int] = 2
    # Whether :meth:`sample` may run on several threads at once (it reads the model and its own generator only, or
    # guards what it caches): an output then draws blocks ahead on worker threads (duckmob.release.sampling).
    # False for the torch methods, whose sampling sets the process's torch thread count.
    concurrent_sample: ClassVar[bool] = False

    @property
    def default_n(self) -> int | None:
        """How many trajectories ``sample`` draws when the caller gives no n (a noisy count), or None."""
        return None

    @property
    def size_count(self) -> dict | None:
        """The noisy trajectory count behind :attr:`default_n` with its public eps, sensitivity and Laplace scale
        (``count_eps``, ``count_k``, ``count_scale``, recorded at fit by ``counting.count_record``), or None (a
        model without a default size)."""
        info = getattr(self, "info", None) or {}
        if self.default_n is None or "count_scale" not in info:
            return None
        return {"value": self.default_n, "eps": info["count_eps"], "k": info["count_k"], "scale": info["count_scale"]}

    @property
    @abstractmethod
    def max_points(self) -> int:
        """The most points one sampled trajectory can have: a public cap from the config (what :meth:`sample`
        really cuts at), so an output of ``n`` trajectories has at most ``n * max_points`` rows."""

    @abstractmethod
    def sample(self, n: int, rng: np.random.Generator) -> Trajectories:
        """Draw ``n`` synthetic trajectories (traj_id 0..n-1; ts = NO_TIME where time is not modelled). ``n`` was
        validated by the caller (:func:`duckmob.validators.n_trajectories`)."""

    @abstractmethod
    def payload(self) -> bytes:
        """The model's own bytes (numpy ``.npz`` or torch state) in layout :attr:`format_version`; no raw data."""

    @classmethod
    @abstractmethod
    def load(cls, payload: bytes, version: int, method: str) -> "Model":
        """The model from :meth:`payload` bytes of layout ``version`` (<= :attr:`format_version`; an older one is
        upgraded here, explicitly), its config re-parsed through the method's config class."""

    def to_bytes(self) -> bytes:
        """The stored form: a header naming the method and format version, then :meth:`payload`."""
        return pack(self.stored_method(), self.format_version, self.payload())

    def stored_method(self) -> str:
        """The method recorded in the header (a class holding several methods' fits overrides it)."""
        return self.method

    @classmethod
    def from_bytes(cls, blob: bytes, method: str | None = None) -> "Model":
        """A model stored by :meth:`to_bytes` (or, format 1, by duckmob before the header existed: then ``method``,
        the stored row's, names it). Refused with a clear message when the method is not this class's or the
        format is newer than this code reads."""
        stored, version, payload = unpack(blob)
        method = stored or method or cls.method
        accepted = cls.methods or (cls.method,)
        if method not in accepted:
            raise DuckmobError(f"this stored model was fitted by method '{method}', not {' / '.join(accepted)}: "
                               "load it as that method's model")
        if not 1 <= version <= cls.format_version:
            raise DuckmobError(f"this {method} model is stored in format {version}, which this duckmob does not read "
                               f"(it reads formats 1 to {cls.format_version}): it was stored by a newer duckmob; "
                               "upgrade duckmob, or fit the model again")
        return cls.load(payload, version, method)

    def describe(self) -> dict[str, Any]:
        """Public parameters of the fit (shown by mob_models())."""
        return {}


_MAGIC = b"DUCKMOB-MODEL\x00"


def pack(method: str, version: int, payload: bytes) -> bytes:
    """``_MAGIC``, a length-prefixed JSON header ``{"method", "format"}``, then the payload."""
    header = json.dumps({"method": method, "format": int(version)}, sort_keys=True).encode()
    return _MAGIC + struct.pack("<I", len(header)) + header + bytes(payload)


def unpack(blob: bytes) -> tuple[str | None, int, bytes]:
    """``(method, format version, payload)`` of a stored model. A blob without the header is format 1 (what
    duckmob stored before models carried a version), of a method the caller knows from the stored row."""
    blob = bytes(blob)
    if not blob.startswith(_MAGIC):
        return None, 1, blob
    at = len(_MAGIC)
    try:
        (size,) = struct.unpack_from("<I", blob, at)
        header = json.loads(blob[at + 4: at + 4 + size].decode())
        method, version = str(header["method"]), int(header["format"])
    except (struct.error, ValueError, KeyError, TypeError):
        raise DuckmobError("this stored model's header is damaged: fit the model again") from None
    return method, version, blob[at + 4 + size:]


class Synthesizer(ABC):
    """A method with its public hyper-parameters, parsed into ``self.config`` (nothing is set on it afterwards).

    The contract the release core (:mod:`duckmob.release`) relies on, pinned by tests/synth/test_contract.py over
    every registered method and a fake one:

    - ``plan(eps, delta, unit, prior)``: from public parameters alone, the :class:`Plan` ``fit`` will spend;
      called before any data is read (outside the ledger's lock, again if other releases took room meanwhile), so
      it must refuse (DuckmobError) an (eps, delta) the mechanism cannot honour. ``unit`` says whom the release
      protects; every sensitivity is multiplied by ``unit.max_trajectories_per_user``, the contribution bound the
      source has already enforced. ``prior`` is the source's :class:`~duckmob.privacy.ledger.Prior` (budget and
      earlier releases), for a method that calibrates its noise to what is left, or None.
    - ``fit(source, plan, release)``: one release of ``plan``. ``source`` is :class:`~duckmob.source.batches.Batches`
      (cleaned, bounded; :class:`Trajectories` are accepted too) and may hold no trajectory (the release path never
      refuses on the data's content). All noise comes from ``release.noise``; long loops call
      ``release.check_interrupt()``; a method whose spend depends on a noisy count re-plans with
      ``release.settle(...)``. Otherwise ``plan.event`` is what was spent.

    ``config_class`` is the method's :class:`~duckmob.synth.config.Config`; ``model_class`` the :class:`Model`
    ``fit`` returns (to load stored models); ``default_delta`` the delta used when the caller gives none;
    ``needs_delta`` whether delta must be > 0 (DP-SGD and Gaussian noise; checked by the release core with every
    other public argument, :func:`duckmob.validators.release_delta`, which quotes ``mechanism`` as the reason); ``needs_time`` whether the input must have
    timestamps (False: a table without time is ordered by ``seq``).
    """

    method: ClassVar[str]
    config_class: ClassVar[type[Config]]
    model_class: ClassVar[type[Model]]
    default_delta: ClassVar[float] = 1e-5
    needs_delta: ClassVar[bool] = False
    mechanism: ClassVar[str] = ""    # why delta > 0 is needed, for the refusal: 'trains with DP-SGD'
    needs_time: ClassVar[bool] = True
    config: Config

    # a public road network (duckmob.roads.Roads) the release core hands a fit with roads := (None: no roads); a
    # method may release on it (PrivTrace's fine density), and every method's output is placed on it
    roads = None

    def __init__(self, bbox, **params):
        self.bbox = BBox.of(bbox)
        self.config = self.configure(self.config_class.parse(params))

    def configure(self, config: Config) -> Config:
        """The parsed config with what the method derives from public parameters alone (override)."""
        return config

    @abstractmethod
    def plan(self, eps: float, delta: float, unit: PrivacyUnit = PrivacyUnit(), prior=None) -> Plan:
        """The :class:`Plan` of ``fit`` at (eps, delta) for ``unit``, from public parameters only."""

    @abstractmethod
    def fit(self, source, plan: Plan, release: ReleaseContext) -> Model:
        """One release of ``plan`` on ``source`` (see the class docstring)."""


def fit_unrecorded(synthesizer: Synthesizer, data, eps: float, delta: float | None = None,
                   noise: NoiseSource | None = None, unit: PrivacyUnit = PrivacyUnit()) -> Model:
    """Plan and fit outside any ledger (tests, benchmarks): the same computation as a release, but nothing is
    recorded, so its result must not be published. ``data``: Trajectories or Batches, already cleaned and bounded
    to ``unit``."""
    delta = synthesizer.default_delta if delta is None else delta
    plan = synthesizer.plan(eps, delta, unit)
    return synthesizer.fit(data, plan, Unrecorded(noise if noise is not None else NoiseSource(0)))


def points_in_cells(cells: np.ndarray, bbox, w: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A point drawn uniformly (in degrees) inside each cell of a w x w grid over ``bbox``: (lat, lon)."""
    a, b, c, d = cell_bounds(cells, bbox, w)
    u = rng.random((2, len(cells)))
    return a + (c - a) * u[0], b + (d - b) * u[1]


def trajectories_from_cells(lengths: np.ndarray, lat: np.ndarray, lon: np.ndarray,
                            ts: np.ndarray | None = None) -> Trajectories:
    """Assemble synthetic Trajectories (traj_id 0..n-1, user_id -1) from per-trajectory lengths and points."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    if ts is None:
        ts = np.full(int(offsets[-1]), NO_TIME, dtype=np.int64)
    return Trajectories(offsets, np.arange(n, dtype=np.int64), np.full(n, -1, dtype=np.int64),
                        np.asarray(ts, dtype=np.int64), np.asarray(lat, dtype=np.float64),
                        np.asarray(lon, dtype=np.float64))
