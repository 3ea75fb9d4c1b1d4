"""What each table contributes to the evaluation, as sums over its trajectories: the evaluation in bounded memory.

Every default metric (the families of :data:`duckmob.metrics.common.FAMILIES`) is computed in two steps: each batch
of whole trajectories is reduced to a :class:`Summary` (``summary(side, plan, parts)`` of each family module), the
summaries of a table are added up (:meth:`Summary.add`), and the family compares two summaries (``compare``). A
part of a summary is one of:

* a NumPy array of counts on a public grid or query set (cells, start x end cells, query hits): added;
* :class:`KeyCounts`, counts of sparse integer keys (cell patterns, (start cell, cell) pairs): added key by key,
  held as sorted distinct keys, so it grows with the keys the data has, never with its rows;
* :class:`Column`, one number per trajectory (lengths, diameters, start cells...): concatenated, a few bytes a
  trajectory, put in the in-memory order (traj_id, user_id) by :meth:`Summary.ordered`;
* :class:`Points`, one number per point (consecutive-step lengths, whose histogram bins reach the real table's
  largest step, known only at the end): concatenated, and written to a temporary file once they pass
  :data:`SPILL_VALUES` values, read back in chunks.

Counts are integers and a trajectory's numbers come from its own points alone, so a table summarised in batches
gives the same summary as the table at once, whatever the batches (tests/metrics/test_metrics_stream.py). A float
sum over trajectories (PateGail's I-rank shares) is kept as its per-trajectory terms and summed at the end in the
in-memory order, so it is bit for bit the same too.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field

import numpy as np

from duckmob.metrics.common import Options, Side, are, bbox_sides_m, lookup, rng, top_patterns
from duckmob.metrics.queries import circle_cells, circle_queries, random_cell_sets

SPILL_VALUES = 1 << 22   # per-point values held in memory before they go to a temporary file (32 MB of float64)
READ_VALUES = 1 << 22    # values read back at a time


@dataclass
class KeyCounts:
    """Counts of integer keys: ``keys`` sorted and distinct, ``counts`` int64 beside them."""

    keys: np.ndarray
    counts: np.ndarray

    @classmethod
    def of(cls, keys, counts=None) -> "KeyCounts":
        """Counts of ``keys`` (each once, or with ``counts``), in any order and with repeats."""
        keys = np.asarray(keys, dtype=np.int64)
        counts = np.ones(len(keys), np.int64) if counts is None else np.asarray(counts, dtype=np.int64)
        if len(keys) == 0:
            return cls(keys, counts)
        order = np.argsort(keys, kind="stable")
        keys, counts = keys[order], counts[order]
        first = np.concatenate([[True], keys[1:] != keys[:-1]])
        return cls(keys[first], np.add.reduceat(counts, np.flatnonzero(first)))

    def add(self, other: "KeyCounts") -> "KeyCounts":
        return KeyCounts.of(np.concatenate([self.keys, other.keys]), np.concatenate([self.counts, other.counts]))


@dataclass
class Column:
    """One value per trajectory, in chunks (one per batch) until :meth:`values`."""

    chunks: list = field(default_factory=list)

    def add(self, other: "Column") -> "Column":
        return Column(self.chunks + other.chunks)

    def values(self) -> np.ndarray:
        if len(self.chunks) != 1:
            self.chunks = [np.concatenate(self.chunks) if self.chunks else np.zeros(0)]
        return self.chunks[0]


class Points:
    """One float64 value per point: held in memory up to :data:`SPILL_VALUES` values, then appended to a temporary
    file (deleted with the object); :meth:`chunks` reads them back a part at a time, :attr:`max` is kept as they
    come."""

    def __init__(self, values=None):
        self.held = [] if values is None else [np.asarray(values, dtype=np.float64)]
        self.n_held = sum(len(v) for v in self.held)
        self.max = max((float(v.max()) for v in self.held if len(v)), default=None)
        self.file = None

    def add(self, other: "Points") -> "Points":
        for values in other.held:
            self.held.append(values)
            self.n_held += len(values)
            if len(values):
                self.max = float(values.max()) if self.max is None else max(self.max, float(values.max()))
        if other.file is not None:
            for values in other.chunks():
                self.add(Points(values))
        if self.n_held > SPILL_VALUES:
            if self.file is None:
                self.file = tempfile.TemporaryFile(prefix="duckmob-eval-")
            for values in self.held:
                values.tofile(self.file)
            self.held, self.n_held = [], 0
        return self

    def copy(self) -> "Points":
        """Another accumulator holding the same values (the arrays are shared, never written to)."""
        other = Points()
        other.held, other.n_held, other.max = list(self.held), self.n_held, self.max
        if self.file is not None:
            other.add(self)
        return other

    def chunks(self):
        if self.file is not None:
            self.file.flush()
            self.file.seek(0)
            while True:
                values = np.fromfile(self.file, dtype=np.float64, count=READ_VALUES)
                if not len(values):
                    break
                yield values
            self.file.seek(0, os.SEEK_END)
        yield from self.held


@dataclass
class Summary:
    """One table's contribution (or a batch's): ``n`` trajectories, ``n_points`` points, whether every trajectory
    has timestamps, and the parts the families asked for (see the module docstring)."""

    n: int
    n_points: int
    has_time: bool
    parts: dict
    name: str = ""
    bbox: object = None

    def add(self, other: "Summary") -> "Summary":
        parts = dict(self.parts)
        for key, value in other.parts.items():
            mine = parts.get(key)
            parts[key] = value if mine is None else mine.add(value) if hasattr(mine, "add") else mine + value
        return Summary(self.n + other.n, self.n_points + other.n_points, self.has_time and other.has_time, parts,
                       self.name or other.name, self.bbox or other.bbox)

    def copy(self) -> "Summary":
        """A summary to add to without changing this one (its :class:`Points` copied; the other parts are replaced,
        never changed, by :meth:`add`)."""
        parts = {k: v.copy() if isinstance(v, Points) else v for k, v in self.parts.items()}
        return Summary(self.n, self.n_points, self.has_time, parts, self.name, self.bbox)

    def ordered(self) -> "Summary":
        """The same summary with every :class:`Column` in the in-memory order of the trajectories, by (traj_id,
        user_id) (what samples drawn over the trajectories' indices depend on)."""
        order = np.lexsort((self.parts["user_id"].values(), self.parts["traj_id"].values()))
        parts = {k: Column([v.values()[order]]) if isinstance(v, Column) else v for k, v in self.parts.items()}
        return Summary(self.n, self.n_points, self.has_time, parts, self.name, self.bbox)

    def column(self, key: str) -> np.ndarray:
        return self.parts[key].values()


@dataclass(frozen=True)
class Plan:
    """What the evaluation decides before reading a row: the options, the public bbox, and the random queries
    (from the evaluation's generator, never privacy noise): each family draws from a fresh ``rng(seed)``, so a
    family's queries do not depend on which others run and the anchors use the very queries the value does."""

    opts: Options
    bbox: object
    hrnet_sets: np.ndarray | None = None
    privtrace_inside: np.ndarray | None = None   # cells of the query_w grid inside each circle (circle_cells)
    adatrace_inside: np.ndarray | None = None

    @classmethod
    def of(cls, opts: Options, bbox) -> "Plan":
        fam = set(opts.families)
        w = opts.w
        longer = max(bbox_sides_m(bbox))
        lo, hi = opts.radius_range
        return cls(
            opts, bbox,
            random_cell_sets(w * w, opts.n_queries, opts.max_set_fraction, rng(opts.seed)) if "hrnet" in fam
            else None,
            circle_cells(bbox, opts.query_w, circle_queries(bbox, opts.n_queries, (lo * longer, hi * longer),
                                                            rng(opts.seed))) if "privtrace" in fam else None,
            circle_cells(bbox, opts.query_w, circle_queries(bbox, opts.adatrace_queries,
                                                            opts.adatrace_radius * longer, rng(opts.seed)))
            if "adatrace" in fam else None)


def summarise(side: Side, plan: Plan, families) -> Summary:
    """The summary of ``side`` (a batch of whole trajectories, or a whole table) for ``families`` (their modules:
    :func:`duckmob.metrics.stream.family_module`)."""
    t = side.traj
    parts = {"traj_id": Column([np.asarray(t.traj_id, np.int64)]), "user_id": Column([np.asarray(t.user_id, np.int64)])}
    for module in families:
        module.summary(side, plan, parts)
    return Summary(side.n, int(t.offsets[-1]), side.has_time, parts, side.name, side.bbox)


def shared_counts(real: Summary | np.ndarray, synth, key: str | None, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`duckmob.metrics.common.shared_histograms` of two summaries' :class:`Column` or :class:`Points` part
    ``key``: ``bins`` equal bins on [0, the largest real value], synthetic values beyond it in the last bin."""
    from duckmob.metrics.common import shared_histograms

    a, b = real.parts[key], synth.parts[key]
    if isinstance(a, Column):
        return shared_histograms(a.values(), b.values(), bins)
    upper = a.max if a.max is not None and a.max > 0 else 1.0
    out = []
    for part in (a, b):
        total = np.zeros(bins)
        for values in part.chunks():
            total += np.bincount(np.clip(np.floor(values / upper * bins), 0, bins - 1).astype(np.int64),
                                 minlength=bins)
        out.append(total)
    return out[0], out[1]


def keyed_are(real: KeyCounts, synth: KeyCounts, top: int, scale: float, phi: float) -> tuple[float, int]:
    """:func:`duckmob.metrics.common.pattern_are` from two tables' pattern counts: ARE of the ``top`` most frequent
    real patterns, synthetic counts times ``scale`` (value, number of patterns compared); NaN without any."""
    best = top_patterns(real.keys, real.counts, top)
    if len(best) == 0:
        return float("nan"), 0
    return are(real.counts[best], scale * lookup(synth.keys, synth.counts, real.keys[best]), phi), len(best)


__all__ = ["keyed_are", "KeyCounts", "Column", "Points", "Summary", "Plan", "summarise", "shared_counts", "SPILL_VALUES"]
