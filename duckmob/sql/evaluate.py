"""SQL layer for the evaluation: hidden UDFs behind the table macros in evaluate.sql.

Every macro calls one UDF here with each table's points and one request STRUCT (:class:`duckmob.sql.udf.Request`),
which returns rows as LIST(STRUCT). mob_evaluate's many options travel inside it as one JSON object (NULL = the
default). mob_evaluate and mob_plot_density read a table out of core when a cursor of the caller's connection can
read it (a committed table or view: ``_mob_readable``, folded when the statement is planned, so its rows are never
gathered), one batch of whole trajectories at a time (:func:`duckmob.metrics.evaluate_relations`): memory bounded
by the grids, not the tables. A temporary table's points arrive gathered through ``mob_points`` into one
LIST(STRUCT), as every other macro here gets its tables.
"""

from __future__ import annotations

import json

import pyarrow as pa

from duckmob.sql.udf import POINTS_TYPE, Request, Udf, one_row, points, resolving

METRIC_ROW = ("STRUCT(exact_not_private BOOLEAN, metric VARCHAR, value DOUBLE, reference DOUBLE, baseline DOUBLE, "
              "lower_is_better BOOLEAN, source VARCHAR, description VARCHAR)[]")

# Each UDF's request (the STRUCT its macro in evaluate.sql builds), parsed into keyword arguments.
# Where each table is read (mob_evaluate, mob_plot_density): its name, the caller's database and schema, and
# whether a cursor reads it out of core (else its points come gathered).
_TABLES = dict(real="VARCHAR", synth="VARCHAR", database="VARCHAR", schema="VARCHAR", real_out_of_core="BOOLEAN",
               synth_out_of_core="BOOLEAN")
EVALUATE = Request(bbox="DOUBLE[]", options="VARCHAR", **_TABLES)
PLOT_DENSITY = Request(bbox="DOUBLE[]", path="VARCHAR", w="BIGINT", roads="VARCHAR", **_TABLES)
ROADS_TYPE = "STRUCT(lat1 DOUBLE, lon1 DOUBLE, lat2 DOUBLE, lon2 DOUBLE)[]"
PLOT_DISTRIBUTIONS = Request(bbox="DOUBLE[]", path="VARCHAR", bins="BIGINT")
MODE_TRIPS = Request(modes="VARCHAR")
AUDIT = Request(bbox="DOUBLE[]", w="BIGINT", k="BIGINT", seed="BIGINT")
DOWNSTREAM = Request(bbox="DOUBLE[]", task="VARCHAR", w="BIGINT", modes="VARCHAR", seed="BIGINT")


def setup(con) -> None:
    """Nothing to create: these macros name no table."""


def _options(text) -> dict:
    return {k: v for k, v in json.loads(text).items() if v is not None} if text else {}


def _rows(rows: list[dict]) -> pa.ListArray:
    from duckmob.metrics import to_table

    return one_row(to_table(rows))


def _evaluate(con):
    def run(real, synth, request):
        from duckmob.metrics import evaluate, evaluate_relations

        r = EVALUATE.parse(request, "_mob_evaluate")
        options = _options(r["options"])
        if not (r["real_out_of_core"] or r["synth_out_of_core"]):
            return _rows(evaluate(points(real), points(synth), r["bbox"], **options))
        with _cursor(con, r) as cur:
            selects = [_select(cur, r, name, gathered) for name, gathered in (("real", real), ("synth", synth))]
            return _rows(evaluate_relations(cur, *selects, r["bbox"], **options))

    return run


def _cursor(con, r: dict):
    """A cursor of ``con`` that resolves names as the caller does (its database and schema)."""
    return resolving(con.cursor(), r["database"], r["schema"])


def _select(cur, r: dict, name: str, gathered) -> str:
    """The SELECT of the contract's columns of table ``r[name]`` on ``cur`` (:func:`duckmob.metrics.stream.
    relation_select`), or of its gathered points (a temporary table), registered on ``cur``."""
    from duckmob.metrics.stream import relation_select

    if not r[f"{name}_out_of_core"]:
        view = f"_mob_gathered_{name}"
        cur.register(view, pa.Table.from_struct_array(points(gathered)))
        return f"SELECT * FROM {view}"
    return relation_select(cur, r[name])


def _sides(real, synth, bbox):
    from duckmob.metrics import load_side

    return load_side(points(real), bbox, "real")[0], load_side(points(synth), bbox, "synth")[0]


def _path_row(path: str) -> pa.ListArray:
    return one_row(pa.table({"path": pa.array([path], pa.string())}))


def _plot_density(con):
    def run(real, synth, segments, request):
        from duckmob.errors import DuckmobError
        from duckmob.metrics.plots import density_png
        from duckmob.grid import check_width
        from duckmob.roads import Roads

        r = PLOT_DENSITY.parse(request, "_mob_plot_density")
        w = check_width(r["w"])
        roads = None
        if r["roads"] is not None:   # a public table: its own values may be quoted in an error
            found = points(segments)   # an empty or NULL list: no segment
            if not len(found):
                raise DuckmobError(f"mob_plot_density: roads := '{r['roads']}' has no segment; give a roads table "
                                   "(e.g. FROM mob_sf_roads()) or leave roads out")
            roads = Roads.of(pa.Table.from_struct_array(found), name=f"roads := '{r['roads']}'")
        if not (r["real_out_of_core"] or r["synth_out_of_core"]):
            return _path_row(density_png(*_sides(real, synth, r["bbox"]), r["path"], w, roads))
        with _cursor(con, r) as cur:
            sides = [_passes(cur, _select(cur, r, name, gathered), r["bbox"], w, name)
                     for name, gathered in (("real", real), ("synth", synth))]
            return _path_row(density_png(*sides, r["path"], w, roads))

    return run


