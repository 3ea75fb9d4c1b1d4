"""The narrow SQL adapter (duckmob/sql): every UDF takes its data columns and ONE request STRUCT, matched by name and
parsed in one place; one macro body per SQL function; the areas registered explicitly; ``duckmob.evaluate`` an
ordinary function; SQL quoting written once."""

from __future__ import annotations

import importlib
import pathlib
import re
import types

import duckdb
import pyarrow as pa
import pytest

import duckmob
from duckmob.errors import DuckmobError
from duckmob.sql import _areas
from duckmob.sql.udf import MAX_PARAMS, Request

ROOT = pathlib.Path(__file__).resolve().parents[1] / "duckmob"


def _udfs(con) -> dict[str, list[str]]:
    """Every non-macro function a registered connection has and a plain DuckDB connection does not: the Python UDFs
    duckmob registered (from any place: the areas, the release core), with their parameter types."""
    query = "SELECT function_name, parameter_types FROM duckdb_functions() WHERE macro_definition IS NULL"
    plain = duckdb.connect()
    try:
        builtin = {name for name, _ in plain.sql(query).fetchall()}
    finally:
        plain.close()
    return {name: params for name, params in con.sql(query).fetchall() if name not in builtin}


@pytest.fixture
def con():
    c = duckmob.connect()
    yield c
    c.close()


def test_no_registered_udf_has_more_than_eight_parameters(con):
    udfs = _udfs(con)
    from duckmob import release

    declared = {udf.name for area in _areas() for udf in area.udfs(release.database(con))}
    assert declared <= set(udfs), declared - set(udfs)   # the enumeration sees every area's UDFs
    assert "_mob_instance" in udfs                         # and those registered elsewhere
    too_many = {name: len(params) for name, params in udfs.items() if len(params) > MAX_PARAMS}
    assert MAX_PARAMS == 8 and not too_many, too_many


def test_the_release_udfs_take_their_columns_and_one_request(con):
    udfs = _udfs(con)
    for name in ("_mob_synthesize", "_mob_fit", "_mob_transitions", "_mob_noisy_count", "_mob_sample",
                 "_mob_set_budget", "_mob_evaluate", "_mob_cell_sequences"):
        assert udfs[name][-1].startswith("STRUCT("), (name, udfs[name])
        assert not any(t.startswith("STRUCT(") and not t.endswith("[]") for t in udfs[name][:-1]), udfs[name]


def test_every_area_is_listed_with_its_udfs_setup_and_sql():
    names = [a.__name__.rpartition(".")[2] for a in _areas()]
    assert names == ["trajectories", "privacy", "evaluate", "synth", "demo", "roads", "report"]
    for area in _areas():
        assert callable(area.udfs) and callable(area.setup)
        assert (ROOT / "sql" / f"{area.__name__.rpartition('.')[2]}.sql").is_file()
    init = (ROOT / "sql" / "__init__.py").read_text()
    assert "hasattr(" not in init and not re.search(r"^\s*except\b", init, re.M)


def test_a_request_is_parsed_by_name_and_refuses_missing_or_unknown_keys():
    req = Request(eps="DOUBLE", seed="BIGINT", order="BIGINT")
    assert req.sql_type == 'STRUCT("eps" DOUBLE, "seed" BIGINT, "order" BIGINT)'
    assert req.parse({"seed": 3, "order": 1, "eps": 0.5}) == {"eps": 0.5, "seed": 3, "order": 1}
    arrow = pa.array([{"eps": 0.5, "seed": None, "order": 2}])
    assert req.parse(arrow) == {"eps": 0.5, "seed": None, "order": 2}
    with pytest.raises(DuckmobError, match=r"_mob_x received a request with missing keys \['order'\]"):
        req.parse({"eps": 1.0, "seed": 1}, "_mob_x")
    with pytest.raises(DuckmobError, match=r"unknown keys \['k'\].*expected exactly \['eps', 'seed', 'order'\]"):
        req.parse({"eps": 1.0, "seed": 1, "order": 1, "k": 2})
    with pytest.raises(DuckmobError, match="NULL request"):
        req.parse(pa.array([None], pa.struct([("eps", pa.float64())])))


