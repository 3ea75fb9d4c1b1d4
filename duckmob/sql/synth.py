"""SQL layer for synthesis: ``synthesize``, ``mob_fit``, ``mob_sample``, ``mob_models`` (macros in synth.sql).

The same driver serves SQL and Python (:func:`duckmob.synthesize`): validate the public parameters, ask the
ledger whether the spend fits the source's budget BEFORE the points are read, load and clean the points,
bound each user's contributions when the privacy unit is a user, fit (one release), record the spend ONCE,
and (for mob_fit) store the model. Sampling a stored model reads no data and spends nothing.

Parameters shared by every method (one fixed list, since TEMP macros need one): ``eps``, ``delta`` (NULL: the
method's default, 0 for PrivTrace), ``method``, ``bbox`` (required, public), ``n`` (NULL: the model's noisy
trajectory count), ``seed`` (NULL: OS entropy; a seed makes noise and sampling reproducible and is recorded as
"seeded, not for release"), ``privacy_unit`` ('trajectory' or 'user'), ``max_trajectories_per_user`` (k,
required for 'user': a random subset of at most k trajectories per user is kept and every sensitivity is
multiplied by k), ``params`` (method-specific hyper-parameters as a JSON string '{"K": 8}' or a STRUCT/MAP
{'K': 8}), ``outside`` ('fail' or 'drop' for points outside the bbox) and the column mapping (``traj_col``,
``ts_col``, ``lat_col``, ``lon_col``, ``user_col``) of mob_points.
"""

from __future__ import annotations

import json
from typing import Callable

import numpy as np
import pyarrow as pa

from duckmob import synth
from duckmob.errors import DuckmobError
from duckmob.sql import Udf, one_row, scalar
from duckmob.synth import store
from duckmob.trajectories import NO_TIME, Trajectories, from_points

PRIVACY_UNITS = ("trajectory", "user")

ROWS_TYPE = "STRUCT(traj_id BIGINT, seq BIGINT, lat DOUBLE, lon DOUBLE, ts TIMESTAMP)[]"
FIT_TYPE = "STRUCT(name VARCHAR, method VARCHAR, source VARCHAR, eps DOUBLE, delta DOUBLE, params VARCHAR)[]"


def parse_params(params) -> dict:
    """Method hyper-parameters from a JSON object string, a dict, or None."""
    if params is None or (isinstance(params, str) and not params.strip()):
        return {}
    if isinstance(params, dict):
        return dict(params)
    try:
        value = json.loads(params)
    except (TypeError, ValueError):
        raise DuckmobError(f"params must be a JSON object such as '{{\"K\": 8}}' or a STRUCT {{'K': 8}}, "
                           f"got {params!r}")
    if not isinstance(value, dict):
        raise DuckmobError(f"params must be a JSON object such as '{{\"K\": 8}}', got {params!r}")
    return value


def _check_eps(eps) -> float:
    try:
        value = float(eps)
    except (TypeError, ValueError):
        value = float("nan")
    if eps is None or not np.isfinite(value) or value <= 0:
        raise DuckmobError(f"eps must be a positive number, got {eps!r}: pass e.g. eps := 1.0")
    return value


def _check_delta(delta, default: float) -> float:
    if delta is None:
        return float(default)
    try:
        value = float(delta)
    except (TypeError, ValueError):
        value = float("nan")
    if not (0.0 <= value < 1.0):
        raise DuckmobError(f"delta must be a number in [0, 1), got {delta!r}: pass e.g. delta := 1e-5")
    return value


def _check_unit(privacy_unit, k) -> tuple[str, int]:
    unit = str(privacy_unit or "trajectory").strip().lower()
    if unit not in PRIVACY_UNITS:
        raise DuckmobError(f"privacy_unit := '{privacy_unit}' is not an option: use 'trajectory' (one "
                           "trajectory is protected) or 'user' (all of a user's trajectories, with "
                           "max_trajectories_per_user := k)")
    if unit == "trajectory":
        if k is not None and int(k) != 1:
            raise DuckmobError("max_trajectories_per_user only applies with privacy_unit := 'user'")
        return unit, 1
    if k is None:
        raise DuckmobError("privacy_unit := 'user' needs a contribution bound: pass max_trajectories_per_user "
                           ":= k (a user's trajectories beyond k are dropped at random; noise grows with k)")
    if int(k) != k or int(k) < 1:
        raise DuckmobError(f"max_trajectories_per_user must be a positive integer, got {k!r}")
    return unit, int(k)


