"""The dbt-duckdb plugin: every duckmob function inside dbt models, hooks and tests.

In ``profiles.yml``::

    my_profile:
      target: dev
      outputs:
        dev:
          type: duckdb
          path: trips.duckdb
          plugins:
            - module: duckmob.dbt
              alias: duckmob

Then a model is plain SQL, e.g. ``FROM synthesize('{{ ref("trips") }}', eps := 1.0, bbox := [...])`` materialised
as a table. What the plugin does:

- ``configure_connection``: registers duckmob's UDFs (database-wide, once per dbt run) and creates the ledger
  tables (``duckmob_budget``, ``duckmob_ledger``) in the target database;
- ``configure_cursor``: creates the TEMP macros (``synthesize``, ``mob_*``) on each thread's cursor, since a
  DuckDB cursor does not see its parent's TEMP macros;
- ``load``: a source whose ``meta`` says ``plugin: duckmob`` is read from a Parquet file, ``meta.path``, or the
  GeoLife sample shipped with duckmob when no path is given (so the example project needs no data of its own);
- errors: a failing model shows duckmob's own one-line message (``duckmob: no privacy budget declared for ...``)
  instead of DuckDB's UDF wrapper text (see :func:`_install_error_messages`).

The privacy budget is the data owner's declaration, kept in the target database: a model that synthesises needs
``FROM mob_set_budget('<source>', eps := ..., delta := ...)`` to have run first, e.g. as its ``pre_hook``
(examples/dbt_project does that). Every run that rebuilds a synthetic model is a new release and is charged
again; the ledger refuses a run that would go past the budget, before reading any data.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Any

import pyarrow.parquet as pq
from dbt.adapters.duckdb.plugins import BasePlugin

from duckmob.errors import one_line
from duckmob.sql import register


class Plugin(BasePlugin):
    """duckmob for dbt-duckdb (module ``duckmob.dbt``; any alias)."""

    def initialize(self, plugin_config: dict[str, Any]) -> None:
        self.config = dict(plugin_config or {})
        _install_error_messages()

    def configure_connection(self, conn) -> None:
        register(conn)

    def configure_cursor(self, cursor) -> None:
        register(cursor)

    def load(self, source_config):
        """The rows of a plugin source as a pyarrow Table: the Parquet file at ``meta.path``, or duckmob's shipped
        GeoLife sample when the source names no path."""
        from duckmob.samples import sample_path

        path = source_config.get("path") or sample_path()
        return pq.read_table(path)


_RAISE = re.compile(r"FROM mob_set_budget\('([^']*)', eps := ([^,]+), delta := ([^)]+)\)")


def for_dbt(text: str) -> str:
    """A budget message's next step said where a dbt user declares the budget: in the project (the
    ``mob_set_budget`` hook of the model, whose eps is usually a var), not by running SQL by hand."""
    return _RAISE.sub(lambda m: f"the eps your project passes to mob_set_budget (a pre_hook; in the example project "
                                f"dbt run --vars '{{budget_eps: {m.group(2)}}}')", text)


def _install_error_messages() -> None:
    """Make dbt show duckmob's one-line message for a duckmob error raised in a model or hook.

    dbt-duckdb turns every DuckDB exception into ``DbtRuntimeError(str(exc))``, and a duckmob error raised in a UDF
    reads ``Invalid Input Error: Python exception occurred while executing the UDF: BudgetError: ...``. A plugin
    sees no exception, so this wraps the adapter's ``exception_handler`` once per process: errors that carry a
    duckmob message (or a column missing from a duckmob call's input) are re-raised with
    :func:`duckmob.errors.one_line`; everything else passes unchanged.
    """
    from dbt.adapters.duckdb.connections import DuckDBConnectionManager
    from dbt_common.exceptions import DbtRuntimeError

    original = DuckDBConnectionManager.exception_handler
    if getattr(original, "_duckmob", False):
        return

    @contextmanager
    def exception_handler(self, sql: str, connection_name: str = "master"):
        try:
            with original(self, sql, connection_name):
                yield
        except DbtRuntimeError as exc:
            cause = exc.__cause__ if exc.__cause__ is not None else exc
            text = one_line(cause, sql)   # also names a column missing from a duckmob call's input
            if text.startswith("duckmob: "):
                raise DbtRuntimeError(for_dbt(text)) from cause
            raise

    exception_handler._duckmob = True
    DuckDBConnectionManager.exception_handler = exception_handler
