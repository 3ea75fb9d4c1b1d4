"""The one input path (duckmob.source): a trajectory is (user_id, traj_id) on every path and under both units, types
are checked on the schema before anything is reserved, values are converted with TRY_CAST (no message quotes one),
and the budget follows the data (any spelling, a view, a query) on every entry point."""

import json
import sys

import duckdb
import numpy as np
import pytest

import duckmob
from duckmob.errors import DuckmobError
from duckmob.privacy import counting
from duckmob.source.batches import as_batches

SAMPLE = "duckmob/data/geolife_sample.parquet"
BBOX = [39.8477, 116.1956, 40.1133, 116.4880]
SECRET = "12345678901234567890"   # a UBIGINT beyond BIGINT: it must never appear in a message


@pytest.fixture
def con():
    c = duckmob.connect()
    # 30 trajectories of each of two users, renumbered 0..29 per user: every traj_id is shared by two users
    c.execute(f"""CREATE TABLE shared AS
        SELECT user_id, dense_rank() OVER (PARTITION BY user_id ORDER BY traj_id) - 1 AS traj_id, ts, lat, lon
        FROM '{SAMPLE}' WHERE traj_id IN (
            SELECT traj_id FROM (SELECT DISTINCT user_id, traj_id FROM '{SAMPLE}')
            QUALIFY row_number() OVER (PARTITION BY user_id ORDER BY traj_id) <= 30 AND user_id IN (
                SELECT DISTINCT user_id FROM '{SAMPLE}' ORDER BY user_id LIMIT 2))""")
    c.execute("FROM mob_set_budget('shared', eps := 1000, delta := 1e-5)").fetchall()
    yield c
    c.close()


def _spent(con, source):
    rows = con.sql(f"SELECT spent FROM mob_budget() WHERE source = '{source}'").fetchall()
    return rows[0][0] if rows else 0.0


def _spy_fits(monkeypatch, cls) -> list:
    """The sorted (user_id, traj_id) pairs every fit of the method ``cls`` receives, in order of the fits."""
    seen = []
    fit = cls.fit

    def spy(self, data, *args, **kw):
        t = as_batches(data).trajectories()
        seen.append(sorted(zip(t.user_id.tolist(), t.traj_id.tolist())))
        return fit(self, data, *args, **kw)

    monkeypatch.setattr(cls, "fit", spy)
    return seen


@pytest.fixture
def fitted(monkeypatch):
    from duckmob.synth.privtrace import PrivTrace

    return _spy_fits(monkeypatch, PrivTrace)


def test_users_sharing_traj_ids_stay_apart_on_every_path(con, fitted):
    """Two users' trajectories that share a traj_id are two trajectories: on the committed table (read out of core),
    a temporary table (gathered by the macro), the Python API, and under both units."""
    con.execute("CREATE TEMP TABLE shared_tmp AS FROM shared")
    con.execute("FROM mob_set_budget('shared_tmp', eps := 100, delta := 1e-5)").fetchall()
    args = f"eps := 1.0, bbox := {BBOX}, seed := 1, n := 5"
    con.sql(f"FROM synthesize('shared', {args})").fetchall()
    con.sql(f"FROM synthesize('shared_tmp', {args})").fetchall()
    con.sql(f"FROM synthesize('shared', {args}, privacy_unit := 'user', max_trajectories_per_user := 40)").fetchall()
    duckmob.synthesize(con, "shared", eps=1.0, bbox=BBOX, seed=1, n=5)
    assert len(fitted) == 4
    assert len(fitted[0]) > 50 and len({t for _, t in fitted[0]}) <= 30   # more trajectories than traj_ids
    assert fitted[1] == fitted[0] == fitted[2] == fitted[3]


def test_the_count_keys_trajectories_by_user_too(con):
    exact = con.sql("SELECT count(*) FROM (SELECT DISTINCT user_id, traj_id FROM shared)").fetchall()[0][0]
    got = con.sql("FROM mob_noisy_count('shared', eps := 100, seed := 3)").fetchall()[0][0]
    assert exact == 60 and abs(got - exact) < 1


# -- neighbouring tables: removing one trajectory moves every released statistic by at most its sensitivity -----

_RELEASES = ("release_sums", "normalised_release", "noisy_count", "noisy_unit_counts")


