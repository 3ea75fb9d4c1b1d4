"""duckmob.roads and its SQL surface: a roads table validated and digested, the road graph and its shortest paths,
exact snapping, points along segments, the shipped San Francisco roads and the OpenStreetMap loader."""

import bz2
import gzip
import math
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from duckmob import roads as R
from duckmob.road_osm import DRIVABLE, read_osm
from duckmob.errors import DuckmobError
from duckmob.grid import EARTH_RADIUS_M
from duckmob.sql.roads import sf_roads_path

SMALL_OSM = """<?xml version="1.0" encoding="UTF-8"?>
<osm version="0.6">
  <node id="1" lat="37.7700000" lon="-122.4200000"/>
  <node id="2" lat="37.7700000" lon="-122.4190000"/>
  <node id="3" lat="37.7710000" lon="-122.4190000"><tag k="highway" v="traffic_signals"/></node>
  <node id="4" lat="37.7720000" lon="-122.4190000"/>
  <node id="5" lat="37.7800000" lon="-122.4000000"/>
  <node id="6" lat="37.7800000" lon="-122.4010000"/>
  <way id="10"><nd ref="1"/><nd ref="2"/><nd ref="3"/><tag k="highway" v="residential"/><tag k="name" v="A St"/></way>
  <way id="11"><nd ref="3"/><nd ref="4"/><tag k="highway" v="footway"/></way>
  <way id="12"><nd ref="4"/><nd ref="99"/><nd ref="5"/><tag k="highway" v="primary"/></way>
  <way id="13"><nd ref="1"/><nd ref="3"/><nd ref="4"/><nd ref="1"/>
    <tag k="highway" v="service"/><tag k="area" v="yes"/></way>
  <way id="14"><nd ref="5"/><nd ref="6"/><nd ref="6"/><tag k="highway" v="motorway_link"/></way>
  <relation id="20"><member type="way" ref="10" role=""/><tag k="type" v="route"/></relation>
</osm>
"""
# What the loader must read from SMALL_OSM: way 10's two segments, way 14's segment (its repeated node gives a
# zero-length segment, kept by read_osm and dropped by Roads.of); not the footway, not the area, not way 12 (its
# node 99 is missing, which drops both of its segments).
SMALL_ROWS = [(37.77, -122.42, 37.77, -122.419, "residential"), (37.77, -122.419, 37.771, -122.419, "residential"),
              (37.78, -122.4, 37.78, -122.401, "motorway_link")]


def _table(rows, highway=None):
    cols = dict(zip(R.COLUMNS, np.array(rows, dtype=float).T))
    if highway is not None:
        cols["highway"] = highway
    return pa.table(cols)


def _grid(n=3, step=0.001, lat0=10.0, lon0=20.0):
    """An n x n grid of nodes joined to their right and upper neighbours: 2 n (n - 1) segments."""
    rows = []
    for i in range(n):
        for j in range(n):
            a, b = lat0 + i * step, lon0 + j * step
            if j + 1 < n:
                rows.append((a, b, a, b + step))
            if i + 1 < n:
                rows.append((a, b, a + step, b))
    return rows


@pytest.fixture(scope="module")
def sf():
    return R.Roads.of(pq.read_table(sf_roads_path()))


# ---------------------------------------------------------------------------------------------- table and digest

def test_the_digest_depends_on_the_rows_not_their_order(sf):
    table = pq.read_table(sf_roads_path())
    shuffled = table.take(np.random.default_rng(7).permutation(table.num_rows))
    assert R.Roads.of(shuffled).digest == sf.digest
    assert len(sf.digest) == 64 and len(sf) == 28_609
    # one coordinate moved by 1e-7 degree, one class renamed, the class column dropped: each a different network
    lat1 = table.column("lat1").to_numpy().copy()
    lat1[123] += 1e-7
    assert R.Roads.of(table.set_column(0, "lat1", pa.array(lat1))).digest != sf.digest
    hw = table.column("highway").to_pylist()
    hw[5] = "primary" if hw[5] != "primary" else "secondary"
    assert R.Roads.of(table.set_column(4, "highway", pa.array(hw))).digest != sf.digest
    assert R.Roads.of(table.drop_columns(["highway"])).digest != sf.digest
    # duplicated rows with different classes: still order-invariant (the class is part of the sort key)
    dup = _table([(1, 2, 1, 3), (1, 2, 1, 3)], highway=["a", "b"])
    assert R.Roads.of(dup).digest == R.Roads.of(dup.take([1, 0])).digest


