"""PrivTrace's release on the roads as flows between street pieces (issue 39, item 4; duckmob/road_flows.py): each
trajectory matched to the network on its own points, its moves counted with mass 1 in all, Laplace on every pair
of touching pieces, the density read from the flows and the routes weighted by them."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import duckmob
from duckmob.privacy.noise import NoiseSource, granularity
from duckmob.road_flows import FlowLink, LINK_CLIP, flow_sums, matched_pieces, piece_mass, release_flows, \
    segment_density
from duckmob.roads import Roads, snap
from duckmob.trajectories import from_points

from grid_roads import grid_roads

GRID_BOX = [10.0, 20.0, 10.02, 20.02]          # 11 x 11 streets about 220 m apart
SF_BOX = [37.76, -122.45, 37.80, -122.38]


@pytest.fixture(scope="module")
def grid():
    return Roads.of(grid_roads(GRID_BOX, streets=11))


def _trips(lat, lon, per_trip):
    n = len(lat)
    return from_points(pa.table({"traj_id": np.repeat(np.arange(n // per_trip), per_trip),
                                 "ts": pa.array(np.tile(np.arange(per_trip), n // per_trip), pa.timestamp("s")),
                                 "lat": np.asarray(lat, float), "lon": np.asarray(lon, float)}))[0]


def test_a_trip_along_one_street_meets_every_piece_of_it_in_order(grid):
    # three fixes ~770 m apart along the southern street: the matched path runs along it, so the sequence is the
    # street's pieces west to east, though no fix lies on most of them
    owner, pieces = matched_pieces(_trips([10.0] * 3, [20.0005, 20.0075, 20.0145], 3), grid, 400.0)
    south = np.flatnonzero((grid.lat1 == 10.0) & (grid.lat2 == 10.0) & (grid.lon1 < 20.0145))
    along = grid.pieces(400.0)[south[np.argsort(grid.lon1[south])]]
    expected = along[np.r_[True, along[1:] != along[:-1]]]
    assert (owner == 0).all() and len(expected) >= 3
    assert pieces.tolist() == expected.tolist()


def test_each_trajectory_is_matched_on_its_own_points(grid):
    rng = np.random.default_rng(3)
    lat, lon = rng.uniform(10.001, 10.019, 120), rng.uniform(20.001, 20.019, 120)
    o_all, p_all = matched_pieces(_trips(lat, lon, 6), grid, 400.0)
    for t in (0, 7, 19):
        o_one, p_one = matched_pieces(_trips(lat[6 * t:6 * t + 6], lon[6 * t:6 * t + 6], 6), grid, 400.0)
        assert (o_one == 0).all() and p_one.tolist() == p_all[o_all == t].tolist()


def test_one_trajectory_moves_the_flows_by_at_most_one_on_a_public_support():
    roads = Roads.of(pq.read_table("duckmob/data/roads_sf_downtown.parquet")).clip(SF_BOX)
    rng = np.random.default_rng(4)
    data = _trips(rng.uniform(37.765, 37.795, 400), rng.uniform(-122.44, -122.39, 400), 10)
    scale = 5.0
    steps = round(1 / granularity(scale))            # one trajectory's mass in noise-grid steps
    full = flow_sums(data, roads, scale, 400.0)
    links = roads.piece_links(400.0)
    assert len(full) == len(links) == len(flow_sums(data.take(np.arange(0)), roads, scale, 400.0))
    for drop in (0, 17, 39):
        keep = np.setdiff1d(np.arange(40), [drop])
        diff = full - flow_sums(data.take(keep), roads, scale, 400.0)
        assert diff.min() >= 0 and diff.sum() == steps
    # every pair of the support is two pieces that share a node, or a piece with itself
    n_pieces = int(roads.pieces(400.0).max()) + 1
    p, q = links // n_pieces, links % n_pieces
    g = roads.graph
    piece = roads.pieces(400.0)
    nodes = [set(np.r_[g.u[piece == k], g.v[piece == k]].tolist()) for k in range(n_pieces)]
    sample = np.random.default_rng(0).choice(len(links), 300, replace=False)
    assert all(nodes[p[i]] & nodes[q[i]] for i in sample)


def test_the_release_adds_laplace_to_every_pair_and_the_density_comes_from_it(grid):
    seen = []

    class Recording(NoiseSource):
        def laplace(self, scale, size):
            seen.append((scale, size))
            return super().laplace(scale, size)

    rng = np.random.default_rng(5)
    data = _trips(rng.uniform(10.001, 10.019, 300), rng.uniform(20.001, 20.019, 300), 10)
    sums = flow_sums(data, grid, 2.0, 400.0)
    noisy, cut = release_flows(sums, 2.0, Recording(1))
    assert seen == [(2.0, len(grid.piece_links(400.0)))]
    assert (cut >= 0).all() and abs(cut.sum() - noisy.sum()) < 1e-3 * abs(noisy.sum())   # NormCut keeps the total
    density = segment_density(noisy, grid, 400.0)
    piece = grid.pieces(400.0)
    mass = np.maximum(piece_mass(noisy, grid.piece_links(400.0), int(piece.max()) + 1), 0)
    assert (density >= 0).all()
    assert np.allclose(np.bincount(piece, weights=density, minlength=len(mass)), mass)


def test_a_link_favours_the_moves_the_flows_use_more_than_their_traffic_predicts():
    piece = np.array([0, 1, 2, 3])                     # one segment a piece
    links = np.array([0 * 4 + 1, 0 * 4 + 2, 3 * 4 + 1, 3 * 4 + 2, 3 * 4 + 3])     # sorted keys p * 4 + q
    flows = np.array([90.0, 10.0, 10.0, 90.0, 5.0])    # every piece's traffic even: 0 -> 1 and 0 -> 2 expected alike
    link = FlowLink.of(piece, links, flows)
    w = link(np.array([0, 0, 3, 1, 1]), np.array([1, 2, 3, 2, 1]))
    assert w[0] > 0 > w[1]                             # 0 -> 1 used more than 0 -> 2
    assert w[2] == 0 and w[3] == 0 and w[4] == 0       # a piece with itself; pieces that do not touch
    assert np.abs(link.log_weight).max() <= LINK_CLIP


def test_privtrace_flows_from_sql_put_points_on_roads_store_their_flows_and_charge_the_same():
    from duckmob.synth import store

    con = duckmob.connect()
    con.execute("""CREATE TABLE trips AS SELECT range // 20 AS traj_id, TIMESTAMP '2024-01-01' + INTERVAL
        (range * 30) SECOND AS ts, 37.78 + 0.015 * sin(range / 7.0) AS lat, -122.415 + 0.03 * cos(range / 11.0) AS lon
        FROM range(4000)""")
    con.execute("CREATE TABLE roads AS FROM mob_sf_roads()")
    con.execute("FROM mob_set_budget('trips', eps := 10, delta := 1e-5)").fetchall()
    box = json.dumps(SF_BOX)
    for name, release in (("flows", "flows"), ("pieces", "pieces")):
        con.sql(f"""FROM mob_fit('trips', '{name}', eps := 1, bbox := {box}, roads := 'roads',
                    params := {{'road_release': '{release}'}})""").fetchall()
    _, model = store.load(con, "flows")
    _, plain = store.load(con, "pieces")
    assert model.fine.flow is not None and plain.fine.flow is None and plain.road_link is None
    roads = Roads.of(con.sql("FROM roads").to_arrow_table()).clip(SF_BOX)
    assert len(model.fine.flow) == len(roads.piece_links(400.0)) and len(model.fine.piece) == len(roads)
    assert model.road_link is not None and (np.asarray(model.fine.road) >= 0).all()
    rows = con.sql("FROM mob_sample('flows', n := 200, seed := 2)").to_arrow_table()
    again = con.sql("FROM mob_sample('flows', n := 200, seed := 2)").to_arrow_table()
    assert rows.equals(again) and rows.num_rows > 200
    assert snap(roads, rows.column("lat").to_numpy(), rows.column("lon").to_numpy())[4].max() < 1e-3
    spent = con.sql("SELECT epsilon, event FROM mob_ledger() ORDER BY id").fetchall()
    assert len(spent) == 2 and spent[0] == spent[1]     # the flows take the density's place: the same events
    con.close()
