"""The counting releases: ``mob_noisy_count`` and ``mob_transitions``.

Each takes its public arguments as one typed value, validated when it is made: :class:`CountArgs` and
:class:`TransitionArgs` (each field with its SQL type, as :class:`~duckmob.release.fitting.FitArgs` for a fit). The
SQL UDFs (duckmob/sql/privacy.py: the request STRUCT is :meth:`CountArgs.sql_types`) and the Python API
(:func:`duckmob.noisy_count`, :func:`duckmob.transitions`) build one at their boundary and hand it down unchanged
(tests/test_count_args.py checks both faces against the fields), so the eps a release spends is ``args.eps``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable

import numpy as np

from duckmob import validators
from duckmob.errors import DuckmobError
from duckmob.privacy import accounting, counting
from duckmob.privacy.noise import NoiseSource
from duckmob.privacy.noise import check_scale
from duckmob.privacy.unit import PrivacyUnit, no_user_column
from duckmob.release.protocol import Release, Request, run
from duckmob.release.registry import Database

WHAT = ("trajectories", "users")
SUPPORTS = (None, "full", "neighbours")


def _sql(kind: str, default=None, **more):
    return field(default=default, metadata={"sql": kind, **more})


class _Args:
    """What the two argument types share: their SQL request types, and setting a field to its validated value."""

    @classmethod
    def sql_types(cls) -> dict[str, str]:
        """Each public argument's SQL type, in the order of the request STRUCT the macro builds (its keys)."""
        return {f.name: f.metadata["sql"] for f in fields(cls) if "sql" in f.metadata}

    @classmethod
    def macro_names(cls) -> dict[str, str]:
        """Each public argument's parameter name in the SQL macro (the STRUCT key, unless the macro spells it
        otherwise: ``markov_order`` is ``order``)."""
        return {f.name: f.metadata.get("macro", f.name) for f in fields(cls) if "sql" in f.metadata}

    def _set(self, **values) -> None:
        for name, value in values.items():
            object.__setattr__(self, name, value)


@dataclass(frozen=True)
class CountArgs(_Args):
    """The public arguments of a noisy count (``mob_noisy_count``, :func:`duckmob.noisy_count`), validated when made
    (before any input is resolved, anything reserved or read): ``eps`` in (0, MAX_EPSILON], ``what`` 'trajectories'
    or 'users', the privacy unit (``unit``; the user unit needs max_trajectories_per_user := k unless users are
    counted), ``seed``, ``stability``. ``what`` NULL is 'trajectories'."""

    eps: float = field(metadata={"sql": "DOUBLE"})   # required (NULL from SQL is refused)
    seed: int | None = _sql("BIGINT")
    privacy_unit: str = _sql("VARCHAR", "trajectory")
    max_trajectories_per_user: int | None = _sql("BIGINT")
    what: str = _sql("VARCHAR", "trajectories")
    stability: int | None = _sql("BIGINT")
    unit: PrivacyUnit = field(init=False, repr=False)   # the privacy unit the two fields above name

    def __post_init__(self):
        what = "trajectories" if self.what is None else self.what
        if what not in WHAT:
            raise DuckmobError(f"what must be 'trajectories' or 'users'; got {what!r}")
        unit = validators.privacy_unit(self.privacy_unit, self.max_trajectories_per_user,
                                       needs_bound=what == "trajectories")
        self._set(what=what, unit=unit, privacy_unit=unit.kind,
                  max_trajectories_per_user=unit.max_trajectories_per_user if unit.is_user else None,
                  eps=validators.epsilon(self.eps), stability=validators.stability(self.stability),
                  seed=validators.seed(self.seed))

    @property
    def sensitivity(self) -> int:
        """How much one privacy unit changes the count: k trajectories (1 for the trajectory unit), or 1 user."""
        return self.unit.max_trajectories_per_user if self.what == "trajectories" else 1