def test_a_roads_table_is_validated_with_one_line_errors():
    ok = _table([(37.0, -122.0, 37.001, -122.0)])
    with pytest.raises(DuckmobError, match=r"needs columns lat1, lon1, lat2, lon2 \(degrees\); missing lon2 "):
        R.Roads.of(ok.drop_columns(["lon2"]))
    with pytest.raises(DuckmobError, match="column lat2 must be numeric degrees, got type string"):
        R.Roads.of(ok.set_column(2, "lat2", pa.array(["37"])))
    with pytest.raises(DuckmobError, match="column lon1 is NULL in row 1"):
        R.Roads.of(pa.table({"lat1": [1.0, 2.0], "lon1": [1.0, None], "lat2": [1.5, 2.5], "lon2": [1.0, 2.0]}))
    with pytest.raises(DuckmobError, match=r"lat1 = 95.0 in row 0 is not a finite degree in \[-90, 90\]"):
        R.Roads.of(_table([(95.0, 0, 1, 1)]))
    with pytest.raises(DuckmobError, match=r"lon2 = nan in row 1 is not a finite degree in \[-180, 180\]"):
        R.Roads.of(_table([(0, 0, 1, 1), (0, 0, 1, np.nan)]))
    with pytest.raises(DuckmobError, match="column highway must be text"):
        R.Roads.of(ok.append_column("highway", pa.array([3])))
    with pytest.raises(DuckmobError, match="no segment of non-zero length"):
        R.Roads.of(_table([(1, 2, 1, 2)]))
    with pytest.raises(DuckmobError, match="expected an Arrow table"):
        R.Roads.of({"lat1": [1]})
    with pytest.raises(DuckmobError) as one_line:
        R.Roads.of(_table([(95.0, 0, 1, 1)]))
    assert "\n" not in str(one_line.value)
    # upper-case names, integer degrees, a zero-length segment dropped, NULL classes read as ''
    t = pa.table({"LAT1": [1, 2, 3], "Lon1": [1, 2, 3], "lat2": [1, 2, 4], "lon2": [2, 2, 3],
                  "highway": ["primary", None, None], "other": ["x", "y", "z"]})
    roads = R.Roads.of(t)
    assert len(roads) == 2 and roads.lat2.tolist() == [1.0, 4.0] and roads.highway.tolist() == ["primary", ""]


def test_clip_keeps_segments_with_an_endpoint_inside(sf):
    box = [37.77, -122.42, 37.78, -122.41]
    clipped = sf.clip(box)
    inside1 = (sf.lat1 >= 37.77) & (sf.lat1 <= 37.78) & (sf.lon1 >= -122.42) & (sf.lon1 <= -122.41)
    inside2 = (sf.lat2 >= 37.77) & (sf.lat2 <= 37.78) & (sf.lon2 >= -122.42) & (sf.lon2 <= -122.41)
    assert len(clipped) == int((inside1 | inside2).sum()) > 1000
    assert clipped.digest == R.Roads.of(sf.to_arrow().filter(pa.array(inside1 | inside2))).digest
    with pytest.raises(DuckmobError, match=r"no segment has an endpoint inside bbox \[1.0, 1.0, 2.0, 2.0\]"):
        sf.clip([1, 1, 2, 2])


# ---------------------------------------------------------------------------------------------- graph and paths

def test_a_grid_is_one_component_and_shared_endpoints_join():
    rows = _grid(3)
    noisy = [(a + 2e-9, b - 2e-9, c, d) for a, b, c, d in rows]          # below the 1e-7 degree rounding
    g = R.Roads.of(_table(noisy)).graph
    assert g.n_nodes == 9 and g.matrix.nnz == 2 * 12
    assert g.components()[0] == 1
    # a second grid 1 degree away: two components, each of 9 nodes
    far = [(a + 1, b, c + 1, d) for a, b, c, d in rows]
    n, labels = R.Roads.of(_table(rows + far)).graph.components()
    assert n == 2 and np.bincount(labels).tolist() == [9, 9]


