"""SQL layer for synthesis: ``synthesize``, ``mob_fit``, ``mob_sample``, ``mob_models`` (macros in synth.sql).

Only decoding and encoding: arguments arrive as constant columns and are handed to the release core
(:mod:`duckmob.release`), which validates them, reserves the budget, reads the points, fits and records; rows go
back as one LIST(STRUCT). Sampling a stored model reads no data and spends nothing.

Parameters shared by every method (one fixed list, since TEMP macros need one): ``eps``, ``delta`` (NULL: the
method's default, 0 for PrivTrace), ``method``, ``bbox`` (required, public), ``n`` (NULL: the model's noisy
trajectory count), ``seed`` (NULL: OS entropy; a seed makes noise and sampling reproducible and is recorded as
"seeded, not for release"), ``privacy_unit`` ('trajectory' or 'user'), ``max_trajectories_per_user`` (k,
required for 'user': a random subset of at most k trajectories per user is kept and every sensitivity is
multiplied by k), ``params`` (method-specific hyper-parameters as a JSON string '{"K": 8}' or a STRUCT/MAP
{'K': 8}), ``outside`` ('drop': points outside the bbox are dropped; a private release cannot refuse because
of them) and the column mapping (``traj_col``, ``ts_col``, ``lat_col``, ``lon_col``, ``user_col``) of mob_points.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from duckmob import release, stream, synth, validators
from duckmob.errors import DuckmobError
from duckmob.privacy.noise import NoiseSource
from duckmob.sql import Udf, one_row, scalar
from duckmob.sql.privacy import unshadowed
from duckmob.synth import store
from duckmob.trajectories import NO_TIME, Trajectories

ROWS_TYPE = "STRUCT(traj_id BIGINT, seq BIGINT, lat DOUBLE, lon DOUBLE, ts TIMESTAMP)[]"
FIT_TYPE = "STRUCT(name VARCHAR, method VARCHAR, source VARCHAR, eps DOUBLE, delta DOUBLE, params VARCHAR)[]"


def rows(traj: Trajectories) -> pa.Table:
    """The synthetic table: traj_id, seq, lat, lon, ts (NULL where the method models no time)."""
    lengths = traj.lengths
    seq = np.arange(traj.n_points, dtype=np.int64) - np.repeat(traj.offsets[:-1], lengths)
    ts = pa.array(traj.ts, pa.int64(), mask=traj.ts == NO_TIME).cast(pa.timestamp("us"))
    return pa.table({"traj_id": np.repeat(np.asarray(traj.traj_id, dtype=np.int64), lengths), "seq": seq,
                     "lat": traj.lat, "lon": traj.lon, "ts": ts})


def _values(arg) -> pa.Array | None:
    """The values of a one-row LIST argument (None when the list itself is NULL)."""
    if isinstance(arg, pa.ChunkedArray):
        arg = arg.combine_chunks() if arg.num_chunks != 1 else arg.chunk(0)
    if arg.null_count == len(arg):
        return None
    values = arg.values if len(arg) == 1 else arg.flatten()
    if values.null_count == 0 and values.buffers()[0] is not None and len(values.buffers()) == 2:
        # drop an all-valid validity bitmap (zero copy): with it, numpy conversions downstream copy
        values = pa.Array.from_buffers(values.type, len(values), [None, values.buffers()[1]], 0, values.offset)
    return values


def _lazy_points(traj, user, ts, lat, lon, seq):
    """The points from the column lists the macros pass (aligned lists, one per column), as an Arrow table.

    One primitive list per column costs DuckDB about half the memory of one list of structs (measured at
    15M points: +1.4 GB against +2.6 GB). ``user`` is NULL unless the privacy unit is a user; ``seq`` holds
    only the rows without a timestamp (all of them for a table without time, else none).
    """
    def load():
        traj_v = _values(traj)
        if traj_v is None:   # an empty table: a valid input of a release (nothing is refused on the data)
            return pa.table({"traj_id": pa.array([], pa.int64()), "ts": pa.array([], pa.timestamp("us")),
                             "lat": pa.array([], pa.float64()), "lon": pa.array([], pa.float64())})
        cols = {"traj_id": traj_v, "ts": _values(ts), "lat": _values(lat), "lon": _values(lon)}
        user_v = _values(user)
        if user_v is not None:
            cols["user_id"] = user_v
        seq_v = _values(seq)
        if seq_v is not None and len(seq_v) == len(traj_v):
            cols["seq"] = seq_v
        return _in_order(cols)
    return load


def _in_order(cols: dict) -> pa.Table:
    """The columns as a table sorted by (traj_id, ts): DuckDB's list() gathers rows in thread order.

    Sorting here, one column at a time, keeps the peak lower than letting the cleaning step reorder every
    column at once (15M points: about 0.5 GB less). Rows without time are left as they are.
    """
    ts = cols["ts"]
    if ts is None or ts.null_count:
        return pa.table({k: v for k, v in cols.items() if v is not None})
    traj = cols["traj_id"].to_numpy(zero_copy_only=False)
    t = ts.cast(pa.int64()).to_numpy(zero_copy_only=False)
    in_order = (traj[1:] > traj[:-1]) | ((traj[1:] == traj[:-1]) & (t[1:] >= t[:-1]))
    if in_order.all():
        return pa.table(cols)
    del in_order
    order = np.lexsort((t, traj))
    del traj, t
    out = {}
    for name, col in cols.items():
        if col.null_count:
            out[name] = col.take(pa.array(order))
        else:
            out[name] = pa.array(np.take(col.to_numpy(zero_copy_only=False), order), type=col.type)
    return pa.table(out)


def _summary(name, method, source, eps, delta, model) -> pa.Table:
    return pa.table({"name": [name], "method": [method], "source": [source], "eps": [float(eps)],
                     "delta": [float(delta)], "params": [store.to_json(model.describe())]})


def _request(source, eps, delta, method, bbox, unit, k, params, outside, seed, name=None, n=None):
    """The release core's validated fit request from the UDF's arguments (constant columns of one row)."""
    return release.fit_request(source=scalar(source), eps=scalar(eps), delta=scalar(delta), method=scalar(method),
                               bbox=scalar(bbox), privacy_unit=scalar(unit), max_trajectories_per_user=scalar(k),
                               params=scalar(params), outside=scalar(outside), seed=scalar(seed),
                               name=None if name is None else scalar(name), n=None if n is None else scalar(n))


def udfs(db) -> list[Udf]:
    def _fit(traj, user, ts, lat, lon, seq, source, name, eps, delta, method, bbox, unit, k, params, outside,
             seed):
        if scalar(name) is None:
            raise DuckmobError("a model needs a name: FROM mob_fit('trips', 'my_model', eps := 1.0, ...)")
        r = _request(source, eps, delta, method, bbox, unit, k, params, outside, seed, name=name)
        model, _, _ = release.fit(db, r, _lazy_points(traj, user, ts, lat, lon, seq))
        return one_row(_summary(r.name, r.method, r.source, r.eps, r.delta, model))

    def _sample(name, n, seed):
        name = validators.model_name(scalar(name))
        n, seed = validators.n_trajectories(scalar(n)), validators.seed(scalar(seed))
        _method, model = release.read_ledger(db, lambda cur: store.load(cur, name))
        return one_row(rows(release.sample(model, n, NoiseSource(seed).generator())))

    def _synthesize(traj, user, ts, lat, lon, seq, source, eps, delta, method, bbox, unit, k, params, outside,
                    n, seed):
        r = _request(source, eps, delta, method, bbox, unit, k, params, outside, seed, n=n)
        model, _, noise = release.fit(db, r, _lazy_points(traj, user, ts, lat, lon, seq))
        return one_row(rows(release.sample(model, r.n, noise.generator())))

    def _source(source, traj_col, ts_col, lat_col, lon_col, user_col, shadowed, unit):
        """The source read out of core on a cursor of the core's connection (it sees committed tables and views,
        not the caller's temp tables or CTEs: the macros send those through the in-memory path)."""
        name = unshadowed(source, shadowed)   # schema, not data: said before anything is reserved
        mapping = _mapping(*(scalar(c) for c in (traj_col, ts_col, lat_col, lon_col, user_col)))
        query = points_query(name, mapping, validators.privacy_unit(scalar(unit), 1)[0])
        from duckmob.sql import register

        def load():
            return stream.Source(register(db.cursor()), query, owned=True)
        return load

    def _fit_source(source, traj_col, ts_col, lat_col, lon_col, user_col, shadowed, name, eps, delta, method, bbox,
                    unit, k, params, outside, seed):
        if scalar(name) is None:
            raise DuckmobError("a model needs a name: FROM mob_fit('trips', 'my_model', eps := 1.0, ...)")
        r = _request(source, eps, delta, method, bbox, unit, k, params, outside, seed, name=name)
        load = _source(source, traj_col, ts_col, lat_col, lon_col, user_col, shadowed, unit)
        model, _, _ = release.fit(db, r, load)
        return one_row(_summary(r.name, r.method, r.source, r.eps, r.delta, model))

    def _synthesize_source(source, traj_col, ts_col, lat_col, lon_col, user_col, shadowed, eps, delta, method, bbox,
                           unit, k, params, outside, n, seed):
        r = _request(source, eps, delta, method, bbox, unit, k, params, outside, seed, n=n)
        load = _source(source, traj_col, ts_col, lat_col, lon_col, user_col, shadowed, unit)
        model, _, noise = release.fit(db, r, load)
        return one_row(rows(release.sample(model, r.n, noise.generator())))

    def _out_of_core(source):
        """True when the core's own cursor can read ``source`` (a committed table or view, or a query over them):
        folded once when the statement is planned, so the other branch of the macro is never scanned."""
        name = scalar(source)
        if not isinstance(name, str):
            return pa.array([False])
        try:
            with db.connection() as cur:
                cur.execute(f"SELECT * FROM {name} LIMIT 0")
        except Exception:   # temp tables, CTEs, anything else: the in-memory path (which reports what is wrong)
            return pa.array([False])
        return pa.array([True])

    common = ["DOUBLE", "DOUBLE", "VARCHAR", "DOUBLE[]", "VARCHAR", "BIGINT", "VARCHAR", "VARCHAR"]
    mapping = ["VARCHAR"] * 6 + ["BOOLEAN"]
    columns = ["BIGINT[]", "BIGINT[]", "TIMESTAMP[]", "DOUBLE[]", "DOUBLE[]", "BIGINT[]"]
    return [
        Udf("_mob_fit", _fit, columns + ["VARCHAR", "VARCHAR"] + common + ["BIGINT"], FIT_TYPE,
            side_effects=True, special_nulls=True),
        Udf("_mob_sample", _sample, ["VARCHAR", "BIGINT", "BIGINT"], ROWS_TYPE, side_effects=True,
            special_nulls=True),
        Udf("_mob_synthesize", _synthesize, columns + ["VARCHAR"] + common + ["BIGINT", "BIGINT"], ROWS_TYPE,
            side_effects=True, special_nulls=True),
        Udf("_mob_fit_source", _fit_source, mapping + ["VARCHAR"] + common + ["BIGINT"], FIT_TYPE,
            side_effects=True, special_nulls=True),
        Udf("_mob_synthesize_source", _synthesize_source, mapping + common + ["BIGINT", "BIGINT"], ROWS_TYPE,
            side_effects=True, special_nulls=True),
        Udf("_mob_out_of_core", _out_of_core, ["VARCHAR"], "BOOLEAN", special_nulls=True),
    ]


