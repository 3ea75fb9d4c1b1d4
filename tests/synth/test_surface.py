"""The SQL surface every synthesizer shares: synthesize, mob_fit, mob_sample, mob_models, duckmob.synthesize."""

from __future__ import annotations

import numpy as np
import pytest

import duckmob
from duckmob import synth
from duckmob.errors import BudgetError, DuckmobError, one_line
from duckmob.privacy import ledger

BOX = "[0.0, 0.0, 1.0, 1.0]"


@pytest.fixture
def spends(monkeypatch):
    """Every reservation the release core made (source, planned event, recorded facts), in order."""
    calls = []
    real_reserve = ledger.reserve

    def counting_reserve(c, prior, event, **kw):
        calls.append((prior.source, event, kw))
        return real_reserve(c, prior, event, **kw)

    monkeypatch.setattr(ledger, "reserve", counting_reserve)
    return calls


@pytest.fixture
def db(spends):
    con = duckmob.connect()
    rng = np.random.default_rng(0)
    rows = []
    for t in range(120):
        a, b = rng.random(2) * 0.8 + 0.1, rng.random(2) * 0.8 + 0.1
        k = int(rng.integers(2, 12))
        for i, f in enumerate(np.linspace(0, 1, k)):
            p = a + f * (b - a)
            rows.append((t % 30, t, i * 60, float(p[0]), float(p[1])))
    con.execute("CREATE TABLE trips (user_id INTEGER, traj_id INTEGER, ts TIMESTAMP, lat DOUBLE, lon DOUBLE)")
    con.executemany("INSERT INTO trips VALUES (?, ?, to_timestamp(1.7e9 + ?)::TIMESTAMP, ?, ?)", rows)
    yield con
    con.close()


def _err(con, sql) -> str:
    with pytest.raises(Exception) as info:
        con.execute(sql).fetchall()
    return one_line(info.value)


def test_registry_names_methods_and_refuses_unknown_ones():
    assert synth.get("privtrace").method == "privtrace"
    assert synth.get("PrivTrace").model_class.method == "privtrace"
    with pytest.raises(DuckmobError, match="use one of .*privtrace"):
        synth.get("magic")


def test_a_source_without_budget_is_refused_with_what_to_run(db, spends):
    msg = _err(db, f"FROM synthesize('trips', eps := 1.0, bbox := {BOX})")
    assert "budget" in msg and "trips" in msg
    assert spends == []


def test_synthesize_returns_the_synthetic_table(db, spends):
    ledger.set_budget(db, "trips", 5.0, 1e-6)
    out = db.sql(f"FROM synthesize('trips', eps := 1.0, bbox := {BOX}, n := 50, seed := 1, "
                 "params := {'K': 4})").to_arrow_table()
    assert out.column_names == ["traj_id", "seq", "lat", "lon", "ts"]
    traj = np.asarray(out["traj_id"])
    assert len(np.unique(traj)) == 50 and out["ts"].null_count == out.num_rows
    lat, lon = np.asarray(out["lat"]), np.asarray(out["lon"])
    assert ((lat >= 0) & (lat <= 1) & (lon >= 0) & (lon <= 1)).all()
    assert len(spends) == 1 and spends[0][0] == "trips"
    assert spends[0][2]["seeded"] is True
    # same seed -> same table; the Python twin gives the same rows
    again = db.sql(f"FROM synthesize('trips', eps := 1.0, bbox := {BOX}, n := 50, seed := 1, "
                   "params := '{\"K\": 4}')").to_arrow_table()
    assert again.equals(out)
    py = duckmob.synthesize(db, "trips", eps=1.0, bbox=[0, 0, 1, 1], n=50, seed=1, K=4)
    assert py.equals(out)
    assert len(spends) == 3


def test_fit_spends_once_and_sampling_is_free(db, spends):
    ledger.set_budget(db, "trips", 2.0, 1e-6)
    row = db.execute(f"FROM mob_fit('trips', 'm', eps := 1.5, bbox := {BOX}, seed := 3)").fetchall()
    assert row[0][:5] == ("m", "privtrace", "trips", 1.5, 0.0)
    assert len(spends) == 1
    from duckmob.privacy import accounting
    assert abs(accounting.epsilon(spends[0][1], 1e-6) - 1.5) < 0.02
    a = db.sql("FROM mob_sample('m', n := 200, seed := 4)").to_arrow_table()
    b = db.sql("FROM mob_sample('m', n := 200, seed := 4)").to_arrow_table()
    c = db.sql("FROM mob_sample('m', n := 300)").to_arrow_table()
    assert a.equals(b) and len(np.unique(np.asarray(c["traj_id"]))) == 300
    # 120 trajectories at eps 1.5: the count (at eps 0.024, +-125) is mostly noise, so it sizes nothing
    assert "mostly noise" in _err(db, "FROM mob_sample('m')") and "n := " in _err(db, "FROM mob_sample('m')")
    assert len(spends) == 1
    models = db.execute("SELECT name, method, source, eps, delta, params->>'K' FROM mob_models()").fetchall()
    assert models == [("m", "privtrace", "trips", 1.5, 0.0, "2")]
    # past the budget: refused, nothing recorded, nothing stored
    msg = _err(db, f"FROM mob_fit('trips', 'm2', eps := 1.0, bbox := {BOX})")
    assert "budget" in msg
    assert len(spends) == 1 and db.execute("SELECT count(*) FROM mob_models()").fetchone()[0] == 1
    # a name in use is refused before anything is spent
    ledger.set_budget(db, "trips", 10.0, 1e-6)
    assert "already exists" in _err(db, f"FROM mob_fit('trips', 'm', eps := 1.0, bbox := {BOX})")
    assert db.execute("SELECT count(*) FROM duckmob_ledger WHERE status <> 'cancelled'").fetchone()[0] == 1
    assert len(spends) == 1
    assert "no model named 'nope'" in _err(db, "FROM mob_sample('nope', n := 5)")


