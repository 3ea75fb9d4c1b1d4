"""Fitted models stored inside the user's database: table ``duckmob_models``.

One row per model: ``name`` (unique), ``method``, ``source`` (the table it was fitted on), ``params`` (JSON:
the public hyper-parameters and what the fit derived from noisy counts), ``eps``, ``delta`` (the spend),
``created_at``, ``model`` (BLOB: the serialised model; only differentially private statistics or weights and
public configuration are in it, never raw data). All functions take a connection or a cursor.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from duckmob.errors import DuckmobError

TABLE = "duckmob_models"

_DDL = f"""CREATE TABLE IF NOT EXISTS {TABLE} (
    name VARCHAR PRIMARY KEY,
    method VARCHAR NOT NULL,
    source VARCHAR,
    params JSON,
    eps DOUBLE,
    delta DOUBLE,
    created_at TIMESTAMP DEFAULT current_timestamp,
    model BLOB NOT NULL
)"""


def ensure_table(con) -> None:
    """Create ``duckmob_models`` if it does not exist."""
    con.execute(_DDL)


def _check_name(name) -> str:
    if name is None or not str(name).strip():
        raise DuckmobError("a model needs a name: mob_fit('trips', 'my_model', eps := 1.0, ...)")
    return str(name)


def exists(con, name: str) -> bool:
    ensure_table(con)
    return con.execute(f"SELECT count(*) FROM {TABLE} WHERE name = ?", [_check_name(name)]).fetchone()[0] > 0


def check_free(con, name: str) -> None:
    """Refuse a name already in use (checked before any budget is spent)."""
    if exists(con, name):
        raise DuckmobError(f"a model named '{name}' already exists: choose another name, or delete it first "
                           f"with DELETE FROM {TABLE} WHERE name = '{name}'")


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def to_json(params: dict[str, Any]) -> str:
    return json.dumps(params, default=_json_default, sort_keys=True)


def save(con, name: str, method: str, source: str, params: dict, eps: float, delta: float, blob: bytes) -> None:
    """Insert a fitted model."""
    ensure_table(con)
    con.execute(f"INSERT INTO {TABLE} (name, method, source, params, eps, delta, model) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [_check_name(name), method, source, to_json(params), float(eps), float(delta), blob])


def load(con, name: str):
    """The stored model ``name`` as ``(method, Model)``."""
    from duckmob import synth

    ensure_table(con)
    row = con.execute(f"SELECT method, model FROM {TABLE} WHERE name = ?", [_check_name(name)]).fetchone()
    if row is None:
        known = [r[0] for r in con.execute(f"SELECT name FROM {TABLE} ORDER BY name").fetchall()]
        hint = f"stored models: {', '.join(known)}" if known else "no model is stored yet"
        raise DuckmobError(f"no model named '{name}' ({hint}): fit one with FROM mob_fit('table', '{name}', "
                           "eps := ..., bbox := [...])")
    method, blob = row
    return method, synth.model_class(method).from_bytes(blob)
