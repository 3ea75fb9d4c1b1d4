"""Privacy audit: a synthesizer that copies its training data is caught; one that never saw it is not."""

from __future__ import annotations

import numpy as np
import pytest

import duckmob
from duckmob.metrics import load_side
from duckmob.metrics.audit import auc_and_accuracy, audit, resampled

from metrics_helpers import BBOX, city, table


def sides(members, non_members, synth):
    return [load_side(table(p, first_id=i * 1000), BBOX, name)[0]
            for i, (p, name) in enumerate(((members, "members"), (non_members, "non_members"), (synth, "synth")))]


def by_name(rows):
    return {r.metric: r.value for r in rows}


def test_auc_and_accuracy_by_hand():
    assert auc_and_accuracy(np.array([3.0, 4.0]), np.array([1.0, 2.0])) == (1.0, 1.0)
    auc, acc = auc_and_accuracy(np.array([1.0, 3.0]), np.array([2.0, 4.0]))
    assert auc == pytest.approx(0.25) and acc == pytest.approx(0.5)
    assert auc_and_accuracy(np.array([1.0, 1.0]), np.array([1.0, 1.0])) == (0.5, 0.5)


def test_resampling_follows_the_path():
    side = load_side(table([[(10, 10), (10, 12)], [(5, 5), (5, 5)]]), BBOX, "x")[0]
    pts = resampled(side, 3).reshape(2, 3, 2)
    # Three points at 0, 1/2 and 1 of the path: the middle one halfway between the ends.
    assert pts[0, 1] == pytest.approx((pts[0, 0] + pts[0, 2]) / 2, abs=1e-3)
    assert np.allclose(pts[1], pts[1, 0])  # a trajectory that never moves repeats its point


def test_copying_the_members_is_detected():
    members, non_members = city(40, seed=1), city(40, seed=2)
    v = by_name(audit(*sides(members, non_members, members), w=32, k=8))
    assert v["audit_mia_auc"] > 0.9 and v["audit_mia_accuracy"] > 0.85
    assert v["audit_uniqueness_members"] == pytest.approx(1.0)
    assert v["audit_full_overlap_members"] == pytest.approx(1.0)
    assert v["audit_uniqueness_non_members"] < 1.0


def test_independent_synthetic_data_looks_like_chance():
    members, non_members, synth = city(150, seed=1), city(150, seed=2), city(150, seed=3)
    v = by_name(audit(*sides(members, non_members, synth), w=32, k=8))
    assert 0.35 < v["audit_mia_auc"] < 0.65
    assert abs(v["audit_uniqueness_members"] - v["audit_uniqueness_non_members"]) < 0.1


def test_mob_audit_from_sql():
    con = duckmob.connect()
    for name, seed in (("m", 1), ("n", 2)):
        con.register(f"{name}_view", table(city(30, seed=seed)))
        con.execute(f"CREATE TEMP TABLE {name} AS FROM {name}_view")
    rows = con.execute(f"FROM mob_audit('m', 'n', 'm', bbox := {BBOX}, k := 8, seed := 1)").fetchall()
    con.close()
    assert all(r[0] is True for r in rows)   # exact_not_private, first on every row
    got = {r[1]: r[2] for r in rows}
    assert got["audit_mia_auc"] > 0.9 and got["audit_uniqueness_members"] == pytest.approx(1.0)