@dataclass(frozen=True)
class TransitionArgs(_Args):
    """The public arguments of noisy transition counts (``mob_transitions``, :func:`duckmob.transitions`), validated
    when made: ``order`` 1 or 2 (NULL: 1; the macro's ``markov_order``), ``eps``, ``n_states`` (required, public:
    w * w), the privacy unit, ``max_length`` (a positive cap, or None), ``support`` (None, 'full' or 'neighbours',
    which needs the grid width ``w`` with w * w = n_states), ``seed``, ``stability``; a dense table over too many
    states is refused here (:func:`duckmob.privacy.counting.check_dense`)."""

    order: int = _sql("BIGINT", 1, macro="markov_order")
    eps: float = field(default=None, metadata={"sql": "DOUBLE"})   # required (None is refused)
    n_states: int = _sql("BIGINT")                                  # required (None is refused)
    seed: int | None = _sql("BIGINT")
    privacy_unit: str = _sql("VARCHAR", "trajectory")
    max_trajectories_per_user: int | None = _sql("BIGINT")
    max_length: int | None = _sql("BIGINT")
    support: str | None = _sql("VARCHAR")
    w: int | None = _sql("BIGINT")
    stability: int | None = _sql("BIGINT")
    unit: PrivacyUnit = field(init=False, repr=False)

    def __post_init__(self):
        unit = validators.privacy_unit(self.privacy_unit, self.max_trajectories_per_user)
        eps, stability = validators.epsilon(self.eps), validators.stability(self.stability)
        if self.n_states is None:
            raise DuckmobError("n_states is required (public: w * w for a w x w grid): pass e.g. n_states := 1024")
        n_states = validators.count("n_states", self.n_states, maximum=1 << 40)
        order = 1 if self.order is None else self.order
        if order not in (1, 2):
            raise DuckmobError(f"markov_order must be 1 or 2; got {order!r}")
        max_length = None if self.max_length is None else validators.count("max_length", self.max_length)
        support, w = self.support, self.w
        if support not in SUPPORTS:
            raise DuckmobError(f"support must be NULL, 'full' or 'neighbours'; got {support!r}")
        if support == "neighbours":
            if w is None or validators.count("w", w) ** 2 != n_states:
                raise DuckmobError(f"support := 'neighbours' needs the grid width w with w * w = n_states "
                                   f"({n_states}); got w = {w!r}")
            w = int(w)
        else:
            counting.check_dense(n_states, int(order))
        self._set(order=int(order), eps=eps, n_states=n_states, seed=validators.seed(self.seed), unit=unit,
                  privacy_unit=unit.kind,
                  max_trajectories_per_user=unit.max_trajectories_per_user if unit.is_user else None,
                  max_length=max_length, w=w, stability=stability)


def _stable(s: int | None, eps: float) -> tuple[int, float]:
    """(s, the eps the mechanism runs at on the relation): a release over a relation of public stability s (one base
    row becomes at most s of its rows) is made at eps / s, so that grouped by s (every sensitivity times s,
    ``accounting.grouped``) it costs the base tables the eps asked."""
    s = s or 1
    return s, eps / s


