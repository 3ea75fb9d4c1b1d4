"""Road distances, road paths and trajectories walked along them (duckmob.road_paths; issue 39, item 3)."""

import numpy as np
import pyarrow as pa
import pytest
from scipy.sparse import csgraph

from duckmob.grid import haversine_m
from duckmob.road_paths import ROUTE_LIMIT_M, build_chains, chains_of, network_distance, route, walk
from duckmob.road_search import hash_table
from duckmob.roads import Placer, Roads, points_along, snap
from grid_roads import grid_roads

BOX = [37.76, -122.45, 37.80, -122.38]


@pytest.fixture(scope="module")
def sf():
    import duckmob

    con = duckmob.connect()
    roads = Roads.of(con.sql("FROM mob_sf_roads()").to_arrow_table())
    con.close()
    return roads


def brute_force(roads, sa, ta, sb, tb, limit):
    """The road distance by Dijkstra on the full (uncontracted) graph: the shortest of the four ways out of one
    segment's ends and into the other's, or along one segment."""
    g = roads.graph
    length = g.length_m
    nodes = np.unique(np.r_[g.u[sa], g.v[sa]])
    dist = csgraph.dijkstra(g.matrix, directed=False, indices=nodes)
    row = {n: i for i, n in enumerate(nodes)}
    out = np.empty(len(sa))
    for i in range(len(sa)):
        best = abs(ta[i] - tb[i]) * length[sa[i]] if sa[i] == sb[i] else np.inf
        for na, da in ((g.u[sa[i]], ta[i] * length[sa[i]]), (g.v[sa[i]], (1 - ta[i]) * length[sa[i]])):
            for nb, db in ((g.u[sb[i]], tb[i] * length[sb[i]]), (g.v[sb[i]], (1 - tb[i]) * length[sb[i]])):
                best = min(best, da + dist[row[na], nb] + db)
        out[i] = best
    return np.where(out <= limit, out, np.inf)


def test_road_distances_equal_dijkstra_on_the_whole_graph(sf):
    """The contracted graph (chains between junctions, searched on local subgraphs and in the kept table of
    junction distances) gives the same distances as Dijkstra over every node of San Francisco's graph."""
    rng = np.random.default_rng(3)
    m = 300
    sa = rng.integers(0, len(sf), m)
    ta = rng.random(m)
    lat, lon = points_along(sf, sa, ta)
    sb, tb, *_ = snap(sf, lat + rng.normal(0, 0.002, m), lon + rng.normal(0, 0.002, m))
    sb[:30], tb[:30] = sa[:30], rng.random(30)                     # some on the same segment
    for limit in (ROUTE_LIMIT_M, 2_500.0):                         # the kept table, and searches beyond it
        got = network_distance(sf, sa, ta, sb, tb, limit)
        want = brute_force(sf, sa, ta, sb, tb, limit)
        assert np.array_equal(np.isfinite(got), np.isfinite(want))
        assert np.isfinite(got).mean() > 0.5
        assert np.allclose(got[np.isfinite(got)], want[np.isfinite(want)], atol=1e-3)


def test_chains_contract_shape_points_and_break_loops():
    """A ring road with no crossing (a loop of degree-2 nodes) and a spur: every segment lies on a chain with two
    distinct ends, and distances around the ring are the shorter way round."""
    ang = np.linspace(0, 2 * np.pi, 13)[:-1]
    lat = 37.77 + 0.003 * np.sin(ang)
    lon = -122.42 + 0.004 * np.cos(ang)
    ring = Roads.from_arrays(lat, lon, np.roll(lat, -1), np.roll(lon, -1))
    ch = build_chains(ring.graph)
    assert len(ch.length) >= 2 and (ch.ends[:, 0] != ch.ends[:, 1]).all()
    assert np.isclose(ch.length.sum(), ring.length_m.sum())
    sa, sb = np.array([0, 0, 2]), np.array([6, 11, 9])
    ta, tb = np.array([0.0, 0.0, 0.5]), np.array([0.0, 1.0, 0.5])
    got = network_distance(ring, sa, ta, sb, tb, 10_000)
    assert np.allclose(got, brute_force(ring, sa, ta, sb, tb, 10_000))
    assert got[1] < 1e-6          # segment 11 ends where segment 0 starts