def _record_releases(monkeypatch):
    """Every counting release any method makes, with its EXACT statistic (what the noise is added to): patched on
    every duckmob module that holds the function."""
    calls = []
    originals = {name: getattr(counting, name) for name in _RELEASES}

    def exact(name, args):
        if name == "release_sums":
            return np.minimum(np.asarray(args[0], np.int64), counting.MAX_UNITS) * counting.granularity(args[1]), 1.0
        if name == "normalised_release":
            index, owner, n_windows, entries, scale = args[:5]
            sums = counting.normalised_sums(index, owner, n_windows, entries, scale)
            return np.minimum(sums, counting.MAX_UNITS) * counting.granularity(scale), 1.0
        if name == "noisy_count":
            return np.array([float(args[0])]), float(args[3] if len(args) > 3 else 1)
        user_id = np.asarray(args[0])   # noisy_unit_counts: the trajectory count (and the user count)
        return np.array([float(len(user_id)), float(np.unique(user_id[user_id >= 0]).size)]), 1.0

    def wrap(name):
        fn = originals[name]

        def recorded(*args, **kw):
            calls.append((name, *exact(name, args)))
            return fn(*args, **kw)
        return recorded

    for module in [m for n, m in list(sys.modules.items()) if n.startswith("duckmob") and m is not None]:
        for name in _RELEASES:
            if getattr(module, name, None) is originals[name]:
                monkeypatch.setattr(module, name, wrap(name))
    return calls


METHODS = {
    "privtrace": {},
    "cleanslate": dict(w=8, n_time=4, ti_epochs=1, tpg_epochs=1, ti_hidden=8, ti_latent=2, tpg_embed=4, tpg_hidden=8,
                       n_hint=200, batch_size=8),
    "hrnet": dict(w=8, epochs=1, pretrain_iterations=20, max_len=6, progress=False, device="cpu"),
    "baseline": dict(w=8, epochs=1, max_len=6, progress=False, device="cpu"),
    "pategail": dict(rounds=2, episodes=16, disc_steps=1),
}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_neighbouring_tables_move_each_release_by_its_sensitivity(con, monkeypatch, method):
    """D has users sharing traj_ids; D' lacks one of them (user 2's traj 3, whose traj_id user 1 also uses). Under
    the same seed every counting release of the method (in the order it makes them, while their supports agree)
    moves by at most its sensitivity in L1, and the method's fit sees exactly one trajectory fewer."""
    from duckmob import synth

    seen = _spy_fits(monkeypatch, synth.get(method))
    calls = _record_releases(monkeypatch)
    users = [r[0] for r in con.sql("SELECT DISTINCT user_id FROM shared ORDER BY 1").fetchall()]
    con.execute(f"CREATE TABLE neighbour AS FROM shared WHERE NOT (user_id = {users[1]} AND traj_id = 3)")
    con.execute("FROM mob_set_budget('neighbour', eps := 1000, delta := 1e-5)").fetchall()
    runs = []
    for table in ("shared", "neighbour"):
        calls.clear()
        duckmob.synthesize(con, table, eps=2.0, method=method, bbox=BBOX, seed=5, n=3, **METHODS[method])
        runs.append(list(calls))
    a, b = set(seen[0]), set(seen[1])
    assert a - b == {(users[1], 3)} and b < a                               # one trajectory, not a merged one
    compared = 0
    for (name_a, a, sens), (name_b, b, _) in zip(*runs):
        if name_a != name_b or a.shape != b.shape:
            break                                  # the supports follow earlier noisy releases from here on
        assert np.abs(a - b).sum() <= sens + 1e-9, name_a
        compared += 1
    assert compared >= 1 and runs[0]


# -- schema before data: refusals name columns and types only, charge nothing, and do not depend on the rows ----

BAD_TABLES = {
    "traj_id VARCHAR": "SELECT 'secret-4242' AS traj_id, 1 AS user_id, TIMESTAMP '2020-01-01' AS ts, 39.9 AS lat, "
                       "116.3 AS lon",
    "lat VARCHAR": "SELECT 1 AS traj_id, 1 AS user_id, TIMESTAMP '2020-01-01' AS ts, '39.9xyz' AS lat, 116.3 AS lon",
    "user_id DOUBLE": "SELECT 1 AS traj_id, 4242.5 AS user_id, TIMESTAMP '2020-01-01' AS ts, 39.9 AS lat, "
                      "116.3 AS lon",
    "ts BIGINT": "SELECT 1 AS traj_id, 1 AS user_id, 1600000000 AS ts, 39.9 AS lat, 116.3 AS lon",
}