def fit(con, load_points: Callable[[], object], *, source: str, eps, delta=None, method: str = "privtrace",
        bbox=None, privacy_unit: str = "trajectory", max_trajectories_per_user=None, params=None,
        outside: str = "fail", noise=None, name: str | None = None):
    """Fit ``method`` on the points ``load_points()`` returns, spending (eps, delta) of ``source``'s budget once.

    The ledger is asked before ``load_points`` is called; a model ``name`` already in use is refused before
    anything is spent. Returns ``(synthesizer, model, delta)``.
    """
    from duckmob.privacy import ledger
    from duckmob.privacy.counting import bound_contributions
    from duckmob.privacy.noise import NoiseSource

    cls = synth.get(method)
    method = cls.method
    synthesizer = cls(bbox, **parse_params(params))
    eps = _check_eps(eps)
    delta = _check_delta(delta, getattr(cls, "default_delta", 1e-5))
    unit, k = _check_unit(privacy_unit, max_trajectories_per_user)
    if outside not in ("fail", "drop"):
        raise DuckmobError(f"outside := '{outside}' is not an option: use 'drop' or 'fail'")
    if name is not None:
        store.check_free(con, name)
    noise = noise if noise is not None else NoiseSource(None)
    if unit == "user":
        synthesizer.contribution_bound = k   # before planning: the plan's sensitivities scale by k
    declared = ledger.budget(con, source)
    if declared is not None:
        synthesizer.ledger_prior = (ledger.events(con, source), *declared)
    event = synthesizer.privacy_event(eps, delta)
    ledger.check(con, source, event)

    data, _report = from_points(load_points(), bbox=synthesizer.bbox, outside=outside,
                                time_required=getattr(cls, "needs_time", True))
    if unit == "user":
        if (data.user_id < 0).any():
            raise DuckmobError("privacy_unit := 'user' needs a user id on every trajectory: name the column with "
                               "user_col := ..., or use privacy_unit := 'trajectory'")
        keep = bound_contributions(data.user_id, k, noise.generator())
        data = data.take(np.asarray(keep, dtype=bool))
    recorded = {"method": method, "max_trajectories_per_user": k, **parse_params(params),
                **({"model": name} if name else {})}
    try:
        model = synthesizer.fit(data, eps, delta, noise)
    except DuckmobError as exc:
        if getattr(exc, "spent", None) is not None:   # refused after a noisy count: that count is spent
            ledger.record(con, source, exc.spent, mechanism=method, privacy_unit=unit,
                          params={**recorded, "refused": True}, seeded=bool(noise.seeded))
        raise
    # Record what actually ran. A method whose plan depends on a noisy count (HRNet: the sampling rate and the
    # DP-SGD steps follow N~) reports its own event, calibrated like the plan checked above to (eps, delta) and,
    # through ledger_prior, to the budget composed with the earlier releases; the others spend exactly the plan.
    spent = getattr(model, "event", None) or event
    ledger.record(con, source, spent, mechanism=method, privacy_unit=unit, params=recorded,
                  seeded=bool(noise.seeded))
    return synthesizer, model, delta


def sample(model, n, rng) -> Trajectories:
    """``n`` trajectories from a fitted model (n None: the model's noisy trajectory count)."""
    if n is None:
        n = getattr(model, "default_n", None)
        if n is None:
            raise DuckmobError("this model has no default size: pass n := number of trajectories")
        if n < 1:
            raise DuckmobError("the model's noisy trajectory count is below 1: pass n := number of trajectories")
    try:
        ok = int(n) == n and int(n) >= 1
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise DuckmobError(f"n must be a positive number of trajectories, got {n!r}: pass e.g. n := 1000")
    return model.sample(int(n), rng)


def rows(traj: Trajectories) -> pa.Table:
    """The synthetic table: traj_id, seq, lat, lon, ts (NULL where the method models no time)."""
    lengths = traj.lengths
    seq = np.arange(traj.n_points, dtype=np.int64) - np.repeat(traj.offsets[:-1], lengths)
    ts = pa.array(traj.ts, pa.int64(), mask=traj.ts == NO_TIME).cast(pa.timestamp("us"))
    return pa.table({"traj_id": np.repeat(np.asarray(traj.traj_id, dtype=np.int64), lengths), "seq": seq,
                     "lat": traj.lat, "lon": traj.lon, "ts": ts})


def _noise(seed):
    from duckmob.privacy.noise import NoiseSource

    if seed is not None and (int(seed) != seed):
        raise DuckmobError(f"seed must be an integer, got {seed!r}")
    return NoiseSource(None if seed is None else int(seed))


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
        if traj_v is None or len(traj_v) == 0:
            raise DuckmobError("the trajectory table is empty: give a table with at least one trajectory of 2 "
                               "points")
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


def _fit_args(cur, columns, source, eps, delta, method, bbox, unit, k, params, outside, noise, name=None):
    """Call :func:`fit` with the UDF's arguments (constant columns of one row)."""
    return fit(cur, _lazy_points(*columns), source=scalar(source), eps=scalar(eps), delta=scalar(delta),
               method=scalar(method), bbox=scalar(bbox), privacy_unit=scalar(unit),
               max_trajectories_per_user=scalar(k), params=scalar(params), outside=scalar(outside) or "fail",
               noise=noise, name=name)


