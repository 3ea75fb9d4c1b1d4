"""SQL layer for the privacy core: budgets and the ledger, noisy counts, noisy transition counts.

Hidden UDFs behind the macros in privacy.sql; they only decode arguments and encode rows. Every release goes
through the release core (:mod:`duckmob.release`), which writes the ledger on its own connection (never the
calling one). Anything that writes the ledger or draws noise is registered with ``side_effects=True``.
``_mob_noisy_count`` / ``_mob_transitions`` get the rows of a temporary table gathered as one list;
``_mob_noisy_count_source`` / ``_mob_transitions_source`` get a committed table's name and read it out of core on
a cursor of the core's connection, after the reservation (:mod:`duckmob.release.tables`): the same release.
"""

from __future__ import annotations

from contextlib import closing

import duckdb
import numpy as np
import pyarrow as pa

from duckmob import release, validators
from duckmob.errors import DuckmobError
from duckmob.privacy import ledger
from duckmob.release import tables
from duckmob.source.schema import Mapping, check_ids, quote
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


def _transition_rows(states: np.ndarray, values: np.ndarray) -> pa.ListArray:
    """mob_transitions' rows from ``release.transitions``' (states, counts): zeros after NormCut are omitted (the
    whole table is released; they are known zeros); prev_state is NULL for the first order."""
    order = states.shape[1] - 1
    keep = values > 0
    states, values = states[keep], values[keep]
    prev = pa.nulls(len(values), pa.int64()) if order == 1 else pa.array(states[:, 0], pa.int64())
    return one_row(pa.table({"prev_state": prev, "from_state": pa.array(states[:, -2], pa.int64()),
                             "to_state": pa.array(states[:, -1], pa.int64()), "count": pa.array(values)}))


CALLER_TYPE = "STRUCT(relation VARCHAR, database VARCHAR, schema VARCHAR, temp_tables VARCHAR[], temp_views VARCHAR[])"
_COUNT_ARGS = "STRUCT(eps DOUBLE, seed BIGINT, privacy_unit VARCHAR, k BIGINT, what VARCHAR)"
_TRANSITION_ARGS = ("STRUCT(\"order\" BIGINT, eps DOUBLE, n_states BIGINT, seed BIGINT, privacy_unit VARCHAR, k BIGINT, "
                    "max_length BIGINT, support VARCHAR, w BIGINT)")


def caller(arg) -> dict:
    """The caller's facts (``_mob_caller`` in privacy.sql): relation, database, schema, temporary tables and views;
    the relation checked to be a name or a query (a non-empty string)."""
    facts = dict(scalar(arg))
    facts["relation"] = validators.source_name(facts.get("relation"))
    return facts


def core_cursor(db, facts: dict):
    """A cursor of the release core's connection that resolves names as the caller does (its database and schema):
    it sees committed tables and views, not the caller's temporary objects (checked by the caller's facts)."""
    cur = db.cursor()
    try:
        cur.execute(f"USE {quote(facts['database'])}.{quote(facts['schema'])}")
    except Exception:
        cur.close()
        raise
    return cur


def readable(db, facts: dict) -> bool:
    """Whether the core's cursor can plan ``facts['relation']`` (a committed table or view, or a query over them):
    folded once when the statement is planned, so the other branch of a macro is never scanned."""
    try:
        with closing(core_cursor(db, facts)) as cur:
            cur.execute(f"SELECT * FROM {facts['relation']} LIMIT 0")
    except Exception:   # temp tables, CTEs, anything else: the gathered branch (which reports what is wrong)
        return False
    return True


def shadow_checked(facts: dict) -> str:
    """The relation, refused (before anything is reserved) when it mentions one of the caller's temporary tables or
    views while the release reads it on the core's connection, where that name means another object."""
    tables.check_shadowing(facts["relation"], list(facts.get("temp_tables") or []) +
                           list(facts.get("temp_views") or []))
    return facts["relation"]


def mapping(arg) -> Mapping:
    return Mapping.of(**{k: v for k, v in dict(scalar(arg)).items()})


