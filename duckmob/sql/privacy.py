"""SQL layer for the privacy core: budgets and the ledger, noisy counts, noisy transition counts.

Hidden UDFs behind the macros in privacy.sql. Anything that writes the ledger or draws noise is registered with
``side_effects=True`` and reaches the database through ``con.cursor()`` (never the calling connection).
"""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from duckmob.errors import DuckmobError
from duckmob.privacy import accounting, counting, ledger
from duckmob.privacy.noise import NoiseSource
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
                            ("seeded", pa.bool_())])
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


def _budget_row(cur, source: str) -> pa.ListArray:
    eps, delta = ledger.budget(cur, source)
    used = ledger.spent(cur, source, delta)
    return one_row(pa.table({"source": [source], "eps": [eps], "delta": [delta], "spent": [used],
                             "remaining": [max(eps - used, 0.0)]}))


def _unit_args(privacy_unit, max_per_user, needs_bound: bool = True) -> tuple[str, int | None]:
    """The privacy unit and its contribution bound k (None with the trajectory unit, or when the release's
    sensitivity does not depend on k: ``needs_bound`` False)."""
    unit = privacy_unit or "trajectory"
    if unit not in counting.PRIVACY_UNITS:
        raise DuckmobError(f"privacy_unit must be 'trajectory' or 'user'; got {unit!r}")
    if unit == "trajectory" and max_per_user is not None and max_per_user != 1:
        raise DuckmobError("max_trajectories_per_user only applies with privacy_unit := 'user': drop it, or "
                           "add privacy_unit := 'user'")
    if unit == "user" and max_per_user is None and needs_bound:
        raise DuckmobError("privacy_unit := 'user' needs a public max_trajectories_per_user := k (extra "
                           "trajectories of a user are dropped at random)")
    return unit, (max_per_user if unit == "user" and needs_bound else None)


def _required(name: str, value, example: str):
    if value is None:
        raise DuckmobError(f"{name} is required, e.g. {example}")
    return value


