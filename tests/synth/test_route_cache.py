"""The route cache of the fine placement (issue 42 item 2): route tables kept across output blocks give exactly the
rows that tables computed afresh in every block give, under a seed, on every sampling path.

The IndexError that withdrew the cache at 300 M fixes (block 60 of a default-n output) is reproduced here on an
8 x 8 fine grid: a coarse cell holding no fine cell centre (a PrivTrace split deeper than the fine grid) has no
anchors, so a move from it has no routes and its ``first`` is the next key's. In a table computed for one block
that silently reads another move's routes; in the kept table a key first met in a later block is laid out after
every route, so the chain read past the end. The first test's scenario run against routes.py as it was before
084cb66 raised ``IndexError: index 12 is out of bounds for axis 0 with size 12`` on the kept table (and started
trajectory 0 in cell 2 on a fresh one); with that fix (proxy cells) reverted in today's code, the first test fails
with the same IndexError.
"""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pytest

import duckmob
from duckmob.privacy.noise import NoiseSource
from duckmob.release import sampling
from duckmob.synth.base import fit_unrecorded
from duckmob.synth.placement import STEP_EDGES_M, FineStats, Placement
from duckmob.synth.placement import routes as routes_module
from duckmob.synth.privtrace import PrivTrace, PrivTraceModel
from duckmob.trajectories import Trajectories, synthetic_table

BOX = [40.0, 116.0, 40.05, 116.06]
GEOLIFE_BBOX = [39.8477, 116.1956, 40.1133, 116.4880]