def _passes(cur, select: str, bbox, w: int, name: str):
    """The route passes of a table read out of core (:func:`duckmob.metrics.plots.passes`)."""
    from duckmob.errors import DuckmobError
    from duckmob.metrics.plots import passes
    from duckmob.metrics.stream import read_table

    got = passes(read_table(cur, select, bbox).batches, bbox, w)
    if got.n == 0:
        raise DuckmobError(f"the {name} table has no trajectory inside the bbox: check the bbox and the table")
    return got


def _plot_distributions(real, synth, request):
    from duckmob import validators
    from duckmob.metrics.plots import distributions_png

    r = PLOT_DISTRIBUTIONS.parse(request, "_mob_plot_distributions")
    return _path_row(distributions_png(*_sides(real, synth, r["bbox"]), r["path"], validators.count("bins", r["bins"])))


def _mode_trips(con):
    def run(real, request):
        import numpy as np

        from duckmob.metrics import load_side
        from duckmob.metrics.downstream import labelled_trips
        from duckmob.trajectories import to_arrow

        side = load_side(points(real), [-90, -180, 90, 180], "real")[0]
        trips, labels = labelled_trips(side, _read_modes(con, MODE_TRIPS.parse(request, "_mob_mode_trips")["modes"]))
        out = to_arrow(trips)
        return one_row(out.append_column("mode", pa.array(np.repeat(labels, trips.lengths), pa.string())))

    return run


def _audit(members, non_members, synth, request):
    from duckmob.metrics import load_side
    from duckmob.metrics.audit import audit
    from duckmob.grid import check_width

    r = AUDIT.parse(request, "_mob_audit")
    sides = [load_side(points(p), r["bbox"], name)[0]
             for p, name in ((members, "members"), (non_members, "non_members"), (synth, "synth"))]
    seed = r["seed"]
    rows = audit(*sides, w=check_width(r["w"]), k=r["k"], seed=None if seed is None else int(seed))
    return _rows([r.as_dict() for r in rows])


def _read_modes(con, source: str) -> pa.Table:
    """Mode labels from a Parquet file or a (non-temporary) table name."""
    import os

    import pyarrow.parquet as pq

    from duckmob.errors import DuckmobError

    if os.path.isfile(os.path.expanduser(source)):
        return pq.read_table(os.path.expanduser(source))
    try:
        return con.cursor().sql(f"SELECT user_id, start, \"end\", mode FROM {source}").to_arrow_table()
    except Exception:
        raise DuckmobError(f"cannot read mode labels from {source!r}: give a Parquet file path or a table "
                           "(not a TEMP table) with user_id, start, end, mode") from None


def _downstream(con):
    def run(real, synth, synth_modes, request):
        import numpy as np

        from duckmob.errors import DuckmobError
        from duckmob.metrics.downstream import downstream
        from duckmob.grid import check_width

        r = DOWNSTREAM.parse(request, "_mob_downstream")
        real_side, synth_side = _sides(real, synth, r["bbox"])
        task, seed, source = r["task"], r["seed"], r["modes"]
        labels = None
        if task == "mode":
            pairs = points(synth_modes)
            ids = pairs.field("traj_id").to_numpy(zero_copy_only=False)
            names = np.asarray(pairs.field("mode").to_pylist(), dtype=object)
            order = np.argsort(ids, kind="stable")
            pos = np.clip(np.searchsorted(ids[order], synth_side.traj.traj_id), 0, max(len(ids) - 1, 0))
            labels = names[order][pos] if len(ids) else np.array([None] * synth_side.n, dtype=object)
            if len(ids) == 0 or any(v is None for v in labels):
                raise DuckmobError("task := 'mode' needs a mode column in the synthetic table with a mode for "
                                   "every trajectory (synthesize each mode's trips separately, then stack them)")
            labels = labels.astype(str)
        rows = downstream(real_side, synth_side, task, w=check_width(r["w"]),
                          seed=None if seed is None else int(seed), synth_modes=labels,
                          modes=_read_modes(con, source) if (task == "mode" and source) else None)
        return _rows([r.as_dict() for r in rows])

    return run


def udfs(con) -> list[Udf]:
    two = [POINTS_TYPE, POINTS_TYPE]
    return [
        Udf("_mob_evaluate", _evaluate(con), two, METRIC_ROW, EVALUATE, special_nulls=True),
        Udf("_mob_downstream", _downstream(con), two + ["STRUCT(traj_id BIGINT, mode VARCHAR)[]"], METRIC_ROW,
            DOWNSTREAM, special_nulls=True),
        Udf("_mob_mode_trips", _mode_trips(con), [POINTS_TYPE],
            "STRUCT(traj_id BIGINT, user_id BIGINT, seq BIGINT, ts TIMESTAMP, lat DOUBLE, lon DOUBLE, mode VARCHAR)[]",
            MODE_TRIPS, special_nulls=True),
        Udf("_mob_audit", _audit, two + [POINTS_TYPE], METRIC_ROW, AUDIT, special_nulls=True),
        Udf("_mob_plot_density", _plot_density(con), two + [ROADS_TYPE], "STRUCT(path VARCHAR)[]", PLOT_DENSITY,
            side_effects=True, special_nulls=True),
        Udf("_mob_plot_distributions", _plot_distributions, two, "STRUCT(path VARCHAR)[]", PLOT_DISTRIBUTIONS,
            side_effects=True, special_nulls=True),
    ]
