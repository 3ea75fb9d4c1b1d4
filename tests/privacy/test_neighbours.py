"""Neighbouring tables over every path (issue 38, item 8): one unit in, one unit's worth out.

For random small tables D (traj_ids shared across users, timeless trajectories ordered by ``seq`` mixed with
timestamped ones, duplicate rows, NULLs, rows in scrambled physical order) and a neighbour D' (D plus one
trajectory, or under the user unit D plus one user with k trajectories; for cell sequences, one (user, traj) key
stored as many rows), the same release with the same seed runs on D and on D' with the noise replaced by a recorder
(tests/privacy/neighbours.py: it reads the exact array each noise call is added to, and on D' replays D's outputs,
so both runs take the same public path). Every noise call must then move by at most what the ledger charged for
it: ``||exact_D - exact_D'||_1 <= scale_i * eps_i`` for a matching of the calls to the event's Laplace leaves.

Paths: memory (a TEMP table released from SQL: gathered, ArrowSource), out of core (a committed table through
``duckmob.synthesize`` or SQL: TableSource), Spark (one case; skipped without pyspark or Java), cell sequences
(``mob_transitions``, ``mob_noisy_count``), and fan-out views (a product with a table of copies; a UNION ALL of
shifted copies), which must be refused before any ledger row or, with ``stability`` declared, stay within the
charged sensitivity. Methods: PrivTrace on every path and both units; HRNet, baseline, clean-slate and PateGail
(their Laplace parts) on tiny configurations under both units.
"""

from __future__ import annotations

import inspect
import json
import shutil
import sys

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

import duckmob
from duckmob import release

import neighbours as nb

EPS = 4.0
K = 2                    # max_trajectories_per_user under the user unit
SEED = 7
BBOX = nb.BBOX
PRIVTRACE = {"K": 4}
NEURAL = {
    "hrnet": {"w": 8, "epochs": 1, "pretrain_iterations": 5, "stay_points": False, "max_len": 6, "progress": False,
              "device": "cpu", "hidden": 8, "loc_dim": 8, "time_dim": 4},
    "baseline": {"w": 8, "epochs": 1, "stay_points": False, "max_len": 6, "progress": False, "device": "cpu",
                 "hidden": 8, "loc_dim": 8, "time_dim": 4},
    "cleanslate": {"w": 4, "n_time": 4, "ti_epochs": 1, "tpg_epochs": 1, "ti_hidden": 8, "ti_latent": 2,
                   "tpg_embed": 4, "tpg_hidden": 8, "n_hint": 200, "batch_size": 8, "ti_coarse": 2,
                   "progress": False, "device": "cpu"},
    "pategail": {"rounds": 2, "episodes": 16, "disc_steps": 1, "w": 8, "n_slots": 8, "max_steps": 8,
                 "hidden": 8, "student": False, "device": "cpu"},
}
UNITS = {"trajectory": {}, "user": {"privacy_unit": "user", "max_trajectories_per_user": K}}


@pytest.fixture
def recorder(monkeypatch):
    rec = nb.Recorder()
    rec.install(monkeypatch)
    return rec


# -- running a release on D and on D' -----------------------------------------------------------------------------

def _connect(path) -> duckdb.DuckDBPyConnection:
    con = duckmob.connect(str(path))
    release.database(con).recent.WINDOW = 0.0    # no answer from an earlier request: every release runs
    return con


def _points_db(path, table, *, temp: bool, views: tuple[str, ...] = ()):
    con = _connect(path)
    con.register("_rows", table)
    con.execute(f"CREATE {'TEMP ' if temp else ''}TABLE trips AS FROM _rows")
    con.unregister("_rows")
    for view in views:
        con.execute(view)
    for name in ("trips", "copies") if views else ("trips",):
        con.execute(f"FROM mob_set_budget('{name}', eps := 10000.0, delta := 0.001)").fetchall()
    return con


def _ledger(con) -> list[tuple[str, str]]:
    return con.execute("SELECT event::VARCHAR, status FROM mob_ledger() ORDER BY id").fetchall()


class Refused(Exception):
    """The release was refused before anything was recorded."""


def _run(recorder, con, release_fn, replay=None):
    recorder.start(replay)
    try:
        release_fn(con)
    except (duckmob.DuckmobError, duckdb.Error) as exc:
        if replay is None and not _ledger(con):
            raise Refused(str(exc)) from None
        raise
    rows = _ledger(con)
    assert rows and rows[-1][1] == "spent", rows
    return recorder.calls, rows[-1][0]


