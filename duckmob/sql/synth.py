"""SQL layer for synthesis: ``synthesize``, ``mob_fit``, ``mob_sample``, ``mob_models`` (macros in synth.sql).

Only decoding and encoding: the gathered columns and one request STRUCT (:class:`duckmob.sql.udf.Request`) arrive as
constant columns and are handed to the release core (:mod:`duckmob.release`), which validates them, reserves the
budget, reads the points, fits and records. ``synthesize`` and ``mob_sample`` stream: their UDF opens the output (a
:class:`~duckmob.release.sampling.Output` kept under a handle in :class:`~duckmob.release.registry.Outputs`) and
returns (handle, n, blocks); the macro then calls ``_mob_draw(handle, id)`` on the trajectory ids, 2048 at a time,
which returns each id's points as one LIST(STRUCT). The request's ``out_of_core`` (decided
once when the statement is planned) says whether the release reads the table itself, out of core, or gets the
gathered rows of a temporary table. Sampling a stored model reads no data and spends nothing.

Parameters shared by every method (one fixed list, since TEMP macros need one): ``eps``, ``delta`` (NULL: the
method's default, 0 for PrivTrace), ``method``, ``bbox`` (required, public), ``n`` (NULL: the model's noisy
trajectory count), ``seed`` (NULL: OS entropy; a seed makes noise and sampling reproducible and is recorded as
"seeded, not for release"), ``privacy_unit`` ('trajectory' or 'user'), ``max_trajectories_per_user`` (k,
required for 'user': a random subset of at most k trajectories per user is kept and every sensitivity is
multiplied by k), ``max_rows`` (the public cap on the output's rows; NULL: :data:`duckmob.validators.MAX_ROWS`),
``params`` (method-specific hyper-parameters as a JSON string '{"K": 8}' or a STRUCT/MAP
{'K': 8}), ``outside`` ('drop': points outside the bbox are dropped; a private release cannot refuse because
of them) and the column mapping (``traj_col``, ``ts_col``, ``lat_col``, ``lon_col``, ``user_col``) of mob_points.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from duckmob import release
from duckmob.errors import DuckmobError
from duckmob.release import sampling, tables
from duckmob.release.fitting import FitArgs
from duckmob.sql.privacy import CALLER_TYPE, release_input
from duckmob.sql.udf import Request, Udf, one_row
from duckmob.source.batches import concat
from duckmob.synth import store
from duckmob.trajectories import synthetic_table

ROWS_TYPE = "STRUCT(traj_id BIGINT, seq BIGINT, lat DOUBLE, lon DOUBLE, ts TIMESTAMP)[]"
FIT_TYPE = "STRUCT(name VARCHAR, method VARCHAR, source VARCHAR, eps DOUBLE, delta DOUBLE, params VARCHAR)[]"
# An opened output: its handle in the registry, its number of trajectories and of blocks (sampling.BLOCK each).
OPEN_TYPE = "STRUCT(handle VARCHAR, n BIGINT, blocks BIGINT)"




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
    """The points from the column lists the macros pass (aligned lists, one per column, values TRY_CAST), as a
    callable giving an Arrow table (called when the release reads them).

    One primitive list per column costs DuckDB about half the memory of one list of structs (measured at
    15M points: +1.4 GB against +2.6 GB). ``user`` is all NULL when the table has no user column; ``seq`` is
    aligned with the other columns and NULL on the rows that have a timestamp (where it is not used), or NULL as a
    whole when every row has one: a trajectory without time is ordered by its own seq whatever the others hold.
    """
    def load():
        traj_v = _values(traj)
        if traj_v is None:   # an empty table: a valid input of a release (nothing is refused on the data)
            return pa.table({"traj_id": pa.array([], pa.int64()), "ts": pa.array([], pa.timestamp("us")),
                             "lat": pa.array([], pa.float64()), "lon": pa.array([], pa.float64())})
        cols = {"traj_id": traj_v, "ts": _values(ts), "lat": _values(lat), "lon": _values(lon)}
        user_v = _values(user)
        if user_v is not None:   # all NULL when the table has no user column: no user (-1), as without it
            cols["user_id"] = user_v
        seq_v = _values(seq)
        if seq_v is not None and seq_v.null_count < len(seq_v):   # all NULL: every row has a ts, seq is unused
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


MAPPING_TYPE = "STRUCT(traj_col VARCHAR, ts_col VARCHAR, lat_col VARCHAR, lon_col VARCHAR, user_col VARCHAR)"
# The request of a fit (the STRUCT the synthesize and mob_fit macros in synth.sql build): the caller's facts,
# the input path, the gathered rows' column types, the column mapping, then the fit's public arguments (FitArgs).
FIT = Request(source=CALLER_TYPE, out_of_core="BOOLEAN", types="VARCHAR[]", mapping=MAPPING_TYPE,
              **FitArgs.sql_types())
SAMPLE = Request(name="VARCHAR", n="BIGINT", seed="BIGINT", max_rows="BIGINT")
COLUMNS = ["BIGINT[]", "BIGINT[]", "TIMESTAMP[]", "DOUBLE[]", "DOUBLE[]", "BIGINT[]"]   # traj, user, ts, lat, lon, seq


def _named(name) -> None:
    if name is None:
        raise DuckmobError("a model needs a name: FROM mob_fit('trips', 'my_model', eps := 1.0, ...)")


def _opened(db, output: sampling.Output) -> pa.Array:
    """Keep ``output`` under a new handle: the one row (handle, n, blocks) the macro streams from."""
    return pa.array([{"handle": db.outputs.open(output), "n": output.n, "blocks": sampling.n_blocks(output.n)}],
                    pa.struct([("handle", pa.string()), ("n", pa.int64()), ("blocks", pa.int64())]))


def _column(arg) -> pa.Array:
    if isinstance(arg, pa.ChunkedArray):
        return arg.combine_chunks() if arg.num_chunks != 1 else arg.chunk(0)
    return arg


def draw(db, handle, ids) -> pa.ListArray:
    """``_mob_draw``: the points of each trajectory id (one LIST(STRUCT) per row) of the outputs named by
    ``handle`` (one per query, in practice one per call). Whole blocks are drawn (:func:`sampling.draw_ids`)."""
    handle, ids = _column(handle), _column(ids).to_numpy(zero_copy_only=False).astype(np.int64)
    names = pc.unique(handle).to_pylist()
    parts, order = [], []
    for name in names:
        output = db.outputs.get(name) if name is not None else None
        if output is None:
            raise DuckmobError("duckmob: this synthetic output is no longer open (unused for an hour, or many outputs "
                               "were opened since): run the query again")
        where = np.flatnonzero(pc.equal(handle, name).to_numpy(zero_copy_only=False)) if len(names) > 1 else None
        parts.append(output.draw(ids if where is None else ids[where]))
        order.append(where)
    traj = parts[0] if len(parts) == 1 else concat(parts).take(np.argsort(np.concatenate(order), kind="stable"))
    struct = synthetic_table(traj).combine_chunks().to_struct_array()
    struct = struct.chunk(0) if struct.num_chunks else pa.array([], struct.type)
    return pa.ListArray.from_arrays(pa.array(np.asarray(traj.offsets, np.int64).astype(np.int32)), struct)


def udfs(db) -> list[Udf]:
    def fit_or_synthesize(udf, columns, request, *, fit: bool):
        """A fit (tables.fit) or fit + sample (tables.synthesize) of the input the request names
        (:func:`~duckmob.sql.privacy.release_input`: a relation read out of core, or a temporary table's rows)."""
        r = FIT.parse(request, udf)
        if fit:
            _named(r["name"])
        inp = release_input(db, r, "points", _lazy_points(*columns))   # what remains: the fit's arguments
        return (tables.fit if fit else tables.synthesize)(db, inp, FitArgs(**r))

    @release.interrupts.entered()   # Ctrl-C from the first moment
    def _fit(traj, user, ts, lat, lon, seq, request):
        model, _, _, r = fit_or_synthesize("_mob_fit", (traj, user, ts, lat, lon, seq), request, fit=True)
        return one_row(_summary(r.name, r.method, r.source, r.eps, r.delta, model))

    @release.interrupts.entered()
    def _synthesize(traj, user, ts, lat, lon, seq, request):
        return _opened(db, fit_or_synthesize("_mob_synthesize", (traj, user, ts, lat, lon, seq), request, fit=False))

    def _sample(request):
        return _opened(db, tables.sample(db, **SAMPLE.parse(request, "_mob_sample")))

    return [
        Udf("_mob_fit", _fit, COLUMNS, FIT_TYPE, FIT, side_effects=True, special_nulls=True),
        Udf("_mob_sample", _sample, [], OPEN_TYPE, SAMPLE, side_effects=True, special_nulls=True),
        Udf("_mob_synthesize", _synthesize, COLUMNS, OPEN_TYPE, FIT, side_effects=True, special_nulls=True),
        Udf("_mob_draw", lambda handle, ids: draw(db, handle, ids), ["VARCHAR", "BIGINT"], ROWS_TYPE,
            side_effects=True),
    ]


def setup(con) -> None:
    """Create the models table (a TEMP one when the database is read-only, so the macros still bind)."""
    try:
        store.ensure_table(con)
    except Exception:  # read-only database: mob_models() shows nothing, mob_fit cannot store
        con.execute(store.DDL.replace("CREATE TABLE", "CREATE TEMP TABLE"))