def _sequences(rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets, cells, user_id) of a list of (traj_id, user_id, cells) structs; NULL users -> -1."""
    seqs = points(rows)
    if seqs is None or len(seqs) == 0 or seqs.null_count == len(seqs):
        return np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(seqs.field("traj_id").to_numpy(zero_copy_only=False), kind="stable")
    seqs = seqs.take(pa.array(order))
    lists = seqs.field("cells")
    lengths = np.nan_to_num(pc.list_value_length(lists).to_numpy(zero_copy_only=False)).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    flat = pc.list_flatten(lists)
    if flat.null_count:
        raise DuckmobError("cells must not contain NULL: drop or fill the NULL cells of the sequences first")
    cells = flat.to_numpy(zero_copy_only=False).astype(np.int64)
    users = seqs.field("user_id")
    user_id = np.asarray(users.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)
    return offsets, cells, user_id


def udfs(con) -> list[Udf]:
    def set_budget(source, eps, delta):
        source, eps, delta = scalar(source), scalar(eps), scalar(delta)
        if eps is None or delta is None:
            raise DuckmobError(f"mob_set_budget needs both eps and delta, e.g. FROM mob_set_budget('{source}', "
                               "eps := 4, delta := 1e-5)")
        cur = con.cursor()
        try:
            ledger.set_budget(cur, source, eps, delta)
            return _budget_row(cur, source)
        finally:
            cur.close()

    def listing(read, schema):
        def udf(_):
            cur = con.cursor()
            try:
                rows = read(cur)
            finally:
                cur.close()
            return one_row(pa.Table.from_pylist(rows, schema=schema))
        return udf

    def transitions(rows, source, order, eps, n_states, seed, privacy_unit, max_per_user, max_length, support, w):
        source, order, eps, n_states = scalar(source), scalar(order), scalar(eps), scalar(n_states)
        seed, max_length, support, w = scalar(seed), scalar(max_length), scalar(support), scalar(w)
        unit, k = _unit_args(scalar(privacy_unit), scalar(max_per_user))
        example = f"FROM mob_transitions('{source}', eps := 0.5, n_states := 1024)"
        eps = _required("eps", eps, example)
        n_states = _required("n_states (public: w * w for a w x w grid)", n_states, example)
        order = 1 if order is None else order
        if order not in (1, 2):
            raise DuckmobError(f"markov_order must be 1 or 2; got {order!r}")
        noise = NoiseSource(seed)
        event = accounting.laplace(eps)
        cur = con.cursor()
        try:
            ledger.check(cur, source, event)  # before any computation on the data
            offsets, cells, user_id = _sequences(rows)
            args = dict(user_id=user_id, privacy_unit=unit, max_trajectories_per_user=k, max_length=max_length,
                        support=support, w=w)
            if support == "neighbours":
                states, values = counting.noisy_transition_counts_sparse(offsets, cells, n_states, order, eps,
                                                                         noise, **args)
            else:
                counts = counting.noisy_transition_counts(offsets, cells, n_states, order, eps, noise,
                                                          dtype=np.float64 if order == 1 else np.float32, **args)
                nz = np.nonzero(counts)
                states, values = np.stack(nz, axis=1), counts[nz].astype(np.float64)
            ledger.record(cur, source, event, mechanism=f"transition_counts(order={order})", privacy_unit=unit,
                          params={"order": order, "eps": eps, "n_states": n_states, "max_length": max_length,
                                  "max_trajectories_per_user": k, "support": support, "w": w,
                                  "normcut": True}, seeded=noise.seeded)
        finally:
            cur.close()
        keep = values > 0  # zeros after NormCut are omitted (the whole table is released; they are known zeros)
        states, values = states[keep], values[keep]
        prev = pa.nulls(len(values), pa.int64()) if order == 1 else pa.array(states[:, 0], pa.int64())
        return one_row(pa.table({"prev_state": prev, "from_state": pa.array(states[:, -2], pa.int64()),
                                 "to_state": pa.array(states[:, -1], pa.int64()), "count": pa.array(values)}))

    def noisy_count(rows, source, eps, seed, privacy_unit, max_per_user, what):
        source, eps, seed, what = scalar(source), scalar(eps), scalar(seed), scalar(what) or "trajectories"
        if what not in ("trajectories", "users"):
            raise DuckmobError(f"what must be 'trajectories' or 'users'; got {what!r}")
        # the user count has sensitivity 1 under either unit: it needs no contribution bound
        unit, k = _unit_args(scalar(privacy_unit), scalar(max_per_user), needs_bound=what == "trajectories")
        eps = _required("eps", eps, f"FROM mob_noisy_count('{source}', eps := 0.1)")
        noise = NoiseSource(seed)
        event = accounting.laplace(eps)
        cur = con.cursor()
        try:
            ledger.check(cur, source, event)
            pairs = points(rows)
            n = 0 if pairs is None else len(pairs) - pairs.null_count
            users = (np.zeros(0, np.int64) if n == 0 else
                     np.asarray(pairs.field("user_id").fill_null(-1).to_numpy(zero_copy_only=False), np.int64))
            if what == "users":
                if n > 0 and not (users >= 0).any():
                    raise DuckmobError("what := 'users' needs a user id: name the column with user_col := ...")
                # one trajectory (or one user) adds at most one user to the count: sensitivity 1
                n_items, sensitivity = int(np.unique(users[users >= 0]).size), 1
            elif unit == "user":
                keep = counting.bound_contributions(users, k, noise.generator())
                n_items, sensitivity = int(keep.sum()), int(k)
            else:
                n_items, sensitivity = n, 1
            value = counting.noisy_count(n_items, eps, noise, sensitivity)
            ledger.record(cur, source, event, mechanism=f"count({what})", privacy_unit=unit,
                          params={"eps": eps, "what": what, "sensitivity": sensitivity,
                                  "max_trajectories_per_user": k}, seeded=noise.seeded)
        finally:
            cur.close()
        return one_row(pa.table({"count": [value]}))

    return [
        Udf("_mob_transitions", transitions,
            [_SEQS_TYPE, "VARCHAR", "BIGINT", "DOUBLE", "BIGINT", "BIGINT", "VARCHAR", "BIGINT", "BIGINT", "VARCHAR",
             "BIGINT"], _TRANSITION_ROW, side_effects=True, special_nulls=True),
        Udf("_mob_noisy_count", noisy_count,
            ["STRUCT(traj_id BIGINT, user_id BIGINT)[]", "VARCHAR", "DOUBLE", "BIGINT", "VARCHAR", "BIGINT",
             "VARCHAR"], "STRUCT(count DOUBLE)[]", side_effects=True, special_nulls=True),
        Udf("_mob_set_budget", set_budget, ["VARCHAR", "DOUBLE", "DOUBLE"], _BUDGET_ROW, side_effects=True,
            special_nulls=True),
        Udf("_mob_budgets", listing(ledger.budgets, _BUDGETS_SCHEMA), ["BOOLEAN"], _struct(_BUDGETS_SCHEMA),
            side_effects=True),
        Udf("_mob_ledger", listing(ledger.releases, _LEDGER_SCHEMA), ["BOOLEAN"], _struct(_LEDGER_SCHEMA),
            side_effects=True),
    ]