def test_the_shortest_path_has_the_hand_computed_length():
    # along the meridian lon 0: A(0, 0) - B(0.001, 0) - C(0.002, 0); a detour A - D(0.001, 0.001) - C
    rows = [(0.0, 0.0, 0.001, 0.0), (0.001, 0.0, 0.002, 0.0), (0.0, 0.0, 0.001, 0.001), (0.001, 0.001, 0.002, 0.0)]
    roads = R.Roads.of(_table(rows))
    g = roads.graph
    node = {(round(a, 6), round(b, 6)): i for i, (a, b) in enumerate(zip(g.node_lat, g.node_lon))}
    a, c = node[(0.0, 0.0)], node[(0.002, 0.0)]
    sp = R.shortest_paths(g, [a])
    expected = EARTH_RADIUS_M * math.radians(0.002)                       # 222.390 m along a meridian
    assert sp.dist[0, c] == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(222.3902, abs=1e-4)
    offsets, nodes = sp.paths([0, 0], [c, a])
    assert offsets.tolist() == [0, 3, 4]
    assert nodes.tolist() == [a, node[(0.001, 0.0)], c, a]
    seg_off, segs = R.path_segments(g, offsets, nodes)
    assert seg_off.tolist() == [0, 2, 2] and segs.tolist() == [0, 1]


def test_paths_sum_to_their_distances_on_the_sf_graph(sf):
    g = sf.graph
    rng = np.random.default_rng(3)
    sources = rng.choice(g.n_nodes, 20, replace=False)
    sp = R.shortest_paths(g, sources)
    rows, targets = rng.integers(0, 20, 2000), rng.integers(0, g.n_nodes, 2000)
    offsets, nodes = sp.paths(rows, targets)
    reach = np.isfinite(sp.dist[rows, targets])
    assert reach.mean() > 0.9 and (np.diff(offsets)[~reach] == 0).all()
    first = nodes[offsets[:-1][reach]]
    last = nodes[offsets[1:][reach] - 1]
    assert (first == sources[rows[reach]]).all() and (last == targets[reach]).all()
    seg_off, segs = R.path_segments(g, offsets, nodes)
    assert (segs >= 0).all()
    total = np.add.reduceat(np.append(sf.length_m[segs], 0.0), seg_off[:-1])
    total[np.diff(seg_off) == 0] = 0.0
    assert np.allclose(total[reach], sp.dist[rows, targets][reach], rtol=1e-9, atol=1e-6)


# ---------------------------------------------------------------------------------------------- snapping

def _brute_snap(roads, lat, lon):
    """Projection of every point onto every segment in the same local plane (lat0: the middle of the network's
    latitude range): the nearest distance and snapped point."""
    lats = np.concatenate([roads.lat1, roads.lat2])
    lat0 = (lats.min() + lats.max()) / 2
    kx = math.cos(math.radians(lat0))
    ax, ay, bx, by = roads.lon1 * kx, roads.lat1, roads.lon2 * kx, roads.lat2
    qx, qy = lon[:, None] * kx, lat[:, None]
    dx, dy = bx - ax, by - ay
    t = np.clip(((qx - ax) * dx + (qy - ay) * dy) / (dx * dx + dy * dy), 0, 1)
    d = np.hypot(qx - ax - t * dx, qy - ay - t * dy)
    best = np.argmin(d, axis=1)
    r = np.arange(len(lat))
    tb = t[r, best]
    return best, d[r, best], roads.lat1[best] + tb * (roads.lat2[best] - roads.lat1[best]), \
        roads.lon1[best] + tb * (roads.lon2[best] - roads.lon1[best])


