"""Behaviour kept: every method's seeded output equals the one recorded in tests/data/seeded_outputs.json (re-recorded
by a change meant to alter it), and a model stored in the first format (tests/data/models_v1/) still loads and
draws what it drew when it was stored (models_v1/samples.json, never re-recorded).

The record was made on one machine (its CPU's instruction set, torch and numpy versions are in it); floating-point
results may legitimately differ on another, so the exact comparison runs where the platform matches. The loading
of old models is checked everywhere on what must not depend on the platform (it loads, is upgraded, and samples).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import seeded_outputs as so

RECORD = json.loads(so.RECORD.read_text())
SAME_PLATFORM = RECORD["platform"] == so.platform_key()


@pytest.mark.parametrize("case", sorted(so.CASES))
def test_seeded_outputs_equal_the_record(case):
    if not SAME_PLATFORM:
        pytest.skip(f"recorded on {RECORD['platform']}, this is {so.platform_key()}")
    got, _ = so.run_case(case)
    assert got == RECORD["cases"][case]


@pytest.mark.parametrize("case", sorted(so.CASES))
def test_models_stored_in_the_first_format_still_load(case):
    blob = (so.MODELS / f"{case}.bin").read_bytes()
    model = so.load_model(case, blob)
    t = model.sample(40, np.random.default_rng(5))
    assert t.n_trajectories == 40 and t.n_points >= 40
    stored = json.loads(so.STORED_SAMPLES.read_text())
    if stored["platform"] == so.platform_key():
        assert so.loaded_digest(case, blob) == stored["samples"][case]
