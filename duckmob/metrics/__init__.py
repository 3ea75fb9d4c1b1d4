"""Evaluation of a synthetic trajectory table against the real one: one function per metric, with its formula.

``evaluate(real, synth, bbox, **options)`` returns one row per metric: ``metric``, ``value``, ``reference``,
``lower_is_better``, ``source`` (paper and section), ``description`` (one line: what was measured, units).
``reference`` is the same metric between two halves of the real table, split by a fixed hash of the trajectory
key (user_id, traj_id) (:func:`duckmob.metrics.common.reference_half`; half 0 in the real table's place, half 1
in the synthetic one's): how far apart two samples of the real data are, the scale to read ``value`` against.
It costs one more comparison, not another pass over the table: the real table's sums are its two halves' added
up, so each trajectory is summarised once (``reference=False`` skips it; the column is then NULL).

``baseline`` is the second anchor, an absolute one: the same metric between real half 0 and a naive table, half
1's trajectories (at most 1,000, chosen by a hash of their key: :func:`duckmob.metrics.common.baseline_rows`) as
straight trips between uniformly random places in the bbox
(:func:`duckmob.metrics.common.baseline_side`): what a synthesizer that learnt nothing about places would score.
A ``value`` reads between the two: ``(value - reference) / (baseline - reference)`` is 0 as close as real data,
1 no better than the naive table (the report's verdicts, :mod:`duckmob.report.compare`). It costs a third
comparison, whose real half is the reference's and whose naive table is bounded (``baseline=False`` skips it).

Families (``families=[...]``): ``hrnet`` (hrnet.py), ``privtrace`` (privtrace.py), ``pategail``
(pategail.py), ``lestyan`` (lestyan.py), ``adatrace`` (adatrace.py), ``fine`` (fine.py: fine-grid point,
trajectory and route density, consecutive-step lengths, one-point trajectories, points per trajectory); the
papers' reference-code definitions, only when named: ``pategail_paper``, ``hrnet_paper``, ``privtrace_paper``,
``cleanslate_paper`` (paper/, docs/metrics_papers.md); shared
helpers live in common.py, downstream tasks in downstream.py, privacy attacks in audit.py, pictures in plots.py.

NOT differentially private: every number here reads the real table exactly, the reference included. The
evaluation is for the data owner, to judge a synthetic table before releasing it; publishing these figures
publishes facts about the real data outside any privacy budget.

Every default family is computed from sums over trajectories (:mod:`duckmob.metrics.summary`): each batch of whole
trajectories is reduced to grid-sized counts, sparse pattern counts and a few numbers per trajectory, and the
families compare the two tables' sums (:mod:`duckmob.metrics.stream`). :func:`evaluate` takes the tables in
memory as one batch; :func:`evaluate_relations` (mob_evaluate over committed tables and views, and
``duckmob.evaluate``) reads them out of core, in memory bounded by the grids, with the same rows, bit for bit. Lestyan's EMD compares at most ``emd_sample`` trips a
side and the naive baseline at most 1,000 trajectories: bounded, seeded samples whatever the tables' size.

Both tables are loaded with :func:`duckmob.trajectories.from_points` (``outside='drop'``,
``time_required=False``: a synthetic table whose ``ts`` is all NULL is accepted and its time-based metrics
are NULL with the reason in the description; ``min_points=1``: nothing else is dropped). Informational rows
``real_trajectories`` and ``synth_trajectories`` say how many trajectories were compared and what cleaning did
(their reference: how many trajectories are in real half 0 and real half 1).
"""

from __future__ import annotations

import time
from dataclasses import replace

import pyarrow as pa

from duckmob.errors import DuckmobError
from duckmob.metrics.common import (FAMILIES, PAPER_FAMILIES, Metric, Options, Side, baseline_side, reference_sides,
                                     rng)
from duckmob.grid import BBox
from duckmob.metrics.stream import family_module, fold, rows as stream_rows
from duckmob.metrics.summary import Plan
from duckmob.source.schema import literal
from duckmob.trajectories import Trajectories, from_points

# The first column of every exact (NOT differentially private) result table: mob_evaluate, mob_audit,
# mob_downstream, duckmob.evaluate; mob_check has the same column (docs/sql.md, "Exact results").
NOT_PRIVATE_FIELD = pa.field("exact_not_private", pa.bool_())
RESULT_SCHEMA = pa.schema([("metric", pa.string()), ("value", pa.float64()), ("reference", pa.float64()),
                           ("baseline", pa.float64()), ("lower_is_better", pa.bool_()), ("source", pa.string()),
                           ("description", pa.string())])