def test_snapping_equals_a_brute_force_projection(sf):
    rng = np.random.default_rng(11)
    # 200 in the downtown box, 80 around the network (the Bay too), 20 far away
    lat = np.concatenate([rng.uniform(37.76, 37.80, 200), rng.uniform(37.75, 37.81, 80), rng.uniform(37.5, 38.1, 20)])
    lon = np.concatenate([rng.uniform(-122.45, -122.38, 200), rng.uniform(-122.46, -122.36, 80),
                          rng.uniform(-122.8, -122.0, 20)])
    seg, t, slat, slon, dist = R.snap(sf, lat, lon)
    best, bdist, blat, blon = _brute_snap(sf, lat, lon)
    kx = math.cos(math.radians((min(sf.lat1.min(), sf.lat2.min()) + max(sf.lat1.max(), sf.lat2.max())) / 2))
    got = np.hypot((slon - lon) * kx, slat - lat)                     # planar distance, in degrees of latitude
    assert np.allclose(got, bdist, rtol=0, atol=1e-12)
    assert np.abs(slat - blat).max() < 1e-9 and np.abs(slon - blon).max() < 1e-9
    assert (seg == best).mean() > 0.9                                   # others: equal distances (a shared end)
    assert ((t >= 0) & (t <= 1)).all()
    lat_s, lon_s = R.points_along(sf, seg, t)
    assert np.array_equal(lat_s, slat) and np.array_equal(lon_s, slon)
    hav = 2 * EARTH_RADIUS_M * np.arcsin(np.sqrt(np.sin(np.radians(slat - lat) / 2) ** 2 + np.cos(np.radians(lat))
                                                 * np.cos(np.radians(slat)) * np.sin(np.radians(slon - lon) / 2) ** 2))
    assert np.allclose(dist, hav, rtol=1e-9, atol=1e-9)
    # in the box the issue measured, uniformly random points lie a median ~15 m from a road
    assert 12 < np.median(dist[:200]) < 19


def test_points_on_a_road_snap_to_themselves_and_bad_points_are_refused(sf):
    seg, t, lat, lon = R.sample_along(sf, 500, np.random.default_rng(5))
    s2, t2, lat2, lon2, d = R.snap(sf, lat, lon, chunk=64)
    assert d.max() < 1e-6 and np.abs(lat2 - lat).max() < 1e-12
    with pytest.raises(DuckmobError, match=r"^snap: every point needs a finite lat and lon; drop the others first$"):
        R.snap(sf, [37.77, np.nan], [-122.4, -122.4])
    empty = R.snap(sf, [], [])
    assert all(len(a) == 0 for a in empty)


# ---------------------------------------------------------------------------------------------- points along roads

def test_points_drawn_along_segments_lie_on_them_in_proportion_to_the_weights(sf):
    rng = np.random.default_rng(2)
    segs = np.array([10, 20, 30])
    seg, t, lat, lon = R.sample_along(sf, 30_000, rng, weights=[1.0, 3.0, 0.0], segments=segs)
    assert set(np.unique(seg).tolist()) == {10, 20}
    assert abs((seg == 20).mean() - 0.75) < 0.01
    # on the segment: the distance to the line through its ends, in degrees, and t inside [0, 1]
    a = np.column_stack([sf.lat1[seg], sf.lon1[seg]])
    b = np.column_stack([sf.lat2[seg], sf.lon2[seg]])
    p = np.column_stack([lat, lon])
    ab, ap = b - a, p - a
    tt = np.clip((ab * ap).sum(1) / (ab * ab).sum(1), 0, 1)
    assert np.abs(a + tt[:, None] * ab - p).max() < 1e-6
    assert ((t >= 0) & (t < 1)).all() and np.allclose(tt, t, atol=1e-9)
    # default weights: lengths, so the draws per metre are uniform over the whole network
    seg_all = R.sample_along(sf, 200_000, np.random.default_rng(4))[0]
    long_ = sf.length_m > np.quantile(sf.length_m, 0.5)
    share = long_[seg_all].mean()
    assert abs(share - sf.length_m[long_].sum() / sf.length_m.sum()) < 0.005
    with pytest.raises(TypeError, match="np.random.Generator"):
        R.sample_along(sf, 5, 42)
    with pytest.raises(DuckmobError, match="not all zero"):
        R.sample_along(sf, 5, rng, weights=[0.0, 0.0], segments=[1, 2])


# ---------------------------------------------------------------------------------------------- SQL and OSM

def test_mob_sf_roads_is_the_shipped_table(con, sf):
    assert con.sql("SELECT count(*) FROM mob_sf_roads()").fetchall() == [(28_609,)]
    table = con.sql("FROM mob_sf_roads()").to_arrow_table()
    assert table.column_names == ["lat1", "lon1", "lat2", "lon2", "highway"]
    assert R.Roads.of(table).digest == sf.digest
    assert round(float(sf.length_m.sum()) / 1000) == 620


def _write(tmp_path, name, text):
    path = tmp_path / name
    opener = {".gz": gzip.open, ".bz2": bz2.open}.get(path.suffix, open)
    with opener(path, "wt") as f:
        f.write(text)
    return str(path)


