"""Length-normalised transition counts and their noisy release (PrivTrace §4.3 and App. B.2; HRNet §4.1).

Input: cell sequences as ragged arrays (``offsets`` int64[n+1], ``cells`` int64[m], states ``0 .. n_states-1``).
Each sequence is augmented with a virtual start (index ``S = n_states``) and end (``E = n_states + 1``):
``(S, c_1, .., c_L, E)``. Its order-k transitions are its ``W = L + 2 - (k + 1)`` windows of k + 1 consecutive
states (``L + 1`` pairs for the first order, ``L`` triples for the second).

Length normalisation. Trajectory T adds ``1 / W_T`` to the entry of each of its windows:
``N'(a, b) = sum_T N_T(a, b) / W_T`` (first order), ``N'(a, b, c) = sum_T N_T(a, b, c) / W_T`` (second order).

Sensitivity (add/remove one trajectory), with proof. Adding T to a dataset adds its contribution vector
``v_T`` to the table: ``v_T >= 0`` entrywise and ``sum(v_T) = sum over T's W_T windows of 1 / W_T = 1``. So
``||N'(D + T) - N'(D)||_1 = 1`` exactly, however long T is, however often it loops or repeats one transition
(repeats only pile ``1/W_T`` onto the same entry). This is PrivTrace's Theorem 2; we divide by the number of
windows ``W_T`` rather than by the number of cells ``|T|`` because, with the virtual start and end, a sequence of
``|T|`` cells has ``|T| + 1`` first-order windows and dividing by ``|T|`` would give mass ``(|T|+1)/|T| > 1``.
A privacy unit of up to ``k`` trajectories (``privacy_unit='user'`` with a public ``max_trajectories_per_user = k``,
extra trajectories dropped at random before counting) changes the table by at most ``k``.

Release (``noisy_transition_counts``). Laplace noise of scale ``b = k / eps`` on EVERY entry of a data-independent
support — zero or not — then NormCut on each row (post-processing). Privacy map: eps-DP for the privacy unit,
accounted as ``accounting.laplace(eps)``. The support is either the structural one (all entries except the
impossible ones: into S, out of E, S -> E) or, with ``support='neighbours'`` and the public grid width ``w``, the
pairs of cells at Chebyshev distance <= 1 (plus S -> cell and cell -> E; triples whose two steps are such pairs).
Transitions outside a restricted support are dropped before noise (removing mass only lowers the sensitivity);
that suits raw GPS cell sequences, whose consecutive cells touch, not stay-point sequences, which jump.
The noise is ``duckmob.privacy.noise``'s grid sampler: every trajectory's mass 1 is split into ``G = 1/g``
steps of the noise grid ``g`` (``G // W_T`` per window, one more on its first ``G % W_T`` windows), so each
trajectory still adds exactly 1 in L1 with non-negative entries, the counts are exact multiples of ``g`` and
``counts + noise`` is computed exactly (no Mironov leak, no epsilon increase). Each window's weight differs from
``1 / W_T`` by less than ``g ~ 1e-6 b``.

A public ``max_length`` truncates every sequence to its first ``max_length`` cells before counting (it bounds the
work per trajectory; the sensitivity bound above does not need it).

Invalid input is dropped, never refused (a refusal that depends on the data is itself a one-bit release): a
trajectory with a cell id outside ``0 .. n_states - 1`` or a NULL cell is dropped whole, and under
``privacy_unit='user'`` a trajectory without a user id is dropped. Both act on each trajectory by itself, so the
sensitivities above hold unchanged (a dropped trajectory contributes nothing). Every released entry, a sum of
whole noise-grid steps, is clamped to ``[0, MAX_UNITS]`` steps before noise (clamping each coordinate is
1-Lipschitz: the L1 sensitivity cannot grow), which keeps ``counts + noise`` exact in float64 whatever the data
size; no real table comes near it (``MAX_UNITS g`` lies in ``(2^30 b, 2^31 b]``: a billion trajectories on one
entry at noise scale ``b = 1``).

HRNet's coarse-to-fine DPTRAN (§4.1 eq. 3-4) is ``region_transition_counts``: ``TRAN_i[r, l] = sum_v 1[v has a
transition from a cell inside region r of the 2^i x 2^i grid to cell l] / W_v``, with ``W_v = |v| - 1`` the number
of transitions of v (a trajectory has at most that many distinct (region, cell) pairs, so again L1 <= 1; HRNet
divides by ``|v|``, which is also <= 1 but looser).
"""

from __future__ import annotations

import math

import numpy as np

from duckmob.errors import DuckmobError
from duckmob.grid import parent, quadtree_depth
from duckmob.validators import count
from duckmob.privacy import accounting
from duckmob.privacy.noise import NoiseSource, granularity, laplace_scale
from duckmob.privacy.normcut import normcut
from duckmob.privacy.steps import grid_steps as _grid_steps, positions as _positions
from duckmob.privacy.unit import PrivacyUnit