@pytest.mark.parametrize("kind", ["committed", "temp", "python"])
@pytest.mark.parametrize("bad", sorted(BAD_TABLES))
def test_wrong_types_are_refused_the_same_whether_empty_or_not(kind, bad):
    con = duckmob.connect()
    try:
        temp = "TEMP " if kind == "temp" else ""
        answers = []
        for empty in (False, True):
            name = f"t_{int(empty)}"
            con.execute(f"CREATE {temp}TABLE {name} AS {BAD_TABLES[bad]}{' LIMIT 0' if empty else ''}")
            con.execute(f"FROM mob_set_budget('{name}', eps := 10, delta := 1e-5)").fetchall()
            with pytest.raises((duckdb.Error, DuckmobError)) as err:
                if kind == "python":
                    duckmob.synthesize(con, name, eps=1.0, bbox=BBOX)
                else:
                    con.sql(f"FROM synthesize('{name}', eps := 1.0, bbox := {BBOX})").fetchall()
            message = str(err.value)
            assert "secret" not in message and "xyz" not in message and "4242" not in message
            assert "has type" in message and "not " in message
            answers.append(message.replace(name, "T"))
            assert con.sql("FROM mob_ledger()").fetchall() == []             # nothing reserved, nothing charged
        assert answers[0] == answers[1]
    finally:
        con.close()


@pytest.mark.parametrize("kind", ["committed", "temp", "cte"])
def test_unconvertible_values_drop_their_points_silently(kind):
    """Out-of-range integers (UBIGINT, HUGEINT) and strings that are no number: TRY_CAST makes them NULL and the
    cleaning drops their points; no message quotes them, and the release is made (and charged) as usual."""
    con = duckmob.connect()
    try:
        con.execute(f"CREATE TABLE base AS FROM '{SAMPLE}' WHERE traj_id IN (SELECT DISTINCT traj_id FROM '{SAMPLE}' "
                    "ORDER BY traj_id LIMIT 20)")
        con.execute("FROM mob_set_budget('base', eps := 10, delta := 1e-5)").fetchall()
        # per row (a window numbering the rows would be refused: it lets one row change the others)
        odd = (f"SELECT CASE WHEN hash(ts, lat) % 7 = 0 THEN {SECRET}::UBIGINT ELSE traj_id::UBIGINT END "
               f"AS traj_id, user_id::HUGEINT * (CASE WHEN hash(ts, lon) % 11 = 0 THEN {SECRET}::HUGEINT "
               "ELSE 1 END) AS user_id, ts, lat, lon FROM base")
        if kind == "committed":
            con.execute(f"CREATE TABLE odd AS {odd}")
            con.execute("FROM mob_set_budget('odd', eps := 10, delta := 1e-5)").fetchall()
            rows = con.sql(f"FROM synthesize('odd', eps := 1.0, bbox := {BBOX}, seed := 2, n := 5)").fetchall()
            source = "odd"
        elif kind == "temp":
            con.execute(f"CREATE TEMP TABLE odd AS {odd}")
            con.execute("FROM mob_set_budget('odd', eps := 10, delta := 1e-5)").fetchall()
            rows = con.sql(f"FROM synthesize('odd', eps := 1.0, bbox := {BBOX}, seed := 2, n := 5)").fetchall()
            source = "temp.odd"
        else:   # a query over the table: its budget is the base table's
            rows = con.sql(f"FROM synthesize('({odd})', eps := 1.0, bbox := {BBOX}, seed := 2, n := 5)").fetchall()
            source = "base"
        assert len({r[0] for r in rows}) == 5
        assert _spent(con, source) == pytest.approx(1.0, rel=0.01)
    finally:
        con.close()