def udfs(db) -> list[Udf]:
    def set_budget(facts, eps, delta):
        facts, eps, delta = caller(facts), scalar(eps), scalar(delta)
        source = facts["relation"]
        if eps is None or delta is None:
            raise DuckmobError(f"mob_set_budget needs both eps and delta, e.g. FROM mob_set_budget('{source}', "
                               "eps := 4, delta := 1e-5)")
        eps, delta = validators.positive("eps", eps), validators.delta_value(delta)   # public arguments first
        if readable(db, facts):
            shadow_checked(facts)
            with closing(core_cursor(db, facts)) as cur:
                row = tables.set_budget(db, cur, source, eps, delta)
        else:
            with db.connection() as cur:
                row = tables.set_budget(db, cur, source, eps, delta, temp_tables=facts.get("temp_tables"))
        return one_row(pa.table({k: [row[k]] for k in ("source", "eps", "delta", "spent", "remaining")}))

    def listing(read, schema):
        def udf(_):
            return one_row(pa.Table.from_pylist(release.read_ledger(db, read), schema=schema))
        return udf

    def _transition_request(args) -> dict:
        a = dict(scalar(args))
        return dict(order=a["order"], eps=a["eps"], n_states=a["n_states"], seed=a["seed"],
                    privacy_unit=a["privacy_unit"], max_trajectories_per_user=a["k"], max_length=a["max_length"],
                    support=a["support"], w=a["w"])

    def _count_request(args) -> dict:
        a = dict(scalar(args))
        return dict(eps=a["eps"], seed=a["seed"], privacy_unit=a["privacy_unit"], max_trajectories_per_user=a["k"],
                    what=a["what"] or "trajectories")

    def transitions(rows, facts, types, cols, args):
        facts, m = caller(facts), mapping(cols)
        has_user = check_ids(dict(zip(("traj_id", "user_id", "cells"), scalar(types))), m)
        return _transition_rows(*tables.transitions_gathered(
            db, facts["relation"], facts.get("temp_tables"), has_user, m, lambda: points(rows),
            **_transition_request(args)))

    def transitions_source(facts, cols, args):
        """mob_transitions of a relation the core's connection reads out of core."""
        facts = caller(facts)
        relation = shadow_checked(facts)
        with closing(core_cursor(db, facts)) as cur:
            return _transition_rows(*tables.transitions(db, cur, relation, mapping=mapping(cols), caller_checked=True,
                                                        **_transition_request(args)))

    def noisy_count(rows, facts, types, cols, args):
        facts, m = caller(facts), mapping(cols)
        has_user = check_ids(dict(zip(("traj_id", "user_id"), scalar(types)[:2])), m)
        value = tables.noisy_count_gathered(db, facts["relation"], facts.get("temp_tables"), has_user, m,
                                            lambda: tables.gathered_pairs(points(rows)), **_count_request(args))
        return one_row(pa.table({"count": [value]}))

    def noisy_count_source(facts, cols, args):
        """mob_noisy_count of a relation the core's connection reads: DuckDB counts, an integer reaches Python."""
        facts = caller(facts)
        relation = shadow_checked(facts)
        with closing(core_cursor(db, facts)) as cur:
            value = tables.noisy_count(db, cur, relation, mapping=mapping(cols), caller_checked=True,
                                       **_count_request(args))
        return one_row(pa.table({"count": [value]}))

    def out_of_core(relation, database, schema):
        facts = {"relation": scalar(relation), "database": scalar(database), "schema": scalar(schema)}
        if not isinstance(facts["relation"], str) or not facts["relation"].strip():
            return pa.array([False] * len(relation))
        return pa.array([readable(db, facts)] * len(relation))

    ids = "STRUCT(traj_col VARCHAR, user_col VARCHAR)"
    seq_cols = "STRUCT(traj_col VARCHAR, user_col VARCHAR, cells_col VARCHAR)"
    return [
        Udf("_mob_transitions", transitions, [_SEQS_TYPE, CALLER_TYPE, "VARCHAR[]", seq_cols, _TRANSITION_ARGS],
            _TRANSITION_ROW, side_effects=True, special_nulls=True),
        Udf("_mob_noisy_count", noisy_count,
            ["STRUCT(traj_id BIGINT, user_id BIGINT)[]", CALLER_TYPE, "VARCHAR[]", ids, _COUNT_ARGS],
            "STRUCT(count DOUBLE)[]", side_effects=True, special_nulls=True),
        Udf("_mob_transitions_source", transitions_source, [CALLER_TYPE, seq_cols, _TRANSITION_ARGS], _TRANSITION_ROW,
            side_effects=True, special_nulls=True),
        Udf("_mob_noisy_count_source", noisy_count_source, [CALLER_TYPE, ids, _COUNT_ARGS],
            "STRUCT(count DOUBLE)[]", side_effects=True, special_nulls=True),
        Udf("_mob_out_of_core", out_of_core, ["VARCHAR"] * 3, "BOOLEAN", special_nulls=True),
        Udf("_mob_set_budget", set_budget, [CALLER_TYPE, "DOUBLE", "DOUBLE"], _BUDGET_ROW, side_effects=True,
            special_nulls=True),
        Udf("_mob_budgets", listing(ledger.budgets, _BUDGETS_SCHEMA), ["BOOLEAN"], _struct(_BUDGETS_SCHEMA),
            side_effects=True),
        Udf("_mob_ledger", listing(ledger.releases, _LEDGER_SCHEMA), ["BOOLEAN"], _struct(_LEDGER_SCHEMA),
            side_effects=True),
    ]
