"""SQL layer for the privacy core: budgets and the ledger, noisy counts, noisy transition counts.

Hidden UDFs behind the macros in privacy.sql; they only decode arguments and encode rows. Every release goes
through the release core (:mod:`duckmob.release`), which writes the ledger on its own connection (never the
calling one). Anything that writes the ledger or draws noise is registered with ``side_effects=True``.
``_mob_noisy_count`` / ``_mob_transitions`` get the rows gathered as one list (temp tables, CTEs);
``_mob_noisy_count_source`` / ``_mob_transitions_source`` get a committed table's name and read it out of core on
a cursor of the core's connection, after the reservation (:mod:`duckmob.stream`): the same release.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from duckmob import release, stream, validators
from duckmob.errors import DuckmobError
from duckmob.privacy import ledger
from duckmob.sql import Udf, one_row, points, scalar

_BUDGET_ROW = "STRUCT(source VARCHAR, eps DOUBLE, delta DOUBLE, spent DOUBLE, remaining DOUBLE)[]"
_TRANSITION_ROW = "STRUCT(prev_state BIGINT, from_state BIGINT, to_state BIGINT, count DOUBLE)[]"
_SEQS_TYPE = "STRUCT(traj_id BIGINT, user_id BIGINT, cells BIGINT[])[]"
_BUDGETS_SCHEMA = pa.schema([("source", pa.string()), ("eps", pa.float64()), ("delta", pa.float64()),
                             ("spent", pa.float64()), ("remaining", pa.float64()), ("releases", pa.int64()),
                             ("declared_at", pa.timestamp("us"))])
_LEDGER_SCHEMA = pa.schema([("id", pa.int64()), ("recorded_at", pa.timestamp("us")), ("source", pa.string()),
                            ("mechanism", pa.string()), ("epsilon", pa.float64()), ("delta", pa.float64()),
                            ("privacy_unit", pa.string()), ("params", pa.string()), ("event", pa.string()),
                            ("seeded", pa.bool_()), ("status", pa.string())])
_SQL_TYPES = {pa.string(): "VARCHAR", pa.float64(): "DOUBLE", pa.int64(): "BIGINT", pa.bool_(): "BOOLEAN",
              pa.timestamp("us"): "TIMESTAMP"}


def _struct(schema: pa.Schema) -> str:
    return "STRUCT(" + ", ".join(f"{f.name} {_SQL_TYPES[f.type]}" for f in schema) + ")[]"


def setup(con) -> None:
    """Create the budget and ledger tables (skipped quietly on a read-only database without them)."""
    try:
        ledger.ensure_tables(con)
    except duckdb.Error as exc:  # a read-only file: mob_set_budget will say what is wrong when it is used
        if "read-only" not in str(exc) and "read only" not in str(exc):
            raise


def _sequences(rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets, cells, user_id) of a list of (traj_id, user_id, cells) structs; NULL users -> -1. A sequence
    holding a NULL cell is dropped whole (a per-trajectory transformation: nothing is refused on the data)."""
    seqs = points(rows)
    if seqs is None or len(seqs) == 0 or seqs.null_count == len(seqs):
        return np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    seqs = seqs.filter(pc.is_valid(seqs))
    lists = seqs.field("cells")
    flat_valid = pc.is_valid(pc.list_flatten(lists.fill_null([]) if lists.null_count else lists))
    lengths = np.nan_to_num(pc.list_value_length(lists).to_numpy(zero_copy_only=False)).astype(np.int64)
    owner = np.repeat(np.arange(len(lengths)), lengths)
    bad = np.bincount(owner[~flat_valid.to_numpy(zero_copy_only=False)], minlength=len(lengths)) > 0
    seqs = seqs.filter(pa.array(~bad))
    order = np.argsort(seqs.field("traj_id").fill_null(-1).to_numpy(zero_copy_only=False), kind="stable")
    seqs = seqs.take(pa.array(order))
    lists = seqs.field("cells")
    lengths = np.nan_to_num(pc.list_value_length(lists).to_numpy(zero_copy_only=False)).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    cells = pc.list_flatten(lists).to_numpy(zero_copy_only=False).astype(np.int64)
    user_id = np.asarray(seqs.field("user_id").fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)
    return offsets, cells, user_id


def _transition_rows(states: np.ndarray, values: np.ndarray) -> pa.ListArray:
    """mob_transitions' rows from ``release.transitions``' (states, counts): zeros after NormCut are omitted (the
    whole table is released; they are known zeros); prev_state is NULL for the first order."""
    order = states.shape[1] - 1
    keep = values > 0
    states, values = states[keep], values[keep]
    prev = pa.nulls(len(values), pa.int64()) if order == 1 else pa.array(states[:, 0], pa.int64())
    return one_row(pa.table({"prev_state": prev, "from_state": pa.array(states[:, -2], pa.int64()),
                             "to_state": pa.array(states[:, -1], pa.int64()), "count": pa.array(values)}))


def unshadowed(source, shadowed) -> str:
    """The name of a table read out of core; refused (before anything is reserved: it is about the catalog) when
    a temporary table or view of the caller's connection has that name and would hide it."""
    name = scalar(source)
    if scalar(shadowed):
        raise DuckmobError(f"a temporary table or view named '{name}' hides the table of the same name that "
                           "duckmob would read: rename one of them")
    return name


