"""SQL layer for the privacy core: budgets and the ledger, noisy counts, noisy transition counts.

Hidden UDFs behind the macros in privacy.sql; they only decode arguments and encode rows. Every release goes
through the release core (:mod:`duckmob.release`), which writes the ledger on its own connection (never the
calling one). Anything that writes the ledger or draws noise is registered with ``side_effects=True``.
``_mob_noisy_count`` / ``_mob_transitions`` take the gathered rows and one request STRUCT
(:class:`duckmob.sql.udf.Request`) whose ``out_of_core`` says which input path the statement was planned with:
a committed table the core's connection can read is read out of core on a cursor of that connection, after the
reservation (the gathered list is then empty); a temporary table of the caller arrives as the gathered rows
(:mod:`duckmob.release.tables`): the same release either way.
"""

from __future__ import annotations

from contextlib import closing
from typing import Callable

import duckdb
import numpy as np
import pyarrow as pa

from duckmob import release, validators
from duckmob.errors import DuckmobError
from duckmob.privacy import ledger
from duckmob.release import shown, tables
from duckmob.release.counting import CountArgs, TransitionArgs
from duckmob.source.schema import Mapping
from duckmob.sql.udf import Request, Udf, one_row, points, resolving

_BUDGET_ROW = "STRUCT(source VARCHAR, eps DOUBLE, delta DOUBLE, spent DOUBLE, remaining DOUBLE)[]"
_TRANSITION_ROW = "STRUCT(prev_state BIGINT, from_state BIGINT, to_state BIGINT, count DOUBLE)[]"
_SEQS_TYPE = "STRUCT(traj_id BIGINT, user_id BIGINT, cells BIGINT[])[]"
_SQL_TYPES = {pa.string(): "VARCHAR", pa.float64(): "DOUBLE", pa.int64(): "BIGINT", pa.bool_(): "BOOLEAN",
              pa.timestamp("us"): "TIMESTAMP"}


def _struct(schema: pa.Schema) -> str:
    return "STRUCT(" + ", ".join(f"{f.name} {_SQL_TYPES[f.type]}" for f in schema) + ")[]"


CALLER_TYPE = "STRUCT(relation VARCHAR, database VARCHAR, schema VARCHAR, temp_tables VARCHAR[], temp_views VARCHAR[])"
_IDS = "STRUCT(traj_col VARCHAR, user_col VARCHAR)"
_SEQ_COLS = "STRUCT(traj_col VARCHAR, user_col VARCHAR, cells_col VARCHAR)"
# Each UDF's request (the STRUCT its macro in privacy.sql builds), parsed into keyword arguments: the caller's facts
# (``source``, from _mob_caller), the input path chosen when the statement was planned (``out_of_core``), the column
# types of the gathered rows (``types``, the schema), the column mapping, then the release's own public arguments,
# whose one typed definition is CountArgs / TransitionArgs (duckmob.release.counting).
OUT_OF_CORE = Request(relation="VARCHAR", database="VARCHAR", schema="VARCHAR")
SET_BUDGET = Request(source=CALLER_TYPE, eps="DOUBLE", delta="DOUBLE")
TRANSITIONS = Request(source=CALLER_TYPE, out_of_core="BOOLEAN", types="VARCHAR[]", mapping=_SEQ_COLS,
                      **TransitionArgs.sql_types())
NOISY_COUNT = Request(source=CALLER_TYPE, out_of_core="BOOLEAN", types="VARCHAR[]", mapping=_IDS,
                      **CountArgs.sql_types())


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


def caller(value: dict) -> dict:
    """The caller's facts (``_mob_caller`` in privacy.sql, a request's ``source``): relation, database, schema,
    temporary tables and views; the relation checked to be a name or a query (a non-empty string)."""
    facts = dict(value)
    facts["relation"] = validators.source_name(facts.get("relation"))
    return facts


def core_cursor(db, facts: dict):
    """A cursor of the release core's connection that resolves names as the caller does (its database and schema):
    it sees committed tables and views, not the caller's temporary objects (checked by the caller's facts)."""
    return resolving(db.cursor(), facts["database"], facts["schema"])


def readable(db, facts: dict) -> bool:
    """Whether the core's cursor can plan ``facts['relation']`` (a committed table or view, or a query over them):
    folded once when the statement is planned, so the other branch of a macro is never scanned."""
    try:
        with closing(core_cursor(db, facts)) as cur:
            cur.execute(f"SELECT * FROM {facts['relation']} LIMIT 0")
    except Exception:   # temp tables, CTEs, anything else: the gathered branch (which reports what is wrong)
        return False
    return True


def shadow_checked(db, facts: dict) -> str:
    """The relation, refused (before anything is reserved) when it -- or a view it reads, however deep -- mentions
    one of the caller's temporary tables or views while the release reads it on the core's connection, where that
    name means another object."""
    temporary = list(facts.get("temp_tables") or []) + list(facts.get("temp_views") or [])
    if temporary:
        with closing(core_cursor(db, facts)) as cur:
            tables.check_shadowing(facts["relation"], temporary, cur)
    return facts["relation"]


def mapping(value: dict) -> Mapping:
    """The column mapping of a request (its ``mapping`` STRUCT)."""
    return Mapping.of(**dict(value))