TABLE_SCHEMA = pa.schema([NOT_PRIVATE_FIELD, *RESULT_SCHEMA])


def load_side(points, bbox, name: str) -> tuple[Side, Metric]:
    """A :class:`Side` from Arrow points (or ready :class:`Trajectories`), plus its informational row."""
    box = BBox.of(bbox)
    if isinstance(points, Side):
        return points, _info(name, points.n, "given ready")
    if isinstance(points, Trajectories):
        inside = box.contains(points.lat, points.lon)
        traj = points if inside.all() else points.take_points(inside)
        notes = f"dropped {int((~inside).sum())} points outside the bounding box" if not inside.all() else \
            "nothing dropped"
    else:
        points = _without_empty_seq(points)
        try:
            traj, report = from_points(points, bbox=box, outside="drop", min_points=1, time_required=False)
        except DuckmobError as exc:
            raise DuckmobError(f"{name} table: {exc}") from None
        notes = "; ".join(report.messages()) or "nothing dropped"
    if traj.n_trajectories == 0:
        raise DuckmobError(f"the {name} table has no trajectory inside the bbox: check the bbox and the table")
    return Side(traj, box, name), _info(name, traj.n_trajectories, notes)


def _without_empty_seq(points):
    """Drop a ``seq`` column that is entirely NULL (mob_points always supplies one): points are then kept in
    table order rather than ordered by a column of NULLs."""
    names = points.type.names if isinstance(points, pa.StructArray) else points.column_names
    if "seq" not in names:
        return points
    col = points.field("seq") if isinstance(points, pa.StructArray) else points.column("seq")
    if col.null_count < len(col):
        return points
    keep = [n for n in names if n != "seq"]
    if isinstance(points, pa.StructArray):
        return pa.StructArray.from_arrays([points.field(n) for n in keep], names=keep)
    return points.select(keep)


def _info(name: str, n: int, notes: str) -> Metric:
    return Metric(f"{name}_trajectories", float(n), None, "duckmob", f"{name} trajectories compared ({notes})")


def evaluate(real, synth, bbox, timings: dict | None = None, **options) -> list[dict]:
    """Compare ``synth`` with ``real``: a list of row dicts (metric, value, reference, baseline, lower_is_better,
    source, description).

    ``real`` and ``synth`` are Arrow tables / struct arrays of points (traj_id, ts, lat, lon, optional user_id,
    seq) or :class:`Trajectories`. ``bbox`` is the public ``[min_lat, min_lon, max_lat, max_lon]``; points
    outside it are dropped on both sides. Options: see :class:`duckmob.metrics.common.Options` (``families``,
    ``w``, ``bins``, ``n_queries``, ``seed``, ``reference``, ``baseline``, ...). ``timings``, if given, receives
    seconds per stage (``load``; ``real``: the real table's summaries, its halves' included; ``synth``; ``compare``:
    every family's rows and anchors; ``papers``: the papers' definitions, when asked for).
    A value is None where a metric is undefined (e.g. time-based metrics without timestamps); a reference or
    baseline is None where it is undefined between its tables, or with ``reference=False`` / ``baseline=False``.
    NOT differentially private, the anchors no more than the value: for the data owner only (see the module
    docstring). The tables out of core, in bounded memory: :func:`evaluate_relations`.
    """
    opts = Options.of(**options)
    t0 = time.perf_counter()
    real_side, real_info = load_side(real, bbox, "real")
    synth_side, synth_info = load_side(synth, bbox, "synth")
    if timings is not None:
        timings["load"] = time.perf_counter() - t0
    out = _rows(opts, real_side.bbox, [real_side], [synth_side], [real_info, synth_info], timings)
    return [r.as_dict() for r in out + _paper_rows(real_side, synth_side, opts, timings)]


def _rows(opts: Options, bbox, real_batches, synth_batches, info, timings: dict | None,
          real_info=None, synth_info=None) -> list[Metric]:
    """The default families' rows over batches of the two tables (:mod:`duckmob.metrics.stream`); ``info`` are
    the informational rows, or ``real_info()`` / ``synth_info()`` make them after each table is read."""
    plan = Plan.of(opts, BBox.of(bbox))
    anchors = opts.reference or opts.baseline
    t = time.perf_counter()
    real = fold(real_batches, plan, "real", anchors, opts.baseline)
    t1 = time.perf_counter()
    synth = fold(synth_batches, plan, "synth").table
    t2 = time.perf_counter()
    if real_info is not None:
        info = [real_info(real.table.n), synth_info(synth.n)]
    out = stream_rows(real, synth, plan, info)
    if timings is not None:
        timings.update(real=t1 - t, synth=t2 - t1, compare=time.perf_counter() - t2)
    return out