def test_a_walk_keeps_the_points_on_the_roads_and_joins_them_by_roads(sf):
    """Walked trajectories keep their number of points and their first and last points; every point lies on a road
    (within 1 m) and consecutive points are a shorter drive apart than points placed one by one (straight lines
    across the street grid: the road distance between consecutive points over the straight one, its median and
    90th percentile both lower)."""
    rng = np.random.default_rng(5)
    n_traj, per = 300, 12
    lat0, lon0 = rng.uniform(37.765, 37.795, n_traj), rng.uniform(-122.44, -122.39, n_traj)
    heading = rng.uniform(0, 2 * np.pi, n_traj)
    step = np.arange(per) * 0.0025                                  # about 250 m a step, in a straight line
    lat = (lat0[:, None] + np.sin(heading)[:, None] * step).ravel()
    lon = (lon0[:, None] + np.cos(heading)[:, None] * step * 1.26).ravel()
    seg, t, *_ = snap(sf, lat, lon)
    offsets = np.arange(n_traj + 1) * per
    wl, wo = walk(sf, offsets, seg, t)
    assert wl.shape == lat.shape
    assert snap(sf, wl, wo)[4].max() < 1.0
    ends = np.r_[offsets[:-1], offsets[1:] - 1]
    plat, plon = points_along(sf, seg, t)
    assert np.allclose(wl[ends], plat[ends]) and np.allclose(wo[ends], plon[ends])

    def detours(la, lo):
        a = np.flatnonzero(np.arange(len(la) - 1) % per != per - 1)
        s1, t1, *_ = snap(sf, la[a], lo[a])
        s2, t2, *_ = snap(sf, la[a + 1], lo[a + 1])
        straight = haversine_m(la[a], lo[a], la[a + 1], lo[a + 1])
        ok = straight > 20
        return network_distance(sf, s1, t1, s2, t2, 5_000)[ok] / straight[ok]

    walked, placed = detours(wl, wo), detours(plat, plon)
    assert np.median(walked) < 0.97 * np.median(placed)
    assert np.quantile(walked, 0.9) < 0.85 * np.quantile(placed, 0.9)


def test_a_walked_trajectory_depends_on_its_own_positions_only(sf):
    """Each trajectory's walked points are bit for bit the same alone as after hundreds of others in one call
    (no running sum or rounding crosses trajectories), with positions shared by consecutive points, as points
    between anchors share one (legs of length 0, skipped)."""
    rng = np.random.default_rng(11)
    n_traj = 400
    counts = rng.integers(2, 25, n_traj)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    traj = np.repeat(np.arange(n_traj), counts)
    k = np.arange(offsets[-1]) - offsets[:-1][traj]
    lat0, lon0 = rng.uniform(37.765, 37.795, n_traj), rng.uniform(-122.44, -122.39, n_traj)
    lat = lat0[traj] + 0.002 * k * np.sin(traj)
    lon = lon0[traj] + 0.0025 * k * np.cos(traj)
    seg, t, *_ = snap(sf, lat, lon)
    # two points in three take the position before them, as points between anchors do
    keep = (rng.random(len(seg)) < 0.35) | (k == 0) | (k == counts[traj] - 1)
    last = np.maximum.accumulate(np.where(keep, np.arange(len(seg)), 0))
    seg, t = seg[last], t[last]
    wl, wo = walk(sf, offsets, seg, t)
    for i in rng.choice(n_traj, 25, replace=False):
        part = slice(offsets[i], offsets[i + 1])
        al, ao = walk(sf, np.array([0, counts[i]]), seg[part], t[part])
        assert np.array_equal(al, wl[part]) and np.array_equal(ao, wo[part])


def test_points_too_far_apart_for_a_road_path_are_joined_straight_then_snapped():
    """Two separate street grids: a trajectory from one to the other has no road path; its points in between
    still end on a road (the nearest)."""
    west = grid_roads([37.76, -122.45, 37.77, -122.44], streets=5)
    east = grid_roads([37.76, -122.41, 37.77, -122.40], streets=5)
    roads = Roads.of(pa.concat_tables([west, east]))
    lat = np.array([37.765, 37.765, 37.765, 37.765])
    lon = np.array([-122.445, -122.43, -122.42, -122.405])
    seg, t, *_ = snap(roads, lat, lon)
    wl, wo = walk(roads, np.array([0, 4]), seg, t)
    assert snap(roads, wl, wo)[4].max() < 1.0


