"""SQL layer for the evaluation: hidden UDFs behind the table macros in evaluate.sql.

Every macro gathers each table's points through ``mob_points`` into one LIST(STRUCT) and calls one UDF here,
which returns rows as LIST(STRUCT). Options travel as one JSON object (NULL = the default).
"""

from __future__ import annotations

import json

import pyarrow as pa

from duckmob.sql import POINTS_TYPE, Udf, one_row, points, scalar

METRIC_ROW = ("STRUCT(metric VARCHAR, value DOUBLE, reference DOUBLE, lower_is_better BOOLEAN, source VARCHAR, "
              "description VARCHAR)[]")


def _options(arg) -> dict:
    text = scalar(arg)
    return {k: v for k, v in json.loads(text).items() if v is not None} if text else {}


def _rows(rows: list[dict]) -> pa.ListArray:
    from duckmob.evaluate import to_table

    return one_row(to_table(rows))


def _evaluate(real, synth, bbox, options):
    from duckmob.evaluate import evaluate

    return _rows(evaluate(points(real), points(synth), scalar(bbox), **_options(options)))


def _sides(real, synth, bbox):
    from duckmob.evaluate import load_side

    bbox = scalar(bbox)
    return load_side(points(real), bbox, "real")[0], load_side(points(synth), bbox, "synth")[0]


def _path_row(path: str) -> pa.ListArray:
    return one_row(pa.table({"path": pa.array([path], pa.string())}))


def _plot_density(real, synth, bbox, path, w):
    from duckmob.evaluate.plots import density_png
    from duckmob.grid import check_width

    return _path_row(density_png(*_sides(real, synth, bbox), scalar(path), check_width(scalar(w))))


def _plot_distributions(real, synth, bbox, path, bins):
    from duckmob.evaluate.plots import distributions_png

    return _path_row(distributions_png(*_sides(real, synth, bbox), scalar(path), int(scalar(bins))))


def _mode_trips(con):
    def run(real, modes):
        import numpy as np

        from duckmob.evaluate import load_side
        from duckmob.evaluate.downstream import labelled_trips
        from duckmob.trajectories import to_arrow

        side = load_side(points(real), [-90, -180, 90, 180], "real")[0]
        trips, labels = labelled_trips(side, _read_modes(con, scalar(modes)))
        out = to_arrow(trips)
        return one_row(out.append_column("mode", pa.array(np.repeat(labels, trips.lengths), pa.string())))

    return run


def _audit(members, non_members, synth, bbox, w, k, seed):
    from duckmob.evaluate import load_side
    from duckmob.evaluate.audit import audit
    from duckmob.grid import check_width

    bbox = scalar(bbox)
    sides = [load_side(points(p), bbox, name)[0]
             for p, name in ((members, "members"), (non_members, "non_members"), (synth, "synth"))]
    seed = scalar(seed)
    rows = audit(*sides, w=check_width(scalar(w)), k=scalar(k), seed=None if seed is None else int(seed))
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
    def run(real, synth, synth_modes, bbox, task, w, modes, seed):
        import numpy as np

        from duckmob.errors import DuckmobError
        from duckmob.evaluate.downstream import downstream
        from duckmob.grid import check_width

        real_side, synth_side = _sides(real, synth, bbox)
        task, seed, source = scalar(task), scalar(seed), scalar(modes)
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
        rows = downstream(real_side, synth_side, task, w=check_width(scalar(w)),
                          seed=None if seed is None else int(seed), synth_modes=labels,
                          modes=_read_modes(con, source) if (task == "mode" and source) else None)
        return _rows([r.as_dict() for r in rows])

    return run


def udfs(con) -> list[Udf]:
    return [
        Udf("_mob_evaluate", _evaluate, [POINTS_TYPE, POINTS_TYPE, "DOUBLE[]", "VARCHAR"], METRIC_ROW,
            special_nulls=True),
        Udf("_mob_downstream", _downstream(con),
            [POINTS_TYPE, POINTS_TYPE, "STRUCT(traj_id BIGINT, mode VARCHAR)[]", "DOUBLE[]", "VARCHAR", "BIGINT",
             "VARCHAR", "BIGINT"], METRIC_ROW, special_nulls=True),
        Udf("_mob_mode_trips", _mode_trips(con), [POINTS_TYPE, "VARCHAR"],
            "STRUCT(traj_id BIGINT, user_id BIGINT, seq BIGINT, ts TIMESTAMP, lat DOUBLE, lon DOUBLE, mode VARCHAR)[]",
            special_nulls=True),
        Udf("_mob_audit", _audit, [POINTS_TYPE, POINTS_TYPE, POINTS_TYPE, "DOUBLE[]", "BIGINT", "BIGINT", "BIGINT"],
            METRIC_ROW, special_nulls=True),
        Udf("_mob_plot_density", _plot_density, [POINTS_TYPE, POINTS_TYPE, "DOUBLE[]", "VARCHAR", "BIGINT"],
            "STRUCT(path VARCHAR)[]", side_effects=True, special_nulls=True),
        Udf("_mob_plot_distributions", _plot_distributions,
            [POINTS_TYPE, POINTS_TYPE, "DOUBLE[]", "VARCHAR", "BIGINT"], "STRUCT(path VARCHAR)[]",
            side_effects=True, special_nulls=True),
    ]
