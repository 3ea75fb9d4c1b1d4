"""The privacy SQL functions through duckmob.connect(): budgets checked and spent, only noisy output."""

import duckdb
import numpy as np
import pytest

from duckmob.errors import BudgetError, one_line
from duckmob.privacy import accounting as acc
from duckmob.privacy import ledger

BBOX = "[39.8477, 116.1956, 40.1133, 116.4880]"


@pytest.fixture
def seqs(con):
    con.execute("CREATE TABLE seqs AS SELECT * FROM (VALUES (1, 10, [0, 1, 2]), (2, 10, [2, 0]), (3, 11, [1]), "
                "(4, NULL, [3, 3, 1])) t(traj_id, user_id, cells)")
    return con


def refused(con, sql) -> str:
    with pytest.raises(duckdb.Error) as err:
        con.sql(sql).fetchall()
    return one_line(err.value)


def test_refused_without_budget_and_nothing_recorded(seqs):
    msg = refused(seqs, "FROM mob_transitions('seqs', eps := 1, n_states := 4)")
    assert msg == ("duckmob: no privacy budget declared for 'seqs': run FROM mob_set_budget('seqs', eps := ..., "
                   "delta := ...) first")
    assert "mob_set_budget('seqs'" in refused(seqs, "FROM mob_noisy_count('seqs', eps := 1)")
    assert seqs.sql("FROM mob_ledger()").fetchall() == []


def test_transitions_spend_and_record(seqs):
    seqs.sql("FROM mob_set_budget('seqs', eps := 2, delta := 0)").fetchall()
    q = "FROM mob_transitions('seqs', eps := 0.5, n_states := 4, seed := 7) ORDER BY from_state, to_state"
    rows = seqs.sql(q).fetchall()
    assert all(r[0] is None and r[3] > 0 for r in rows)  # NormCut-ed, zeros omitted, prev_state NULL
    assert {r[1] for r in rows} <= set(range(5)) and {r[2] for r in rows} <= {0, 1, 2, 3, 5}
    assert rows == seqs.sql(q).fetchall()  # the same request again: the same release, charged once
    assert len(seqs.sql("FROM mob_ledger()").fetchall()) == 1
    again = seqs.sql(q.replace("'seqs'", "'SEQS'")).fetchall()   # another request (its own SELECT), seeded alike
    assert again == rows                                          # seeded: reproducible
    led = seqs.sql("SELECT source, mechanism, epsilon, privacy_unit, seeded, event FROM mob_ledger()").fetchall()
    assert len(led) == 2
    assert led[0][:5] == ("seqs", "transition_counts(order=1)", 0.5, "trajectory", True)
    assert acc.Event.from_json(led[0][5]) == acc.laplace(0.5)
    assert ledger.spent(seqs, "seqs") == pytest.approx(1.0)
    msg = refused(seqs, "FROM mob_transitions('seqs', eps := 1.5, n_states := 4)")
    assert msg.startswith("duckmob: privacy budget of 'seqs' exceeded: eps 1 of 2 is spent (1 left) and this release "
                          "needs eps 1.5; use a smaller eps, or raise the budget to at least 2.5: "
                          "FROM mob_set_budget('seqs', eps := 2.5, delta := 0)")
    assert len(seqs.sql("FROM mob_ledger()").fetchall()) == 2  # a refused release records nothing


def test_second_order_and_options(seqs):
    seqs.sql("FROM mob_set_budget('seqs', eps := 10, delta := 1e-6)").fetchall()
    rows = seqs.sql("FROM mob_transitions('seqs', markov_order := 2, eps := 1, n_states := 4, seed := 1)").fetchall()
    assert rows and all(r[0] is not None and r[3] > 0 for r in rows)
    assert all(r[1] < 4 for r in rows)  # the middle state of a triple is a real cell
    seqs.execute("UPDATE seqs SET user_id = 12 WHERE user_id IS NULL")
    nb = seqs.sql("FROM mob_transitions('seqs', eps := 1, n_states := 4, w := 2, support := 'neighbours', "
                  "max_length := 2, privacy_unit := 'user', max_trajectories_per_user := 1, seed := 2)").fetchall()
    assert all(r[3] > 0 for r in nb)
    assert seqs.execute("SELECT privacy_unit FROM mob_ledger() ORDER BY id DESC LIMIT 1").fetchall()[0][0] == "user"