def test_bad_inputs_give_clear_errors(db):
    ledger.set_budget(db, "trips", 100.0, 1e-6)
    assert "eps must be a positive number" in _err(db, f"FROM synthesize('trips', eps := 0, bbox := {BOX})")
    assert "eps must be a positive number" in _err(db, f"FROM synthesize('trips', eps := -1, bbox := {BOX})")
    assert "bounding box is required" in _err(db, "FROM synthesize('trips', eps := 1.0)")
    assert "unknown synthesis method" in _err(db, f"FROM synthesize('trips', eps := 1, bbox := {BOX}, "
                                                  "method := 'gan')")
    assert "unknown PrivTrace parameter" in _err(db, f"FROM synthesize('trips', eps := 1, bbox := {BOX}, "
                                                     "params := {'kapa': 2})")
    # nothing in the data can make a release refuse (a refusal would be an unaccounted one-bit release): an empty
    # table, or one with no point in the bbox, is synthesised from noise alone
    db.execute("CREATE TABLE empty AS FROM trips LIMIT 0")
    ledger.set_budget(db, "empty", 1.0, 1e-6)
    out = db.execute(f"FROM synthesize('empty', eps := 1.0, bbox := {BOX}, n := 5, seed := 1)").fetchall()
    assert len({r[0] for r in out}) == 5
    far = "[10.0, 10.0, 11.0, 11.0]"
    out = db.execute(f"FROM synthesize('trips', eps := 1.0, bbox := {far}, n := 5, seed := 1)").fetchall()
    assert all(10 <= r[2] <= 11 and 10 <= r[3] <= 11 for r in out)
    assert "cannot be honoured by a private release" in _err(db, f"FROM synthesize('trips', eps := 1.0, "
                                                                 f"bbox := {BOX}, outside := 'fail')")
    assert "n must be an integer of at least 1" in _err(db, f"FROM synthesize('trips', eps := 1.0, bbox := {BOX}, "
                                                            "n := 0)")
    assert "privacy_unit := 'user' needs" in _err(db, f"FROM synthesize('trips', eps := 1, bbox := {BOX}, "
                                                      "privacy_unit := 'user')")
    assert "is not an option" in _err(db, f"FROM synthesize('trips', eps := 1, bbox := {BOX}, "
                                          "privacy_unit := 'family')")
    db.execute(f"FROM mob_fit('trips', 'ok', eps := 1.0, bbox := {BOX})").fetchall()
    assert "n must be an integer of at least 1" in _err(db, "FROM mob_sample('ok', n := 0)")
    with pytest.raises(DuckmobError, match="elsewhere does not exist"):   # refused before any budget is looked at
        duckmob.synthesize(db, "elsewhere", eps=1.0, bbox=[0, 0, 1, 1])
    db.execute("CREATE TABLE elsewhere AS FROM trips LIMIT 10")
    with pytest.raises(BudgetError):
        duckmob.synthesize(db, "elsewhere", eps=1.0, bbox=[0, 0, 1, 1])


def test_user_level_privacy_bounds_contributions_and_column_mapping(db, spends):
    db.execute("CREATE TABLE moves AS SELECT user_id AS who, traj_id AS trip, ts AS t, lat AS y, lon AS x "
               "FROM trips")
    ledger.set_budget(db, "moves", 2.0, 1e-6)
    out = db.execute(f"FROM synthesize('moves', eps := 1.0, bbox := {BOX}, n := 10, privacy_unit := 'user', "
                     "max_trajectories_per_user := 2, traj_col := 'trip', ts_col := 't', lat_col := 'y', "
                     "lon_col := 'x', user_col := 'who')").fetchall()
    assert len({r[0] for r in out}) == 10
    (source, _event, kw), = spends
    assert source == "moves" and kw["privacy_unit"] == "user" and kw["params"]["max_trajectories_per_user"] == 2


