"""The walk on road costs weighted by a released traffic density (duckmob.road_costs, issue 39 item 4)."""

import json

import numpy as np
import pytest
from scipy import sparse
from scipy.sparse import csgraph

from duckmob.errors import DuckmobError
from duckmob.road_costs import ROAD_WEIGHT_MAX, cost_factor, weighted_chains
from duckmob.road_paths import ROUTE_LIMIT_M, chains_of, leg_chains, network_distance, walk
from duckmob.roads import Roads, points_along, snap
from grid_roads import grid_roads

BOX = [37.76, -122.45, 37.80, -122.38]


@pytest.fixture(scope="module")
def sf_density(sf_downtown):
    """A made-up released density: lumpy (a tenth of the segments carry ten times the traffic), zero on a third."""
    rng = np.random.default_rng(11)
    d = sf_downtown.length_m * rng.gamma(0.5, 1.0, len(sf_downtown)) * np.where(rng.random(len(sf_downtown)) < 0.1, 10.0, 1.0)
    d[rng.random(len(sf_downtown)) < 0.3] = 0.0
    return d


def test_g_is_bounded_monotone_and_relative_to_the_mean():
    """g in [1, 1 / (1 - s)]: 1 / (1 - s) without traffic, (1 - s / 2) / (1 - s) at the network's mean traffic per
    metre, towards 1 far above it; decreasing in the traffic per metre; the same for the density times any factor;
    1 everywhere at s = 0 or with no positive density."""
    length = np.array([100.0, 100.0, 50.0, 200.0, 100.0, 100.0])
    density = np.array([0.0, 1.0, 1.0, 1.0, 10.0, -3.0])      # per metre: 0, .01, .02, .005, .1, 0 (cut)
    g = cost_factor(density, length, 0.5)
    mean = 13.0 / 650.0
    r = np.array([0.0, 0.01, 0.02, 0.005, 0.1, 0.0]) / mean
    assert np.allclose(g, (1 - 0.5 * r / (1 + r)) / 0.5)
    assert g[0] == pytest.approx(2.0) and g[5] == pytest.approx(2.0)
    assert ((g >= 1.0) & (g <= 2.0)).all()
    order = np.argsort(r, kind="stable")
    assert (np.diff(g[order]) <= 0).all()
    at_mean = cost_factor(np.array([1.0, 1.0]), np.array([10.0, 10.0]), 0.5)
    assert np.allclose(at_mean, 1.5)
    assert np.allclose(cost_factor(density * 37.0, length, 0.5), g, rtol=1e-12, atol=0)
    assert (cost_factor(density, length, 0.0) == 1.0).all()
    assert (cost_factor(np.zeros(6), length, 0.5) == 1.0).all()
    top = cost_factor(np.array([0.0, 1.0]), np.array([1e6, 1.0]), ROAD_WEIGHT_MAX)    # r about 1e6 on the second
    assert top[0] == pytest.approx(1 / (1 - ROAD_WEIGHT_MAX)) and top[1] == pytest.approx(1.0, abs=1e-4)
    for bad in (-0.1, 0.95, 1.0):
        with pytest.raises(DuckmobError, match="road_weight must be between 0 and 0.9"):
            cost_factor(density, length, bad)


def test_costs_depend_on_the_released_density_only(sf_downtown, sf_density):
    """The chains' costs are a function of the density (up to a factor) and the strength; a chain costs its length
    times the length-weighted mean of its segments' g, at least its length."""
    a = weighted_chains(sf_downtown, sf_density, 0.5)
    b = weighted_chains(sf_downtown, sf_density * 3.0, 0.5)
    assert np.allclose(a.cost, b.cost, rtol=1e-12, atol=0) and np.array_equal(a.edge_chain, b.edge_chain)
    assert np.allclose(a.matrix.toarray(), b.matrix.toarray(), rtol=1e-12, atol=0)
    ch = chains_of(sf_downtown)
    assert a.cost.shape == ch.length.shape and (a.cost >= 1.0).all() and (a.cost <= 2.0).all()
    g = cost_factor(sf_density, sf_downtown.length_m, 0.5)
    c = np.random.default_rng(1).integers(0, len(ch.length), 50)
    for k in c:
        on = ch.seg_chain == k
        assert a.cost[k] == pytest.approx(np.sum(g[on] * sf_downtown.length_m[on]) / np.sum(sf_downtown.length_m[on]))
    other = weighted_chains(sf_downtown, sf_density[::-1].copy(), 0.5)
    assert not np.array_equal(other.cost, a.cost)
    assert np.array_equal(weighted_chains(sf_downtown, sf_density, 0.0).cost, np.ones(len(ch.length)))


