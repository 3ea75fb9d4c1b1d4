"""Small constructed trajectory tables for the evaluation tests."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa

BBOX = [40.0, 116.0, 40.32, 116.32]   # 0.01 degree cells on a 32 x 32 grid
W = 32
STEP = 0.01


def center(row: int, col: int) -> tuple[float, float]:
    """Centre (lat, lon) of cell (row, col) of the 32 x 32 test grid."""
    return BBOX[0] + (row + 0.5) * STEP, BBOX[1] + (col + 0.5) * STEP


def table(paths: list[list[tuple[int, int]]], with_time: bool = True, start_hour: int = 8,
          first_id: int = 0) -> pa.Table:
    """A points table: trajectory i visits the centres of the cells ``paths[i]`` (row, col), one point a minute
    (or no time, ordered by ``seq``)."""
    rows = {"traj_id": [], "ts": [], "lat": [], "lon": [], "seq": []}
    t0 = dt.datetime(2008, 5, 1, start_hour, 0, 0)
    for i, path in enumerate(paths):
        for j, (r, c) in enumerate(path):
            lat, lon = center(r, c)
            rows["traj_id"].append(first_id + i)
            rows["ts"].append(t0 + dt.timedelta(minutes=j) if with_time else None)
            rows["lat"].append(lat)
            rows["lon"].append(lon)
            rows["seq"].append(j)
    return pa.table({"traj_id": pa.array(rows["traj_id"], pa.int64()),
                     "ts": pa.array(rows["ts"], pa.timestamp("us")),
                     "lat": pa.array(rows["lat"], pa.float64()),
                     "lon": pa.array(rows["lon"], pa.float64()),
                     "seq": pa.array(rows["seq"], pa.int64())})


def city(n: int = 60, seed: int = 0) -> list[list[tuple[int, int]]]:
    """``n`` random walks of 3-12 cells around the middle of the grid (a small, varied real table)."""
    rng = np.random.default_rng(seed)
    paths = []
    for _ in range(n):
        r, c = rng.integers(10, 22, size=2)
        path = [(int(r), int(c))]
        for _ in range(int(rng.integers(2, 12))):
            dr, dc = rng.integers(-1, 2, size=2)
            r, c = int(np.clip(r + dr, 0, W - 1)), int(np.clip(c + dc, 0, W - 1))
            path.append((r, c))
        paths.append(path)
    return paths



def real_and_synth(con) -> None:
    """TEMP tables ``real`` (the test city, timed) and ``synth`` (another draw, without time) on ``con``."""
    con.register("r", table(city()))
    con.register("s", table(city(seed=4), with_time=False))
    con.execute("CREATE TEMP TABLE real AS FROM r; CREATE TEMP TABLE synth AS FROM s")