def noisy_count(db: Database, args: CountArgs, *, source: str, user_col: str | None = "user_id",
                count: Callable[[str, PrivacyUnit], int]) -> float:
    """An eps-DP count of the trajectories or users of ``source`` (``mob_noisy_count``), eps = ``args.eps``.

    ``count(what, unit)`` returns the exact number of items, counted where the data lives after the
    reservation (``duckmob.source.table.count_query`` in DuckDB, ``pair_count`` in memory): distinct (user_id,
    traj_id) pairs; under the user unit at most k per user; or distinct users. ``user_col`` names the table's user
    column, None when it has none: counting users, or the user unit, is then refused before anything is reserved
    (it would count no one and release noise around 0). ``args.stability`` is the input's (checked on its plan).
    Privacy map: one trajectory changes the trajectory count by
    1; under the user unit at most k trajectories per user are counted (sensitivity k); one trajectory or user
    changes the user count by at most 1. Laplace(sensitivity / eps), accounted as ``accounting.laplace(eps)``.
    Over a relation of declared stability s (one base row becomes at most s rows) every sensitivity is s times
    larger: the noise is Laplace(s * sensitivity / eps), still accounted as ``laplace(eps)`` (:func:`_stable`).
    """
    what, unit = args.what, args.unit
    if user_col is None and what == "users":
        raise no_user_column(f"'{source}'", "its users cannot be counted",
                             "count trajectories with what := 'trajectories'")
    if user_col is None and unit.is_user:
        raise no_user_column(f"'{source}'")
    s, eps_relation = _stable(args.stability, args.eps)
    sensitivity = args.sensitivity
    check_scale(sensitivity / eps_relation)
    noise = NoiseSource(args.seed)
    event = accounting.grouped(accounting.laplace(eps_relation), s)

    def compute(release: Release) -> float:
        n_items = release.read(lambda: int(count(what, unit)))
        return counting.noisy_count(n_items, eps_relation, noise, sensitivity)

    params = {"eps": args.eps, "what": what, "sensitivity": sensitivity, **({"stability": s} if s > 1 else {}),
              "max_trajectories_per_user": args.max_trajectories_per_user if what == "trajectories" else None}
    value, _ = run(db, Request(source=source, mechanism=f"count({what})", privacy_unit=unit.kind, params=params,
                               seeded=noise.seeded, price=lambda p: (event, None)), compute)
    return value


def transitions(db: Database, args: TransitionArgs, *, source: str, user_col: str | None = "user_id",
                load: Callable[[], tuple[np.ndarray, np.ndarray, np.ndarray]]):
    """eps-DP length-normalised transition counts of a table of cell sequences (``mob_transitions``), eps =
    ``args.eps``.

    ``load()`` returns ``(offsets, cells, user_id)``, or a callable yielding such batches (read out of core:
    ``duckmob.release.tables.transitions``; the same release); ``user_col`` is as in :func:`noisy_count` (the user unit
    on a table without a user column is refused before anything is reserved). The mechanism and its privacy map are
    ``duckmob.privacy.counting.noisy_transition_counts`` (dense) / ``..._sparse`` (support 'neighbours'):
    Laplace(k / eps) on every entry of a data-independent support, accounted as ``accounting.laplace(eps)``
    (over a relation of declared stability s: Laplace(s k / eps), :func:`_stable`).
    Returns ``(states (n, order + 1), counts)`` of the entries left positive by NormCut.
    """
    a, unit = args, args.unit
    if user_col is None and unit.is_user:
        raise no_user_column(f"'{source}'", "privacy_unit := 'user' cannot tell whose each sequence is")
    s, eps_relation = _stable(a.stability, a.eps)
    check_scale(unit.max_trajectories_per_user / eps_relation)
    noise = NoiseSource(a.seed)
    event = accounting.grouped(accounting.laplace(eps_relation), s)

    def compute(release: Release):
        loaded = release.read(load)
        # a callable yields (offsets, cells, user_id) batches read out of core (duckmob.source.table.read_sequences)
        batches = loaded if callable(loaded) else (lambda: iter([loaded]))
        shared = dict(unit=unit, max_length=a.max_length, support=a.support, w=a.w)
        if a.support == "neighbours":
            return counting.noisy_transition_counts_sparse_batches(batches, a.n_states, a.order, eps_relation, noise,
                                                                   **shared)
        counts = counting.noisy_transition_counts_batches(batches, a.n_states, a.order, eps_relation, noise,
                                                          dtype=np.float64 if a.order == 1 else np.float32, **shared)
        nz = np.nonzero(counts)
        return np.stack(nz, axis=1), counts[nz].astype(np.float64)

    params = {"order": a.order, "eps": a.eps, "n_states": a.n_states, "max_length": a.max_length,
              "max_trajectories_per_user": a.max_trajectories_per_user, "support": a.support, "w": a.w,
              "normcut": True, **({"stability": s} if s > 1 else {})}
    result, _ = run(db, Request(source=source, mechanism=f"transition_counts(order={a.order})",
                                privacy_unit=unit.kind, params=params, seeded=noise.seeded,
                                price=lambda p: (event, None)), compute)
    return result


__all__ = ["CountArgs", "TransitionArgs", "noisy_count", "transitions"]