def path(request: dict) -> tuple[dict, dict, list | None, bool]:
    """A release request split into the caller's facts (checked), its column mapping (a dict, for :func:`mapping`),
    the gathered rows' column types and whether the release reads out of core; what remains in ``request`` is the
    release's keyword arguments."""
    return (caller(request.pop("source")), request.pop("mapping"), request.pop("types"),
            bool(request.pop("out_of_core")))


def public_args(request: dict, kind):
    """The release's public arguments (``kind``: :class:`CountArgs` or :class:`TransitionArgs`), taken out of a
    parsed request and validated, before the input is resolved (nothing opened yet, nothing to close on a
    refusal)."""
    return kind(**{name: request.pop(name) for name in kind.sql_types()})


def release_input(db, request: dict, shape: str, gathered: Callable) -> tables.Input:
    """The input of a SQL release, chosen here once (the one ``out_of_core`` branch) and taken out of ``request``
    (what remains is the release's keyword arguments): a relation the core's connection can read, read out of core
    on a cursor of that connection (it resolves names as the caller does but sees committed tables and views only:
    the macros send temporary tables through the gathered rows), refused first when a temporary object of the caller
    shadows what it reads; or the rows the macro gathered from a temporary table (``gathered()`` gives them in
    ``shape``), their column types checked first (the schema only)."""
    facts, cols, types, out_of_core = path(request)
    if out_of_core:
        relation = shadow_checked(db, facts)
        return tables.Relation(db, core_cursor(db, facts), relation, mapping(cols), shape=shape, owned=True,
                               caller_checked=True)
    return tables.Gathered(facts["relation"], facts.get("temp_tables"), types, mapping(cols), gathered, shape=shape)


def udfs(db) -> list[Udf]:
    def set_budget(request):
        r = SET_BUDGET.parse(request, "_mob_set_budget")
        facts, eps, delta = caller(r["source"]), r["eps"], r["delta"]
        source = facts["relation"]
        if eps is None or delta is None:
            raise DuckmobError(f"mob_set_budget needs both eps and delta, e.g. FROM mob_set_budget('{source}', "
                               "eps := 4, delta := 1e-5)")
        ledger.check_budget(eps, delta)   # the ledger's check of a budget, before the table is resolved
        if readable(db, facts):   # resolved as the caller resolves it, on a cursor of the core's connection
            shadow_checked(db, facts)
            on, temp_tables = closing(core_cursor(db, facts)), None
        else:                     # the caller's temporary table (its budget key), or a refusal
            on, temp_tables = db.connection(), facts.get("temp_tables")
        with on as cur:
            row = tables.set_budget(db, cur, source, eps, delta, temp_tables=temp_tables)
        return one_row(pa.table({k: [row[k]] for k in ("source", "eps", "delta", "spent", "remaining")}))

    def listing(shown_table):
        def udf(_):
            return one_row(shown_table(db))     # verified first, as a release does (duckmob.release.shown)
        return udf

    @release.interrupts.entered()   # Ctrl-C from the first moment
    def transitions(rows, request):
        """mob_transitions: of a relation the core's connection reads out of core, or of the gathered rows."""
        r = TRANSITIONS.parse(request, "_mob_transitions")
        args = public_args(r, TransitionArgs)
        inp = release_input(db, r, "sequences", lambda: points(rows))
        return _transition_rows(*tables.transitions(db, inp, args))

    @release.interrupts.entered()
    def noisy_count(rows, request):
        """mob_noisy_count: of a relation the core's connection reads (DuckDB counts, an integer reaches Python), or
        of the gathered (traj_id, user_id) rows."""
        r = NOISY_COUNT.parse(request, "_mob_noisy_count")
        args = public_args(r, CountArgs)   # what := NULL is 'trajectories'
        inp = release_input(db, r, "ids", lambda: tables.gathered_pairs(points(rows)))
        return one_row(pa.table({"count": [tables.noisy_count(db, inp, args)]}))

    def out_of_core(request):
        facts = OUT_OF_CORE.parse(request, "_mob_out_of_core")
        if not isinstance(facts["relation"], str) or not facts["relation"].strip():
            return pa.array([False] * len(request))
        return pa.array([readable(db, facts)] * len(request))

    return [
        Udf("_mob_transitions", transitions, [_SEQS_TYPE], _TRANSITION_ROW, TRANSITIONS, side_effects=True, special_nulls=True),
        Udf("_mob_noisy_count", noisy_count, ["STRUCT(traj_id BIGINT, user_id BIGINT)[]"], "STRUCT(count DOUBLE)[]",
            NOISY_COUNT, side_effects=True, special_nulls=True),
        Udf("_mob_out_of_core", out_of_core, [], "BOOLEAN", OUT_OF_CORE, special_nulls=True),
        Udf("_mob_set_budget", set_budget, [], _BUDGET_ROW, SET_BUDGET, side_effects=True, special_nulls=True),
        Udf("_mob_budgets", listing(shown.budgets), ["BOOLEAN"], _struct(shown.BUDGETS_SCHEMA), side_effects=True),
        Udf("_mob_ledger", listing(shown.releases), ["BOOLEAN"], _struct(shown.LEDGER_SCHEMA), side_effects=True),
    ]