def check_pair(recorder, open_d, open_dp, release_fn) -> None:
    """The release on D (recorded) and on D' (replayed): every call within the charged sensitivity."""
    con = open_d()
    try:
        calls_d, event = _run(recorder, con, release_fn)
    finally:
        con.close()
    con = open_dp()
    try:
        calls_dp, event_dp = _run(recorder, con, release_fn, replay=calls_d)
    finally:
        con.close()
    assert event == event_dp, "the ledger event depends on the data"
    assert calls_d, "no noise was drawn: the release did not run"
    problems = nb.violations(calls_d, calls_dp, nb.laplace_leaves(event))
    assert not problems, ("one neighbour moved a release by more than the ledger charged:\n  " + "\n  ".join(problems)
                          + f"\n  moves (site, scale, L1): {nb.moves(calls_d, calls_dp)}")


def _sql_args(**kwargs) -> str:
    parts = []
    for key, value in kwargs.items():
        if isinstance(value, str):
            parts.append(f"{key} := '{value}'")
        elif isinstance(value, dict):
            parts.append(f"{key} := '{json.dumps(value)}'")
        else:
            parts.append(f"{key} := {value}")
    return ", ".join(parts)


def mob_fit(method: str, unit: str, params: dict, relation: str = "trips", eps: float = EPS):
    args = _sql_args(eps=eps, method=method, bbox=BBOX, seed=SEED, params=params, **UNITS[unit])
    return lambda con: con.execute(f"FROM mob_fit('{relation}', 'm', {args})").fetchall()


def py_synthesize(method: str, unit: str, params: dict, relation: str = "trips", **extra):
    return lambda con: duckmob.synthesize(con, relation, EPS, method, bbox=BBOX, seed=SEED, n=3, params=params,
                                          **UNITS[unit], **extra)


