"""The counting releases: ``mob_noisy_count`` and ``mob_transitions``."""

from __future__ import annotations

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


def _stable(stability, eps: float) -> tuple[int, float]:
    """(s, the eps the mechanism runs at on the relation): a release over a relation of public stability s (one base
    row becomes at most s of its rows) is made at eps / s, so that grouped by s (every sensitivity times s,
    ``accounting.grouped``) it costs the base tables the eps asked."""
    s = validators.stability(stability) or 1
    return s, eps / s


def noisy_count(db: Database, *, source, eps, seed=None, privacy_unit="trajectory", max_trajectories_per_user=None,
                what="trajectories", user_col: str | None = "user_id", stability=None,
                count: Callable[[str, PrivacyUnit], int]) -> float:
    """An eps-DP count of the trajectories or users of ``source`` (``mob_noisy_count``).

    ``count(what, unit)`` returns the exact number of items, counted where the data lives after the
    reservation (``duckmob.source.table.count_query`` in DuckDB, ``pair_count`` in memory): distinct (user_id,
    traj_id) pairs; under the user unit at most k per user; or distinct users. ``user_col`` names the table's user
    column, None when it has none: counting users, or the user unit, is then refused before anything is reserved
    (it would count no one and release noise around 0). Privacy map: one trajectory changes the trajectory count by
    1; under the user unit at most k trajectories per user are counted (sensitivity k); one trajectory or user
    changes the user count by at most 1. Laplace(sensitivity / eps), accounted as ``accounting.laplace(eps)``.
    Over a relation of declared stability s (one base row becomes at most s rows) every sensitivity is s times
    larger: the noise is Laplace(s * sensitivity / eps), still accounted as ``laplace(eps)`` (:func:`_stable`).
    """
    if what not in ("trajectories", "users"):
        raise DuckmobError(f"what must be 'trajectories' or 'users'; got {what!r}")
    unit = validators.privacy_unit(privacy_unit, max_trajectories_per_user, needs_bound=what == "trajectories")
    k = unit.max_trajectories_per_user
    source = validators.source_name(source)
    if user_col is None and what == "users":
        raise no_user_column(f"'{source}'", "its users cannot be counted",
                             "count trajectories with what := 'trajectories'")
    if user_col is None and unit.is_user:
        raise no_user_column(f"'{source}'")
    eps = validators.epsilon(eps)
    s, eps_relation = _stable(stability, eps)
    sensitivity = k if what == "trajectories" else 1
    check_scale(sensitivity / eps_relation)
    noise = NoiseSource(validators.seed(seed))
    event = accounting.grouped(accounting.laplace(eps_relation), s)

    def compute(release: Release) -> float:
        n_items = release.read(lambda: int(count(what, unit)))
        return counting.noisy_count(n_items, eps_relation, noise, sensitivity)

    params = {"eps": eps, "what": what, "sensitivity": sensitivity, **({"stability": s} if s > 1 else {}),
              "max_trajectories_per_user": k if unit.is_user and what == "trajectories" else None}
    value, _ = run(db, Request(source=source, mechanism=f"count({what})", privacy_unit=unit.kind, params=params,
                               seeded=noise.seeded, price=lambda p: (event, None)), compute)
    return value


def transitions(db: Database, *, source, order=1, eps, n_states, seed=None, privacy_unit="trajectory",
                max_trajectories_per_user=None, max_length=None, support=None, w=None, user_col: str | None = "user_id",
                stability=None, load: Callable[[], tuple[np.ndarray, np.ndarray, np.ndarray]]):
    """eps-DP length-normalised transition counts of a table of cell sequences (``mob_transitions``).

    ``load()`` returns ``(offsets, cells, user_id)``, or a callable yielding such batches (read out of core:
    ``duckmob.release.tables.transitions``; the same release); ``user_col`` is as in :func:`noisy_count` (the user unit
    on a table without a user column is refused before anything is reserved). The mechanism and its privacy map are
    ``duckmob.privacy.counting.noisy_transition_counts`` (dense) / ``..._sparse`` (support 'neighbours'):
    Laplace(k / eps) on every entry of a data-independent support, accounted as ``accounting.laplace(eps)``
    (over a relation of declared stability s: Laplace(s k / eps), :func:`_stable`).
    Returns ``(states (n, order + 1), counts)`` of the entries left positive by NormCut.
    """
    example = f"FROM mob_transitions('{source}', eps := 0.5, n_states := 1024)"
    unit = validators.privacy_unit(privacy_unit, max_trajectories_per_user)
    k = unit.max_trajectories_per_user
    source = validators.source_name(source)
    if user_col is None and unit.is_user:
        raise no_user_column(f"'{source}'", "privacy_unit := 'user' cannot tell whose each sequence is")
    eps = validators.epsilon(eps)
    s, eps_relation = _stable(stability, eps)
    if n_states is None:
        raise DuckmobError(f"n_states is required (public: w * w for a w x w grid), e.g. {example}")
    n_states = validators.count("n_states", n_states, maximum=1 << 40)
    order = 1 if order is None else order
    if order not in (1, 2):
        raise DuckmobError(f"markov_order must be 1 or 2; got {order!r}")
    if max_length is not None:
        max_length = validators.count("max_length", max_length)
    check_scale(k / eps_relation)
    if support not in (None, "full", "neighbours"):
        raise DuckmobError(f"support must be NULL, 'full' or 'neighbours'; got {support!r}")
    if support == "neighbours" and (w is None or validators.count("w", w) ** 2 != n_states):
        raise DuckmobError(f"support := 'neighbours' needs the grid width w with w * w = n_states ({n_states}); "
                           f"got w = {w!r}")
    if support != "neighbours" and (n_states + 2) ** (order + 1) > counting.MAX_DENSE:
        raise DuckmobError(f"a dense order-{order} table over {n_states} states is too large: use fewer states, "
                           "support := 'neighbours' (with w), or markov_order := 1")
    noise = NoiseSource(validators.seed(seed))
    event = accounting.grouped(accounting.laplace(eps_relation), s)

    def compute(release: Release):
        loaded = release.read(load)
        # a callable yields (offsets, cells, user_id) batches read out of core (duckmob.source.table.read_sequences)
        batches = loaded if callable(loaded) else (lambda: iter([loaded]))
        args = dict(unit=unit, max_length=max_length, support=support, w=w)
        if support == "neighbours":
            return counting.noisy_transition_counts_sparse_batches(batches, n_states, order, eps_relation, noise,
                                                                   **args)
        counts = counting.noisy_transition_counts_batches(batches, n_states, order, eps_relation, noise,
                                                          dtype=np.float64 if order == 1 else np.float32, **args)
        nz = np.nonzero(counts)
        return np.stack(nz, axis=1), counts[nz].astype(np.float64)

    params = {"order": order, "eps": eps, "n_states": n_states, "max_length": max_length,
              "max_trajectories_per_user": k if unit.is_user else None, "support": support, "w": w,
              "normcut": True, **({"stability": s} if s > 1 else {})}
    result, _ = run(db, Request(source=source, mechanism=f"transition_counts(order={order})",
                                privacy_unit=unit.kind, params=params, seeded=noise.seeded,
                                price=lambda p: (event, None)), compute)
    return result