def test_a_cte_is_refused_for_free_naming_no_value():
    con = duckmob.connect()
    try:
        con.execute(f"CREATE TABLE base AS FROM '{SAMPLE}' LIMIT 100")
        con.execute("FROM mob_set_budget('base', eps := 10, delta := 1e-5)").fetchall()
        with pytest.raises(duckdb.Error, match="CTE"):
            con.sql(f"WITH c AS (SELECT {SECRET}::UBIGINT AS traj_id, * EXCLUDE (traj_id) FROM base) "
                    f"FROM synthesize('c', eps := 1.0, bbox := {BBOX})").fetchall()
        assert con.sql("FROM mob_ledger()").fetchall() == []
    finally:
        con.close()


# -- the budget follows the data ---------------------------------------------------------------------------------

def test_every_spelling_view_and_query_draws_on_the_tables_budget(con):
    con.execute("CREATE VIEW v AS FROM shared WHERE lat > 39.9")
    spellings = ["shared", "SHARED", "main.shared", '"shared"', "memory.main.shared", "v",
                 "(SELECT * FROM shared WHERE lat < 40.1)"]
    for i, name in enumerate(spellings, 1):
        con.sql(f"FROM mob_noisy_count('{name}', eps := 1.0, seed := {i})").fetchall()
        assert _spent(con, "shared") == pytest.approx(i, rel=0.01)
    assert [r[0] for r in con.sql("SELECT source FROM mob_budget()").fetchall()] == ["shared"]
    # the Python API resolves the same way on the caller's connection
    duckmob.noisy_count(con, "V", eps=1.0)
    assert _spent(con, "shared") == pytest.approx(len(spellings) + 1, rel=0.01)


def test_a_release_over_two_tables_needs_both_budgets(con):
    con.execute("CREATE TABLE keep AS SELECT DISTINCT user_id FROM shared")
    query = "(SELECT s.* FROM shared s JOIN keep USING (user_id))"
    # a join can copy rows: refused, naming it, unless the caller declares a stability (here its own claim: 1)
    with pytest.raises(duckdb.Error, match=r"through HASH_JOIN \(INNER join\).*stability := s"):
        con.sql(f"FROM mob_noisy_count('{query}', eps := 1.0)").fetchall()
    with pytest.raises(duckdb.Error, match="no privacy budget declared for 'keep'"):
        con.sql(f"FROM mob_noisy_count('{query}', eps := 1.0, stability := 1)").fetchall()
    con.execute("FROM mob_set_budget('keep', eps := 2, delta := 1e-5)").fetchall()
    con.sql(f"FROM mob_noisy_count('{query}', eps := 1.5, stability := 1)").fetchall()
    assert _spent(con, "keep") == pytest.approx(1.5, rel=0.01)
    assert _spent(con, "shared") == pytest.approx(1.5, rel=0.01)
    with pytest.raises(duckdb.Error, match="exceeded"):   # keep's budget is the tighter one
        con.sql(f"FROM mob_noisy_count('{query}', eps := 1.0, stability := 1)").fetchall()
    assert _spent(con, "shared") == pytest.approx(1.5, rel=0.01)


def test_a_shadowing_temp_table_is_refused(con):
    con.execute("CREATE TEMP TABLE shared AS FROM main.shared LIMIT 10")
    for sql in (f"FROM synthesize('shared', eps := 1.0, bbox := {BBOX})", "FROM mob_noisy_count('shared', eps := 1)",
                "FROM mob_noisy_count('(SELECT * FROM shared)', eps := 1)"):
        with pytest.raises(duckdb.Error, match="temporary table or view named 'shared' hides"):
            con.sql(sql).fetchall()
    with pytest.raises(DuckmobError, match="temporary table or view named 'shared' hides"):
        duckmob.noisy_count(con, "shared", eps=1.0)
    assert _spent(con, "shared") == 0.0