def udfs(con) -> list[Udf]:
    def _fit(traj, user, ts, lat, lon, seq, source, name, eps, delta, method, bbox, unit, k, params, outside,
             seed):
        cur = con.cursor()
        try:
            noise, name = _noise(scalar(seed)), scalar(name)
            synthesizer, model, delta_used = _fit_args(cur, (traj, user, ts, lat, lon, seq), source, eps, delta,
                                                       method, bbox, unit, k, params, outside, noise, name)
            store.save(cur, name, synthesizer.method, scalar(source), model.describe(), scalar(eps), delta_used,
                       model.to_bytes())
            return one_row(_summary(name, synthesizer.method, scalar(source), scalar(eps), delta_used, model))
        finally:
            cur.close()

    def _sample(name, n, seed):
        cur = con.cursor()
        try:
            _method, model = store.load(cur, scalar(name))
        finally:
            cur.close()
        return one_row(rows(sample(model, scalar(n), _noise(scalar(seed)).generator())))

    def _synthesize(traj, user, ts, lat, lon, seq, source, eps, delta, method, bbox, unit, k, params, outside,
                    n, seed):
        cur = con.cursor()
        try:
            noise = _noise(scalar(seed))
            _s, model, _d = _fit_args(cur, (traj, user, ts, lat, lon, seq), source, eps, delta, method, bbox, unit,
                                      k, params, outside, noise)
        finally:
            cur.close()
        return one_row(rows(sample(model, scalar(n), noise.generator())))

    common = ["DOUBLE", "DOUBLE", "VARCHAR", "DOUBLE[]", "VARCHAR", "BIGINT", "VARCHAR", "VARCHAR"]
    columns = ["BIGINT[]", "BIGINT[]", "TIMESTAMP[]", "DOUBLE[]", "DOUBLE[]", "BIGINT[]"]
    return [
        Udf("_mob_fit", _fit, columns + ["VARCHAR", "VARCHAR"] + common + ["BIGINT"], FIT_TYPE,
            side_effects=True, special_nulls=True),
        Udf("_mob_sample", _sample, ["VARCHAR", "BIGINT", "BIGINT"], ROWS_TYPE, side_effects=True,
            special_nulls=True),
        Udf("_mob_synthesize", _synthesize, columns + ["VARCHAR"] + common + ["BIGINT", "BIGINT"], ROWS_TYPE,
            side_effects=True, special_nulls=True),
    ]


def setup(con) -> None:
    """Create the models table (a TEMP one when the database is read-only, so the macros still bind)."""
    try:
        store.ensure_table(con)
    except Exception:  # read-only database: mob_models() shows nothing, mob_fit cannot store
        con.execute(store._DDL.replace("CREATE TABLE", "CREATE TEMP TABLE"))


def _literal(text: str) -> str:
    return "'" + str(text).replace("'", "''") + "'"


def synthesize_table(con, table: str, eps, method: str = "privtrace", *, delta=None, bbox=None, n=None, seed=None,
                     privacy_unit: str = "trajectory", max_trajectories_per_user=None, params=None,
                     outside: str = "fail", traj_col: str = "traj_id", ts_col: str = "ts", lat_col: str = "lat",
                     lon_col: str = "lon", user_col: str = "user_id", **method_params) -> pa.Table:
    """Python twin of ``FROM synthesize(...)``: fit + sample, one spend of ``table``'s budget; a pyarrow Table."""
    from duckmob.sql import register

    register(con)
    merged = {**parse_params(params), **method_params}
    noise = _noise(seed)
    mapping = ", ".join(f"{k} := {_literal(v)}" for k, v in (("traj_col", traj_col), ("ts_col", ts_col),
                                                             ("lat_col", lat_col), ("lon_col", lon_col),
                                                             ("user_col", user_col)))

    def load():
        user = "user_id" if str(privacy_unit).strip().lower() == "user" else "NULL::BIGINT AS user_id"
        pts = con.sql(f"SELECT traj_id, {user}, ts, lat, lon, seq FROM mob_points({_literal(table)}, {mapping})"
                      ).to_arrow_table()
        if pts.num_rows == 0:
            raise DuckmobError("the trajectory table is empty: give a table with at least one trajectory of 2 "
                               "points")
        return pts

    _s, model, _d = fit(con, load, source=table, eps=eps, delta=delta, method=method, bbox=bbox,
                        privacy_unit=privacy_unit, max_trajectories_per_user=max_trajectories_per_user,
                        params=merged, outside=outside, noise=noise)
    return rows(sample(model, n, noise.generator()))