def test_duckdb_binds_a_request_by_name_never_by_position():
    """What the adapter relies on: a STRUCT literal with the declared keys in another order reaches the UDF under the
    right names (values cast to the declared types); a missing or extra key does not bind at all."""
    req = Request(eps="DOUBLE", method="VARCHAR", n="BIGINT")
    seen = []

    def udf(request):
        seen.append(req.parse(request, "_t"))
        return pa.array([1] * len(request))

    c = duckdb.connect()
    try:
        c.create_function("_t", udf, [req.sql_type], "BIGINT", type="arrow", null_handling="special")
        c.sql("SELECT _t({'n': 7, 'method': 'privtrace', 'eps': 1})").fetchall()
        assert seen == [{"eps": 1.0, "method": "privtrace", "n": 7}] and isinstance(seen[0]["eps"], float)
        for bad in ("{'n': 7, 'method': 'privtrace'}", "{'n': 7, 'method': 'x', 'eps': 1, 'seed': 2}"):
            with pytest.raises(duckdb.BinderException):
                c.sql(f"SELECT _t({bad})").fetchall()
    finally:
        c.close()


RELEASE_MACROS = {"synth.sql": ("synthesize", "mob_fit"), "privacy.sql": ("mob_transitions", "mob_noisy_count")}


def _macros() -> dict[str, list[str]]:
    bodies: dict[str, list[str]] = {}
    for path in sorted((ROOT / "sql").glob("*.sql")):
        parts = re.split(r"CREATE OR REPLACE TEMP MACRO (\w+)", path.read_text())
        for name, body in zip(parts[1::2], parts[2::2]):
            bodies.setdefault(name, []).append(body)
    return bodies


def test_one_macro_body_per_sql_function():
    bodies = _macros()
    assert {name: len(b) for name, b in bodies.items() if len(b) > 1} == {}
    for names in RELEASE_MACROS.values():
        for name in names:
            (body,) = bodies[name]
            assert "UNION" not in body.upper(), name
            assert "_mob_readable(tbl)" in body and "'out_of_core'" in body, name


@pytest.mark.parametrize("macro", ["synthesize('{t}', eps := 1.0, bbox := [39.8, 116.2, 40.1, 116.5])",
                                   "mob_noisy_count('{t}', eps := 0.5)"])
def test_a_committed_table_is_read_out_of_core_and_never_gathered(con, macro):
    con.execute("CREATE TABLE trips AS SELECT 1 AS traj_id, 1 AS user_id, TIMESTAMP '2024-01-01' AS ts, "
                "40.0 AS lat, 116.3 AS lon")
    con.execute("CREATE TEMP TABLE temp_trips AS FROM trips")
    committed = con.sql("EXPLAIN FROM " + macro.format(t="trips")).fetchall()[0][1]
    temporary = con.sql("EXPLAIN FROM " + macro.format(t="temp_trips")).fetchall()[0][1]
    assert "Empty Result" in committed and "Empty Result" not in temporary


def test_duckmob_evaluate_is_an_ordinary_function():
    from duckmob.api import evaluate

    assert duckmob.evaluate is evaluate and isinstance(evaluate, types.FunctionType)
    metrics = importlib.import_module("duckmob.metrics")   # its own name: nothing rebinds duckmob.evaluate

    assert duckmob.evaluate is evaluate and type(duckmob) is types.ModuleType and duckmob.metrics is metrics
    assert callable(metrics.load_side) and callable(metrics.table_points)


def test_sql_quoting_is_written_once():
    pattern = re.compile(r"""replace\(\s*(["'])(?:'|")\1\s*,""")
    found = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py") if pattern.search(p.read_text()))
    assert found == ["source/schema.py"], found
