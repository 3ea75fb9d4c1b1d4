"""SQL layer for trajectories, grids and stay points: hidden UDFs behind the macros in trajectories.sql."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from duckmob import grid, staypoints
from duckmob.sql.udf import POINTS_TYPE, Request, Udf, one_row, points
from duckmob.trajectories import from_points, inspect

_TS = pa.timestamp("us")

# Each UDF's request (the STRUCT its macro in trajectories.sql builds), parsed into keyword arguments.
STAYPOINTS = Request(radius_m="DOUBLE", min_minutes="DOUBLE")
CELL_SEQUENCES = Request(bbox="DOUBLE[]", w="BIGINT", stay_points="BOOLEAN", radius_m="DOUBLE", min_minutes="DOUBLE",
                         outside="VARCHAR")
CHECK = Request(bbox="DOUBLE[]")
ASSIGN_POIS = Request(bbox="DOUBLE[]", w="BIGINT")


def setup(con) -> None:
    """Nothing to create: these macros name no table."""


def _ts(values: np.ndarray) -> pa.Array:
    return pa.array(values, pa.int64()).cast(_TS)


def _user(values: np.ndarray) -> pa.Array:
    return pa.array(values, pa.int64(), mask=values < 0)


def _load(pts, bbox=None, outside="fail", time_required=True):
    # mob_staypoints and mob_cell_sequences return exact data, so they use the informative, refusing cleaning;
    # release paths call from_points(..., private=True) instead.
    traj, _report = from_points(points(pts), bbox=bbox, outside=outside, time_required=time_required)
    return traj


def _staypoints(pts, request):
    traj = _load(pts)
    r = STAYPOINTS.parse(request, "_mob_staypoints")
    stays = staypoints.detect(traj, r["radius_m"], r["min_minutes"])
    idx = stays["traj"]
    first_of_traj = np.concatenate([[0], np.cumsum(np.bincount(idx, minlength=traj.n_trajectories))[:-1]])
    seq = np.arange(len(idx)) - first_of_traj[idx]
    return one_row(pa.table({
        "traj_id": traj.traj_id[idx], "seq": seq,
        "arrive_ts": _ts(stays["arrive_ts"]), "leave_ts": _ts(stays["leave_ts"]),
        "lat": stays["lat"], "lon": stays["lon"],
    }))


def _cell_sequences(pts, request):
    r = CELL_SEQUENCES.parse(request, "_mob_cell_sequences")
    bbox, w = grid.BBox.of(r["bbox"]), grid.check_width(r["w"])
    traj = _load(pts, bbox=bbox, outside=r["outside"])
    seqs = staypoints.cell_sequences(traj, bbox, w, bool(r["stay_points"]), r["radius_m"], r["min_minutes"])
    offsets = pa.array(seqs.offsets.astype(np.int32))
    return one_row(pa.table({
        "traj_id": seqs.traj_id, "user_id": _user(seqs.user_id),
        "cells": pa.ListArray.from_arrays(offsets, pa.array(seqs.cells)),
        "ts": pa.ListArray.from_arrays(offsets, _ts(seqs.ts)),
    }))


def _check(pts, request):
    # Exact counts for the data owner, NOT differentially private: inspect's first row says so.
    rows = inspect(points(pts), CHECK.parse(request, "_mob_check")["bbox"])
    return one_row(pa.table({k: [r[k] for r in rows] for k in ("check", "count", "action")},
                            schema=pa.schema([("check", pa.string()), ("count", pa.int64()),
                                              ("action", pa.string())])))


def _assign_pois(pois, request):
    pois = points(pois)
    ids = pois.field("poi_id")
    lat, lon = pois.field("lat").to_numpy(zero_copy_only=False), pois.field("lon").to_numpy(zero_copy_only=False)
    r = ASSIGN_POIS.parse(request, "_mob_assign_pois")
    cells = grid.assign_pois(lat, lon, r["bbox"], r["w"])
    return one_row(pa.table({"poi_id": ids, "cell": cells}))


def udfs(con) -> list[Udf]:
    sp_row = "STRUCT(traj_id BIGINT, seq BIGINT, arrive_ts TIMESTAMP, leave_ts TIMESTAMP, lat DOUBLE, lon DOUBLE)[]"
    seq_row = "STRUCT(traj_id BIGINT, user_id BIGINT, cells BIGINT[], ts TIMESTAMP[])[]"
    return [
        Udf("_mob_staypoints", _staypoints, [POINTS_TYPE], sp_row, STAYPOINTS),
        Udf("_mob_cell_sequences", _cell_sequences, [POINTS_TYPE], seq_row, CELL_SEQUENCES, special_nulls=True),
        Udf("_mob_check", _check, [POINTS_TYPE], "STRUCT(\"check\" VARCHAR, count BIGINT, action VARCHAR)[]", CHECK,
            special_nulls=True),
        Udf("_mob_assign_pois", _assign_pois, ["STRUCT(poi_id BIGINT, lat DOUBLE, lon DOUBLE)[]"],
            "STRUCT(poi_id BIGINT, cell BIGINT)[]", ASSIGN_POIS),
    ]
