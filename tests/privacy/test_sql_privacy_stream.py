"""mob_noisy_count and mob_transitions read committed tables out of core (duckmob.release.inputs.Relation): the
same release as the in-memory list path (inputs.Gathered) bit for bit under a seed, both privacy units, with only
bounded data reaching Python."""

import duckdb
import numpy as np
import pytest

import duckmob
from duckmob.errors import DuckmobError
from duckmob.release import inputs
from duckmob.source import table as stream

SAMPLE = "duckmob/data/geolife_sample.parquet"
BBOX = [39.8477, 116.1956, 40.1133, 116.4880]
BIG = 18446744073709551615   # beyond BIGINT: TRY_CAST makes it NULL on both paths


@pytest.fixture(scope="module")
def con():
    c = duckdb.connect()
    duckmob.register(c)
    # 400 trajectories of the shipped sample (points, for the count) and their cell sequences on an 8 x 8 grid;
    # each committed table (read out of core) has a TEMP copy (gathered as lists: the in-memory path)
    c.execute(f"CREATE TABLE t AS FROM '{SAMPLE}' WHERE traj_id IN "
              f"(SELECT DISTINCT traj_id FROM '{SAMPLE}' ORDER BY traj_id % 89, traj_id LIMIT 400)")
    c.execute(f"CREATE TABLE s AS FROM mob_cell_sequences('t', bbox := {BBOX}, w := 8, outside := 'drop', "
              "stay_points := false)")
    # what the list path does with odd rows: an id beyond BIGINT (NULL: traj_id sorted as -1, user dropped under
    # the user unit), a NULL user, a NULL cell and a cell beyond n_states (the sequence dropped), unsigned types
    c.execute("CREATE TABLE e AS SELECT * FROM (VALUES (1::UBIGINT, 3::UBIGINT, [0, 1, 2]::INTEGER[]), "
              f"(2, {BIG}, [1, 2]), ({BIG}, 3, [2, 2, 1]), (4, 4, [1, NULL]), (5, 3, [3, 1, 0]), (6, NULL, [0]), "
              "(7, 4, [9, 1]), (10, 3, [3, 0]), (8, 3, [2, 3, 3, 1]), (9, 4, [0, 0])) v(traj_id, user_id, cells)")
    for name in ("t", "s", "e"):
        c.execute(f"CREATE TEMP TABLE {name}_mem AS FROM {name}")
    for name in ("t", "s", "e", "t_mem", "s_mem", "e_mem"):
        c.execute(f"FROM mob_set_budget('{name}', eps := 1000, delta := 1e-3)").fetchall()
    yield c
    c.close()


@pytest.fixture
def loaded(monkeypatch):
    """How each release read its rows, by kind: 'count' (an integer counted by DuckDB), 'batches' (record batches
    read by the release) or 'lists' (the rows gathered by the macro)."""
    seen = []

    def spy(fn, kind):
        def wrapped(*args, **kw):
            seen.append(kind)
            return fn(*args, **kw)
        return wrapped

    monkeypatch.setattr(inputs, "count_query", spy(inputs.count_query, "count"))
    monkeypatch.setattr(inputs, "pair_count", spy(inputs.pair_count, "lists"))
    monkeypatch.setattr(inputs, "read_sequences", spy(inputs.read_sequences, "batches"))
    monkeypatch.setattr(inputs, "sequence_arrays", spy(inputs.sequence_arrays, "lists"))
    return seen


def _one(con, sql):
    return con.sql(sql).fetchall()


@pytest.mark.parametrize("table", ["t", "e"])
@pytest.mark.parametrize("unit,what", [("trajectory", "trajectories"), ("user", "trajectories"),
                                       ("trajectory", "users"), ("user", "users")])
def test_noisy_count_out_of_core_equals_the_list_path(con, loaded, table, unit, what):
    k = 2 if unit == "user" and what == "trajectories" else None
    args = f"eps := 1.0, seed := 4, privacy_unit := '{unit}', max_trajectories_per_user := {k or 'NULL'}, " \
           f"what := '{what}'"
    got = _one(con, f"FROM mob_noisy_count('{table}', {args})")
    want = _one(con, f"FROM mob_noisy_count('{table}_mem', {args})")
    assert loaded == ["count", "lists"]          # only an integer reached Python from the committed table
    assert got == want and len(got) == 1
    assert got[0][0] != round(got[0][0])         # noisy


