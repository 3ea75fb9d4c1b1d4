"""Taxi-like trips simulated on the public downtown San Francisco roads (benchmark data for issue 39, not private).

A :class:`City` is the public part: the shipped road network (duckmob/data/roads_sf_downtown.parquet, ODbL), the
graph's largest connected component, a few dozen "hubs" and the origin-destination distribution they make. Its
seed fixes the city; :meth:`City.trips` then draws a table of trips with its own seed, so two tables drawn with
two seeds are two disjoint samples of one population (the benchmark's "real A" and "real B").

The model, in full:

- **Road classes.** Each OpenStreetMap class has a free-flow speed (``SPEED_MS``: motorway 25 m/s ... service
  4 m/s) and an origin-destination weight (``OD_WEIGHT``: primary/trunk 4, secondary 3, tertiary 2, residential
  and unclassified 1, service and living streets 0.2, motorways and links 0: nobody is picked up on a
  motorway). A node's weight is the largest weight of its segments; nodes off the graph's largest connected
  component or outside ``bbox`` (default: the issue's downtown box, lat 37.76..37.80, lon -122.45..-122.38)
  weigh 0, so trips start and end in the box (a route may leave it for a while).
- **Hubs.** ``hubs`` nodes drawn with probability proportional to their weight, with Zipf weights 1 / k^``zipf``
  (k = 1 .. hubs): a few busy places and a long tail.
- **Origins and destinations.** Each independently: with probability ``background`` a node drawn by weight alone
  (the whole city gets some trips); otherwise a hub by its Zipf weight, then a node near it with probability
  proportional to weight x exp(-d^2 / 2 spread^2) (d: straight-line metres to the hub, spread ``spread_m``,
  nodes within 3 spreads). Pairs whose path is shorter than ``min_trip_m`` are drawn again.
- **Routes.** The fastest path on the road graph (edge weight = length / class speed, so arterials carry more
  traffic), by :func:`duckmob.roads.shortest_paths`: one Dijkstra per distinct origin node (not per trip), in
  chunks of ``chunk`` sources (memory 16 bytes x chunk x nodes), paths read back vectorised.
- **Fixes.** A trip drives at a speed uniform in [``speed_ms``] (per trip); a fix every gap uniform in
  [``gap_s``] seconds (per fix), the distance covered in each gap being gap x speed x a factor in [0.5, 2]
  (log-normal, sigma 0.25: traffic lights and congestion); the first fix at the origin, the last at the
  destination. Each fix gets isotropic Gaussian GPS noise of ``gps_sigma_m`` (4) metres per axis, except a share
  ``gps_tail`` (10%) of the fixes, which get ``gps_tail_sigma_m`` (15 m: multipath between tall buildings). Issue
  39 measured real San Francisco taxi fixes in this box a median 3.8 m and a 95th percentile 20 m from a road,
  1.5% beyond 30 m; the simulated ones stay nearer (0.07% beyond 30 m: downtown's roads are dense, so a far fix
  is usually near another road; real fixes also come from parking lots and yards the roads table lacks).
- **Ids and times.** ``traj_id`` 0 .. n-1 (plus ``id_offset``); ``user_id`` uniform over n / ``trips_per_user``
  users; each trip starts at a uniform second of the week from Monday 2024-03-04 00:00.

Everything is drawn from one seeded ``numpy.random.Generator`` (benchmark data: no privacy noise here).

    python benchmarks/roads_sim.py --trips 5000 --seed 1 --out /tmp/trips.parquet   # write a table
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

SPEED_MS = {"motorway": 25.0, "motorway_link": 12.0, "trunk": 18.0, "trunk_link": 10.0, "primary": 13.0,
            "primary_link": 9.0, "secondary": 11.0, "secondary_link": 8.0, "tertiary": 9.0, "tertiary_link": 7.0,
            "unclassified": 7.0, "residential": 7.0, "living_street": 3.0, "service": 4.0}
OD_WEIGHT = {"trunk": 4.0, "primary": 4.0, "secondary": 3.0, "tertiary": 2.0, "unclassified": 1.0,
             "residential": 1.0, "living_street": 0.2, "service": 0.2, "primary_link": 0.5, "secondary_link": 0.5,
             "tertiary_link": 0.5}
WEEK_START_US = 1_709_510_400_000_000          # 2024-03-04 00:00:00 UTC, in microseconds
M_PER_DEG = 111_194.93                         # metres per degree of latitude on the sphere of duckmob.grid


def load_roads():
    """The shipped downtown San Francisco roads as a :class:`duckmob.roads.Roads`."""
    import pyarrow.parquet as pq

    from duckmob.roads import Roads
    from duckmob.sql.roads import sf_roads_path

    return Roads.of(pq.read_table(sf_roads_path()), name="mob_sf_roads")


@dataclass
class City:
    """The public side of the simulation: roads, travel-time graph, hubs and the origin-destination distribution."""

    seed: int = 0
    hubs: int = 40
    zipf: float = 1.0
    spread_m: float = 300.0
    background: float = 0.1
    bbox: tuple = (37.76, -122.45, 37.80, -122.38)
    roads: object = None
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        from scipy import sparse

        from duckmob.grid import haversine_m

        if self.roads is None:
            self.roads = load_roads()
        roads = self.roads
        g = roads.graph
        self.graph = g
        hw = roads.highway if roads.highway is not None else np.full(len(roads), "residential", object)
        speed = np.array([SPEED_MS.get(h, 7.0) for h in hw])
        weight = np.array([OD_WEIGHT.get(h, 0.0) for h in hw])
        # the travel-time graph: per node pair the fastest segment (seconds); undirected as the roads table
        real = g.u != g.v
        a = np.concatenate([g.u[real], g.v[real]])
        b = np.concatenate([g.v[real], g.u[real]])
        t = np.tile(np.maximum(g.length_m[real] / speed[real], 1e-6), 2)
        key = a * g.n_nodes + b
        order = np.lexsort((t, key))
        first = np.concatenate([[True], key[order][1:] != key[order][:-1]])
        sel = order[first]
        self.time_matrix = sparse.csr_matrix((t[sel], (a[sel], b[sel])), shape=(g.n_nodes, g.n_nodes))
        # origin-destination weight of each node: the largest of its segments', on the largest component only
        node_w = np.zeros(g.n_nodes)
        np.maximum.at(node_w, g.u, weight)
        np.maximum.at(node_w, g.v, weight)
        _, comp = g.components()
        node_w[comp != np.argmax(np.bincount(comp))] = 0.0
        lo_lat, lo_lon, hi_lat, hi_lon = self.bbox
        node_w[(g.node_lat < lo_lat) | (g.node_lat > hi_lat) | (g.node_lon < lo_lon) | (g.node_lon > hi_lon)] = 0.0
        self.node_w = node_w
        rng = np.random.default_rng(self.seed)
        self.hub_nodes = rng.choice(g.n_nodes, self.hubs, replace=False, p=node_w / node_w.sum())
        zipf = 1.0 / np.arange(1, self.hubs + 1) ** self.zipf
        self.hub_p = zipf / zipf.sum()
        # each hub's kernel: nodes within 3 spreads, weight x Gaussian of the straight-line distance
        self.kernels = []
        for h in self.hub_nodes:
            d = haversine_m(g.node_lat[h], g.node_lon[h], g.node_lat, g.node_lon)
            near = np.flatnonzero((d < 3 * self.spread_m) & (node_w > 0))
            p = node_w[near] * np.exp(-0.5 * (d[near] / self.spread_m) ** 2)
            self.kernels.append((near, np.cumsum(p) / p.sum()))
        self.node_cum = np.cumsum(node_w) / node_w.sum()

    def draw_nodes(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` origin (or destination) nodes from the mixture of the module docstring."""
        out = np.empty(n, np.int64)
        bg = rng.random(n) < self.background
        idx = np.flatnonzero(bg)
        out[idx] = np.minimum(np.searchsorted(self.node_cum, rng.random(len(idx)), side="right"),
                              len(self.node_cum) - 1)
        idx = np.flatnonzero(~bg)
        hub = rng.choice(self.hubs, len(idx), p=self.hub_p)
        u = rng.random(len(idx))
        for k in np.unique(hub):
            near, cum = self.kernels[k]
            sel = hub == k
            out[idx[sel]] = near[np.minimum(np.searchsorted(cum, u[sel], side="right"), len(near) - 1)]
        return out

    def routes(self, origins, destinations, chunk: int = 256):
        """Fastest node paths (ragged ``offsets, nodes``) and their lengths in metres, one Dijkstra per distinct
        origin node, ``chunk`` origins at a time."""
        from dataclasses import replace

        from duckmob.roads import shortest_paths

        g = replace(self.graph, matrix=self.time_matrix)
        src, row = np.unique(origins, return_inverse=True)
        paths = [None] * len(origins)
        for start in range(0, len(src), chunk):
            part = np.flatnonzero((row >= start) & (row < start + chunk))
            sp = shortest_paths(g, src[start:start + chunk])
            offsets, nodes = sp.paths(row[part] - start, destinations[part])
            for j, i in enumerate(part):
                paths[i] = nodes[offsets[j]:offsets[j + 1]]
        counts = np.array([len(p) for p in paths])
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        nodes = np.concatenate(paths).astype(np.int64)
        return offsets, nodes

    def trips(self, n: int, seed: int, *, speed_ms=(6.0, 12.0), gap_s=(30.0, 60.0), gps_sigma_m: float = 4.0,
              gps_tail: float = 0.1, gps_tail_sigma_m: float = 15.0,
              min_trip_m: float = 500.0, trips_per_user: int = 10, id_offset: int = 0) -> pa.Table:
        """``n`` simulated trips as a table (user_id, traj_id, ts, lat, lon), ordered by traj_id then ts."""
        from duckmob.grid import haversine_m

        rng = np.random.default_rng(seed)
        g = self.graph
        got_nodes, got_len = [], []
        have = 0
        while have < n:
            m = int((n - have) * 1.3) + 16
            o, d = self.draw_nodes(m, rng), self.draw_nodes(m, rng)
            offsets, nodes = self.routes(o, d)
            step = haversine_m(g.node_lat[nodes[:-1]], g.node_lon[nodes[:-1]], g.node_lat[nodes[1:]],
                               g.node_lon[nodes[1:]])
            cum = np.concatenate([[0.0], np.cumsum(step)])
            length = cum[offsets[1:] - 1] - cum[offsets[:-1]]
            keep = np.flatnonzero(length >= min_trip_m)[:n - have]
            for i in keep:            # a few thousand slices: cheap beside the Dijkstras
                got_nodes.append(nodes[offsets[i]:offsets[i + 1]])
            got_len.append(length[keep])
            have += len(keep)
        counts = np.array([len(p) for p in got_nodes])
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        nodes = np.concatenate(got_nodes)
        length = np.concatenate(got_len)
        lat, lon, fix_traj, t_s = self._fixes(offsets, nodes, length, rng, speed_ms, gap_s)
        # GPS noise, metres -> degrees
        sigma = np.where(rng.random(len(lat)) < gps_tail, gps_tail_sigma_m, gps_sigma_m)
        lat = lat + rng.normal(0.0, 1.0, len(lat)) * sigma / M_PER_DEG
        lon = lon + rng.normal(0.0, 1.0, len(lon)) * sigma / (M_PER_DEG * np.cos(np.radians(lat)))
        start_us = rng.integers(0, 7 * 86_400, n) * 1_000_000 + WEEK_START_US
        users = rng.integers(0, max(1, n // trips_per_user), n)
        ts = start_us[fix_traj] + np.rint(t_s * 1e6).astype(np.int64)
        return pa.table({"user_id": pa.array(users[fix_traj], pa.int64()),
                         "traj_id": pa.array(fix_traj + id_offset, pa.int64()),
                         "ts": pa.array(ts, pa.timestamp("us")),
                         "lat": pa.array(lat), "lon": pa.array(lon)})

    def _fixes(self, offsets, nodes, length, rng, speed_ms, gap_s):
        """Fix positions (no noise yet) along each path, their trip and their seconds since the trip's start."""
        from duckmob.grid import haversine_m

        g = self.graph
        n = len(length)
        speed = rng.uniform(*speed_ms, n)
        kmax = int(np.ceil((length / (speed * gap_s[0] * 0.5)).max())) + 1
        gaps = rng.uniform(*gap_s, (n, kmax))
        factor = np.clip(np.exp(rng.normal(0.0, 0.25, (n, kmax))), 0.5, 2.0)
        dist = np.cumsum(gaps * speed[:, None] * factor, axis=1)
        times = np.cumsum(gaps, axis=1)
        inner = dist < length[:, None]                     # fixes strictly before the destination
        n_inner = inner.sum(axis=1)
        # per trip: 0 at the origin, the inner fixes, the destination (reached at its own time)
        n_fix = n_inner + 2
        fix_traj = np.repeat(np.arange(n), n_fix)
        pos = np.arange(len(fix_traj)) - np.repeat(np.cumsum(n_fix) - n_fix, n_fix)
        s = np.zeros(len(fix_traj))
        t = np.zeros(len(fix_traj))
        mid = (pos > 0) & (pos <= n_inner[fix_traj])
        s[mid] = dist[fix_traj[mid], pos[mid] - 1]
        t[mid] = times[fix_traj[mid], pos[mid] - 1]
        last = pos == n_fix[fix_traj] - 1
        s[last] = length
        prev_t = np.where(n_inner > 0, times[np.arange(n), np.maximum(n_inner - 1, 0)], 0.0)
        prev_s = np.where(n_inner > 0, dist[np.arange(n), np.maximum(n_inner - 1, 0)], 0.0)
        t[last] = prev_t + (length - prev_s) / speed          # the last stretch at the trip's speed
        # along the paths: one monotone axis over all trips (each trip's cumulative metres + its base)
        step = haversine_m(g.node_lat[nodes[:-1]], g.node_lon[nodes[:-1]], g.node_lat[nodes[1:]],
                           g.node_lon[nodes[1:]])
        step[offsets[1:-1] - 1] = 1.0                      # between trips: a 1 m gap keeps the axis increasing
        axis = np.concatenate([[0.0], np.cumsum(step)])
        base = axis[offsets[:-1]]
        q = s + base[fix_traj]
        i = np.searchsorted(axis, q, side="right") - 1
        i = np.clip(i, offsets[:-1][fix_traj], offsets[1:][fix_traj] - 2)
        f = np.clip((q - axis[i]) / np.maximum(axis[i + 1] - axis[i], 1e-9), 0.0, 1.0)
        lat = g.node_lat[nodes[i]] + f * (g.node_lat[nodes[i + 1]] - g.node_lat[nodes[i]])
        lon = g.node_lon[nodes[i]] + f * (g.node_lon[nodes[i + 1]] - g.node_lon[nodes[i]])
        return lat, lon, fix_traj, t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trips", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--city-seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the table as Parquet here")
    args = parser.parse_args()
    import time

    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    city = City(seed=args.city_seed)
    t1 = time.perf_counter()
    table = city.trips(args.trips, args.seed)
    t2 = time.perf_counter()
    n_pts = table.num_rows
    print(f"city {t1 - t0:.1f} s, {args.trips:,} trips {t2 - t1:.1f} s: {n_pts:,} fixes, "
          f"{n_pts / args.trips:.1f} per trip")
    if args.out:
        pq.write_table(table, args.out)


if __name__ == "__main__":
    main()