def test_the_osm_loader_keeps_drivable_ways(tmp_path, con):
    path = _write(tmp_path, "small.osm", SMALL_OSM)
    table = read_osm(path)
    assert [tuple(r.values()) for r in table.to_pylist()] == SMALL_ROWS + [(37.78, -122.401, 37.78, -122.401,
                                                                            "motorway_link")]
    for name in ("small.osm.gz", "small.osm.bz2"):
        assert read_osm(_write(tmp_path, name, SMALL_OSM)).equals(table)
    assert read_osm(path, classes=("footway",)).to_pylist() == [
        {"lat1": 37.771, "lon1": -122.419, "lat2": 37.772, "lon2": -122.419, "highway": "footway"}]
    rows = con.sql(f"FROM mob_roads_from_osm('{path}')").fetchall()
    assert rows == SMALL_ROWS                                             # the zero-length segment dropped
    rows = con.sql(f"FROM mob_roads_from_osm('{path}', bbox := [37.7705, -122.43, 37.79, -122.41])").fetchall()
    assert rows == SMALL_ROWS[1:2]
    assert con.sql(f"SELECT count(*) FROM mob_roads_from_osm('{path}', bbox := [1, 1, 2, 2])").fetchall() == [(0,)]
    # another public list of classes: the footway alone, or with the drivable ones (a walking or cycling network)
    rows = con.sql(f"FROM mob_roads_from_osm('{path}', classes := ['footway'])").fetchall()
    assert rows == [(37.771, -122.419, 37.772, -122.419, "footway")]
    names = ", ".join(f"'{c}'" for c in DRIVABLE + ("footway",))
    rows = con.sql(f"FROM mob_roads_from_osm('{path}', classes := [{names}])").fetchall()
    assert sorted(rows) == sorted(SMALL_ROWS + [(37.771, -122.419, 37.772, -122.419, "footway")])
    for bad in ((), ("",), "footway", (None,)):                        # the Python reader checks them itself
        with pytest.raises(DuckmobError, match=r"mob_roads_from_osm: classes must be a non-empty list of "):
            read_osm(path, classes=bad)
    for bad in ("[]", "['']", "[NULL]"):
        with pytest.raises(Exception, match=r"mob_roads_from_osm: classes must be a non-empty list of OpenStreetMap "
                                            r"highway values, such as \['primary'"):
            con.sql(f"FROM mob_roads_from_osm('{path}', classes := {bad})").fetchall()


def test_the_osm_loader_refuses_what_it_cannot_read(tmp_path, con, monkeypatch):
    with pytest.raises(Exception, match=r"mob_roads_from_osm: no file at '.*nope.osm'; give the path"):
        con.sql(f"FROM mob_roads_from_osm('{tmp_path / 'nope.osm'}')").fetchall()
    bad = _write(tmp_path, "bad.osm", "<osm><node id='1' lat='1' lon='2'></osm>")
    with pytest.raises(DuckmobError, match="'bad.osm' is not readable OSM XML"):
        read_osm(bad)
    other = _write(tmp_path, "roads.csv", "lat1,lon1\n")
    with pytest.raises(DuckmobError, match="'roads.csv' is not an OpenStreetMap extract"):
        read_osm(other)
    pbf = _write(tmp_path, "x.osm.pbf", "not a pbf")
    monkeypatch.setitem(sys.modules, "osmium", None)                  # as if the [roads] extra were not installed
    with pytest.raises(DuckmobError, match=r"reading .osm.pbf needs the osmium package: pip install 'duckmob\[roads"):
        read_osm(pbf)


def test_the_osm_loader_reads_pbf_like_xml(tmp_path):
    osmium = pytest.importorskip("osmium")
    xml = _write(tmp_path, "small.osm", SMALL_OSM)
    pbf = str(tmp_path / "small.osm.pbf")
    writer = osmium.SimpleWriter(pbf)
    for obj in osmium.FileProcessor(xml):
        writer.add(obj)
    writer.close()
    assert read_osm(pbf).equals(read_osm(xml))
    assert read_osm(pbf, bbox=[37.7705, -122.43, 37.79, -122.41]).num_rows == 1
    bad = _write(tmp_path, "bad.osm.pbf", "garbage")
    with pytest.raises(DuckmobError, match=r"^mob_roads_from_osm: 'bad.osm.pbf' is not a readable .osm.pbf \("):
        read_osm(bad)