def test_argument_errors_say_the_fix(seqs):
    seqs.sql("FROM mob_set_budget('seqs', eps := 10, delta := 1e-6)").fetchall()
    assert "n_states" in refused(seqs, "FROM mob_transitions('seqs', eps := 1)")
    assert "eps is required" in refused(seqs, "FROM mob_transitions('seqs', n_states := 4)")
    assert "max_trajectories_per_user" in refused(
        seqs, "FROM mob_transitions('seqs', eps := 1, n_states := 4, privacy_unit := 'user')")
    assert "markov_order must be 1 or 2" in refused(seqs, "FROM mob_transitions('seqs', markov_order := 3, "
                                                         "eps := 1, n_states := 4)")
    assert "support := 'neighbours' needs the grid width" in refused(
        seqs, "FROM mob_transitions('seqs', eps := 1, n_states := 4, support := 'neighbours')")
    assert "too small" in refused(seqs, "FROM mob_transitions('seqs', eps := 1e-300, n_states := 4)")
    assert len(seqs.sql("FROM mob_ledger()").fetchall()) == 0  # refused before reserving: nothing recorded
    # a cell id beyond the public n_states is not refused (that would reveal the largest id): its trajectory is
    # dropped, and the release is recorded like any other
    rows = seqs.sql("FROM mob_transitions('seqs', eps := 1, n_states := 3, seed := 1)").fetchall()
    assert all(max(r[1], r[2]) <= 4 for r in rows)
    assert seqs.sql("SELECT status FROM mob_ledger()").fetchall() == [("spent",)]


def test_noisy_count(seqs):
    seqs.sql("FROM mob_set_budget('seqs', eps := 1000, delta := 0)").fetchall()
    values = [seqs.execute(f"FROM mob_noisy_count('seqs', eps := 1, seed := {s})").fetchall()[0][0] for s in range(40)]
    assert np.mean(values) == pytest.approx(4, abs=1.0)
    assert seqs.execute("FROM mob_noisy_count('seqs', eps := 1, what := 'users', seed := 1)").fetchall()[0][0] != 2
    # trajectory 4 has no user: under the user unit it is not counted (no refusal: that would be a release too)
    seqs.execute("FROM mob_noisy_count('seqs', eps := 50, privacy_unit := 'user', max_trajectories_per_user := 1)")
    seqs.execute("UPDATE seqs SET user_id = 12 WHERE user_id IS NULL")
    capped = [seqs.execute(f"FROM mob_noisy_count('seqs', eps := 20, privacy_unit := 'user', "
                           f"max_trajectories_per_user := 1, seed := {s})").fetchall()[0][0] for s in range(20)]
    assert np.mean(capped) == pytest.approx(3, abs=0.2)  # users 10, 11, 12: one trajectory each
    rows = seqs.sql("SELECT mechanism, params->>'sensitivity' FROM mob_ledger() ORDER BY id").fetchall()
    assert rows[40] == ("count(users)", "1") and rows[-1] == ("count(trajectories)", "1")
    assert len(rows) == 62


def test_noisy_count_contribution_bound_only_where_it_applies(seqs):
    seqs.sql("FROM mob_set_budget('seqs', eps := 100, delta := 0)").fetchall()
    # a bound with the trajectory unit would be ignored: refused instead, before anything is spent
    assert "only applies with privacy_unit := 'user'" in refused(
        seqs, "FROM mob_noisy_count('seqs', eps := 1, max_trajectories_per_user := 3)")
    # the user count has sensitivity 1 under the user unit too: no bound needed, none recorded
    seqs.execute("FROM mob_noisy_count('seqs', eps := 1, what := 'users', privacy_unit := 'user', seed := 1)").fetchall()
    (row,) = seqs.sql("SELECT privacy_unit, params->>'sensitivity', params->>'max_trajectories_per_user' "
                      "FROM mob_ledger()").fetchall()
    assert row == ("user", "1", None)


def test_on_cell_sequences_of_the_shipped_sample(con):
    con.execute("CREATE TABLE pts AS FROM 'duckmob/data/geolife_sample.parquet'")
    con.execute(f"CREATE TABLE trips_cells AS FROM mob_cell_sequences('pts', bbox := {BBOX}, w := 8, "
                "stay_points := false, outside := 'drop')")
    con.sql("FROM mob_set_budget('trips_cells', eps := 1, delta := 1e-5)").fetchall()
    n, total = con.execute("SELECT count(*), sum(count) FROM mob_transitions('trips_cells', eps := 1, "
                           "n_states := 64, seed := 3)").fetchall()[0]
    true_n = con.execute("SELECT count(*) FROM trips_cells").fetchall()[0][0]
    assert 0 < n < 66 * 66
    assert total == pytest.approx(true_n, rel=0.1)  # first-order mass ~ number of trajectories


