"""Downstream tasks: next-location prediction, transport mode, commuting distance."""

from __future__ import annotations

import datetime as dt

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import duckmob
from duckmob.errors import DuckmobError
from duckmob.metrics import load_side
from duckmob.metrics.downstream import MarkovPredictor, downstream, labelled_trips

from metrics_helpers import BBOX, city, table


def side(paths, name="x", **kw):
    return load_side(table(paths, **kw), BBOX, name)[0]


def values(rows):
    return {r.metric: r.value for r in rows}


def test_markov_predictor_backs_off():
    # Sequences 1-2-3 (twice) and 4-2-5: after (1, 2) comes 3; after (9, 2), unseen, first order: 3 then 5.
    offsets = np.array([0, 3, 6, 9])
    cells = np.array([1, 2, 3, 1, 2, 3, 4, 2, 5])
    model = MarkovPredictor(offsets, cells, 10)
    pred = model.predict(np.array([1, 9, -1]), np.array([2, 2, 7]))
    assert pred[0, 0] == 3 and pred[1, :2].tolist() == [3, 5]
    assert pred[2, 0] == 2                      # unseen cell: most visited cells
    assert len(set(pred[1][pred[1] >= 0])) == (pred[1] >= 0).sum()   # no repeated candidate


def test_next_location_perfect_and_hopeless():
    paths = [[(5, 5), (5, 6), (5, 7), (6, 7)], [(10, 10), (11, 10), (12, 10)]] * 5
    real = side(paths, "real")
    v = values(downstream(real, side(paths, "synth"), "next_location"))
    assert v["next_location_acc1"] == 1.0 and v["next_location_acc5"] == 1.0
    far = [[(r, c + 20) for r, c in p] for p in paths]
    v = values(downstream(real, side(far, "synth"), "next_location"))
    assert v["next_location_acc1"] == 0.0
    assert v["next_location_acc1_real_trained"] == 1.0


def test_commute_identical_and_shorter():
    paths = city(40)
    v = values(downstream(side(paths), side(paths), "commute"))
    assert v["commute_distance_error_m"] == 0.0 and v["commute_destination_jsd"] == 0.0
    assert v["commute_unreached_share"] == 0.0
    # The synthetic trips go straight to their destination from one cell west of it: the error is by hand.
    short = [[(p[-1][0], p[-1][1] - 1), p[-1]] for p in paths]
    real_s, short_s = side(paths), side(short)
    v = values(downstream(real_s, short_s, "commute"))
    assert v["commute_destination_jsd"] == 0.0
    end = real_s.cells(32).end
    n = np.bincount(end, minlength=1024)
    d_real = np.bincount(end, weights=real_s.od_m, minlength=1024)
    d_short = np.bincount(end, weights=short_s.od_m, minlength=1024)
    hit = n > 0
    expected = np.average(np.abs(d_real[hit] - d_short[hit]) / n[hit], weights=n[hit])
    assert v["commute_distance_error_m"] == pytest.approx(expected)


def modes_table(rows):
    return pa.table({"user_id": pa.array([r[0] for r in rows], pa.int64()),
                     "start": pa.array([r[1] for r in rows], pa.timestamp("us")),
                     "end": pa.array([r[2] for r in rows], pa.timestamp("us")),
                     "mode": pa.array([r[3] for r in rows], pa.string())})


def with_user(tbl, user):
    return tbl.append_column("user_id", pa.array([user] * tbl.num_rows, pa.int64()))


def test_labelled_trips_split_by_interval():
    tbl = with_user(table([[(5, c) for c in range(10)]], start_hour=8), 7)  # fixes 08:00 .. 08:09
    t0 = dt.datetime(2008, 5, 1, 8)
    labels = modes_table([(7, t0, t0 + dt.timedelta(minutes=3), "walk"),
                          (7, t0 + dt.timedelta(minutes=5), t0 + dt.timedelta(minutes=8), "bus"),
                          (8, t0, t0 + dt.timedelta(hours=1), "car")])
    trips, modes = labelled_trips(load_side(tbl, BBOX, "real")[0], labels)
    assert trips.lengths.tolist() == [4, 4] and modes.tolist() == ["walk", "bus"]


def test_mode_classification_separates_walks_from_drives():
    rng = np.random.default_rng(0)
    walks = [[(r, c), (r, c + 1)] for r, c in rng.integers(5, 25, size=(20, 2))]
    drives = [[(r, c), (r + 3, c + 3), (r + 6, c + 6)] for r, c in rng.integers(0, 20, size=(20, 2))]
    # Real: the walks happen at 08:00 and the drives at 14:00, and the labels say so.
    real = pa.concat_tables([with_user(table(walks, start_hour=8), 1),
                             with_user(table(drives, start_hour=14, first_id=100), 1)])
    t0 = dt.datetime(2008, 5, 1)
    labels = modes_table([(1, t0 + dt.timedelta(hours=8), t0 + dt.timedelta(hours=9), "walk"),
                          (1, t0 + dt.timedelta(hours=14), t0 + dt.timedelta(hours=15), "car")])
    real_side = load_side(real, BBOX, "real")[0]
    synth_paths = [[(r, c), (r, c + 1)] for r, c in rng.integers(5, 25, size=(20, 2))] + \
        [[(r, c), (r + 3, c + 3), (r + 6, c + 6)] for r, c in rng.integers(0, 20, size=(20, 2))]
    synth = side(synth_paths, "synth", with_time=False)
    synth_modes = np.array(["walk"] * 20 + ["car"] * 20)
    v = values(downstream(real_side, synth, "mode", synth_modes=synth_modes, modes=labels))
    assert v["mode_accuracy"] == 1.0 and v["mode_macro_f1"] == 1.0
    with pytest.raises(DuckmobError, match="two modes"):
        downstream(real_side, synth, "mode", synth_modes=np.array(["walk"] * 40), modes=labels)


def test_mob_downstream_from_sql(tmp_path):
    con = duckmob.connect()
    con.register("r", table(city(40)))
    con.execute("CREATE TEMP TABLE real AS FROM r")
    rows = dict((r[1], r[2]) for r in con.execute(
        f"FROM mob_downstream('real', 'real', bbox := {BBOX}, task := 'commute')").fetchall())
    assert rows["commute_distance_error_m"] == 0.0
    with pytest.raises(duckdb.Error, match="mode column"):
        con.execute(f"FROM mob_downstream('real', 'real', bbox := {BBOX}, task := 'mode', modes := 'x.parquet')"
                    ).fetchall()
    with pytest.raises(duckdb.Error, match="unknown task"):
        con.execute(f"FROM mob_downstream('real', 'real', bbox := {BBOX}, task := 'nope')").fetchall()
    con.close()


def test_mob_mode_trips_from_sql(tmp_path):
    import pyarrow.parquet as pq

    t0 = dt.datetime(2008, 5, 1, 8)
    pq.write_table(modes_table([(7, t0, t0 + dt.timedelta(minutes=3), "walk"),
                                (7, t0 + dt.timedelta(minutes=5), t0 + dt.timedelta(minutes=8), "bus")]),
                   tmp_path / "modes.parquet")
    con = duckmob.connect()
    con.register("r", with_user(table([[(5, c) for c in range(10)]]), 7))
    con.execute("CREATE TEMP TABLE real AS FROM r")
    rows = con.execute(f"SELECT traj_id, mode, count(*) FROM mob_mode_trips('real', modes := "
                       f"'{tmp_path / 'modes.parquet'}') GROUP BY ALL ORDER BY traj_id").fetchall()
    con.close()
    assert rows == [(0, "walk", 4), (1, "bus", 4)]
