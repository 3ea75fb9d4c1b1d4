"""SQL layer for the privacy core: budgets and the ledger, noisy counts, noisy transition counts.

Hidden UDFs behind the macros in privacy.sql. Anything that writes the ledger or draws noise is registered with
``side_effects=True`` and reaches the database through ``con.cursor()`` (never the calling connection).
"""

from __future__ import annotations

import duckdb
import pyarrow as pa

from duckmob.errors import DuckmobError
from duckmob.privacy import accounting, ledger
from duckmob.sql import Udf, one_row, scalar

_BUDGET_ROW = "STRUCT(source VARCHAR, eps DOUBLE, delta DOUBLE, spent DOUBLE, remaining DOUBLE)[]"


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

    def budgets(_):
        cur = con.cursor()
        try:
            rows = ledger.budgets(cur)
        finally:
            cur.close()
        return one_row(pa.Table.from_pylist(rows, schema=_BUDGETS_SCHEMA))

    def releases(_):
        cur = con.cursor()
        try:
            rows = ledger.releases(cur)
        finally:
            cur.close()
        return one_row(pa.Table.from_pylist(rows, schema=_LEDGER_SCHEMA))

    return [
        Udf("_mob_set_budget", set_budget, ["VARCHAR", "DOUBLE", "DOUBLE"], _BUDGET_ROW, side_effects=True,
            special_nulls=True),
        Udf("_mob_budgets", budgets, ["BOOLEAN"], _struct(_BUDGETS_SCHEMA), side_effects=True),
        Udf("_mob_ledger", releases, ["BOOLEAN"], _struct(_LEDGER_SCHEMA), side_effects=True),
    ]
