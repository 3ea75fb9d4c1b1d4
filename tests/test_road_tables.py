"""The junction distance tables a network and a weighting keep (duckmob.road_search.TileTable, NearTable): the
same distances and paths as each other and as searching, whichever is kept."""

import numpy as np
import pytest

import duckmob.road_paths as rp
from duckmob.road_costs import weighted_chains
from duckmob.road_search import NearTable, TileTable, node_distances, node_paths
from duckmob.roads import Roads
from grid_roads import grid_roads


def _pairs(ch, rng, m):
    """m junction pairs, half of them near each other (a junction and one of its 40 nearest)."""
    from scipy.spatial import cKDTree

    n = len(ch.junction)
    a = rng.integers(0, n, m)
    _, near = cKDTree(np.column_stack([ch.x, ch.y])).query(np.column_stack([ch.x[a], ch.y[a]]), k=40)
    b = np.where(rng.random(m) < 0.5, near[np.arange(m), rng.integers(0, 40, m)], rng.integers(0, n, m))
    return a, b


@pytest.mark.parametrize("weighted", [False, True])
def test_the_tile_table_answers_as_the_hash_table_and_the_searches(sf_downtown, weighted):
    """On downtown SF's junction graph, by length and by road costs (road_weight 0.5 on a lumpy made-up density):
    every distance (float32, at the table's limit and below it, broadcast) and every path of TileTable equal
    NearTable's and those of a search from scratch (node_distances / node_paths)."""
    rng = np.random.default_rng(7)
    ch = rp.chains_of(sf_downtown)
    if weighted:
        density = sf_downtown.length_m * rng.gamma(0.5, 1.0, len(sf_downtown)) * np.where(rng.random(len(sf_downtown)) < 0.1, 10.0, 1.0)
        ch = weighted_chains(sf_downtown, density, 0.5)
    tiles = TileTable.build(ch.matrix, ch.x, ch.y, rp.NEAR_M, 10**8)
    pairs = NearTable.build(ch.matrix, ch.x, ch.y, rp.NEAR_M)
    a, b = _pairs(ch, rng, 4000)
    for limit in (rp.NEAR_M, 400.0):
        d = tiles.distances(a, b, limit)
        assert d.dtype == np.float32 and 500 < np.isfinite(d).sum() < len(d)
        assert np.array_equal(d, pairs.distances(a, b, limit))
        assert np.array_equal(d, node_distances(ch.matrix, ch.x, ch.y, a, b, limit).astype(np.float32))
    got = tiles.distances(a[:30, None], b[None, :20], rp.NEAR_M)
    assert got.shape == (30, 20) and np.array_equal(got, pairs.distances(a[:30, None], b[None, :20], rp.NEAR_M))
    want = node_paths(ch.matrix, ch.x, ch.y, a, b, rp.NEAR_M)
    for x, y, z in zip(tiles.paths(a, b, rp.NEAR_M), pairs.paths(a, b, rp.NEAR_M), want):
        assert np.array_equal(x, y) and np.array_equal(x.astype(np.float32), z.astype(np.float32))
    assert tiles.pred.dtype == np.int16 and tiles.dist.nbytes < 40e6


def test_a_network_keeps_the_tile_table_and_falls_back_past_its_bound(monkeypatch):
    """Chains.near keeps a TileTable when its entries fit NEAR_MAX_ENTRIES; past it (counted before any search),
    a NearTable; either way the distances are the same."""
    roads = Roads.of(grid_roads([37.77, -122.43, 37.79, -122.40], streets=12))
    kept = rp.build_chains(roads.graph)
    assert isinstance(kept.near, TileTable)
    monkeypatch.setattr(rp, "NEAR_MAX_ENTRIES", 100)
    assert TileTable.build(kept.matrix, kept.x, kept.y, rp.NEAR_M, 100) is None
    other = rp.build_chains(roads.graph)
    assert isinstance(other.near, NearTable)
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, len(kept.junction), (2, 3000))
    assert np.array_equal(kept.distances(a, b, 600.0), other.distances(a, b, 600.0))
    for x, y in zip(kept.paths(a, b, 600.0), other.paths(a, b, 600.0)):
        assert np.array_equal(x, y)
