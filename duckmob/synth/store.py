"""Fitted models stored inside the user's database: table ``duckmob_models``.

One row per model: ``name`` (unique), ``method``, ``source`` (the table it was fitted on), ``params`` (JSON:
the public hyper-parameters and what the fit derived from noisy counts), ``eps``, ``delta`` (the spend),
``created_at``, ``model`` (BLOB: the serialised model; only differentially private statistics or weights and
public configuration are in it, never raw data), ``ledger_id`` (the release that paid for it) and ``checksum``
(SHA-256 of name, method, source, params, blob and ledger id, also recorded in that ledger row's params as
``model_checksum``). :func:`load` refuses a model whose row or blob no longer matches its ledger record (an
edited bbox, overwritten weights, a row copied from elsewhere). All functions take a connection or a cursor.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from duckmob import synth
from duckmob.errors import DuckmobError
from duckmob.privacy import ledger
from duckmob.validators import model_name

TABLE = "duckmob_models"

DDL = f"""CREATE TABLE IF NOT EXISTS {TABLE} (
    name VARCHAR PRIMARY KEY,
    method VARCHAR NOT NULL,
    source VARCHAR,
    params JSON,
    eps DOUBLE,
    delta DOUBLE,
    created_at TIMESTAMP DEFAULT current_timestamp,
    model BLOB NOT NULL,
    ledger_id BIGINT,
    checksum VARCHAR
)"""


def ensure_table(con) -> None:
    """Create ``duckmob_models`` if it does not exist (and add the ledger binding to an older one)."""
    con.execute(DDL)
    for column, kind in (("ledger_id", "BIGINT"), ("checksum", "VARCHAR")):
        con.execute(f"ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS {column} {kind}")


def _check_name(name) -> str:
    return model_name(name)


def checksum(name: str, method: str, source: str, params: dict, blob: bytes, ledger_id: int) -> str:
    """SHA-256 binding a stored model to the ledger row that paid for it."""
    h = hashlib.sha256()
    for part in (name, method, source, to_json(params), str(int(ledger_id))):
        h.update(part.encode())
        h.update(b"\x1f")
    h.update(bytes(blob))
    return h.hexdigest()


def exists(con, name: str) -> bool:
    ensure_table(con)
    return con.execute(f"SELECT count(*) FROM {TABLE} WHERE name = ?", [_check_name(name)]).fetchone()[0] > 0


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def to_json(params: dict[str, Any]) -> str:
    return json.dumps(params, default=_json_default, sort_keys=True)


def save(con, name: str, method: str, source: str, params: dict, eps: float, delta: float, blob: bytes, *,
         ledger_id: int, checksum: str) -> None:
    """Insert a fitted model, bound to its ledger row."""
    ensure_table(con)
    con.execute(f"INSERT INTO {TABLE} (name, method, source, params, eps, delta, model, ledger_id, checksum) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [_check_name(name), method, source, to_json(params), float(eps), float(delta), blob, int(ledger_id),
                 checksum])


def load(con, name: str):
    """The stored model ``name`` as ``(method, Model)``."""
    ensure_table(con)
    row = con.execute(f"SELECT method, model, source, params, ledger_id, checksum FROM {TABLE} WHERE name = ?",
                      [_check_name(name)]).fetchone()
    if row is None:
        known = [r[0] for r in con.execute(f"SELECT name FROM {TABLE} ORDER BY name").fetchall()]
        hint = f"stored models: {', '.join(known)}" if known else "no model is stored yet"
        raise DuckmobError(f"no model named '{name}' ({hint}): fit one with FROM mob_fit('table', '{name}', "
                           "eps := ..., bbox := [...])")
    method, blob, source, params, ledger_id, stored = row
    _check_binding(con, name, method, source, json.loads(params or "{}"), blob, ledger_id, stored)
    return method, synth.model_class(method).from_bytes(blob, method)


def described(con, name: str) -> dict:
    """The stored description (the ``params`` JSON) of the model ``name``; {} when there is none."""
    ensure_table(con)
    row = con.execute(f"SELECT params FROM {TABLE} WHERE name = ?", [_check_name(name)]).fetchone()
    return json.loads(row[0] or "{}") if row else {}


def _check_binding(con, name, method, source, params, blob, ledger_id, stored) -> None:
    refit = f"fit it again with FROM mob_fit('{source}', '{name}', ...) after DELETE FROM {TABLE} WHERE name = '{name}'"
    if ledger_id is None or stored is None:
        raise DuckmobError(f"model '{name}' is not bound to a ledger row (stored by an older duckmob, or edited): "
                           f"{refit}")
    row = ledger.release_row(con, ledger_id)
    recorded = json.loads(row["params"] or "{}").get("model_checksum") if row else None
    if stored != checksum(name, method, source, params, blob, ledger_id) or recorded != stored \
            or row["source"] != source:
        raise DuckmobError(f"model '{name}' does not match the ledger record of the release that fitted it (its "
                           f"row or weights were changed after it was stored): {refit}")
