"""One interface for every synthesizer (the smartnoise-synth / scikit-learn shape).

A :class:`Synthesizer` is created with public hyper-parameters only. ``privacy_event(eps, delta)`` says, from
those public parameters alone, what ``fit`` will spend (so the ledger can refuse before any data is read).
``fit`` spends the budget once and returns a :class:`Model`; ``Model.sample(n, rng)`` is free
post-processing and can be called again. A model serialises to bytes so it can be stored in the database.

Data flows one way: Trajectories (ragged points) -> the method's own discretisation -> privatised statistics or
a trained model -> sampled cells -> points (uniform within cells) -> Trajectories.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

from duckmob.grid import BBox, cell_bounds
from duckmob.trajectories import NO_TIME, Trajectories


class Model(ABC):
    """A fitted synthesizer: everything in it is differentially private (or public configuration)."""

    method: ClassVar[str]

    @property
    def default_n(self) -> int | None:
        """How many trajectories ``sample`` draws when the caller gives no n (a noisy count), or None."""
        return None

    @property
    def size_count(self) -> dict | None:
        """The noisy trajectory count behind :attr:`default_n` with its public eps, sensitivity and Laplace scale
        (``count_eps``, ``count_k``, ``count_scale``, recorded at fit by ``counting.count_record``), or None (a
        model stored before they were recorded, or one without a default size)."""
        info = getattr(self, "info", None) or {}
        if self.default_n is None or "count_scale" not in info:
            return None
        return {"value": self.default_n, "eps": info["count_eps"], "k": info["count_k"], "scale": info["count_scale"]}

    @abstractmethod
    def sample(self, n: int, rng: np.random.Generator) -> Trajectories:
        """Draw ``n`` synthetic trajectories (traj_id 0..n-1; ts = NO_TIME where time is not modelled)."""

    @abstractmethod
    def to_bytes(self) -> bytes:
        """Serialise (numpy ``.npz`` or torch state); no raw data is ever inside."""

    @classmethod
    @abstractmethod
    def from_bytes(cls, blob: bytes) -> "Model":
        ...

    def describe(self) -> dict[str, Any]:
        """Public parameters of the fit (shown by mob_models())."""
        return {}


class Synthesizer(ABC):
    """A method with its public hyper-parameters (validated in ``__init__``; nothing is set on it afterwards).

    The contract the release core (``duckmob.release``) relies on, all keyword-only beyond the budget:

    - ``privacy_event(eps, delta, *, contribution_bound, prior)``: from public parameters alone, the event
      ``fit`` plans to spend; called under the ledger's lock before any data is read, so it must refuse
      (DuckmobError) an (eps, delta) the mechanism cannot honour. ``contribution_bound`` is k, the trajectories
      one privacy unit may contribute (1 for the trajectory unit; the user unit's max_trajectories_per_user,
      already enforced on the data ``fit`` gets): every sensitivity is multiplied by it. ``prior`` is the
      source's :class:`~duckmob.privacy.ledger.Prior` (budget and earlier releases), for a method that
      calibrates its noise to what is left; one that spends a fixed event ignores it.
    - ``fit(data, eps, delta, noise, *, contribution_bound, release)``: one release. All noise comes from
      ``noise`` (a :class:`~duckmob.privacy.noise.NoiseSource`). Long loops call ``release.check_interrupt()``;
      a method whose spend depends on a noisy count re-plans with ``release.settle(...)`` (see
      :class:`duckmob.release.Release`); otherwise the reserved ``privacy_event`` is what was spent.
      ``data`` may hold zero trajectories (the release path never refuses on the data's content).

    ``model_class`` is the :class:`Model` subclass ``fit`` returns (to load stored models by method name);
    ``default_delta`` the delta used when the caller gives none (0 for a pure eps-DP method); ``needs_time``
    whether the input must have timestamps (False: a table without time is ordered by ``seq``).
    """

    method: ClassVar[str]
    model_class: ClassVar[type[Model]]
    default_delta: ClassVar[float] = 1e-5
    needs_time: ClassVar[bool] = True
    streams: ClassVar[bool] = False     # fit accepts source.batches.Batches (out of core) as well as Trajectories

    def __init__(self, bbox, **params):
        self.bbox = BBox.of(bbox)
        self.params = params

    @abstractmethod
    def privacy_event(self, eps: float, delta: float, *, contribution_bound: int = 1, prior=None):
        """The accounting event ``fit(eps, delta)`` will spend, from public parameters only."""

    @abstractmethod
    def fit(self, data: Trajectories, eps: float, delta: float, noise, *, contribution_bound: int = 1,
            release=None) -> Model:
        """Fit under (eps, delta)-DP using ``noise`` (a duckmob.privacy.noise.NoiseSource) for all noise."""


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