@pytest.mark.parametrize("table", ["s", "e"])
@pytest.mark.parametrize("unit", ["trajectory", "user"])
@pytest.mark.parametrize("order,support", [(1, None), (2, None), (2, "neighbours")])
def test_transitions_out_of_core_equal_the_list_path(con, loaded, monkeypatch, table, unit, order, support):
    monkeypatch.setattr(stream, "SEQUENCE_ROWS", 3 if table == "e" else 40)   # many batches
    k = 2 if unit == "user" else None
    sup = f", support := '{support}', w := 8" if support else ""
    n_states = 64 if table == "s" else 4
    if support and table == "e":
        sup = f", support := '{support}', w := 2"
    args = f"markov_order := {order}, eps := 1.0, n_states := {n_states}, seed := 9, privacy_unit := '{unit}', " \
           f"max_trajectories_per_user := {k or 'NULL'}, max_length := 30{sup}"
    got = _one(con, f"FROM mob_transitions('{table}', {args}) ORDER BY ALL")
    want = _one(con, f"FROM mob_transitions('{table}_mem', {args}) ORDER BY ALL")
    assert loaded[-1] == "lists" and set(loaded[:-1]) == {"batches"}   # read twice under the user unit
    assert got == want
    assert len(got) > (50 if table == "s" else 3)


def test_only_batches_of_whole_sequences_reach_python(con, monkeypatch, loaded):
    """The committed table's sequences arrive SEQUENCE_ROWS at a time (twice under the user unit: the ids for the
    bounding, then the windows); the list path hands over all of them in one call."""
    sizes = []
    decode = stream.sequence_arrays

    def spy(rows):
        out = decode(rows)
        sizes.append(len(out[0]) - 1)
        return out

    monkeypatch.setattr(stream, "sequence_arrays", spy)
    monkeypatch.setattr(inputs, "sequence_arrays", spy)
    monkeypatch.setattr(stream, "SEQUENCE_ROWS", 16)
    n = _one(con, "SELECT count(*) FROM s")[0][0]
    args = "eps := 1.0, n_states := 64, seed := 2, privacy_unit := 'user', max_trajectories_per_user := 3"
    out = _one(con, f"FROM mob_transitions('s', {args}) ORDER BY ALL")
    assert set(loaded) == {"batches"}
    assert max(sizes) <= 16 and sum(sizes) == 2 * n and len(sizes) >= 2 * (n // 16)
    sizes.clear()
    assert _one(con, f"FROM mob_transitions('s_mem', {args}) ORDER BY ALL") == out
    assert sizes == [n]


def test_a_temp_table_hiding_the_committed_one_is_refused_for_free(con):
    other = duckdb.connect()
    try:
        duckmob.register(other)
        other.execute("CREATE TABLE x AS SELECT 1 AS traj_id, 2 AS user_id, [0, 1] AS cells")
        other.execute("FROM mob_set_budget('x', eps := 10, delta := 0)").fetchall()
        other.execute("CREATE TEMP TABLE x AS SELECT 1 AS traj_id, 2 AS user_id, [0, 1] AS cells")
        for sql in ("FROM mob_noisy_count('x', eps := 1)", "FROM mob_transitions('x', eps := 1, n_states := 4)"):
            with pytest.raises(duckdb.Error, match="a temporary table or view named 'x' hides the table"):
                other.sql(sql).fetchall()
        assert other.sql("FROM mob_ledger()").fetchall() == []
    finally:
        other.close()


def test_a_table_made_in_the_open_transaction_is_refused_for_free(con, loaded):
    """The core's connection sees committed tables only: a table made inside the caller's transaction cannot be
    resolved to its base tables from SQL, so its release is refused before anything is reserved (say COMMIT)."""
    other = duckdb.connect()
    try:
        duckmob.register(other)
        other.execute("CREATE TABLE z AS SELECT 1 AS traj_id")
        other.execute("FROM mob_set_budget('z', eps := 10, delta := 0)").fetchall()
        other.execute("BEGIN")
        other.execute("CREATE TABLE y AS SELECT range AS traj_id, range % 3 AS user_id FROM range(40)")
        with pytest.raises(duckdb.Error, match="not committed yet"):
            other.sql("FROM mob_noisy_count('y', eps := 1, seed := 3)").fetchall()
        other.execute("COMMIT")
        assert loaded == []
        assert other.sql("FROM mob_ledger()").fetchall() == []
    finally:
        other.close()


def test_python_api_checks_the_types_as_the_macros(con):
    con.execute("CREATE TABLE bad AS SELECT 'a' AS traj_id, 1 AS user_id, [0] AS cells")
    con.execute("FROM mob_set_budget('bad', eps := 10, delta := 0)").fetchall()
    with pytest.raises(DuckmobError, match="trajectory id column traj_id has type VARCHAR, not an integer"):
        duckmob.noisy_count(con, "bad", eps=1.0)
    with pytest.raises(DuckmobError, match="trajectory id column traj_id has type VARCHAR"):
        duckmob.transitions(con, "bad", eps=1.0, n_states=4)
    assert con.sql("SELECT count(*) FROM mob_ledger() WHERE source = 'bad'").fetchall() == [(0,)]
    # the Python API reads the caller's connection: a temp table is read out of core there too, the same release
    got = duckmob.noisy_count(con, "e_mem", eps=1.0, seed=8, privacy_unit="User", max_trajectories_per_user=1)
    assert got == _one(con, "FROM mob_noisy_count('e_mem', eps := 1.0, seed := 8, privacy_unit := 'User', "
                            "max_trajectories_per_user := 1)")[0][0]
    assert np.isfinite(got)