def test_set_budget_on_a_missing_table_is_refused(seqs):
    assert refused(seqs, "FROM mob_set_budget('seq', eps := 1, delta := 0)") == (
        "duckmob: no such table or view: 'seq' (SHOW TABLES lists them); mob_set_budget declares the budget of "
        "the table that releases will read")
    assert "no such table or view: 'other.seqs'" in refused(seqs, "FROM mob_set_budget('other.seqs', eps := 1, "
                                                                   "delta := 0)")
    assert seqs.sql("FROM mob_budget()").fetchall() == []
    seqs.execute("CREATE VIEW v AS FROM seqs; CREATE SCHEMA s; CREATE TABLE s.Cells AS FROM seqs; "
                 "CREATE TEMP TABLE tmp AS FROM seqs")
    names = ["seqs", "SEQS", "main.seqs", "memory.main.seqs", '"memory"."main"."seqs"', "v", "s.cells", "tmp",
             "temp.tmp", "(SELECT * FROM seqs)"]
    for name in names:   # tables, views, TEMP tables, qualified and quoted names, a parenthesised query
        seqs.sql(f"FROM mob_set_budget('{name}', eps := 1, delta := 0)").fetchall()
    # the budget belongs to the base table, whatever the spelling: three tables, three budgets
    assert [r[0] for r in seqs.sql("FROM mob_budget()").fetchall()] == ["s.Cells", "seqs", "temp.tmp"]
    # a declared budget can still be changed once its table is gone (its ledger stays)
    seqs.execute("DROP TABLE s.cells")
    assert seqs.sql("SELECT eps FROM mob_set_budget('s.Cells', eps := 3, delta := 0)").fetchall() == [(3.0,)]


def test_a_pure_laplace_release_past_a_delta_zero_budget_is_told_to_raise_eps(seqs):
    seqs.sql("FROM mob_set_budget('seqs', eps := 1, delta := 0)").fetchall()
    msg = refused(seqs, "FROM mob_noisy_count('seqs', eps := 2)")
    assert "exceeded" in msg and "mob_set_budget('seqs', eps := 2, delta := 0)" in msg  # raising eps works here


def test_a_release_needing_delta_against_a_delta_zero_budget_says_so(con):
    """A Gaussian / DP-SGD event has no finite eps at delta 0: the refusal asks for a positive delta (or a
    pure-eps method), never for a larger eps at delta 0."""
    con.execute("CREATE TABLE t AS SELECT 1 AS traj_id")
    con.sql("FROM mob_set_budget('t', eps := 4, delta := 0)").fetchall()
    p = ledger.prior(con, "t")
    with pytest.raises(BudgetError) as err:
        p.check(acc.dp_sgd(1.0, 0.01, 100))
    assert str(err.value) == (
        "the privacy budget of 't' has delta 0, and this release (" + str(acc.dp_sgd(1.0, 0.01, 100)) +
        ") needs delta > 0: declare a positive delta, e.g. FROM mob_set_budget('t', eps := 4, delta := 1e-5), or "
        "use a pure-eps method (method := 'privtrace')")
    assert "delta := 0)" not in str(err.value)


@pytest.mark.parametrize("rows", ["(1, 'alice-7', [0, 1]), (2, 'bob', [1, 2])", "(1, 'alice-7', [0, 1]) LIMIT 0"])
def test_a_non_integer_id_column_is_refused_by_its_type_quoting_no_value(con, rows):
    """The refusal depends on the schema only (the same on an empty table) and is free: nothing reserved."""
    con.execute(f"CREATE TABLE t AS SELECT * FROM (VALUES {rows}) v(traj_id, user_id, cells)")
    con.execute("CREATE TABLE u AS SELECT user_id AS traj_id, traj_id AS user_id, cells FROM t")
    con.execute("CREATE TABLE c AS SELECT traj_id, 3 AS user_id, ['a', 'b'] AS cells FROM t")
    for name in ("t", "u", "c"):
        con.sql(f"FROM mob_set_budget('{name}', eps := 10, delta := 0)").fetchall()
    user = ("duckmob: user id column user_id has type VARCHAR, not an integer: number the users, e.g. dense_rank() "
            "OVER (ORDER BY user_id), or name another column with user_col := ...")
    assert refused(con, "FROM mob_noisy_count('t', eps := 1)") == user
    assert refused(con, "FROM mob_noisy_count('t', eps := 1, what := 'users')") == user
    assert refused(con, "FROM mob_transitions('t', eps := 1, n_states := 4)") == user
    assert refused(con, "FROM mob_noisy_count('u', eps := 1)").startswith(
        "duckmob: trajectory id column traj_id has type VARCHAR, not an integer")
    assert refused(con, "FROM mob_transitions('c', eps := 1, n_states := 4)") == (
        "duckmob: cells column cells has type VARCHAR[], not a list of integer cell ids (the cells of "
        "mob_cell_sequences): name it with cells_col := ...")
    assert "alice" not in refused(con, "FROM mob_noisy_count('u', eps := 1)")
    assert con.sql("FROM mob_ledger()").fetchall() == []


def test_integer_ids_of_any_width_are_read(con):
    con.execute("CREATE TABLE w AS SELECT * FROM (VALUES (1::UTINYINT, 3::UBIGINT, [0, 1]::INTEGER[]), "
                "(2::UTINYINT, 18446744073709551615::UBIGINT, [1, 2]::INTEGER[])) v(traj_id, user_id, cells)")
    con.sql("FROM mob_set_budget('w', eps := 10, delta := 0)").fetchall()
    assert len(con.sql("FROM mob_noisy_count('w', eps := 1, seed := 1)").fetchall()) == 1
    assert len(con.sql("FROM mob_transitions('w', eps := 1, n_states := 4, seed := 1)").fetchall()) > 0