def evaluate_relations(cur, real: str, synth: str, bbox, bucket_points: int | None = None,
                       **options) -> list[dict]:
    """:func:`evaluate` of two relations read out of core on the DuckDB cursor ``cur`` (``real`` and ``synth``:
    SELECTs of the contract's columns, :func:`duckmob.source.schema.select_sql`), one batch of whole trajectories
    at a time (about ``bucket_points`` points; :func:`duckmob.metrics.stream.read_table`): memory bounded by the
    grids, the batches and a few numbers per trajectory, not by the tables (docs/scale.md, "Evaluation in bounded
    memory"). The same rows as :func:`evaluate` of the tables in memory. The papers' definitions
    (``families=['..._paper']``) need whole tables: asking for one reads both tables into memory."""
    from duckmob.metrics.stream import BUCKET_POINTS, read_table

    opts = Options.of(**options)
    if set(opts.families) & set(PAPER_FAMILIES):
        return evaluate(cur.sql(real).to_arrow_table(), cur.sql(synth).to_arrow_table(), bbox, **options)
    size = bucket_points or BUCKET_POINTS
    reads = [read_table(cur, select, bbox, size) for select in (real, synth)]

    def info(name, read):
        return lambda n: _info(name, n, "; ".join(read.report.messages()) or "nothing dropped")

    out = _rows(opts, bbox, reads[0].batches, reads[1].batches, None, None, info("real", reads[0]),
                info("synth", reads[1]))
    return [r.as_dict() for r in out]


def _paper_rows(real: Side, synth: Side, opts: Options, timings: dict | None) -> list[Metric]:
    """The papers' definitions asked for by name, on whole tables, with their anchors as the options ask."""
    papers = [f for f in PAPER_FAMILIES if f in opts.families]
    if not papers:
        return []
    t = time.perf_counter()
    out = _family_rows(real, synth, opts, papers)
    if opts.reference or opts.baseline:
        out = _with_anchors(out, real, opts, papers)
    if timings is not None:
        timings["papers"] = time.perf_counter() - t
    return out


def _family_rows(real: Side, synth: Side, opts: Options, families) -> list[Metric]:
    rows = []
    for family in families:
        # One generator per family, seeded alike: a family's queries do not depend on which others run, and the
        # reference is measured on the very queries the value is.
        rows.extend(family_module(family).metrics(real, synth, opts, rng(opts.seed)))
    return rows


def _with_anchors(rows: list[Metric], real: Side, opts: Options, families) -> list[Metric]:
    """``rows`` with their ``reference`` (the same metrics, real half 0 against half 1) and ``baseline`` (half 0
    against :func:`baseline_side` of half 1), as ``opts`` asks. A real table with a half empty (one trajectory) has
    neither."""
    half0, half1 = reference_sides(real)
    if half0.n == 0 or half1.n == 0:
        return rows
    anchors = {}
    for name, wanted, other in (("reference", opts.reference, lambda: half1),
                                ("baseline", opts.baseline, lambda: baseline_side(half1, opts.seed))):
        if wanted:
            anchors[name] = {m.metric: m.value for m in _family_rows(half0, other(), opts, families)}
    return [replace(r, **{name: got.get(r.metric) for name, got in anchors.items()}) for r in rows]


def to_table(rows: list[dict]) -> pa.Table:
    """The rows of :func:`evaluate` (or of the audit and downstream tasks) as a pyarrow Table with
    :data:`TABLE_SCHEMA`: first the constant column ``exact_not_private`` (true on every row), so that every row,
    in any order or filtered, says that it reads the real table exactly and is not private."""
    table = pa.Table.from_pylist(rows, schema=RESULT_SCHEMA)
    return table.add_column(0, NOT_PRIVATE_FIELD, pa.array([True] * table.num_rows, pa.bool_()))


def table_points(con, name: str) -> pa.Table:
    """The points of table/view ``name`` on ``con`` through the ``mob_points`` contract (column checks); ``con`` is a
    connection duckmob registered (``duckmob.connect()`` or ``duckmob.register(con)``)."""
    return con.sql(f"SELECT * FROM mob_points({literal(name)})").to_arrow_table()


__all__ = ["evaluate", "evaluate_relations", "family_module", "table_points", "to_table", "load_side", "Options", "Metric", "Side", "FAMILIES",
           "RESULT_SCHEMA", "TABLE_SCHEMA", "NOT_PRIVATE_FIELD"]