def test_routing_chooses_connected_neighbours_under_a_seed(sf):
    """route: several candidates per point, chosen so that neighbours are a short drive apart, cut the detours
    of independent draws; the same seed gives the same positions."""
    weights = np.ones(len(sf))
    placer = Placer(sf, weights)
    rng = np.random.default_rng(9)
    n_traj, per = 200, 10
    lat0 = rng.uniform(37.765, 37.795, n_traj)
    lon0 = rng.uniform(-122.44, -122.39, n_traj)
    step = np.arange(per) * 0.002
    lat = (lat0[:, None] + step).ravel()
    lon = (lon0[:, None] + 0 * step).ravel()
    offsets = np.arange(n_traj + 1) * per
    one = route(placer, offsets, lat, lon, np.random.default_rng(1), candidates=1)
    four = route(placer, offsets, lat, lon, np.random.default_rng(1))
    again = route(placer, offsets, lat, lon, np.random.default_rng(1))
    assert all(np.array_equal(x, y) for x, y in zip(four, again))

    def mean_detour(seg, t):
        a = np.flatnonzero(np.arange(len(seg) - 1) % per != per - 1)
        la, lo = points_along(sf, seg, t)
        road = network_distance(sf, seg[a], t[a], seg[a + 1], t[a + 1], 5_000)
        return float(np.mean(road - haversine_m(la[a], lo[a], la[a + 1], lo[a + 1])))

    assert mean_detour(*four) < 0.7 * mean_detour(*one)


def test_the_chains_are_kept_with_the_network(sf):
    assert chains_of(sf) is chains_of(sf)


def test_cut_keeps_each_segments_inside_part_in_order():
    """Roads.cut: a segment crossing the bbox's edge ends on the edge, one inside is unchanged, the count and
    order never change (the released density is indexed by segment), and one with nothing inside is kept whole."""
    roads = Roads.from_arrays([37.0, 37.0, 37.5, 37.2], [-122.5, -122.2, -122.5, -122.9],
                              [37.0, 37.0, 37.5, 37.2], [-122.0, -122.1, -121.0, -122.6])
    cut = roads.cut([36.9, -122.4, 37.3, -122.05])
    assert len(cut) == len(roads)
    assert np.allclose([cut.lon1[0], cut.lon2[0]], [-122.4, -122.05])          # cut at both edges
    assert np.allclose([cut.lon1[1], cut.lon2[1]], [-122.2, -122.1])           # inside: unchanged
    assert (cut.lat1[2], cut.lon1[2], cut.lon2[2]) == (37.5, -122.5, -121.0)   # outside: whole
    assert cut.digest != roads.digest


def test_every_point_of_a_release_on_roads_stays_in_the_bbox(sf):
    """Streets cross the bbox's edge; the walk runs on the network cut there, so no point leaves the bbox (helper
    report: 5 of 201,996 points lay 2-4 m outside before the cut)."""
    import duckmob

    box = [37.775, -122.43, 37.79, -122.40]
    con = duckmob.connect()
    con.execute("CREATE TABLE roads AS FROM mob_sf_roads()")
    con.execute("""CREATE TABLE trips AS SELECT range // 20 AS traj_id, range // 200 AS user_id,
        TIMESTAMP '2024-01-01' + INTERVAL (range * 30) SECOND AS ts, 37.7825 + 0.009 * sin(range / 5.0) AS lat,
        -122.415 + 0.017 * cos(range / 7.0) AS lon FROM range(20000)""")
    con.execute("FROM mob_set_budget('trips', eps := 5, delta := 1e-5)").fetchall()
    rows = con.sql(f"FROM synthesize('trips', eps := 2, bbox := {box}, roads := 'roads', seed := 4)").to_arrow_table()
    lat, lon = rows.column("lat").to_numpy(), rows.column("lon").to_numpy()
    assert len(lat) > 5000
    assert ((lat >= box[0]) & (lat <= box[2]) & (lon >= box[1]) & (lon <= box[3])).all()
    assert snap(sf, lat, lon)[4].max() < 1e-3
    con.close()


def test_a_wide_dense_network_keeps_no_table_and_searches_instead():
    """Memory bounded by the network near a search, not by the city: a 300 x 300 street grid (about 90,000
    junctions 60 m apart, some 35 million junction pairs within 1 km) keeps no distance table; its road distances
    are searched at each look-up and still equal Dijkstra on the whole graph."""
    roads = Roads.of(grid_roads([37.70, -122.55, 37.88, -122.30], streets=300))
    ch = chains_of(roads)
    assert len(ch.junction) > 80_000 and ch.near is None
    rng = np.random.default_rng(2)
    sa, ta = rng.integers(0, len(roads), 40), rng.random(40)
    lat, lon = points_along(roads, sa, ta)
    sb, tb, *_ = snap(roads, lat + rng.normal(0, 0.002, 40), lon + rng.normal(0, 0.002, 40))
    got = network_distance(roads, sa, ta, sb, tb, ROUTE_LIMIT_M)
    want = brute_force(roads, sa, ta, sb, tb, ROUTE_LIMIT_M)
    assert np.isfinite(got).sum() > 20 and np.array_equal(np.isfinite(got), np.isfinite(want))
    assert np.allclose(got[np.isfinite(got)], want[np.isfinite(want)], atol=1e-3)


