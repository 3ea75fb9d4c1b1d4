"""Every released size is bounded, and a size read from a count that is mostly noise is refused in plain words.

The default number of synthetic trajectories is the model's noisy trajectory count; when that count is below twice
its own 95% margin (known from its value and public Laplace scale alone) the sample is refused with the value, its
+-, and the fix (n := ...). The two cases of issue 29 (a 30-trajectory table at eps 1; the user unit with k = 50 at
eps 0.3 on the shipped sample) give at most 3x the real points, or refuse naming n :=, over 5 seeds."""

import math

import duckdb
import numpy as np
import pytest

import duckmob
from duckmob.errors import DuckmobError
from duckmob.release.fitting import default_size
from duckmob.synth import placement

BBOX = [39.8477, 116.1956, 40.1133, 116.4880]


class _Counted:
    """A model stand-in: its noisy count and the count's public record."""

    def __init__(self, value, eps, k=1):
        self.default_n = value
        self.size_count = {"value": value, "eps": eps, "k": k, "scale": k / eps}


def test_a_count_below_twice_its_margin_cannot_size_the_output():
    margin = math.log(20) / 0.016                    # 187: PrivTrace's count share at eps 1
    with pytest.raises(DuckmobError) as err:
        default_size(_Counted(198, 0.016))
    message = str(err.value)
    assert "198 ± 187 (95%)" in message and "mostly noise" in message and "n := " in message
    assert "raise eps" in message and "\n" not in message
    with pytest.raises(DuckmobError, match="under the user unit \\(k = 50\\)"):
        default_size(_Counted(28_951, 0.0048, k=50))
    assert default_size(_Counted(int(2 * margin) + 1, 0.016)) == int(2 * margin) + 1   # just past: allowed
    assert default_size(_Counted(1_999, 0.016)) == 1_999


@pytest.fixture(scope="module")
def con():
    c = duckmob.connect()
    c.execute("CREATE TABLE trips AS FROM mob_geolife_sample()")
    c.execute("""CREATE TABLE small AS SELECT * FROM trips WHERE traj_id IN (
                     SELECT DISTINCT traj_id FROM trips ORDER BY traj_id LIMIT 30)
                 QUALIFY row_number() OVER (PARTITION BY traj_id ORDER BY ts) <= 10""")
    for name in ("small", "trips"):
        c.execute(f"FROM mob_set_budget('{name}', eps := 100, delta := 1e-5)").fetchall()
    yield c
    c.close()


@pytest.mark.parametrize("table,args", [
    ("small", "eps := 1.0"),
    ("trips", "eps := 0.3, privacy_unit := 'user', max_trajectories_per_user := 50"),
])
def test_the_absurd_outputs_are_refused_or_bounded(con, table, args):
    real = con.sql(f"SELECT count(*) FROM {table}").fetchall()[0][0]
    for seed in range(1, 6):
        try:
            rows = con.sql(f"SELECT count(*) FROM synthesize('{table}', {args}, bbox := {BBOX}, "
                           f"seed := {seed})").fetchall()[0][0]
        except duckdb.Error as exc:
            assert "mostly noise" in str(exc) and "n := " in str(exc)
            continue
        assert rows <= 3 * real, (seed, rows, real)


def test_the_shipped_sample_at_eps_1_keeps_its_default_size(con):
    n = con.sql(f"SELECT count(DISTINCT traj_id) FROM synthesize('trips', eps := 1.0, bbox := {BBOX}, "
                "seed := 1)").fetchall()[0][0]
    assert abs(n - 1999) < 300


def test_a_step_histogram_that_is_mostly_noise_spaces_points_one_fine_cell_apart():
    """Below one block's 95% margin the histogram is not read (all zero) and points follow the public cell size."""
    scale = 50.0
    assert placement.steps_mostly_noise(np.array([30.0, 10.0, -5.0]), None, scale)
    assert placement.steps_mostly_noise(np.array([300.0, 100.0]), 20.0, scale)          # at most 20 trajectories
    assert not placement.steps_mostly_noise(np.array([300.0, 100.0]), 1_000.0, scale)
    stats = placement.FineStats(w=64, density=np.ones(64 * 64, np.float32) / 4096, steps=np.zeros(48))
    cells = np.arange(64 * 64)
    grid = (cells // 64 // 16) * 4 + (cells % 64) // 16          # 4 x 4 coarse cells of 16 x 16 fine ones
    place = placement.Placement(stats, BBOX, grid, 16)
    cell = place.cell_m()
    assert 390 < cell < 440                                  # the bbox is about 26 x 29 km, 64 cells a side
    lengths, lat, lon = place.points(np.array([0, 4]), np.array([0, 5, 10, 15]), np.random.default_rng(1))[:3]
    x, y = placement.local_xy(place.bbox, lat, lon)
    chords = np.hypot(np.diff(x), np.diff(y))
    assert lengths[0] > 20 and chords.max() <= cell * 1.001 and np.median(chords) > 0.9 * cell


def test_an_output_that_could_pass_max_rows_is_refused_before_anything_is_drawn_or_spent(con):
    """The cap is n times the model's public max_points, checked before any row is drawn; with an explicit n, before
    the reservation (the ledger gains no row); the message says how to raise it."""
    from duckmob import release
    from duckmob.release import fitting
    from duckmob.synth import store

    con.execute(f"FROM mob_fit('trips', 'cap', eps := 1.0, bbox := {BBOX}, seed := 1)").fetchall()
    _, model = release.read_ledger(release.database(con), lambda cur: store.load(cur, "cap"))
    assert model.max_points == 5000
    whole = fitting.sample(model, 250, np.random.SeedSequence(3))
    assert whole.traj_id.tolist() == list(range(250))
    with pytest.raises(DuckmobError, match=r"up to 1,250,000 rows .* max_rows := 2,000: raise it \(max_rows := "
                                           r"1,250,000\).*Nothing was spent"):
        fitting.sample(model, 250, np.random.SeedSequence(3), max_rows=2_000)
    with pytest.raises(duckdb.Error, match="max_rows := 1,000,000: raise it"):
        con.sql("FROM mob_sample('cap', n := 201, max_rows := 1000000)").fetchall()
    assert con.sql("SELECT count(DISTINCT traj_id) FROM mob_sample('cap', n := 200, max_rows := 1000000)"
                   ).fetchall()[0][0] == 200
    rows = con.sql("SELECT count(*) FROM mob_ledger()").fetchall()[0][0]
    with pytest.raises(duckdb.Error, match=r"max_rows := 1,000: raise it.*Nothing was spent"):
        con.sql(f"FROM synthesize('trips', eps := 1.0, bbox := {BBOX}, n := 10, max_rows := 1000)").fetchall()
    with pytest.raises(DuckmobError, match="Nothing was spent"):
        duckmob.synthesize(con, "trips", 1.0, bbox=BBOX, n=10, max_rows=1000)
    assert con.sql("SELECT count(*) FROM mob_ledger()").fetchall()[0][0] == rows     # nothing reserved
    # the default n is known after the fit only: refused before any row is drawn, saying how to check it first
    with pytest.raises(duckdb.Error, match=r"spend stands .* pass n := \.\.\. to have this checked before"):
        con.sql(f"FROM synthesize('trips', eps := 1.0, bbox := {BBOX}, max_rows := 1000)").fetchall()
    assert con.sql("SELECT count(*) FROM mob_ledger()").fetchall()[0][0] == rows + 1
    with pytest.raises(duckdb.Error, match="max_rows must be an integer of at least 1"):
        con.sql("FROM mob_sample('cap', n := 2, max_rows := 0)").fetchall()