# Largest released count, in steps of the noise grid g (public): a count is clamped to [0, MAX_UNITS] steps before
# noise, so that count + noise (both on the g/2 grid, |value| < 2^52 g) is exact in float64.
MAX_UNITS = 2 ** 51
# Slabs of the second-order tensor noised at once (entries per block ~ this).
_BLOCK = 1 << 22
# Tables up to this many entries are summed with one bincount; larger ones by sorting the windows.
_BINCOUNT_MAX = 1 << 24
# Largest dense table built (entries): 602^3 = 218 M fits; 1026^3 (w = 32 plus start/end) does not.
MAX_DENSE = 1 << 28


# -- inputs ------------------------------------------------------------------------------------------------

def _user_ids(user_id) -> np.ndarray:
    """int64 user ids, one per trajectory; NULL (None, NaN) and negative ids become -1: no user."""
    values = np.asarray(user_id)
    if values.dtype.kind not in "iu":
        values = np.asarray(values, dtype=np.float64)
        values = np.where(np.isfinite(values), values, -1)
    return np.maximum(values.astype(np.int64), -1)


def _cell_ids(cells, n_states: int) -> np.ndarray:
    """int64 cell ids with every invalid entry (NULL, NaN, not an integer, outside 0 .. n_states - 1) as -1.

    A NULL cell may come as a masked entry, a NaN (float array) or None (object array)."""
    if np.ma.isMaskedArray(cells):
        cells = np.ma.asarray(cells, dtype=np.float64).filled(np.nan)
    values = np.asarray(cells)
    if values.dtype.kind in "iub":
        values = values.astype(np.int64, copy=False)
        if len(values) == 0 or (values.min() >= 0 and values.max() < n_states):
            return values  # the same result without a copy (only the time depends on this branch)
        return np.where((values >= 0) & (values < n_states), values, -1)
    values = np.asarray(values, dtype=np.float64)
    ok = (values >= 0) & (values < n_states) & (values == np.floor(values))  # False on NaN
    return np.where(ok, values, -1).astype(np.int64)


def _n_states(n_states) -> int:
    """The public number of states (checked once per release, by its entry point)."""
    return count("n_states", n_states, example="n_states := 1024 (public: w * w grid cells)")


def _needs_users(user_id) -> None:
    """The user unit bounds each user's trajectories, so it needs their user ids (a caller's bug, not the data's)."""
    if user_id is None:
        raise DuckmobError("privacy_unit 'user' needs user_id (one per trajectory)")