def test_street_pieces_join_straight_continuations_within_a_cell():
    # a plus-shaped crossing of two straight streets, each of two segments, and a bent spur: the two halves of a
    # street are one piece, the crossing street another, the spur (at 45 degrees to both) its own; a long street is cut
    # into pieces by the piece_m cells
    lat0, lon0, d = 37.78, -122.41, 0.0005
    roads = R.Roads.from_arrays(
        lat1=np.array([lat0, lat0, lat0, lat0, lat0]), lon1=np.array([lon0, lon0, lon0, lon0, lon0]),
        lat2=np.array([lat0, lat0, lat0 + d, lat0 - d, lat0 + d * 0.707]),
        lon2=np.array([lon0 + d, lon0 - d, lon0, lon0, lon0 + d * 0.707 / np.cos(np.radians(lat0))]))
    p = roads.pieces(100_000.0)         # one cell holds them all
    assert p[0] == p[1] and p[2] == p[3] and len({p[0], p[2], p[4]}) == 3
    # ten 100 m segments in a straight line: 200 m cells cut them into about five pieces
    lon = lon0 + np.arange(11) * 100.0 / (111_195.0 * np.cos(np.radians(lat0)))
    line = R.Roads.from_arrays(np.full(10, lat0), lon[:-1], np.full(10, lat0), lon[1:])
    assert len(set(line.pieces(100_000.0))) == 1
    assert 4 <= len(set(line.pieces(200.0))) <= 6
    assert (np.diff(line.pieces(200.0)) != 0).sum() == len(set(line.pieces(200.0))) - 1   # pieces are contiguous


def test_the_placer_draws_segments_by_their_weight_near_the_point(sf):
    Placer, snap = R.Placer, R.snap

    rng = np.random.default_rng(0)
    # two points, weights on a single segment near the first: every draw for the first lands on that segment,
    # the second (no weighted segment near it) goes to its nearest segment
    lat = np.array([37.785, 37.770])
    lon = np.array([-122.405, -122.430])
    seg0 = snap(sf, lat[:1], lon[:1])[0][0]
    weights = np.zeros(len(sf))
    weights[seg0] = 1.0
    placer = Placer(sf, weights)
    out_lat, out_lon = placer.place(np.repeat(lat, 200), np.repeat(lon, 200), rng)
    seg, _, _, _, dist = snap(sf, out_lat, out_lon)
    assert dist.max() < 1.0                                   # on a road
    assert (seg[:200] == seg0).all()
    nearest = snap(sf, lat[1:], lon[1:])
    assert np.allclose(out_lat[200:], nearest[2][0]) and np.allclose(out_lon[200:], nearest[3][0])
    # two weighted segments near a point: the heavier drawn more, and swapping the weights swaps the shares
    near = snap(sf, lat[:1] + 0.0003, lon[:1])[0][0]
    assert near != seg0

    def share(w0, w1):
        w = np.zeros(len(sf))
        w[seg0], w[near] = w0, w1
        # which of the two each placed point lies on (snapped to a network of those two segments alone)
        which, _, _, _, dist = snap(sf.take([seg0, near]),
                                    *Placer(sf, w).place(np.repeat(lat[:1], 4000), np.repeat(lon[:1], 4000), rng))
        assert dist.max() < 1.0
        return float((which == 0).mean())

    assert share(3.0, 1.0) > 0.65 and share(1.0, 3.0) < 0.35 and share(1.0, 0.0) == 1.0


def test_the_placer_table_stays_bounded_on_a_wide_network():
    # a 24 x 24 street grid over about 200 km: radius / 5 metre cells would be 10^7; the table keeps at most
    # PLACE_CELLS cells, and points are still placed on the roads
    from grid_roads import grid_roads

    bbox = [39.0, 115.5, 41.0, 117.5]
    wide = R.Roads.of(grid_roads(bbox))
    placer = R.Placer(wide, np.ones(len(wide)))
    assert placer.nx * placer.ny <= R.PLACE_CELLS and placer.cum.nbytes + placer.segs.nbytes <= 60e6
    rng = np.random.default_rng(1)
    lat, lon = rng.uniform(39.0, 41.0, 500), rng.uniform(115.5, 117.5, 500)
    out_lat, out_lon = placer.place(lat, lon, rng)
    assert R.snap(wide, out_lat, out_lon)[4].max() < 1e-3