def test_attach_and_use_release_from_the_files_own_ledger_or_refuse(tmp_path):
    path = str(tmp_path / "other.duckdb")
    owner = duckmob.connect(path)
    owner.execute(f"CREATE TABLE trips AS FROM '{SAMPLE}' LIMIT 500")
    owner.execute("FROM mob_set_budget('trips', eps := 1.0, delta := 1e-5)").fetchall()
    owner.close()
    con = duckmob.connect()
    try:
        con.execute(f"ATTACH '{path}' AS other")
        con.execute("USE other")
        with pytest.raises(duckdb.Error, match="lives in the attached database 'other'"):
            con.sql("FROM mob_noisy_count('trips', eps := 0.5)").fetchall()
        with pytest.raises(DuckmobError, match="lives in the attached database 'other'"):
            duckmob.noisy_count(con, "trips", eps=0.5)
        assert con.sql("FROM memory.main.duckmob_ledger").fetchall() == []
    finally:
        con.close()
    again = duckmob.connect(path)
    try:   # the file's own ledger: nothing was spent through the attachment
        assert again.sql("SELECT spent FROM mob_budget()").fetchall() == [(0.0,)]
    finally:
        again.close()


def test_a_trajectory_stored_on_many_rows_is_one_sequence_on_both_paths():
    # one (user, traj) key on 50 rows is ONE trajectory of mass 1, out of core and gathered alike; no traj_id: dropped
    import duckmob
    from duckmob.privacy.counting import transition_counts
    from duckmob.source.schema import Mapping
    from duckmob.source.table import grouped_sequences, prepare, read_sequences, sequence_arrays

    con = duckmob.connect()
    con.execute("CREATE TABLE seqs AS SELECT 1::BIGINT AS traj_id, 7::BIGINT AS user_id, [1, 2, 3]::BIGINT[] AS cells "
                "FROM range(50)")
    con.execute("INSERT INTO seqs VALUES (2, 7, [4, 5]), (NULL, 7, [1, 1]), (1, 8, [6, 6])")
    select = prepare(con, "seqs", Mapping(), home="memory", shape="sequences").select
    for unit in ("trajectory", "user"):
        parts = list(read_sequences(con, select, unit))
        offsets = np.concatenate([[0], np.cumsum(np.concatenate([np.diff(p[0]) for p in parts]))])
        cells = np.concatenate([p[1] for p in parts])
        assert sorted(np.diff(offsets).tolist()) == [2, 2, 150]
        assert transition_counts(offsets, cells, 9).sum() == pytest.approx(3.0)   # three keys, mass 1 each
    rows = con.sql("SELECT {'traj_id': traj_id, 'user_id': user_id, 'cells': cells} AS r FROM seqs").to_arrow_table()
    gathered = sequence_arrays(grouped_sequences(rows.column("r").combine_chunks()))
    assert sorted(np.diff(gathered[0]).tolist()) == [2, 2, 150] and gathered[2].tolist() == [7, 8, 7]
    assert transition_counts(gathered[0], gathered[1], 9).sum() == pytest.approx(3.0)
    con.close()


def test_a_temp_table_shadowing_a_table_read_through_a_view_is_refused(con):
    con.execute("CREATE VIEW near AS SELECT * FROM shared WHERE lat > 0")
    con.execute("FROM mob_set_budget('shared', eps := 5, delta := 1e-5)").fetchall()
    con.execute("CREATE VIEW outer_v AS SELECT * FROM near")
    con.execute("CREATE TEMP TABLE shared AS FROM main.shared LIMIT 10")   # the caller would see this one
    for rel in ("near", "outer_v"):
        with pytest.raises(duckdb.Error, match="temporary table or view named 'shared' hides"):
            con.sql(f"FROM mob_noisy_count('{rel}', eps := 1)").fetchall()
    assert _spent(con, "shared") == 0.0


def _ledger_rows(con):
    return con.sql("SELECT source, event, params FROM mob_ledger()").fetchall()


@pytest.mark.parametrize("fan", [
    "SELECT traj_id * 10 + k.range AS traj_id, user_id, ts, lat, lon FROM shared, range(3) k",
    "SELECT * FROM shared UNION ALL SELECT traj_id + 100000, user_id, ts, lat, lon FROM shared",
    "SELECT traj_id, user_id, ts, lat, lon FROM shared WHERE user_id IN (SELECT user_id FROM shared)",
    "SELECT row_number() OVER () // 50 AS traj_id, user_id, ts, lat, lon FROM shared",
])
def test_a_plan_that_can_fan_rows_out_is_refused_before_any_read_unless_stability_is_declared(con, fan):
    con.execute(f"CREATE VIEW fan AS {fan}")
    con.execute("FROM mob_set_budget('shared', eps := 10, delta := 1e-5)").fetchall()
    con.execute("FROM mob_set_budget('fan', eps := 10, delta := 1e-5)").fetchall()   # the range() case's own key
    for call in ("FROM mob_noisy_count('fan', eps := 1)",
                 f"FROM synthesize('fan', eps := 1, bbox := {BBOX}, n := 5)",
                 f"FROM mob_fit('fan', 'm', eps := 1, bbox := {BBOX})"):
        with pytest.raises(duckdb.Error, match="can turn one row of a table into several rows.*stability := s"):
            con.sql(call).fetchall()
    with pytest.raises(DuckmobError, match="stability := s"):
        duckmob.noisy_count(con, "fan", eps=1.0)
    assert _ledger_rows(con) == []   # refused before anything was reserved