def tables(seed: int, unit: str, kind: str, *, n_traj: int = 40, timed_neighbour: bool | None = None):
    """(D, D') as Arrow tables. ``kind`` 'mixed': timeless and timestamped trajectories; 'timeless': D has no
    timestamp at all and the neighbour has them (one trajectory must not change how the others are read)."""
    rng = np.random.default_rng(seed)
    timed_share = {"mixed": 0.5, "timeless": 0.0, "timed": 1.0}[kind]
    d = nb.points(rng, n_traj, timed_share=timed_share, users=n_traj // 2, per_user=K + 1)
    if unit == "user":
        extra = nb.neighbour_user(rng, d, K, timed=True if kind == "timeless" else timed_neighbour)
    else:
        timed = kind in ("timeless", "timed") if timed_neighbour is None else timed_neighbour
        extra = nb.neighbour_trajectory(rng, d, timed, n=int(rng.integers(5, 12)))
    return d.arrow(), d.plus(extra, rng).arrow()


# -- PrivTrace: memory and out of core, both units --------------------------------------------------------------

@pytest.mark.parametrize("unit", ["trajectory", "user"])
@pytest.mark.parametrize("kind", ["mixed", "timeless"])
@pytest.mark.parametrize("path", ["memory", "out_of_core"])
def test_privtrace_moves_within_the_charge(recorder, tmp_path, path, kind, unit):
    for seed in (1, 2):
        d, dp = tables(seed, unit, kind)
        temp = path == "memory"
        run = mob_fit("privtrace", unit, PRIVTRACE) if temp else py_synthesize("privtrace", unit, PRIVTRACE)
        check_pair(recorder, lambda: _points_db(tmp_path / f"d{seed}.duckdb", d, temp=temp),
                   lambda: _points_db(tmp_path / f"dp{seed}.duckdb", dp, temp=temp), run)


# a public lattice of streets every ~500 m over BBOX (made up, not from any table): PrivTrace with roads releases
# its fine density on these segments
LATTICE = """CREATE TABLE roads AS
    SELECT 39.90 + i * 0.005 AS lat1, 116.30 + j * 0.005 AS lon1, 39.90 + i * 0.005 AS lat2, 116.305 + j * 0.005 AS lon2
    FROM range(21) a(i), range(24) b(j)
    UNION ALL SELECT 39.90 + i * 0.005, 116.30 + j * 0.005, 39.905 + i * 0.005, 116.30 + j * 0.005
    FROM range(20) a(i), range(25) b(j)"""


def _with_roads(con):
    con.execute(LATTICE)
    return con


@pytest.mark.parametrize("road_release", ["pieces", "flows"])
@pytest.mark.parametrize("unit", ["trajectory", "user"])
def test_privtrace_on_roads_moves_within_the_charge(recorder, tmp_path, unit, road_release):
    d, dp = tables(5, unit, "mixed")
    check_pair(recorder, lambda: _with_roads(_points_db(tmp_path / "d.duckdb", d, temp=False)),
               lambda: _with_roads(_points_db(tmp_path / "dp.duckdb", dp, temp=False)),
               py_synthesize("privtrace", unit, {**PRIVTRACE, "road_release": road_release}, roads="roads"))


# -- the neural methods' Laplace parts, out of core from SQL, both units ------------------------------------------

@pytest.mark.parametrize("unit", ["trajectory", "user"])
@pytest.mark.parametrize("method", sorted(NEURAL))
def test_neural_methods_laplace_parts_move_within_the_charge(recorder, tmp_path, method, unit):
    d, dp = tables(3, unit, "mixed", n_traj=30)
    check_pair(recorder, lambda: _points_db(tmp_path / "d.duckdb", d, temp=False),
               lambda: _points_db(tmp_path / "dp.duckdb", dp, temp=False), mob_fit(method, unit, NEURAL[method]))


# -- cell sequences: mob_transitions and mob_noisy_count ---------------------------------------------------------

N_STATES, W = 16, 4


def _cells_db(path, rows, *, temp: bool):
    con = _connect(path)
    con.register("_rows", nb.cells_arrow(rows))
    con.execute(f"CREATE {'TEMP ' if temp else ''}TABLE seqs AS FROM _rows")
    con.unregister("_rows")
    con.execute("FROM mob_set_budget('seqs', eps := 10000.0, delta := 0.001)").fetchall()
    return con


def cell_tables(seed: int, unit: str, spread: int = 30):
    """D and D' = D + one (user, traj) key stored as ``spread`` rows (user unit: a new user with K such keys)."""
    rng = np.random.default_rng(seed)
    d = nb.cell_rows(rng, 30, N_STATES, users=8)
    keys = [(3, 1)] if unit == "trajectory" else [(100, 200 + j) for j in range(K)]
    keys = [key for key in keys if key not in {(r[0], r[1]) for r in d}] or [(101, 300)]
    extra = [(u, t, nb.walk_cells(rng, W, int(rng.integers(2, 6)))) for u, t in keys for _ in range(spread)]
    dp = d + extra
    return d, [dp[i] for i in rng.permutation(len(dp))]


@pytest.mark.parametrize("unit", ["trajectory", "user"])
@pytest.mark.parametrize("path", ["memory", "out_of_core"])
@pytest.mark.parametrize("order", [1, 2])
def test_mob_transitions_moves_within_the_charge(recorder, tmp_path, path, order, unit):
    d, dp = cell_tables(order, unit)
    temp = path == "memory"
    args = _sql_args(markov_order=order, eps=EPS, n_states=N_STATES, seed=SEED, support="neighbours", w=W,
                     **UNITS[unit])
    run = lambda con: con.execute(f"FROM mob_transitions('seqs', {args})").fetchall()  # noqa: E731
    check_pair(recorder, lambda: _cells_db(tmp_path / "d.duckdb", d, temp=temp),
               lambda: _cells_db(tmp_path / "dp.duckdb", dp, temp=temp), run)


@pytest.mark.parametrize("unit", ["trajectory", "user"])
@pytest.mark.parametrize("path", ["memory", "out_of_core"])
def test_mob_noisy_count_of_cell_sequences_moves_within_the_charge(recorder, tmp_path, path, unit):
    d, dp = cell_tables(5, unit)
    temp = path == "memory"
    args = _sql_args(eps=EPS, seed=SEED, **UNITS[unit])
    run = lambda con: con.execute(f"FROM mob_noisy_count('seqs', {args})").fetchall()  # noqa: E731
    check_pair(recorder, lambda: _cells_db(tmp_path / "d.duckdb", d, temp=temp),
               lambda: _cells_db(tmp_path / "dp.duckdb", dp, temp=temp), run)


# -- fan-out views: refused, or charged at the declared stability --------------------------------------------------

COPIES = 50
FAN_VIEWS = (
    "CREATE TABLE copies AS SELECT range AS i FROM range(50)",
    "CREATE VIEW fan AS SELECT t.user_id, t.traj_id * 64 + c.i AS traj_id, t.ts, t.seq, t.lat, t.lon "
    "FROM trips t, copies c",
    "CREATE VIEW shifted AS SELECT * FROM trips UNION ALL "
    "SELECT user_id, traj_id + 100000 AS traj_id, ts, seq, lat + 0.002 AS lat, lon FROM trips UNION ALL "
    "SELECT user_id, traj_id + 200000 AS traj_id, ts, seq, lat, lon + 0.002 AS lon FROM trips",
)


def _fan_out(recorder, tmp_path, d, dp, plain, declared) -> None:
    """``plain`` released on D: either it runs (then D and D' are compared as they are) or it is refused before
    any ledger row, and then ``declared`` (the same release with ``stability`` declared) is compared."""
    open_d = lambda: _points_db(tmp_path / "d.duckdb", d, temp=False, views=FAN_VIEWS)  # noqa: E731
    open_dp = lambda: _points_db(tmp_path / "dp.duckdb", dp, temp=False, views=FAN_VIEWS)  # noqa: E731
    try:
        check_pair(recorder, open_d, open_dp, plain)
    except Refused as refusal:
        assert "stability" in str(refusal), f"refused, but not for its fan-out: {refusal}"
        for name in ("d.duckdb", "dp.duckdb"):
            for f in tmp_path.glob(name + "*"):
                f.unlink() if f.is_file() else shutil.rmtree(f)
        check_pair(recorder, open_d, open_dp, declared)


def test_a_product_view_is_refused_or_charged_its_fan_out(recorder, tmp_path):
    d, dp = tables(11, "trajectory", "timed", n_traj=20)   # timestamped: the fan-out alone
    _fan_out(recorder, tmp_path, d, dp, lambda con: duckmob.noisy_count(con, "fan", eps=1.0, seed=SEED),
             lambda con: duckmob.noisy_count(con, "fan", eps=1.0, seed=SEED, stability=COPIES))


def test_a_union_all_of_shifted_copies_is_refused_or_charged_its_fan_out(recorder, tmp_path):
    d, dp = tables(12, "trajectory", "timed", n_traj=20)
    _fan_out(recorder, tmp_path, d, dp, py_synthesize("privtrace", "trajectory", PRIVTRACE, relation="shifted"),
             py_synthesize("privtrace", "trajectory", PRIVTRACE, relation="shifted", stability=3))


# -- Spark: one PrivTrace case ----------------------------------------------------------------------------------

def _spark():
    pytest.importorskip("pyspark")
    pytest.importorskip("pandas")
    if shutil.which("java") is None:
        pytest.skip("Spark needs Java")
    from pyspark.sql import SparkSession

    return (SparkSession.builder.master("local[2]").appName("duckmob-neighbours").config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.adaptive.enabled", "false")
            .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")
            .config("spark.pyspark.python", sys.executable).getOrCreate())


def test_spark_privtrace_moves_within_the_charge(recorder, tmp_path):
    """D: timeless trajectories only; D': one timestamped trajectory more. Spark reads the DataFrame on its
    workers; the noise is drawn on the driver (the recorder's process) from the summed tables."""
    session = _spark()
    from duckmob import spark as dspark

    d, dp = tables(21, "trajectory", "timeless", n_traj=30)
    try:
        runs = []
        for name, table in (("d", d), ("dp", dp)):
            path, ledger = str(tmp_path / f"{name}.parquet"), str(tmp_path / f"{name}.duckdb")
            pq.write_table(table, path)
            frame = session.read.parquet(path)
            # the budget follows the DataFrame's files (issue 38, item 5); before that it was keyed by a name
            named = inspect.signature(dspark.synthesize).parameters.get("source")
            named = named is not None and named.default is inspect.Parameter.empty
            dspark.set_budget(ledger, "trips" if named else frame, 10000.0, 0.001)
            recorder.start(runs[0][0] if runs else None)
            dspark.synthesize(frame, ledger=ledger, eps=EPS, bbox=BBOX, seed=SEED, n=3, partitions=2, params=PRIVTRACE,
                              **({"source": "trips"} if named else {}))
            con = _connect(ledger)
            rows = _ledger(con)
            con.close()
            assert rows and rows[-1][1] == "spent", rows
            runs.append((recorder.calls, rows[-1][0]))
    finally:
        session.stop()
    (calls_d, event), (calls_dp, _) = runs
    problems = nb.violations(calls_d, calls_dp, nb.laplace_leaves(event))
    assert not problems, ("one neighbour moved a Spark release by more than the ledger charged:\n  "
                          + "\n  ".join(problems) + f"\n  moves (site, scale, L1): {nb.moves(calls_d, calls_dp)}")