@pytest.mark.parametrize("bound", [1_000, 50_000_000, 1 << 40])
def test_the_hash_table_finds_exactly_its_keys(bound):
    """road_search.HashTable (the junction distance table's index): every key at the slot it was given, no other
    key found, out-of-range keys (negative, beyond the bound) refused; uint32 slots below 2^32, int64 above."""
    rng = np.random.default_rng(bound % 97)
    keys = np.unique(rng.integers(0, bound, min(bound // 2, 200_000)))
    table, slot = hash_table(keys, bound)
    assert table.slots.dtype == (np.uint32 if bound < 1 << 32 else np.int64)
    assert len(np.unique(slot)) == len(keys) and len(table.slots) >= 2 * len(keys)
    got, found = table.find(keys)
    assert found.all() and np.array_equal(got, slot)
    others = np.setdiff1d(rng.integers(0, bound, 50_000), keys)
    assert not table.find(others)[1].any()
    assert not table.find(np.array([-1, bound, bound + 5]))[1].any()
    empty, _ = hash_table(np.zeros(0, np.int64), bound)
    assert not empty.find(keys[:10])[1].any()


def test_a_packed_table_reads_each_keys_value_and_inf_where_absent():
    """road_search.HashTable.pack / words: each key's 32-bit value beside it in one word; an absent key ends on an
    empty slot, whose value is the fill (inf for the junction distances)."""
    rng = np.random.default_rng(5)
    keys = np.unique(rng.integers(0, 40_000_000, 100_000))
    table, slot = hash_table(keys, 40_000_000)
    values = np.full(len(table.slots), np.inf, np.float32)
    values[slot] = rng.random(len(keys)).astype(np.float32) * 1000
    packed = table.pack(values)
    got_slot, word = packed.words(keys.astype(np.uint64))
    assert np.array_equal(got_slot, slot)
    assert np.array_equal((word >> np.uint64(32)).astype(np.uint32).view(np.float32), values[slot])
    others = np.setdiff1d(rng.integers(0, 40_000_000, 20_000), keys).astype(np.uint64)
    assert np.isinf((packed.words(others)[1] >> np.uint64(32)).astype(np.uint32).view(np.float32)).all()
    assert np.array_equal(packed.find(keys)[0], slot) and not packed.find(others)[1].any()


def test_positions_read_from_the_segment_table_equal_the_graph_s(sf):
    """Chains.position reads each segment's chain and node offsets from a table built once; they equal what the
    graph gives (Chains.segment_ends) for every segment, and the offsets interpolate between them."""
    ch = chains_of(sf)
    seg = np.arange(len(sf))
    chain, o_from, o_to = ch.segment_ends(sf.graph, seg)
    t = np.random.default_rng(3).random(len(sf))
    got_chain, got_offset = ch.position(sf.graph, seg, t)
    assert np.array_equal(got_chain, chain) and np.array_equal(got_offset, o_from + t * (o_to - o_from))
    assert (chain >= 0).all() and (np.abs(o_to - o_from) <= ch.length[chain] + 1e-9).all()


def test_a_table_over_2_32_keys_keeps_its_distances_apart_and_answers_the_same(monkeypatch):
    """road_search.NearTable over 2^32 keys (more than 65,536 junctions) keeps int64 keys and its distances in
    their own array instead of packed words; forced here on a small grid, it answers every distance and path as the
    packed table does."""
    import duckmob.road_search as rs

    roads = Roads.of(grid_roads([37.77, -122.43, 37.79, -122.40], streets=12))
    ch = chains_of(roads)
    packed = rs.NearTable.build(ch.matrix, ch.x, ch.y, 1_000.0)
    real = rs.hash_table
    monkeypatch.setattr(rs, "hash_table", lambda key, bound: real(key, 1 << 40))
    apart = rs.NearTable.build(ch.matrix, ch.x, ch.y, 1_000.0)
    assert packed.dist is None and apart.dist is not None and apart.table.slots.dtype == np.int64
    rng = np.random.default_rng(4)
    a, b = rng.integers(0, len(ch.junction), (2, 3000))
    for limit in (1_000.0, 400.0):
        d = packed.distances(a, b, limit)
        assert np.array_equal(d, apart.distances(a, b, limit)) and 0 < np.isfinite(d).sum() < len(d)
        assert np.array_equal(d, rs.node_distances(ch.matrix, ch.x, ch.y, a, b, limit).astype(np.float32))
    for x, y in zip(packed.paths(a, b, 1_000.0), apart.paths(a, b, 1_000.0)):
        assert np.array_equal(x, y)