def weighted_brute_force(roads, costs, sa, ta, sb, tb, limit):
    """The cheapest cost by Dijkstra on the full graph, each segment weighted by its length times its chain's cost
    per metre: the cheapest of the four ways out of one segment's ends and into the other's, or along one."""
    g = roads.graph
    w = roads.length_m * costs.cost[costs.seg_chain]
    real = g.u != g.v
    u, v, w1 = g.u[real], g.v[real], w[real]
    key = np.minimum(u, v) * g.n_nodes + np.maximum(u, v)
    order = np.lexsort((w1, key))
    first = np.r_[True, key[order][1:] != key[order][:-1]]
    u, v, w1 = u[order][first], v[order][first], w1[order][first]
    m = sparse.csr_matrix((np.r_[w1, w1], (np.r_[u, v], np.r_[v, u])), shape=(g.n_nodes, g.n_nodes))
    nodes = np.unique(np.r_[g.u[sa], g.v[sa]])
    dist = csgraph.dijkstra(m, directed=True, indices=nodes)
    row = {n: i for i, n in enumerate(nodes)}
    out = np.empty(len(sa))
    for i in range(len(sa)):
        best = abs(ta[i] - tb[i]) * w[sa[i]] if sa[i] == sb[i] else np.inf
        for na, da in ((g.u[sa[i]], ta[i] * w[sa[i]]), (g.v[sa[i]], (1 - ta[i]) * w[sa[i]])):
            for nb, db in ((g.u[sb[i]], tb[i] * w[sb[i]]), (g.v[sb[i]], (1 - tb[i]) * w[sb[i]])):
                best = min(best, da + dist[row[na], nb] + db)
        out[i] = best
    return np.where(out <= limit, out, np.inf)


def pairs(roads, m, spread, seed):
    rng = np.random.default_rng(seed)
    sa = rng.integers(0, len(roads), m)
    ta = rng.random(m)
    lat, lon = points_along(roads, sa, ta)
    sb, tb, *_ = snap(roads, lat + rng.normal(0, spread, m), lon + rng.normal(0, spread, m))
    return sa, ta, sb, tb


def test_the_weighted_path_is_the_cheapest_under_the_costs(sf_downtown, sf_density):
    """The walk's legs on costs: their cost (metres along each stretch of chain times its cost per metre) equals the
    cheapest path's by Dijkstra over every node of the weighted graph, the table's costs (up to the limit) and the
    searches' (beyond it) alike; and no leg is shorter than its shortest path."""
    costs = weighted_chains(sf_downtown, sf_density, 0.5)
    sa, ta, sb, tb = pairs(sf_downtown, 200, 0.002, 3)
    for limit in (ROUTE_LIMIT_M, 2_500.0):
        got = network_distance(sf_downtown, sa, ta, sb, tb, limit, costs=costs)
        want = weighted_brute_force(sf_downtown, costs, sa, ta, sb, tb, limit)
        assert np.array_equal(np.isfinite(got), np.isfinite(want)) and np.isfinite(got).mean() > 0.4
        assert np.allclose(got[np.isfinite(got)], want[np.isfinite(want)], rtol=1e-5, atol=1e-2)
    seg, t = np.ravel(np.column_stack([sa, sb])), np.ravel(np.column_stack([ta, tb]))
    offsets = np.arange(0, len(seg) + 1, 2)
    point, chain, o0, o1 = leg_chains(sf_downtown, offsets, seg, t, costs=costs)
    leg = point // 2
    routed = np.bincount(leg, weights=(chain < 0), minlength=len(sa)) == 0
    cost = np.bincount(leg, weights=np.abs(o1 - o0) * costs.cost[np.maximum(chain, 0)], minlength=len(sa))
    metres = np.bincount(leg, weights=np.abs(o1 - o0), minlength=len(sa))
    cheap = np.isfinite(want := weighted_brute_force(sf_downtown, costs, sa, ta, sb, tb, ROUTE_LIMIT_M))
    assert np.allclose(cost[cheap], want[cheap], rtol=1e-5, atol=1e-2) and routed[cheap].all()
    shortest = network_distance(sf_downtown, sa, ta, sb, tb, 5_000)
    assert (metres[routed] >= shortest[routed] - 1e-3).all()
    assert (metres[cheap] > shortest[cheap] + 1.0).sum() > 10          # the costs chose other streets
    # a leg whose cheapest path costs more than the limit takes its shortest one (when within the limit)
    far = ~cheap & (shortest <= ROUTE_LIMIT_M)
    assert far.any() and np.allclose(metres[far], shortest[far], atol=1e-2)