def test_a_synthetic_table_without_time_can_be_fitted_again(db, spends):
    ledger.set_budget(db, "trips", 5.0, 1e-6)
    db.execute(f"CREATE TABLE syn AS FROM synthesize('trips', eps := 1.0, bbox := {BOX}, n := 80, seed := 2)")
    ledger.set_budget(db, "syn", 1.0, 1e-6)
    out = db.execute(f"FROM synthesize('syn', eps := 1.0, bbox := {BOX}, n := 20, seed := 3)").fetchall()
    assert len({r[0] for r in out}) == 20 and all(r[4] is None for r in out)
    assert [s[0] for s in spends] == ["trips", "syn"]


def test_points_gathered_out_of_order_are_sorted_before_cleaning():
    import pyarrow as pa

    from duckmob.sql.synth import _in_order
    from duckmob.trajectories import from_points

    rng = np.random.default_rng(1)
    traj = np.repeat(np.arange(50), 7)
    ts = np.tile(np.arange(7), 50) * 1_000_000
    lat, lon = rng.random(350), rng.random(350)
    perm = rng.permutation(350)
    cols = {"traj_id": pa.array(traj[perm]), "ts": pa.array(ts[perm]).cast(pa.timestamp("us")),
            "lat": pa.array(lat[perm]), "lon": pa.array(lon[perm])}
    a, _ = from_points(_in_order(cols))
    b, _ = from_points(pa.table({"traj_id": traj, "ts": pa.array(ts).cast(pa.timestamp("us")), "lat": lat,
                                 "lon": lon}))
    assert np.array_equal(a.offsets, b.offsets) and np.array_equal(a.lat, b.lat) and np.array_equal(a.ts, b.ts)


# Small public parameters per method, so the test over every registered method runs in seconds.
FAST_PARAMS = {
    "privtrace": {"K": 4},
    "hrnet": {"w": 8, "epochs": 1, "pretrain_iterations": 10, "max_len": 6, "stay_points": False, "n_hint": 120},
    "baseline": {"w": 8, "epochs": 1, "max_len": 6, "stay_points": False, "n_hint": 120},
    "cleanslate": {"w": 4, "n_time": 4, "ti_epochs": 1, "tpg_epochs": 1, "ti_hidden": 8, "ti_latent": 2,
                   "tpg_embed": 4, "tpg_hidden": 8, "n_hint": 120, "batch_size": 8},
    "pategail": {"rounds": 2, "episodes": 16, "disc_steps": 1},
}


@pytest.mark.parametrize("method", sorted(synth.METHODS))
def test_every_registered_method_fits_samples_and_spends_once_within_eps(db, spends, method):
    """The shared contract, for each method in the registry: one reservation per fit, recorded within eps at
    the budget's delta, a stored model listed by mob_models, free sampling inside the bbox, seeded runs
    reproducible. A method added to the registry without small parameters here fails loudly."""
    from duckmob.privacy import accounting

    assert method in FAST_PARAMS, f"add small parameters for {method!r} to FAST_PARAMS"
    params = FAST_PARAMS[method]
    ledger.set_budget(db, "trips", 3.0, 1e-5)
    delta = "NULL" if synth.get(method).default_delta == 0 else "1e-5"
    row = db.execute(f"FROM mob_fit('trips', 'm', eps := 1.0, delta := {delta}, method := '{method}', "
                     f"bbox := {BOX}, seed := 5, params := ?)", [__import__("json").dumps(params)]).fetchall()
    assert row[0][1] == method and len(spends) == 1
    assert accounting.epsilon(spends[0][1], 1e-5) <= 1.0 + 1e-6
    a = db.sql("FROM mob_sample('m', n := 30, seed := 2)").to_arrow_table()
    b = db.sql("FROM mob_sample('m', n := 30, seed := 2)").to_arrow_table()
    assert a.equals(b) and len(np.unique(np.asarray(a["traj_id"]))) == 30
    lat, lon = np.asarray(a["lat"]), np.asarray(a["lon"])
    assert ((lat >= 0) & (lat <= 1) & (lon >= 0) & (lon <= 1)).all()
    assert db.execute("SELECT method FROM mob_models()").fetchall() == [(method,)]
    assert len(spends) == 1


@pytest.mark.parametrize("method", ["hrnet", "cleanslate", "pategail"])
def test_a_date_parameter_is_checked_where_the_config_is_parsed(method):
    """base_date (a ``param(..., date=True)``) is refused unless numpy reads it as a date, naming what to give."""
    with pytest.raises(DuckmobError, match=r"parameter base_date must be a date such as '2008-01-01', got '2008-13-45'"):
        synth.get(method)([0, 0, 1, 1], base_date="2008-13-45")
    synth.get(method)([0, 0, 1, 1], base_date="2010-05-01")   # a valid date passes
