"""Which release made a synthetic table: table ``duckmob_outputs``, one row per output drawn.

``synthesize`` and ``mob_sample`` return rows; the table a user stores them in (``CREATE TABLE synth AS FROM
synthesize(...)``) is named by the user's statement, which duckmob never sees. So an output is recorded by what it
holds: when its first block is drawn, the digest of its trajectory 0 (:func:`digest`: its latitudes and longitudes
as float64 bytes, in point order) is written with the ledger id of the release that paid for the model, the
model's name (``mob_sample``), the output's size, the public bbox and the model's public description
(:meth:`duckmob.synth.base.Model.describe`: differentially private statistics' sizes and public configuration,
never a data value). The release report (:mod:`duckmob.report`) computes the same digest from a stored table and
finds the release (:func:`find`). Nothing read from the sensitive table is written here: every value is the
output's (public) or a public parameter.

The row is written on the release core's own connection; a read-only database writes nothing (the report then
falls back on the last synthesis in the ledger and says so).
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone

import numpy as np

TABLE = "duckmob_outputs"

_DDL = f"""CREATE TABLE IF NOT EXISTS {TABLE} (
    ledger_id BIGINT NOT NULL, model VARCHAR, n BIGINT NOT NULL, first_digest VARCHAR NOT NULL, bbox DOUBLE[],
    description JSON, duckmob_version VARCHAR, format_version INTEGER, created_at TIMESTAMP NOT NULL)"""


def digest(lat, lon) -> str:
    """SHA-256 of one trajectory's points (latitudes then longitudes, float64, in point order): what a stored
    synthetic table's trajectory 0 is recognised by."""
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(lat, dtype=np.float64).tobytes())
    h.update(b"\x1f")
    h.update(np.ascontiguousarray(lon, dtype=np.float64).tobytes())
    return h.hexdigest()


def model_bbox(model) -> list[float] | None:
    """The public bbox a fitted model samples in, where it keeps one (a grid's, or its own)."""
    from duckmob.grid import BBox

    for box in (getattr(getattr(model, "grid", None), "bbox", None), getattr(model, "bbox", None)):
        if box is not None:
            return BBox.of(box).as_list()
    return None


def code_version() -> str:
    """duckmob's installed version (the package metadata: duckmob.api's ``__version__`` is the same number)."""
    from importlib import metadata

    try:
        return metadata.version("duckmob")
    except metadata.PackageNotFoundError:
        return "unknown"


def model_ledger_id(con, name: str) -> int:
    """The ledger id of the release that fitted the stored model ``name`` (checked when it was loaded)."""
    from duckmob.synth import store

    return int(con.execute(f"SELECT ledger_id FROM {store.TABLE} WHERE name = ?", [name]).fetchone()[0])


def recorder(db, ledger_id: int, model, *, name: str | None = None, bbox=None):
    """A callback for :class:`~duckmob.release.sampling.Output` (``on_first``): given the output's first block,
    records the output (see the module docstring)."""
    def record(first, n: int) -> None:
        import duckdb

        from duckmob.synth import store

        if first.n_trajectories == 0 or int(first.traj_id[0]) != 0:
            return
        lo, hi = int(first.offsets[0]), int(first.offsets[1])
        box = bbox.as_list() if hasattr(bbox, "as_list") else (list(bbox) if bbox is not None else model_bbox(model))
        described = store.to_json(model.describe()) if hasattr(model, "describe") else None
        try:
            with db.lock, db.connection() as cur:
                cur.execute(_DDL)
                cur.execute(f"INSERT INTO {TABLE} (ledger_id, model, n, first_digest, bbox, description, "
                            "duckmob_version, format_version, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            [int(ledger_id), name, int(n), digest(first.lat[lo:hi], first.lon[lo:hi]), box,
                             described, code_version(), int(getattr(model, "format_version", 0) or 0),
                             datetime.now(timezone.utc).replace(tzinfo=None)])   # UTC, as the ledger's times
        except duckdb.Error:   # a read-only database: the report falls back on the source's last release
            return
    return record


def find(con, first_digest: str, n: int | None = None) -> dict | None:
    """The latest recorded output whose trajectory 0 has ``first_digest``, one of ``n`` trajectories first when
    given (outputs of one model and seed but of other sizes may share it); None: none, or no table yet."""
    import duckdb

    try:
        row = con.execute(f"SELECT ledger_id, model, n, bbox, description, duckmob_version, format_version, created_at "
                          f"FROM {TABLE} WHERE first_digest = ? "
                          "ORDER BY n IS NOT DISTINCT FROM ? DESC, created_at DESC, ledger_id DESC LIMIT 1",
                          [first_digest, n]).fetchone()
    except duckdb.CatalogException:
        return None
    if row is None:
        return None
    keys = ("ledger_id", "model", "n", "bbox", "description", "duckmob_version", "format_version", "created_at")
    out = dict(zip(keys, row))
    out["description"] = json.loads(out["description"]) if out["description"] else {}
    return out