def test_a_declared_stability_multiplies_the_noise_and_is_charged_the_eps_asked(con, monkeypatch):
    from duckmob.privacy import counting

    con.execute("CREATE VIEW fan AS SELECT traj_id * 10 + k.range AS traj_id, user_id, ts, lat, lon "
                "FROM shared, (SELECT range FROM range(3)) k")
    con.execute("FROM mob_set_budget('shared', eps := 10, delta := 1e-5)").fetchall()
    con.execute("FROM mob_set_budget('fan', eps := 10, delta := 1e-5)").fetchall()
    seen = []
    real = counting.noisy_count
    monkeypatch.setattr(counting, "noisy_count",
                        lambda n, eps, noise, sensitivity=1: seen.append((n, eps, sensitivity)) or real(
                            n, eps, noise, sensitivity))
    con.sql("FROM mob_noisy_count('fan', eps := 0.9, stability := 3)").fetchall()
    assert seen == [(180, pytest.approx(0.3), 1)]   # 60 trajectories x 3 copies, Laplace at eps / 3
    assert _spent(con, "shared") == pytest.approx(0.9, rel=1e-3)
    (_, event, params), = _ledger_rows(con)
    assert json.loads(event) == {"kind": "laplace", "eps": pytest.approx(0.9)} and json.loads(params)["stability"] == 3
    # PrivTrace: every Laplace part at eps / s, the composition charged eps; DP-SGD methods refuse s > 1
    con.sql(f"FROM synthesize('fan', eps := 0.6, bbox := {BBOX}, n := 5, stability := 3, seed := 1)").fetchall()
    leaves = json.loads(_ledger_rows(con)[-1][1])["events"]
    assert sum(e["eps"] for e in leaves) == pytest.approx(0.6)
    with pytest.raises(duckdb.Error, match="stability := 3 needs a release made of Laplace mechanisms only"):
        con.sql(f"FROM synthesize('fan', eps := 1, bbox := {BBOX}, stability := 3, method := 'hrnet')").fetchall()
    assert len(_ledger_rows(con)) == 2


def test_budgets_of_views_over_files_follow_the_files(con, tmp_path):
    path = tmp_path / "trips.parquet"
    con.execute(f"COPY shared TO '{path}'")
    con.execute(f"CREATE VIEW one AS FROM read_parquet('{path}')")
    con.execute(f"CREATE VIEW two AS SELECT * FROM '{tmp_path}/./trips.parquet' WHERE lat > 0")
    with pytest.raises(duckdb.Error, match=f"no privacy budget declared for 'file:{path}'"):
        con.sql("FROM mob_noisy_count('one', eps := 1)").fetchall()
    # the key the refusal names is one mob_set_budget takes, as is either view's name
    con.execute(f"FROM mob_set_budget('file:{path}', eps := 1.5, delta := 1e-5)").fetchall()
    con.sql("FROM mob_noisy_count('one', eps := 1)").fetchall()
    with pytest.raises(duckdb.Error, match="exceeded"):
        con.sql("FROM mob_noisy_count('two', eps := 1)").fetchall()   # the same file, the same budget
    con.execute("FROM mob_set_budget('two', eps := 2, delta := 1e-5)").fetchall()
    con.sql("FROM mob_noisy_count('(SELECT * FROM two)', eps := 1)").fetchall()
    assert _spent(con, f"file:{path}") == pytest.approx(2.0, rel=1e-3)   # two releases of eps 1 (PLD)
