"""Small tables of straight trips in the unit box [0, 1] x [0, 1] (one fix a minute), shared by the release tests."""

import numpy as np


def straight_trips(con, n: int = 60, seed: int = 0) -> None:
    """CREATE TABLE trips of ``n`` straight trips of 2-7 fixes, 20 users, from a seeded generator."""
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(n):
        a, b = rng.random(2) * 0.8 + 0.1, rng.random(2) * 0.8 + 0.1
        for i, f in enumerate(np.linspace(0, 1, int(rng.integers(2, 8)))):
            p = a + f * (b - a)
            rows.append((t % 20, t, i * 60, float(p[0]), float(p[1])))
    con.execute("CREATE TABLE trips (user_id INTEGER, traj_id INTEGER, ts TIMESTAMP, lat DOUBLE, lon DOUBLE)")
    con.executemany("INSERT INTO trips VALUES (?, ?, to_timestamp(1.7e9 + ?)::TIMESTAMP, ?, ?)", rows)