def _split_placement() -> Placement:
    """8 x 8 fine cells; coarse cell 0 the west half, 2 the east half, 1 (centred in the west) holds no fine
    cell centre: it is routed as its proxy, 0."""
    w = 8
    density = (np.random.default_rng(1).random(w * w) ** 3).astype(np.float32)
    coarse = (np.arange(w * w) % w >= w // 2).astype(np.int64) * 2
    lon = BOX[1] + np.array([0.1, 0.3, 0.9]) * (BOX[3] - BOX[1])
    centres = (np.full(3, (BOX[0] + BOX[2]) / 2), lon)
    return Placement(FineStats(w, density, np.ones(len(STEP_EDGES_M) - 1)), BOX, coarse, 3, anchors=3,
                     centres=centres)


def _paths(pl: Placement, seqs, seed: int):
    off = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
    return pl.fine_paths(off, np.concatenate(seqs).astype(np.int64), np.random.default_rng(seed))


def test_a_move_first_met_in_a_later_block_from_a_cell_without_fine_cells_reads_its_own_routes():
    """The 300 M-fix crash on small data: the move 2 -> 0 kept from an earlier block, then a block whose first
    trajectory starts in cell 1 (no fine cell): its moves' keys are laid out after every kept route."""
    block = [[1, 2, 0], [2, 0]]
    fresh = _split_placement()
    f_off, f_cells = _paths(fresh, block, 5)
    kept = _split_placement()
    _paths(kept, [[2, 0]], 4)                                   # the earlier block
    k_off, k_cells = _paths(kept, block, 5)
    assert np.array_equal(k_off, f_off) and np.array_equal(k_cells, f_cells)
    side = kept.coarse[k_cells]
    # trajectory 0 starts in cell 1's proxy (0), crosses to 2 and comes back to 0; trajectory 1 goes 2 -> 0
    assert side[k_off[:-1]].tolist() == [0, 2] and side[k_off[1:] - 1].tolist() == [0, 0]
    assert (side[k_off[0]:k_off[1]] == 2).any()
    kept_moves = kept._cache["moves"]
    starts = np.append(np.sort(kept_moves["first"]), len(kept_moves["end"]))
    assert (np.diff(starts) > 0).all()                              # every kept key owns routes
    assert sorted(set(kept_moves["keys"] % 9)) == [0 * 3 + 2, 2 * 3 + 0]     # 1 -> 2 was routed as 0 -> 2


def test_a_move_without_routes_is_refused_instead_of_reading_another_moves_routes():
    """Cell 1 has no anchor: asked directly for its moves (bypassing the proxy), the cache refuses the table in
    one line rather than keeping a key whose routes are the next key's (or past the end)."""
    pl = _split_placement()
    pl.route_tables(np.array([2 * 3 + 0]))
    with pytest.raises(ValueError, match="move without routes"):
        pl.route_tables(np.array([1 * 3 + 2]))
    assert pl._cache["moves"]["keys"].size == 4                      # the refused fill left the cache as it was
    pl.keep_routes = False
    with pytest.raises(ValueError, match="move without routes"):
        pl.route_tables(np.array([1 * 3 + 2]))


def _random_walks(n: int, seed: int) -> Trajectories:
    rng = np.random.default_rng(seed)
    k = rng.integers(2, 30, n)
    off = np.concatenate([[0], np.cumsum(k)]).astype(np.int64)
    start = rng.random((n, 2)) * [0.05, 0.06] + [40.0, 116.0]
    steps = rng.normal(0, 0.0008, (int(off[-1]), 2))
    owner = np.repeat(np.arange(n), k)
    walk = np.cumsum(steps, axis=0)
    walk -= np.repeat(walk[off[:-1]] - steps[off[:-1]], k, axis=0)     # each walk restarts at its start
    pts = np.clip(start[owner] + walk, [40.0, 116.0], [40.05, 116.06])
    return Trajectories(off, np.arange(n), np.arange(n), np.zeros(len(pts), np.int64), pts[:, 0], pts[:, 1])


@pytest.fixture(scope="module", params=["deep", "default"])
def model(request) -> PrivTraceModel:
    """A PrivTrace model with the fine stage: 'deep' has a fine grid (4 x 4) coarser than its 36 first-layer
    cells, so most coarse cells hold no fine cell centre (the 300 M-fix conditions); 'default' the usual one."""
    data = _random_walks(400, seed=2)
    kwargs = dict(K=6, fine_w=4) if request.param == "deep" else {}
    return fit_unrecorded(PrivTrace(BOX, **kwargs), data, 5.0, 0.0, NoiseSource(3))


def _fresh(model: PrivTraceModel, keep: bool) -> PrivTraceModel:
    again = PrivTraceModel.from_bytes(model.to_bytes())
    again.placement().keep_routes = keep
    return again


def test_kept_routes_give_the_rows_of_fresh_ones_in_any_block_order_and_thread_count(model, monkeypatch):
    monkeypatch.setattr(sampling, "CHEAP_BLOCK_S", 0.0)        # draw ahead on 2 threads however cheap the blocks
    n, seed = 9000, np.random.SeedSequence(11)                 # five blocks, the last one partial
    off = _fresh(model, keep=False)
    expected = sampling.Output(off, n, seed, threads=1).table()
    assert "moves" not in off.placement()._cache                # nothing kept with the cache off
    reversed_blocks = _fresh(model, keep=True)
    parts = {b: sampling.draw_block(reversed_blocks, n, seed, b) for b in range(sampling.n_blocks(n) - 1, -1, -1)}
    first = reversed_blocks.placement()._cache["moves"]["keys"].size
    assert first > 0
    for threads in (1, 2):
        on = _fresh(model, keep=True)
        output = sampling.Output(on, n, seed, threads=threads)
        assert output._ahead.threads == threads
        assert output.table().equals(expected)
        assert on.placement()._cache["moves"]["keys"].size == first      # the same moves kept, whatever the order
    assert pa.concat_tables([synthetic_table(parts[b]) for b in sorted(parts)]).combine_chunks().equals(expected)


def test_concurrent_fills_compute_each_key_once_and_keep_every_key():
    """Four threads fill one placement's cache at once with overlapping move sets: each key is computed once
    (a thread waits for a fill in progress instead of repeating it) and no fill drops another's keys."""
    rng = np.random.default_rng(5)
    w = 32
    density = (rng.random(w * w) ** 3).astype(np.float32)
    coarse = (np.arange(w * w) // w // 8) * 4 + (np.arange(w * w) % w // 8)         # 4 x 4 coarse cells
    stats = FineStats(w, density, np.ones(len(STEP_EDGES_M) - 1))
    pl = Placement(stats, BOX, coarse, 16, anchors=4, route_draws=3)
    computed, lock = [], threading.Lock()
    compute = pl._route_tables_split

    def recording(pairs, costs, which=None):
        with lock:
            computed.append(pairs[:, 0] * 16 + pairs[:, 1])
        return compute(pairs, costs, which)

    pl._route_tables_split = recording
    a, b = np.divmod(np.arange(16 * 16), 16)
    near = np.flatnonzero((np.abs(a // 4 - b // 4) <= 1) & (np.abs(a % 4 - b % 4) <= 1) & (a != b))
    sets = [near[i::3] for i in range(3)] + [near[::2]]                   # the last overlaps all three
    barrier, got = threading.Barrier(len(sets)), [None] * len(sets)

    def fill(i):
        barrier.wait()
        first, off, cells, _ = pl.route_tables(sets[i])
        got[i] = [cells[off[r]:off[r + 1]].tolist() for r in first.reshape(-1)]

    threads = [threading.Thread(target=fill, args=(i,)) for i in range(len(sets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    moves = np.concatenate(computed)
    assert len(moves) == len(np.unique(moves)) == len(near)            # each move's graph built once
    assert pl._cache["moves"]["keys"].size == 3 * len(near)
    fresh = Placement(stats, BOX, coarse, 16, anchors=4, route_draws=3)
    fresh.keep_routes = False
    for i, s in enumerate(sets):
        first, off, cells, _ = fresh.route_tables(s)
        assert got[i] == [cells[off[r]:off[r + 1]].tolist() for r in first.reshape(-1)]


def test_the_switch_is_read_from_the_environment(monkeypatch):
    monkeypatch.setenv(routes_module.ROUTE_CACHE_VARIABLE, "off")
    assert not _split_placement().keep_routes
    monkeypatch.setenv(routes_module.ROUTE_CACHE_VARIABLE, "on")
    assert _split_placement().keep_routes
    monkeypatch.delenv(routes_module.ROUTE_CACHE_VARIABLE)
    assert _split_placement().keep_routes


def _sql_rows(monkeypatch, cache: str, threads: int):
    """A release's output (its first blocks drawn in the release's process) and a stored model's mob_sample, from
    a new database each time, with the route cache on or off and DuckDB's threads set."""
    monkeypatch.setenv(routes_module.ROUTE_CACHE_VARIABLE, cache)
    con = duckmob.connect()
    try:
        con.execute(f"SET threads = {threads}")
        con.execute("CREATE TABLE trips AS FROM mob_geolife_sample()")
        con.execute("FROM mob_set_budget('trips', eps := 10, delta := 1e-5)").fetchall()
        synth = con.sql(f"FROM synthesize('trips', eps := 1.0, n := 5000, bbox := {GEOLIFE_BBOX}, "
                        "seed := 4)").to_arrow_table()
        con.execute(f"FROM mob_fit('trips', 'm', eps := 1.0, bbox := {GEOLIFE_BBOX}, seed := 1)").fetchall()
        sample = con.sql("FROM mob_sample('m', n := 5000, seed := 6)").to_arrow_table()
        streamed = duckmob.sample(con, "m", 5000, seed=6, stream=True).read_all()
    finally:
        con.close()
    return synth, sample, streamed


def test_sql_and_python_outputs_are_the_same_with_the_cache_off_or_on(monkeypatch):
    off = _sql_rows(monkeypatch, "off", threads=1)
    on = _sql_rows(monkeypatch, "on", threads=2)
    assert off[0].num_rows > 5000 and off[1].num_rows > 5000
    for a, b in zip(off, on):
        assert a.equals(b)
    assert off[2].equals(off[1])                                 # the Python reader draws the SQL rows


def test_a_second_mob_sample_of_an_unchanged_model_reads_its_kept_routes_and_a_refit_one_is_new(monkeypatch):
    """mob_sample loads and checks the stored model at every query; a PrivTrace model is then the one the last
    query of the same stored row loaded, so its route tables are kept across queries. A model stored again under
    the same name is another row (another checksum): its routes are its own."""
    computed = []
    compute = Placement._route_tables

    def counting(self, pairs, costs, target=None, which=None):
        computed.append(len(pairs))
        return compute(self, pairs, costs, target, which)

    monkeypatch.setattr(Placement, "_route_tables", counting)
    con = duckmob.connect()
    try:
        con.execute("CREATE TABLE trips AS FROM mob_geolife_sample()")
        con.execute("FROM mob_set_budget('trips', eps := 10, delta := 1e-5)").fetchall()
        con.execute(f"FROM mob_fit('trips', 'm', eps := 1.0, bbox := {GEOLIFE_BBOX}, seed := 1)").fetchall()
        query = "FROM mob_sample('m', n := 3000, seed := 6)"
        first = con.sql(query).to_arrow_table()
        assert computed
        computed.clear()
        assert con.sql(query).to_arrow_table().equals(first)
        assert computed == []                                   # every route read from the kept tables
        assert duckmob.sample(con, "m", 3000, seed=6).equals(first) and computed == []
        con.execute("DELETE FROM duckmob_models WHERE name = 'm'")
        con.execute(f"FROM mob_fit('trips', 'm', eps := 1.0, bbox := {GEOLIFE_BBOX}, seed := 2)").fetchall()
        computed.clear()
        refit = con.sql(query).to_arrow_table()
        assert computed and not refit.equals(first)
    finally:
        con.close()
    monkeypatch.setenv(routes_module.ROUTE_CACHE_VARIABLE, "off")
    fresh = duckmob.connect()
    try:
        fresh.execute("CREATE TABLE trips AS FROM mob_geolife_sample()")
        fresh.execute("FROM mob_set_budget('trips', eps := 10, delta := 1e-5)").fetchall()
        fresh.execute(f"FROM mob_fit('trips', 'm', eps := 1.0, bbox := {GEOLIFE_BBOX}, seed := 2)").fetchall()
        assert fresh.sql(query).to_arrow_table().equals(refit)           # the refit model's own rows
    finally:
        fresh.close()