def test_the_walk_spaces_points_by_length_along_the_cheapest_path_on_roads(sf_downtown, sf_density):
    """Trajectories walked on costs: the same number of points, the first and last kept, every point on a road
    (within 1 m), and the points at equal steps of LENGTH along the legs' cheapest paths (each point where that
    arc length falls on the stretches of chain leg_chains gives)."""
    rng = np.random.default_rng(8)
    n_traj, per = 60, 7
    costs = weighted_chains(sf_downtown, sf_density, 0.5)
    lat0, lon0 = rng.uniform(37.77, 37.79, n_traj), rng.uniform(-122.43, -122.40, n_traj)
    step = np.arange(per) * 0.0015                                  # anchors about 500 m apart
    heading = rng.uniform(0, 2 * np.pi, n_traj)
    lat = (lat0[:, None] + np.sin(heading)[:, None] * step).ravel()
    lon = (lon0[:, None] + np.cos(heading)[:, None] * step * 1.26).ravel()
    seg, t, *_ = snap(sf_downtown, lat, lon)
    # the positions of a walk: anchors at points 0, 3 and 6, the points between keep the anchor's before them
    keep = np.tile(np.arange(per) // 3 * 3, n_traj) + np.repeat(np.arange(n_traj) * per, per)
    seg, t = seg[keep], t[keep]
    offsets = np.arange(n_traj + 1) * per
    wl, wo = walk(sf_downtown, offsets, seg, t, costs=costs)
    assert wl.shape == lat.shape and snap(sf_downtown, wl, wo)[4].max() < 1.0
    plat, plon = points_along(sf_downtown, seg, t)
    ends = np.r_[offsets[:-1], offsets[1:] - 1]
    assert np.allclose(wl[ends], plat[ends]) and np.allclose(wo[ends], plon[ends])
    point, chain, o0, o1 = leg_chains(sf_downtown, offsets, seg, t, costs=costs)
    ok = np.bincount(point // per, weights=chain < 0, minlength=n_traj) == 0   # trajectories routed all along
    assert ok.mean() > 0.8
    ch = chains_of(sf_downtown)
    for i in np.flatnonzero(ok)[:25]:
        mine = point // per == i
        length = np.abs(o1[mine] - o0[mine])
        cum = np.r_[0.0, np.cumsum(length)]
        target = np.arange(per) / (per - 1) * cum[-1]
        at = np.clip(np.searchsorted(cum, target, side="left") - 1, 0, len(length) - 1)
        f = np.clip((target - cum[at]) / np.maximum(length[at], 1e-12), 0, 1)
        c, a, b = chain[mine][at], o0[mine][at], o1[mine][at]
        elat, elon = ch.point_at(sf_downtown.graph, c, a + f * (b - a))
        got = slice(offsets[i], offsets[i + 1])
        assert np.allclose(wl[got], elat, atol=1e-7) and np.allclose(wo[got], elon, atol=1e-7)


def test_a_trip_across_a_grid_takes_the_busy_street():
    """A 5 x 5 street grid (blocks of about 70 x 55 m) whose released traffic is all on its middle east-west
    street: a trip from the south-west corner to the north-east one (many shortest paths, all equally long) runs
    along that street on costs: the points spaced along its east-west half lie on it, in order; on lengths alone
    it does not."""
    box = [37.76, -122.45, 37.7625, -122.4475]
    roads = Roads.of(grid_roads(box, streets=5))
    mid = box[0] + 2 * (box[2] - box[0]) / 4
    busy = np.isclose(roads.lat1, mid) & np.isclose(roads.lat2, mid)
    costs = weighted_chains(roads, np.where(busy, roads.length_m, 0.0), 0.5)
    seg, t, *_ = snap(roads, np.array([box[0], box[2]]), np.array([box[1], box[3]]))
    n = 41
    seg, t = np.r_[np.repeat(seg[0], n - 1), seg[1]], np.r_[np.repeat(t[0], n - 1), t[1]]
    lat, lon = walk(roads, np.array([0, n]), seg, t, costs=costs)
    assert np.isclose(lat[0], box[0]) and np.isclose(lat[-1], box[2]) and np.isclose(lon[-1], box[3])
    on_busy = np.isclose(lat, mid, atol=1e-9, rtol=0)
    assert on_busy.sum() >= 12 and np.all(np.diff(lon[on_busy]) > 0)
    east_west = np.r_[False, np.isclose(lat[1:], lat[:-1], atol=1e-9, rtol=0)]
    assert on_busy[east_west].mean() > 0.9                  # the trip runs east-west on the busy street only
    plain, _ = walk(roads, np.array([0, n]), seg, t)
    assert np.isclose(plain, mid, atol=1e-9, rtol=0).sum() < 5


@pytest.fixture(scope="module")
def con():
    import duckmob

    c = duckmob.connect()
    c.execute("""CREATE TABLE trips AS SELECT range // 20 AS traj_id, range // 400 AS user_id,
        TIMESTAMP '2024-01-01' + INTERVAL (range * 30) SECOND AS ts, 37.78 + 0.012 * sin(range / 7.0) AS lat,
        -122.415 + 0.02 * cos(range / 11.0) AS lon FROM range(8000)""")
    c.execute("CREATE TABLE roads AS FROM mob_sf_roads()")
    c.execute("FROM mob_set_budget('trips', eps := 20, delta := 1e-5)").fetchall()
    yield c
    c.close()


TINY_CLEANSLATE = {"w": 4, "n_time": 4, "ti_epochs": 1, "tpg_epochs": 1, "ti_hidden": 8, "ti_latent": 2,
                   "tpg_embed": 4, "tpg_hidden": 8, "n_hint": 200, "batch_size": 8, "ti_coarse": 2, "progress": False}


@pytest.mark.parametrize("method", ["privtrace", "cleanslate"])
def test_road_weight_changes_only_the_walk_of_a_release_and_is_stored(con, method, sf_downtown):
    """params road_weight: the same release (seeded), the same points per trajectory, every point on a road, other
    streets taken; 0.5 is the default (a release without it draws exactly its rows); a stored model keeps it."""
    import duckmob

    base = TINY_CLEANSLATE if method == "cleanslate" else {}
    kw = dict(bbox=BOX, roads="roads", n=200, seed=5)
    rows = {w: duckmob.synthesize(con, "trips", 1.0, method, params={**base, "road_weight": w}, **kw)
            for w in (0.0, 0.5)}
    plain = duckmob.synthesize(con, "trips", 1.0, method, params=base, **kw)
    assert rows[0.5].equals(plain)
    a, b = rows[0.0], rows[0.5]
    assert a.num_rows == b.num_rows > 200
    assert snap(sf_downtown, b.column("lat").to_numpy(), b.column("lon").to_numpy())[4].max() < 1e-3
    moved = np.hypot(a.column("lat").to_numpy() - b.column("lat").to_numpy(),
                     a.column("lon").to_numpy() - b.column("lon").to_numpy())
    assert (moved > 1e-4).mean() > 0.05
    con.sql(f"""FROM mob_fit('trips', 'weighted_{method}', method := '{method}', eps := 1, bbox := {BOX},
                roads := 'roads', params := {json.dumps({**base, "road_weight": 0.3}).replace('"', "'")})""").fetchall()
    from duckmob.synth import store

    _, model = store.load(con, f"weighted_{method}")
    assert model.config.road_weight == 0.3


def test_a_model_stored_before_road_weight_reads_it_as_off(con):
    """A new config's road_weight is 0.5; a PrivTrace or clean-slate model stored before the parameter existed (its
    stored config lacks it) is loaded with 0, the shortest paths it walked then; one stored with it keeps it."""
    import io

    from duckmob.synth.cleanslate import CleanSlateConfig
    from duckmob.synth.privtrace import PrivTraceConfig, PrivTraceModel

    assert CleanSlateConfig.parse({}).road_weight == PrivTraceConfig.parse({}).road_weight == 0.5
    stored = CleanSlateConfig.parse({}).stored_dict()
    from duckmob.synth.cleanslate import CleanSlateModel

    old = CleanSlateModel.restore(dict(bbox=BOX, config={k: v for k, v in stored.items() if k != "road_weight"},
                                       state={}, event_json="{}", info={}), CleanSlateModel.format_version,
                                  "cleanslate")
    assert old.config.road_weight == 0.0
    con.sql(f"FROM mob_fit('trips', 'plain_privtrace', eps := 1, bbox := {BOX}, roads := 'roads')").fetchall()
    from duckmob.synth import store

    _, model = store.load(con, "plain_privtrace")
    assert isinstance(model, PrivTraceModel) and model.config.road_weight == 0.5
    z = dict(np.load(io.BytesIO(model.payload()), allow_pickle=False))
    meta = json.loads(z["meta"].tobytes().decode())
    for config, want in ((meta["config"], 0.5), ({k: v for k, v in meta["config"].items() if k != "road_weight"},
                                                  0.0)):
        z["meta"] = np.frombuffer(json.dumps({**meta, "config": config}).encode(), dtype=np.uint8)
        buf = io.BytesIO()
        np.savez(buf, **z)
        assert PrivTraceModel.load(buf.getvalue(), model.format_version, "privtrace").config.road_weight == want