def setup(con) -> None:
    """Create the models table (a TEMP one when the database is read-only, so the macros still bind)."""
    try:
        store.ensure_table(con)
    except Exception:  # read-only database: mob_models() shows nothing, mob_fit cannot store
        con.execute(store._DDL.replace("CREATE TABLE", "CREATE TEMP TABLE"))


def _literal(text: str) -> str:
    return "'" + str(text).replace("'", "''") + "'"


def _mapping(traj_col, ts_col, lat_col, lon_col, user_col) -> str:
    """mob_points' column mapping as SQL named arguments."""
    return ", ".join(f"{k} := {_literal(v)}" for k, v in (("traj_col", traj_col), ("ts_col", ts_col),
                                                          ("lat_col", lat_col), ("lon_col", lon_col),
                                                          ("user_col", user_col)))


def points_query(table: str, mapping: str, privacy_unit: str) -> str:
    """The points a fit reads (mob_points' columns), user ids only under the user unit (as the macros' lists)."""
    user = "user_id" if privacy_unit == "user" else "NULL::BIGINT AS user_id"
    return f"SELECT traj_id, {user}, ts, lat, lon, seq FROM mob_points({_literal(table)}, {mapping})"


def synthesize_table(con, table: str, eps, method: str = "privtrace", *, delta=None, bbox=None, n=None, seed=None,
                     privacy_unit: str = "trajectory", max_trajectories_per_user=None, params=None,
                     outside: str = "drop", traj_col: str = "traj_id", ts_col: str = "ts", lat_col: str = "lat",
                     lon_col: str = "lon", user_col: str = "user_id", **method_params) -> pa.Table:
    """Python twin of ``FROM synthesize(...)``: fit + sample, one spend of ``table``'s budget; a pyarrow Table.

    The ledger is written on the release core's own connection: a ROLLBACK of ``con``'s transaction does not
    undo the spend."""
    from duckmob.sql import register

    register(con)
    db = release.database(con)
    r = release.fit_request(source=table, eps=eps, delta=delta, method=method, bbox=bbox, privacy_unit=privacy_unit,
                            max_trajectories_per_user=max_trajectories_per_user,
                            params={**synth.parse_params(params), **method_params}, outside=outside, seed=seed, n=n)
    mapping = _mapping(traj_col, ts_col, lat_col, lon_col, user_col)

    # read out of core by the release, after its reservation, on the caller's connection (which sees its temp
    # tables and CTE-free views): the same model as reading it whole (duckmob.stream)
    source = stream.Source(con, points_query(table, mapping, r.privacy_unit))
    model, _, noise = release.fit(db, r, lambda: source)
    return rows(release.sample(model, r.n, noise.generator()))