def udfs(db) -> list[Udf]:
    def set_budget(source, eps, delta, exists):
        source, eps, delta = scalar(source), scalar(eps), scalar(delta)
        if eps is None or delta is None:
            raise DuckmobError(f"mob_set_budget needs both eps and delta, e.g. FROM mob_set_budget('{source}', "
                               "eps := 4, delta := 1e-5)")
        eps, delta = validators.positive("eps", eps), validators.delta_value(delta)   # public arguments first
        # a first declaration names a table or view that exists; a declared budget can still be changed after
        # its table is dropped (its ledger stays)
        if not scalar(exists) and release.read_ledger(db, lambda cur: ledger.budget(cur, source)) is None:
            raise DuckmobError(f"no such table or view: '{source}' (SHOW TABLES lists them); mob_set_budget "
                               "declares the budget of the table that releases will read")
        row = release.set_budget(db, source, eps, delta)
        return one_row(pa.table({k: [row[k]] for k in ("source", "eps", "delta", "spent", "remaining")}))

    def listing(read, schema):
        def udf(_):
            return one_row(pa.Table.from_pylist(release.read_ledger(db, read), schema=schema))
        return udf

    def transitions(rows, source, order, eps, n_states, seed, privacy_unit, max_per_user, max_length, support, w,
                    user_col):
        return _transition_rows(*release.transitions(
            db, source=scalar(source), order=scalar(order), eps=scalar(eps), n_states=scalar(n_states),
            seed=scalar(seed), privacy_unit=scalar(privacy_unit), max_trajectories_per_user=scalar(max_per_user),
            max_length=scalar(max_length), support=scalar(support), w=scalar(w), user_col=scalar(user_col),
            load=lambda: _sequences(rows)))

    def transitions_source(source, traj_col, user_col, cells_col, shadowed, order, eps, n_states, seed, privacy_unit,
                           max_per_user, max_length, support, w, user):
        """mob_transitions of a table the core's connection reads out of core (duckmob.stream)."""
        name = unshadowed(source, shadowed)
        with db.connection() as cur:
            return _transition_rows(*stream.transitions_release(
                db, cur, name, order=scalar(order), eps=scalar(eps), n_states=scalar(n_states), seed=scalar(seed),
                privacy_unit=scalar(privacy_unit), max_trajectories_per_user=scalar(max_per_user),
                max_length=scalar(max_length), support=scalar(support), w=scalar(w), traj_col=scalar(traj_col),
                user_col=scalar(user_col), cells_col=scalar(cells_col), user=scalar(user)))

    def noisy_count(rows, source, eps, seed, privacy_unit, max_per_user, what, user_col):
        def load():
            pairs = points(rows)
            if pairs is None or len(pairs) == pairs.null_count:
                return np.zeros(0, np.int64), np.zeros(0, np.int64)
            pairs = pairs.filter(pc.is_valid(pairs))
            return (np.asarray(pairs.field("traj_id").fill_null(-1).to_numpy(zero_copy_only=False), np.int64),
                    np.asarray(pairs.field("user_id").fill_null(-1).to_numpy(zero_copy_only=False), np.int64))

        value = release.noisy_count(db, source=scalar(source), eps=scalar(eps), seed=scalar(seed),
                                    privacy_unit=scalar(privacy_unit), max_trajectories_per_user=scalar(max_per_user),
                                    what=scalar(what) or "trajectories", user_col=scalar(user_col), load=load)
        return one_row(pa.table({"count": [value]}))

    def noisy_count_source(source, traj_col, user_col, shadowed, eps, seed, privacy_unit, max_per_user, what, user):
        """mob_noisy_count of a table the core's connection reads: DuckDB counts, an integer reaches Python."""
        name = unshadowed(source, shadowed)
        with db.connection() as cur:
            value = stream.count_release(db, cur, name, eps=scalar(eps), seed=scalar(seed),
                                         privacy_unit=scalar(privacy_unit),
                                         max_trajectories_per_user=scalar(max_per_user),
                                         what=scalar(what) or "trajectories", traj_col=scalar(traj_col),
                                         user_col=scalar(user_col), user=scalar(user))
        return one_row(pa.table({"count": [value]}))

    return [
        Udf("_mob_transitions", transitions,
            [_SEQS_TYPE, "VARCHAR", "BIGINT", "DOUBLE", "BIGINT", "BIGINT", "VARCHAR", "BIGINT", "BIGINT", "VARCHAR",
             "BIGINT", "VARCHAR"], _TRANSITION_ROW, side_effects=True, special_nulls=True),
        Udf("_mob_noisy_count", noisy_count,
            ["STRUCT(traj_id BIGINT, user_id BIGINT)[]", "VARCHAR", "DOUBLE", "BIGINT", "VARCHAR", "BIGINT",
             "VARCHAR", "VARCHAR"], "STRUCT(count DOUBLE)[]", side_effects=True, special_nulls=True),
        Udf("_mob_transitions_source", transitions_source,
            ["VARCHAR"] * 4 + ["BOOLEAN", "BIGINT", "DOUBLE", "BIGINT", "BIGINT", "VARCHAR", "BIGINT", "BIGINT",
                               "VARCHAR", "BIGINT", "VARCHAR"], _TRANSITION_ROW, side_effects=True, special_nulls=True),
        Udf("_mob_noisy_count_source", noisy_count_source,
            ["VARCHAR"] * 3 + ["BOOLEAN", "DOUBLE", "BIGINT", "VARCHAR", "BIGINT", "VARCHAR", "VARCHAR"],
            "STRUCT(count DOUBLE)[]", side_effects=True, special_nulls=True),
        Udf("_mob_set_budget", set_budget, ["VARCHAR", "DOUBLE", "DOUBLE", "BOOLEAN"], _BUDGET_ROW, side_effects=True,
            special_nulls=True),
        Udf("_mob_budgets", listing(ledger.budgets, _BUDGETS_SCHEMA), ["BOOLEAN"], _struct(_BUDGETS_SCHEMA),
            side_effects=True),
        Udf("_mob_ledger", listing(ledger.releases, _LEDGER_SCHEMA), ["BOOLEAN"], _struct(_LEDGER_SCHEMA),
            side_effects=True),
    ]
