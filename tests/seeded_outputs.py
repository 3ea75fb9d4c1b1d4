"""Seeded outputs of every method, as digests: what the tree produced when they were recorded.

``python tests/seeded_outputs.py`` records them in tests/data/seeded_outputs.json; test_seeded_outputs.py
compares a fresh run with the record, so that a change meant to keep behaviour (a refactor) proves it did. Each
case fits a method on the first trajectories of the shipped sample under a fixed seed, through the paths users
run: ``synthesize`` (Python API) and ``mob_fit`` + ``mob_sample`` (SQL, through a stored model).
"""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path

RECORD = Path(__file__).parent / "data" / "seeded_outputs.json"
MODELS = Path(__file__).parent / "data" / "models_v1"
BBOX = [39.75, 116.15, 40.10, 116.60]

# method -> small public hyper-parameters that keep a fit to seconds
CASES = {
    "privtrace": {},
    "privtrace_cells": {"output": "cells"},
    "hrnet": {"epochs": 2, "pretrain_iterations": 30, "n_hint": 200},
    "baseline": {"epochs": 2, "n_hint": 200},
    "pategail": {"rounds": 2, "episodes": 32},
    "cleanslate": {"ti_epochs": 1, "tpg_epochs": 1, "n_hint": 200},
}


def platform_key() -> str:
    """Floating-point results of torch may differ between CPU instruction sets: a record holds for its own."""
    import numpy as np
    import torch

    return f"{platform.machine()}/{torch.backends.cpu.get_cpu_capability()}/torch {torch.__version__}/numpy {np.__version__}"


def _digest(table) -> str:
    h = hashlib.sha256()
    for name in table.column_names:
        h.update(name.encode())
        column = table.column(name).combine_chunks()
        h.update(str(column.to_pylist()).encode())
    return h.hexdigest()


def _method(case: str) -> str:
    return case.split("_")[0]


def run_case(case: str) -> dict[str, str]:
    import duckmob
    from duckmob.samples import sample_path

    params = CASES[case]
    con = duckmob.connect()
    con.execute(f"CREATE TABLE pts AS SELECT * FROM read_parquet('{sample_path()}') "
                "WHERE traj_id IN (SELECT DISTINCT traj_id FROM read_parquet("
                f"'{sample_path()}') ORDER BY traj_id LIMIT 60)")
    con.execute("FROM mob_set_budget('pts', eps := 100, delta := 1e-3)")
    out = duckmob.synthesize(con, "pts", 4.0, method=_method(case), bbox=BBOX, n=40, seed=11,
                             params=json.dumps(params))
    con.execute("SELECT * FROM mob_fit('pts', 'm', eps := 4.0, method := ?, bbox := ?, seed := 12, params := ?)",
                [_method(case), BBOX, json.dumps(params)]).fetchall()
    sampled = con.sql("FROM mob_sample('m', n := 40, seed := 13)").to_arrow_table()
    blob = con.execute("SELECT model FROM duckmob_models WHERE name = 'm'").fetchone()[0]
    con.close()
    return {"synthesize": _digest(out), "mob_sample": _digest(sampled), "loaded": loaded_digest(case, blob)}, blob


def load_model(case: str, blob: bytes):
    """A stored model's blob read back by the current code."""
    from duckmob import synth

    return synth.model_class(_method(case)).from_bytes(blob)


def loaded_digest(case: str, blob: bytes) -> str:
    """Digest of 40 trajectories drawn from ``blob`` loaded back, under a fixed generator."""
    import numpy as np

    t = load_model(case, blob).sample(40, np.random.default_rng(5))
    h = hashlib.sha256()
    for a in (t.offsets, t.traj_id, t.ts, t.lat, t.lon):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def record() -> dict:
    """Run every case. The stored models of the first format (models_v1/, written by the first recording, before
    models carried a version) are kept as they are: they test that later versions still load them."""
    cases = {}
    for case in CASES:
        cases[case], blob = run_case(case)
        if not (MODELS / f"{case}.bin").exists():
            (MODELS / f"{case}.bin").write_bytes(blob)
    return {"platform": platform_key(), "cases": cases}


# What each first-format model of models_v1/ drew when it was recorded (``loaded_digest``), kept apart from the
# record: a later change of a method changes what a new fit draws, never what an old stored model draws.
STORED_SAMPLES = MODELS / "samples.json"


if __name__ == "__main__":
    MODELS.mkdir(parents=True, exist_ok=True)
    RECORD.write_text(json.dumps(record(), indent=1, sort_keys=True) + "\n")
    print(RECORD.read_text())
