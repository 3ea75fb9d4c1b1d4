"""The evaluation over batches of whole trajectories: memory bounded by the grids and the batch, not the tables.

:func:`fold` reduces a table's batches (in memory: one batch; out of core: :func:`read_table`) to
:class:`~duckmob.metrics.summary.Summary` objects: the table's, and for the real table those of its two reference
halves (:func:`duckmob.metrics.common.reference_half`, a function of each trajectory's key, so a batch splits
as the table does) and the candidates of the naive baseline table (:func:`duckmob.metrics.common.baseline_rows`:
at most 1,000 trajectories of half 1, chosen by a hash of their key, so the batch's best are a superset of the
table's). :func:`rows` compares the summaries family by family. The same rows whether the tables came in one
batch or many (tests/metrics/test_metrics_stream.py).

Out of core (:func:`read_table`), DuckDB reads the relation once in record batches and routes its points to
``hash(traj_id)`` buckets of about :data:`BUCKET_POINTS` points (Arrow IPC files in a temporary folder, removed
after, as the releases' input path does: :func:`duckmob.source.table.route`); each bucket is cleaned as the
in-memory path cleans the whole table (``from_points``, ``outside='drop'``, ``min_points=1``,
``time_required=False``: each trajectory by itself), and the points outside the bbox or with an invalid coordinate
are dropped by the scan and counted there, for the informational rows.

NOT differentially private, like every evaluation: it reads both tables exactly (see :mod:`duckmob.metrics`).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from dataclasses import dataclass, fields, replace
from importlib import import_module
from typing import Iterable, Iterator

import numpy as np

from duckmob.errors import DuckmobError
from duckmob.grid import BBox
from duckmob.metrics.common import FAMILIES, PAPER_FAMILIES, Metric, Side, baseline_rows, baseline_side, reference_half, rng
from duckmob.metrics.summary import Plan, Summary, summarise
from duckmob.source.batches import concat, in_order, in_threads
from duckmob.trajectories import CleaningReport, Trajectories, from_points

BUCKET_POINTS = 1 << 19   # points per batch read out of core (about 0.3-0.5 KB a point at the peak of a batch)


@dataclass
class Folded:
    """A table reduced for the evaluation: its summary, its reference halves' (real table only; None where a
    half is empty) and the naive baseline's candidates (half 1's trajectories that may be among the chosen)."""

    table: Summary | None = None
    halves: tuple = (None, None)
    candidates: Trajectories | None = None


def _fold_batch(batch: Trajectories | Side, plan: Plan, families, name: str, anchors: bool,
                baseline: bool) -> Folded:
    batch = trajectories(batch)
    side = batch if isinstance(batch, Side) else Side(batch, plan.bbox, name)   # a Side: its caches are reused
    traj = side.traj
    if not anchors:
        return Folded(summarise(side, plan, families))
    # Every part of a summary is a sum over trajectories, so the batch's is its two halves' added up: each
    # trajectory is summarised once.
    half = reference_half(traj.user_id, traj.traj_id)
    rows = [np.flatnonzero(half == 0), np.flatnonzero(half == 1)]
    halves = tuple(summarise(Side(traj.take(r), plan.bbox, f"real half {h}"), plan, families) if len(r) else None
                   for h, r in enumerate(rows))
    table = _add(halves[0].copy() if halves[0] is not None else None, halves[1])
    table = replace(table, name=side.name, has_time=side.has_time)
    out = Folded(table, halves)
    if baseline:
        out.candidates = _best(traj.take(rows[1]), plan.opts.seed)
    return out


def _best(traj: Trajectories, seed) -> Trajectories:
    return traj.take(baseline_rows(traj.user_id, traj.traj_id, seed))


def family_module(name: str):
    """The module of a metric family (duckmob/metrics/<name>.py, or paper/<name>.py for the papers' definitions)."""
    if name in PAPER_FAMILIES:
        return import_module(f"duckmob.metrics.paper.{name.removesuffix('_paper')}")
    return import_module(f"duckmob.metrics.{name}")


def _modules(plan: Plan) -> list:
    return [family_module(f) for f in FAMILIES if f in plan.opts.families]


def _add(a: Summary | None, b: Summary | None) -> Summary | None:
    return b if a is None else a if b is None else a.add(b)


def fold(batches: Iterable[Trajectories | Side], plan: Plan, name: str, anchors: bool = False,
         baseline: bool = False) -> Folded:
    """The summaries of the trajectories of ``batches`` (each holding whole trajectories), two batches at a time on
    threads; with ``anchors`` also the reference halves', with ``baseline`` the naive table's candidates."""
    families = _modules(plan)
    total = Folded()
    for part in in_threads(lambda t: _fold_batch(t, plan, families, name, anchors, baseline), batches):
        total.table = _add(total.table, part.table)
        total.halves = tuple(_add(a, b) for a, b in zip(total.halves, part.halves))
        if part.candidates is not None:
            both = part.candidates if total.candidates is None else concat([total.candidates, part.candidates])
            total.candidates = _best(both, plan.opts.seed)
    if total.table is None:
        raise DuckmobError(f"the {name} table has no trajectory inside the bbox: check the bbox and the table")
    return total


def rows(real: Folded, synth: Summary, plan: Plan, info: list[Metric]) -> list[Metric]:
    """The rows of every default family asked for (and ``info``, the informational rows), real against
    synthetic, with their ``reference`` (half 0 against half 1) and ``baseline`` (half 0 against the naive
    table) as the options ask; neither when a half is empty."""
    opts = plan.opts
    out = info + _compare(real.table, synth, plan)
    half0, half1 = real.halves
    if not (opts.reference or opts.baseline) or half0 is None or half1 is None:
        return out
    anchors = {}
    if opts.reference:
        anchors["reference"] = _anchor(half0, half1, plan)
    if opts.baseline and real.candidates is not None:
        naive = baseline_side(Side(in_order(real.candidates), plan.bbox, "real half 1"), opts.seed)
        anchors["baseline"] = _anchor(half0, summarise(naive, plan, _modules(plan)), plan)
    return [replace(r, **{k: got.get(r.metric) for k, got in anchors.items()}) for r in out]


def _anchor(half0: Summary, other: Summary, plan: Plan) -> dict:
    return {"real_trajectories": float(half0.n), "synth_trajectories": float(other.n),
            **{m.metric: m.value for m in _compare(half0, other, plan)}}


def _compare(real: Summary, synth: Summary, plan: Plan) -> list[Metric]:
    real, synth = real.ordered(), synth.ordered()
    out = []
    for family in FAMILIES:
        if family in plan.opts.families:
            # One generator per family, seeded alike, as the plan's queries: a family's rows do not depend on
            # which others run.
            out.extend(family_module(family).compare(real, synth, plan.opts, rng(plan.opts.seed)))
    return out


# -- out of core ---------------------------------------------------------------------------------------------------

@dataclass
class Read:
    """The buckets of one relation read out of core (:func:`read_table`; :func:`trajectories` cleans one), and
    after they are cleaned, what the cleaning did (``report``, summed over the buckets, with the scan's counts of
    dropped points)."""

    batches: Iterator["Raw"]
    report: CleaningReport


def relation_select(cur, relation: str) -> str:
    """The SELECT of the contract's columns (traj_id, user_id, ts, lat, lon, seq; a missing optional one NULL, every
    value TRY_CAST) of ``relation`` on ``cur``, its column types checked first as ``mob_points`` checks them (the
    schema only: no row is read)."""
    from duckmob.source.schema import Mapping, check_points, resolve_columns, select_sql

    described = cur.execute(f"DESCRIBE SELECT * FROM {relation}").fetchall()
    names = resolve_columns([d[0] for d in described], Mapping(),
                            what=("traj_id", "user_id", "ts", "lat", "lon", "seq"))
    by_name = {d[0]: str(d[1]) for d in described}
    check_points({col: (by_name[src] if src is not None else None) for col, src in names.items()}, Mapping())
    return select_sql(relation, names)


def read_table(cur, select: str, bbox, bucket_points: int = BUCKET_POINTS) -> Read:
    """Whole trajectories of ``select`` (the contract's columns: :func:`duckmob.source.schema.select_sql`), read
    on ``cur`` out of core and cleaned as :func:`duckmob.metrics.load_side` cleans a table in memory. The points
    with a NULL, NaN or out-of-range coordinate and those outside the public ``bbox`` are dropped by the scan (and
    counted, exactly: NOT private); a ``seq`` column that is entirely NULL is not read (as in memory)."""
    box = BBox.of(bbox)
    report = CleaningReport(min_points=1)
    return Read(_batches(cur, select, box, bucket_points, report), report)


def _batches(cur, select: str, box: BBox, bucket_points: int, report: CleaningReport) -> Iterator["Raw"]:
    """:func:`read_table`'s buckets (:class:`Raw`, cleaned by whoever takes them), read when iterated (so two
    tables read on one cursor never overlap); the report is complete once every bucket is cleaned."""
    from duckmob.source.table import READ_ROWS, n_buckets, route

    valid = "lat BETWEEN -90 AND 90 AND lon BETWEEN -180 AND 180"
    inside = (f"lat BETWEEN '{float(box.min_lat)!r}'::DOUBLE AND '{float(box.max_lat)!r}'::DOUBLE AND "
              f"lon BETWEEN '{float(box.min_lon)!r}'::DOUBLE AND '{float(box.max_lon)!r}'::DOUBLE")
    n_rows, n_seq, invalid, outside = cur.sql(
        f"SELECT count(*), count(seq), count(*) FILTER (WHERE NOT coalesce({valid}, false)), "
        f"count(*) FILTER (WHERE coalesce({valid}, false) AND NOT coalesce({inside}, false)) "
        f"FROM ({select})").fetchall()[0]
    report.points_in, report.invalid_coordinates, report.outside_bbox = int(n_rows), int(invalid), int(outside)
    n = n_buckets(int(n_rows) - int(invalid) - int(outside), bucket_points)
    seq = ", seq" if n_seq else ""
    reader = cur.sql(f"SELECT traj_id, user_id, ts, lat, lon{seq}, (hash(traj_id) % {n})::BIGINT AS _bucket "
                     f"FROM ({select}) WHERE {inside}").to_arrow_reader(batch_size=READ_ROWS)
    folder = tempfile.mkdtemp(prefix="duckmob-eval-") if n > 1 else None
    lock = threading.Lock()
    try:
        for table in route(reader, n, folder):
            if table.num_rows:
                yield Raw(table, box, report, lock)
                del table
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


@dataclass
class Raw:
    """A bucket of points as read, cleaned by :meth:`trajectories` on the thread that summarises it (the cleaning
    sorts and gathers in NumPy, which releases the GIL, so it runs beside the next bucket's read); what the
    cleaning did is added to ``report`` under ``lock``."""

    table: object
    box: BBox
    report: CleaningReport
    lock: object

    def trajectories(self) -> Trajectories:
        traj, got = from_points(self.table, bbox=self.box, outside="drop", min_points=1, time_required=False)
        self.table = None
        with self.lock:
            _merge(self.report, got)
        return traj


def trajectories(batch) -> Trajectories | Side:
    """A batch as :func:`fold` and :func:`duckmob.metrics.plots.passes` take it: a :class:`Raw` bucket cleaned."""
    return batch.trajectories() if isinstance(batch, Raw) else batch


def _merge(total: CleaningReport, part: CleaningReport) -> None:
    for f in fields(CleaningReport):
        if f.name not in ("points_in", "min_points", "notes", "invalid_coordinates", "outside_bbox"):
            setattr(total, f.name, getattr(total, f.name) + getattr(part, f.name))
    total.notes.extend(n for n in part.notes if n not in total.notes)


__all__ = ["family_module", "Folded", "fold", "rows", "Read", "Raw", "trajectories", "relation_select", "read_table", "BUCKET_POINTS"]