def _sequences(offsets, cells, n_states: int, user_id=None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Validated ragged sequences ``(offsets, cells, user_id)`` over ``n_states`` states (checked by the caller:
    :func:`_n_states`).

    The public arguments raise when wrong: ``offsets`` must be a ragged offset
    vector over ``cells`` and ``user_id`` (if given) have one entry per trajectory; these are the caller's
    contract, not the table's content, and their messages quote nothing from the data. The data never raises: a
    trajectory with any cell outside ``0 .. n_states - 1``, or a NULL cell, is dropped whole and silently, with
    its user id. That is a per-trajectory transformation (a trajectory's fate depends on its own cells only),
    so every sensitivity in this module holds unchanged; a refusal instead would release a bit about the data
    (e.g. let an attacker binary-search the largest cell id by varying n_states).
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    n_cells = len(cells)
    if offsets.ndim != 1 or len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != n_cells \
            or np.any(np.diff(offsets) < 0):
        raise DuckmobError("offsets must start at 0, never decrease and end at len(cells) (ragged arrays)")
    if user_id is not None:
        user_id = _user_ids(user_id)
        if user_id.shape != (len(offsets) - 1,):
            raise DuckmobError("user_id must have one entry per trajectory (len(offsets) - 1 entries)")
    cells = _cell_ids(cells, n_states)
    invalid = cells < 0
    if invalid.any():
        lengths = np.diff(offsets)
        owner = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
        keep = np.ones(len(lengths), dtype=bool)
        keep[owner[invalid]] = False
        offsets, cells = _select(offsets, cells, keep)
        user_id = None if user_id is None else user_id[keep]
    return offsets, cells, user_id


def _order(order) -> int:
    if order not in (1, 2):
        raise DuckmobError(f"order must be 1 or 2 (first- or second-order Markov model); got {order!r}")
    return int(order)


def truncate(offsets: np.ndarray, cells: np.ndarray, max_length: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Keep the first ``max_length`` cells of every sequence (public cap); ``None`` keeps everything."""
    return _truncated(offsets, cells, _max_length(max_length))


def _max_length(max_length) -> int | None:
    """The public cap on cells per trajectory: None (no cap) or a positive integer."""
    if max_length is None:
        return None
    return count("max_length", max_length, example="max_length := 64 (a public cap on cells per trajectory)")


def _truncated(offsets: np.ndarray, cells: np.ndarray, max_length: int | None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`truncate` with ``max_length`` checked by the caller (once per release, not once per batch)."""
    if max_length is None:
        return offsets, cells
    lengths = np.diff(offsets)
    kept = np.minimum(lengths, int(max_length))
    pos = np.arange(len(cells), dtype=np.int64) - np.repeat(offsets[:-1], lengths)
    new_offsets = np.concatenate([[0], np.cumsum(kept)]).astype(np.int64)
    return new_offsets, cells[pos < max_length]


def bound_contributions(user_id, max_trajectories_per_user: int, rng: np.random.Generator) -> np.ndarray:
    """Boolean keep mask per trajectory: at most ``max_trajectories_per_user`` (public k) per user, chosen
    uniformly at random (``rng`` from ``NoiseSource.generator()``).

    Users are ``user_id >= 0``. A trajectory without a user (NULL or negative id) is dropped (False), silently:
    user-level privacy needs to know whose each trajectory is, and refusing the whole table instead would
    release whether some id is missing. Dropping acts on each trajectory by itself, so a user still changes the
    kept set by at most k trajectories."""
    user_id = _user_ids(user_id)
    k = count("max_trajectories_per_user", max_trajectories_per_user, example="max_trajectories_per_user := 5")
    order = np.lexsort((rng.random(len(user_id)), user_id))
    sorted_users = user_id[order]
    first = np.flatnonzero(np.concatenate([[True], sorted_users[1:] != sorted_users[:-1]])) if len(order) else \
        np.zeros(0, dtype=np.int64)
    group_start = np.repeat(first, np.diff(np.concatenate([first, [len(order)]])))
    rank = np.arange(len(order)) - group_start
    keep = np.zeros(len(user_id), dtype=bool)
    keep[order[(rank < int(k)) & (sorted_users >= 0)]] = True
    return keep


def _select(offsets, cells, keep) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.diff(offsets)
    return (np.concatenate([[0], np.cumsum(lengths[keep])]).astype(np.int64),
            cells[np.repeat(keep, lengths)])


def _unit(unit: PrivacyUnit, user_id, offsets, cells, noise) -> tuple[np.ndarray, np.ndarray, int]:
    """Apply contribution bounding; return (offsets, cells, k = trajectories per privacy unit).

    ``user_id`` (one per trajectory, as :func:`_sequences` returns it) is needed with the user unit; trajectories
    without a user are dropped (:func:`bound_contributions`)."""
    if not unit.is_user:
        return offsets, cells, 1
    _needs_users(user_id)
    keep = bound_contributions(user_id, unit.max_trajectories_per_user, noise.generator())
    offsets, cells = _select(offsets, cells, keep)
    return offsets, cells, unit.max_trajectories_per_user


# -- windows ----------------------------------------------------------------------------------------------------

def windows(offsets: np.ndarray, cells: np.ndarray, n_states: int, order: int) -> tuple[np.ndarray, np.ndarray,
                                                                                          np.ndarray]:
    """The order-``order`` windows of every augmented sequence ``(S, c_1 .. c_L, E)``.

    Returns ``(index, owner, n_windows)``: the flat index of each window in the ``(n_states + 2,) * (order + 1)``
    table (C order), the trajectory it belongs to, and the number of windows of each trajectory (0 for empty
    sequences, which are skipped)."""
    k = n_states + 2
    lengths = np.diff(offsets)
    nonempty = lengths > 0
    n = len(lengths)
    aug_len = np.where(nonempty, lengths + 2, 0)
    aug_off = np.concatenate([[0], np.cumsum(aug_len)]).astype(np.int64)
    aug = np.empty(aug_off[-1], dtype=np.int64)
    starts, ends = aug_off[:-1][nonempty], aug_off[1:][nonempty] - 1
    aug[starts] = n_states
    aug[ends] = n_states + 1
    body = np.ones(len(aug), dtype=bool)
    body[starts] = False
    body[ends] = False
    aug[body] = cells
    n_windows = np.where(nonempty, lengths + 1 - (order - 1), 0).astype(np.int64)
    owner_of_pos = np.repeat(np.arange(n, dtype=np.int64), aug_len)
    # a window starts at every position that has `order` more positions in the same sequence
    pos_in_seq = np.arange(len(aug), dtype=np.int64) - np.repeat(aug_off[:-1], aug_len)
    first = np.flatnonzero(pos_in_seq < np.repeat(aug_len, aug_len) - order)
    index = aug[first]
    for j in range(1, order + 1):
        index = index * k + aug[first + j]
    return index, owner_of_pos[first], n_windows


def _summed(index: np.ndarray, weights: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct flat indices (sorted, those with a non-zero sum) and the sum of the weights on each."""
    if size <= _BINCOUNT_MAX:
        total = np.bincount(index, weights=weights, minlength=size)
        uniq = np.flatnonzero(total)
        return uniq, total[uniq]
    order = np.argsort(index, kind="stable")
    ordered = index[order]
    starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]])) if len(ordered) else \
        np.zeros(0, dtype=np.int64)
    return ordered[starts], (np.add.reduceat(weights[order], starts) if len(starts) else np.zeros(0))


def _distinct(keys: np.ndarray) -> np.ndarray:
    """Sorted distinct values (a plain sort: numpy 2's hash-based np.unique is several times slower here)."""
    keys = np.sort(keys)
    return keys[np.concatenate([[True], keys[1:] != keys[:-1]])] if len(keys) else keys


# -- the one length-normalised counting mechanism -------------------------------------------------------------

def normalised_release(index, owner, n_windows, entries, scale: float, noise: NoiseSource) -> np.ndarray:
    """THE release of length-normalised counts: every private count table of duckmob goes through here.

    Input: the windows of every trajectory (a window is whatever one trajectory adds to: a transition, a visited
    cell, a length bin), ``index`` the flat table entry of each window, ``owner`` its trajectory (windows listed
    trajectory by trajectory, ``owner`` non-decreasing) and ``n_windows[t]`` the mass divisor ``W_t`` of
    trajectory t (at least its number of windows). ``entries`` is the data-independent support: an int ``size``
    (entries ``0 .. size - 1``) or sorted distinct flat indices; windows outside it are dropped (dropping mass only
    lowers the sensitivity). ``scale`` is ``k / eps`` (k trajectories per privacy unit).

    Sensitivity, by construction: each trajectory's mass 1 is split into ``G = 1/g`` steps of the noise grid g
    (:func:`duckmob.privacy.steps.grid_steps`), ``G // W_t`` per window and one more on its first ``G % W_t``
    windows, so its entries are non-negative and sum to at most 1: adding or removing one trajectory moves the table
    by at most 1 in L1, one privacy unit by at most k. Every entry is clamped to ``[0, MAX_UNITS]`` steps
    (1-Lipschitz per coordinate), then ``Laplace(scale)`` from the vetted sampler is added to EVERY support entry,
    zero or not: eps-DP, accounted as ``accounting.laplace(k / scale)``. Sums are whole grid steps, so ``counts +
    noise`` is exact (no Mironov leak). Returns the noisy values, one per support entry, before any NormCut
    (post-processing is the caller's).
    """
    return release_sums(normalised_sums(index, owner, n_windows, entries, scale), scale, noise)


def normalised_sums(index, owner, n_windows, entries, scale: float) -> np.ndarray:
    """The exact statistics of :func:`normalised_release`, before any clamp or noise: int64 sums of whole noise-grid
    steps, one per support entry (same arguments, no noise). NEVER release these: they are exact.

    Being integers, the sums of disjoint sets of trajectories add up exactly, so a table computed in batches of
    whole trajectories (``duckmob.source``, ``duckmob.spark``) and summed equals the one computed at once, bit for
    bit; :func:`release_sums` then adds the noise once."""
    index = np.asarray(index, dtype=np.int64)
    owner = np.asarray(owner, dtype=np.int64)
    n_windows = np.asarray(n_windows, dtype=np.int64)
    steps, g = _grid_steps(owner, n_windows, scale)
    steps = steps.astype(np.float64)   # whole steps: float64 sums of them are exact below 2^53
    if isinstance(entries, (int, np.integer)):
        size = int(entries)
        sums = np.bincount(index, weights=steps, minlength=size)[:size] if len(index) else np.zeros(size)
    else:
        entries = np.asarray(entries, dtype=np.int64)
        size = len(entries)
        pos = _positions(entries, index)
        inside = pos >= 0
        sums = np.bincount(pos[inside], weights=steps[inside], minlength=size)
    return sums.astype(np.int64)


def release_sums(sums: np.ndarray, scale: float, noise: NoiseSource) -> np.ndarray:
    """The noise of :func:`normalised_release` on exact step sums (:func:`normalised_sums`, possibly added up over
    batches): clamp every entry to ``[0, MAX_UNITS]`` steps, scale by the grid step g and add ``Laplace(scale)``
    to EVERY entry. Privacy map: as :func:`normalised_release` (L1 sensitivity k of the summed table -> eps-DP with
    eps = k / scale)."""
    g = granularity(scale)
    sums = np.asarray(sums, dtype=np.int64)
    return np.minimum(sums, MAX_UNITS).astype(np.float64) * g + noise.laplace(scale, len(sums))


# -- exact counts (not for release) --------------------------------------------------------------------------

def transition_counts(offsets, cells, n_states, order=1, *, max_length: int | None = None,
                      dtype=np.float64) -> np.ndarray:
    """EXACT length-normalised transition counts (PrivTrace §4.3, App. B.2) — never release these directly.

    Shape ``(n_states + 2,) * (order + 1)``: index ``n_states`` is the virtual start, ``n_states + 1`` the end.
    ``counts[a, b] = sum_T N_T(a, b) / W_T`` with ``W_T`` the number of windows of T's augmented sequence, so
    every trajectory adds exactly 1 to ``counts.sum()`` (see the module docstring for the proof). Trajectories with
    an invalid cell are left out, as in the releases.
    """
    n_states = _n_states(n_states)
    offsets, cells, _ = _sequences(offsets, cells, n_states)
    order = _order(order)
    offsets, cells = truncate(offsets, cells, max_length)
    index, owner, n_windows = windows(offsets, cells, n_states, order)
    uniq, sums = _summed(index, 1.0 / n_windows[owner], (n_states + 2) ** (order + 1))
    out = np.zeros((n_states + 2,) * (order + 1), dtype=dtype)
    out.reshape(-1)[uniq] = sums
    return out


# -- supports -----------------------------------------------------------------------------------------------

def first_order_support(n_states: int, support=None, w: int | None = None) -> np.ndarray:
    """Boolean ``(n_states + 2, n_states + 2)`` mask of the (data-independent) first-order support.

    ``support=None`` / ``'full'``: every pair except the structurally impossible (into S, out of E, S -> E).
    ``'neighbours'``: cells of the public ``w x w`` grid (ids ``row * w + col``) at Chebyshev distance <= 1, plus
    S -> any cell and any cell -> E. A boolean array of that shape is taken as given (it must be public).
    """
    k = n_states + 2
    if isinstance(support, np.ndarray):
        if support.shape != (k, k) or support.dtype != bool:
            raise DuckmobError(f"a support mask must be a boolean array of shape ({k}, {k})")
        mask = support.copy()
    elif support in (None, "full"):
        mask = np.ones((k, k), dtype=bool)
    elif support == "neighbours":
        if w is None or int(w) != w or w < 1 or w * w != n_states:
            raise DuckmobError(f"support 'neighbours' needs the grid width w with w * w = n_states ({n_states}); "
                               f"got w = {w!r}")
        w = int(w)
        row, col = np.divmod(np.arange(n_states), w)
        mask = np.zeros((k, k), dtype=bool)
        mask[:n_states, :n_states] = ((np.abs(row[:, None] - row[None, :]) <= 1)
                                      & (np.abs(col[:, None] - col[None, :]) <= 1))
        mask[n_states, :n_states] = True
        mask[:n_states, n_states + 1] = True
    else:
        raise DuckmobError(f"support must be None, 'full', 'neighbours' or a boolean mask; got {support!r}")
    mask[:, n_states] = False      # nothing goes into the virtual start
    mask[n_states + 1, :] = False  # nothing leaves the virtual end
    mask[n_states, n_states + 1] = False  # empty sequences are not counted
    return mask


def check_dense(n_states: int, order: int) -> None:
    """Refuse, from public arguments alone, a dense table of more than :data:`MAX_DENSE` entries (``n_states`` real
    states plus the virtual start and end, to the power ``order + 1``)."""
    if (n_states + 2) ** (order + 1) > MAX_DENSE:
        raise DuckmobError(f"a dense order-{order} table over {n_states} states is too large: use fewer states, "
                           "support := 'neighbours' (with w), or markov_order := 1")


# -- noisy release --------------------------------------------------------------------------------------------

def _bounded_batches(batches, n_states, order, eps, unit: PrivacyUnit, max_length, noise, *, dense: bool = False):
    """(order, Laplace scale k / eps, n_states, iterator of (offsets, cells) per batch) after the checks, the
    truncation and contribution bounding, the batches taken in order as one table.

    ``batches()`` yields ``(offsets, cells, user_id)`` per batch (a callable: the user unit reads them twice).
    Trajectories with an invalid cell are dropped (``_sequences``), then every sequence is truncated, then the
    privacy unit's contributions are bounded over ALL batches at once: ``bound_contributions`` draws its random
    numbers over the trajectories of every batch in order, exactly as on their concatenation."""
    # the public arguments, checked once before any batch is read (the unit was checked when it was made)
    order, n_states = _order(order), _n_states(n_states)
    if dense:
        check_dense(n_states, order)
    k = unit.max_trajectories_per_user
    scale = laplace_scale(k, eps)
    max_length = _max_length(max_length)
    keep = None
    if unit.is_user:
        users = []
        for offsets, cells, user_id in batches():
            _needs_users(user_id)
            users.append(_sequences(offsets, cells, n_states, user_id)[2])
        users = np.concatenate(users) if users else np.zeros(0, np.int64)
        keep = bound_contributions(users, k, noise.generator())

    def bounded():
        start = 0
        for offsets, cells, user_id in batches():
            offsets, cells, user_id = _sequences(offsets, cells, n_states, user_id)
            offsets, cells = _truncated(offsets, cells, max_length)
            if keep is not None:
                part = keep[start:start + len(offsets) - 1]
                start += len(offsets) - 1
                offsets, cells = _select(offsets, cells, part)
            yield offsets, cells

    return order, scale, n_states, bounded()


def _one_batch(offsets, cells, user_id):
    return lambda: iter([(offsets, cells, user_id)])


def noisy_transition_counts(offsets, cells, n_states, order, eps, noise: NoiseSource, *, user_id=None,
                            unit: PrivacyUnit = PrivacyUnit(), max_length: int | None = None,
                            support=None, w: int | None = None,
                            cut: bool = True, dtype=np.float64) -> np.ndarray:
    """eps-DP length-normalised transition counts (PrivTrace §4.3 + App. B.6), NormCut-ed along the last axis.

    Privacy map: one privacy ``unit`` (a trajectory, or a user's at most ``unit.max_trajectories_per_user = k``
    kept trajectories) changes the exact table by at most k in L1; Laplace noise of scale ``k / eps`` on every entry
    of the data-independent support (``first_order_support``; second order: triples whose two steps are in it)
    makes the table eps-DP; NormCut is post-processing. Account it as ``accounting.laplace(eps)``. Trajectories
    with an invalid cell (or, for the user unit, no user id) are dropped first and every entry is clamped to
    ``MAX_UNITS`` grid steps: both keep the sensitivity (module docstring).
    Dense output of shape ``(n_states + 2,) * (order + 1)``, zero outside the support. ``cut=False`` returns the
    noisy table before NormCut (tests). ``dtype=np.float32`` halves the memory of a second-order table (602^3
    entries: 0.9 GB); the rounding to float32 is post-processing. For a restricted support over many states use
    :func:`noisy_transition_counts_sparse`; for sequences read in batches, :func:`noisy_transition_counts_batches`.
    """
    return noisy_transition_counts_batches(_one_batch(offsets, cells, user_id), n_states, order, eps, noise,
                                           unit=unit, max_length=max_length, support=support, w=w, cut=cut, dtype=dtype)


def noisy_transition_counts_batches(batches, n_states, order, eps, noise: NoiseSource, *,
                                    unit: PrivacyUnit = PrivacyUnit(), max_length: int | None = None,
                                    support=None, w: int | None = None,
                                    cut: bool = True, dtype=np.float64) -> np.ndarray:
    """:func:`noisy_transition_counts` of the sequences ``batches()`` yields as ``(offsets, cells, user_id)``, read
    in batches (out of core): the same release as on their concatenation, bit for bit. Each batch's windows are
    summed in whole noise-grid steps (exact integers) and the sums added up; the noise is drawn once."""
    order, scale, n_states, bounded = _bounded_batches(batches, n_states, order, eps, unit, max_length, noise,
                                                       dense=True)
    kk = n_states + 2
    size = kk ** (order + 1)
    parts = []
    for offsets, cells in bounded:
        index, owner, n_windows = windows(offsets, cells, n_states, order)
        steps, g = _grid_steps(owner, n_windows, scale)
        parts.append(_summed(index, steps.astype(np.float64), size))
        if len(parts) > 16:     # keep the partial sums small: re-reduce them
            parts = [_summed(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), size)]
    g = granularity(scale)   # at most 1: laplace_scale refused a larger scale before any batch was read
    uniq, sums = _summed(np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64),
                         np.concatenate([p[1] for p in parts]) if parts else np.zeros(0), size)
    sup1 = first_order_support(n_states, support, w)
    np.minimum(sums, MAX_UNITS, out=sums)  # public clamp: keeps sums * g + noise exact
    out = np.zeros((kk,) * (order + 1), dtype=dtype)
    flat = out.reshape(-1)
    if order == 1:
        slabs, slab_mask = 1, lambda a0, a1: sup1[None]
    else:
        inner = sup1 & (np.arange(kk) < n_states)[:, None]  # the middle state of a triple is a real cell
        slabs = kk
        slab_mask = lambda a0, a1: sup1[a0:a1, :, None] & inner[None]  # noqa: E731
    per_slab = kk * kk  # order 1: the whole table is one slab; order 2: one slab per first state
    step = max(1, _BLOCK // per_slab)
    for a0 in range(0, slabs, step):
        a1 = min(slabs, a0 + step)
        lo, hi = a0 * per_slab, a1 * per_slab
        block = np.zeros(hi - lo, dtype=np.float64)
        i0, i1 = np.searchsorted(uniq, [lo, hi])
        block[uniq[i0:i1] - lo] = sums[i0:i1] * g  # exact multiples of g
        mask = slab_mask(a0, a1).reshape(-1)
        block[mask] += noise.laplace(scale, int(mask.sum()))  # exact: both terms on the g/2 grid
        block[~mask] = 0.0  # outside the support nothing is released (transitions there are dropped)
        flat[lo:hi] = block
    return normcut(out, axis=-1, inplace=True) if cut else out


def support_entries(n_states: int, order: int, support=None, w: int | None = None) -> np.ndarray:
    """Sorted flat indices (C order in the ``(n_states + 2,) * (order + 1)`` table) of the support entries."""
    order = _order(order)
    sup1 = first_order_support(n_states, support, w)
    kk = n_states + 2
    if order == 1:
        return np.flatnonzero(sup1)
    a, b = np.nonzero(sup1 & (np.arange(kk) < n_states)[None, :])  # (a, b) pairs whose b is a real cell
    if len(a) * kk > MAX_DENSE * 4:
        raise DuckmobError("the second-order support is too large to list; restrict it (support := 'neighbours')")
    succ_off = np.concatenate([[0], np.cumsum(sup1.sum(axis=1))]).astype(np.int64)
    succ = np.nonzero(sup1)[1]
    deg = np.diff(succ_off)[b]
    starts = np.repeat(succ_off[b], deg)
    c = succ[starts + np.arange(deg.sum()) - np.repeat(np.cumsum(deg) - deg, deg)]
    return np.sort((np.repeat(a, deg) * kk + np.repeat(b, deg)) * kk + c)


def noisy_transition_counts_sparse(offsets, cells, n_states, order, eps, noise: NoiseSource, *, user_id=None,
                                   unit: PrivacyUnit = PrivacyUnit(), max_length: int | None = None,
                                   support="neighbours", w: int | None = None,
                                   cut: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The same release as :func:`noisy_transition_counts` (same privacy map), listed over the support only.

    Returns ``(states, counts)``: int64 ``(n, order + 1)`` state tuples of every support entry (sorted) and their
    noisy, NormCut-ed (per context row) float64 counts. Meant for restricted supports (``'neighbours'``): a
    second-order neighbour support on a 32 x 32 grid has ~100 k entries instead of 1026^3.
    """
    return noisy_transition_counts_sparse_batches(_one_batch(offsets, cells, user_id), n_states, order, eps, noise,
                                                  unit=unit, max_length=max_length, support=support, w=w, cut=cut)


def noisy_transition_counts_sparse_batches(batches, n_states, order, eps, noise: NoiseSource, *,
                                          unit: PrivacyUnit = PrivacyUnit(), max_length: int | None = None,
                                          support="neighbours", w: int | None = None,
                                          cut: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """:func:`noisy_transition_counts_sparse` of sequences read in batches (as
    :func:`noisy_transition_counts_batches`): exact integer sums per batch, added up, noised once."""
    order, scale, n_states, bounded = _bounded_batches(batches, n_states, order, eps, unit, max_length, noise)
    kk = n_states + 2
    entries = support_entries(n_states, order, support, w)
    sums = np.zeros(len(entries), dtype=np.int64)
    for offsets, cells in bounded:
        index, owner, n_windows = windows(offsets, cells, n_states, order)
        sums += normalised_sums(index, owner, n_windows, entries, scale)
    values = release_sums(sums, scale, noise)
    if cut and len(entries):
        context = entries // kk
        first = np.concatenate([[0], np.flatnonzero(context[1:] != context[:-1]) + 1])
        row_len = np.diff(np.append(first, len(entries)))
        row = np.repeat(np.arange(len(first)), row_len)
        col = np.arange(len(entries)) - first[row]
        padded = np.zeros((len(first), int(row_len.max())))
        padded[row, col] = values
        values = normcut(padded, axis=-1)[row, col]
    states = np.stack(np.unravel_index(entries, (kk,) * (order + 1)), axis=1).astype(np.int64)
    return states, values


def count_shares(eps_count: float, k: int) -> list[float]:
    """Epsilons of the noisy counts of :func:`noisy_unit_counts`: the trajectory count (k = 1), or (trajectories,
    users) for users of at most k trajectories, both at Laplace scale (k + 1) / eps_count:
    eps_count k/(k+1) + eps_count/(k+1) = eps_count."""
    return [eps_count] if k == 1 else [eps_count * k / (k + 1), eps_count / (k + 1)]


def count_events(eps_count: float, max_trajectories_per_user: int) -> list:
    """The accounting events of the noisy counts :func:`noisy_unit_counts` releases (split by :func:`count_shares`)."""
    return [accounting.laplace(e) for e in count_shares(eps_count, max_trajectories_per_user)]


def noisy_unit_counts(user_id, eps_count: float, noise: NoiseSource, k: int = 1) -> tuple[float, float | None]:
    """The noisy number of trajectories, and with k > 1 of users: ``(n_noisy, users_noisy or None)``, spending
    ``eps_count`` in all (split by :func:`count_shares`).

    Privacy map: one trajectory changes the trajectory count by 1 (eps-DP at scale 1 / eps_count); one user of at
    most k trajectories changes (trajectories, users) by at most (k, 1), so each count at sensitivity (k, 1) and
    its share of eps_count makes the pair eps_count-DP. ``user_id`` has one entry per trajectory; users must
    already be bounded to k trajectories (the release core does it: a user with more is a programming error)."""
    user_id = np.asarray(user_id)
    n = len(user_id)
    if k == 1:
        return noisy_count(n, eps_count, noise), None
    users, per_user = np.unique(user_id, return_counts=True)
    if len(per_user) and per_user.max() > k:
        raise DuckmobError("a user has more trajectories than the contribution bound: bound contributions first "
                           "(privacy_unit := 'user' does it)")
    eps_traj, eps_users = count_shares(eps_count, k)
    return noisy_count(n, eps_traj, noise, sensitivity=k), noisy_count(len(users), eps_users, noise)


def count_record(eps: float, sensitivity: int = 1) -> dict:
    """What a model keeps of the noisy trajectory count it was sized by (public: the count's eps, its sensitivity
    and its Laplace scale), so that a sample can tell when that count is mostly noise (post-processing)."""
    return {"count_eps": float(eps), "count_k": int(sensitivity), "count_scale": float(sensitivity) / float(eps)}


def noisy_count(n_items: int, eps: float, noise: NoiseSource, sensitivity: int = 1) -> float:
    """An eps-DP count: ``n_items + Laplace(sensitivity / eps)`` on the noise grid (float, may be negative).

    Privacy map: one privacy unit changes the count by at most ``sensitivity`` (1 per trajectory; k for a user
    with at most k trajectories) -> eps-DP, accounted as ``accounting.laplace(eps)``. Integers lie on the grid
    (its step g is a power of two <= 1). The count is first clamped to the public ``C = MAX_UNITS g`` (2^31 for
    a noise scale of 1; clamping is 1-Lipschitz, so the sensitivity is unchanged), which keeps the sum exact
    whatever the data: no count refuses.
    """
    if isinstance(sensitivity, bool) or int(sensitivity) != sensitivity or sensitivity < 1:
        raise DuckmobError(f"sensitivity must be a positive integer; got {sensitivity!r}")
    scale = laplace_scale(sensitivity, eps)
    if isinstance(n_items, bool) or int(n_items) != n_items or n_items < 0:
        # a count is never negative: this is the caller's bug, and the message quotes nothing from the data
        raise DuckmobError("n_items must be a non-negative integer count")
    g = granularity(scale)
    clamped = min(int(n_items), math.floor(MAX_UNITS * g))
    return float(clamped + noise.laplace(scale, 1)[0])


# -- HRNet's coarse-to-fine transition matrix ------------------------------------------------------------------

def _region_pairs(offsets, cells, w: int, level) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """HRNet's distinct (region, cell) pairs per trajectory of sequences already checked (:func:`_sequences`) on
    the ``w`` x ``w`` grid (w checked by the caller: ``quadtree_depth``)."""
    n_cells = w * w
    lengths = np.diff(offsets)
    owner = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    starts = np.arange(max(len(cells) - 1, 0), dtype=np.int64)
    starts = starts[owner[starts] == owner[starts + 1]]  # a transition stays inside one trajectory
    regions = 4 ** int(level)
    key = parent(cells[starts], w, level) * n_cells + cells[starts + 1]
    # HRNet's indicator: a (region, cell) pair counts once per trajectory, however often it occurs
    distinct = _distinct(owner[starts] * (regions * n_cells) + key)
    traj, pair = np.divmod(distinct, regions * n_cells)
    n_transitions = np.maximum(lengths - 1, 0)
    return traj, pair, n_transitions, regions * n_cells


def region_transition_counts(offsets, cells, w: int, level: int) -> np.ndarray:
    """EXACT HRNet TRAN_level (§4.1 eq. 3): shape ``(4^level, w*w)``; never release directly.

    ``TRAN[r, l] = sum_v 1[v moves from a cell inside region r (the 2^level x 2^level grid) to cell l] / W_v``
    with ``W_v`` the number of transitions of v: each trajectory adds at most 1 in L1. Trajectories with an
    invalid cell are left out, as in the release.
    """
    w = 1 << quadtree_depth(w)
    offsets, cells, _ = _sequences(offsets, cells, w * w)
    traj, pair, n_transitions, size = _region_pairs(offsets, cells, w, level)
    out = np.bincount(pair, weights=1.0 / np.maximum(n_transitions[traj], 1), minlength=size)
    return out.reshape(4 ** int(level), w * w)


def noisy_region_transition_counts(offsets, cells, w: int, level: int, eps: float, noise: NoiseSource, *,
                                   user_id=None, unit: PrivacyUnit = PrivacyUnit()) -> np.ndarray:
    """HRNet's DPTRAN (§4.1 eq. 4): TRAN + Laplace(k / eps) on every one of the ``4^level * w^2`` entries.

    Privacy map: eps-DP for the privacy unit (one trajectory changes TRAN by <= 1 in L1, a user by <= k),
    accounted as ``accounting.laplace(eps)``. Not NormCut-ed (HRNet normalises rows itself); entries are exact
    multiples of the noise grid (clamped to ``MAX_UNITS`` steps) plus grid noise. Trajectories with an invalid
    cell, or without a user id under the user unit, are dropped first (module docstring).
    """
    w = 1 << quadtree_depth(w)
    scale = laplace_scale(unit.max_trajectories_per_user, eps)
    offsets, cells, user_id = _sequences(offsets, cells, w * w, user_id)
    offsets, cells, _ = _unit(unit, user_id, offsets, cells, noise)
    traj, pair, n_transitions, size = _region_pairs(offsets, cells, w, level)
    # a trajectory's distinct pairs are at most its W_v transitions: mass <= 1 each (see normalised_release)
    return normalised_release(pair, traj, n_transitions, size, scale, noise).reshape(4 ** int(level), w * w)


__all__ = ["normalised_release", "normalised_sums", "release_sums", "transition_counts", "noisy_transition_counts",
           "noisy_transition_counts_sparse", "support_entries", "noisy_transition_counts_batches",
           "noisy_transition_counts_sparse_batches", "noisy_count", "bound_contributions", "truncate", "windows",
           "first_order_support", "region_transition_counts", "noisy_region_transition_counts",
           "MAX_UNITS", "check_dense", "count_shares", "count_events", "noisy_unit_counts", "count_record"]
