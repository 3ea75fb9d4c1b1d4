"""The public arguments of a fit have one typed definition (duckmob.release.FitArgs): the SQL macros, the request
STRUCT their UDFs receive, fit_request, the Python API and Spark's synthesize are checked against it here, so an
argument added in one place and forgotten in another fails."""

from __future__ import annotations

import dataclasses
import inspect

from duckmob import api, spark
from duckmob.release import FitArgs, fit_request
from duckmob.sql import synth as sql_synth

ARGS = [f.name for f in dataclasses.fields(FitArgs)]
MAPPING = {"traj_col", "ts_col", "lat_col", "lon_col", "user_col"}


def _keywords(fn) -> dict:
    return {p.name: p.default for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


def test_fit_request_takes_exactly_the_arguments_with_the_same_defaults():
    given = _keywords(fit_request)
    assert given.pop("source") is inspect.Parameter.empty
    defaults = {f.name: f.default for f in dataclasses.fields(FitArgs)}
    assert given == {**defaults, "eps": inspect.Parameter.empty}
    assert defaults["eps"] is dataclasses.MISSING   # required in both


def test_the_fit_udfs_receive_the_arguments_in_the_macros_order():
    keys = list(sql_synth.FIT.fields)
    assert keys[:4] == ["source", "out_of_core", "types", "mapping"]
    assert keys[4:] == ARGS
    assert sql_synth.FIT.fields["eps"] == "DOUBLE" and sql_synth.FIT.fields["name"] == "VARCHAR"


def test_the_macros_take_the_arguments(con):
    params = dict(con.sql("SELECT function_name, parameters FROM duckdb_functions() "
                          "WHERE function_name IN ('synthesize', 'mob_fit')").fetchall())
    assert set(params["synthesize"]) == {"tbl"} | MAPPING | (set(ARGS) - {"name"})
    # mob_fit names the model (its second argument) and draws no rows (no n, no max_rows)
    assert params["mob_fit"][:2] == ["tbl", "name"]
    assert set(params["mob_fit"]) == {"tbl"} | MAPPING | (set(ARGS) - {"n", "max_rows"})


def test_the_python_and_spark_apis_take_the_arguments():
    assert set(ARGS) - {"name"} <= set(_keywords(api.synthesize))
    assert set(ARGS) - {"name", "outside"} <= set(_keywords(spark.synthesize))   # Spark always drops outside points
