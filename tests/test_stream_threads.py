"""Streamed output on threads (issue 42 item 3): SQL and the Python API draw a PrivTrace output's blocks ahead on
DuckDB's ``threads`` worker threads (duckmob/release/sampling.py), each block from its own generator derived from the
output's seed and the block's index, never from a generator shared between blocks. So the rows are the same on 1
or 2 threads, whichever thread draws a block and in whatever order the blocks finish; the blocks come out in order
and at most ``threads + 1`` are held at once."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pytest

import duckmob
from duckmob.release import sampling
from duckmob.trajectories import synthetic_table

BBOX = [39.8477, 116.1956, 40.1133, 116.4880]
N = 9000            # five blocks, the last one partial


@pytest.fixture(scope="module")
def con(fitted_sample):
    """The sample as ``trips`` and a PrivTrace model ``m`` on it (conftest.fitted_sample)."""
    return fitted_sample


@pytest.fixture
def recorded(monkeypatch):
    """Every block drawn (block index, thread name), with drawing ahead on for any block cost (the shipped
    sample's blocks are cheap enough to turn it off otherwise)."""
    drawn, lock = [], threading.Lock()
    draw = sampling.draw_block

    def recording(model, n, seed, block):
        part = draw(model, n, seed, block)
        with lock:
            drawn.append((int(block), threading.current_thread().name))
        return part

    monkeypatch.setattr(sampling, "draw_block", recording)
    monkeypatch.setattr(sampling, "CHEAP_BLOCK_S", 0.0)
    return drawn


def _threads(con, n: int):
    con.execute(f"SET threads = {n}")


def test_sql_and_python_outputs_are_the_same_rows_on_one_and_two_threads(con, recorded):
    outputs = {}
    try:
        for threads in (1, 2):
            _threads(con, threads)
            recorded.clear()
            outputs[threads] = [
                con.sql(f"FROM mob_sample('m', n := {N}, seed := 6)").to_arrow_table(),
                duckmob.sample(con, "m", N, seed=6, stream=True).read_all(),
                con.sql(f"FROM synthesize('trips', eps := 1.0, bbox := {BBOX}, seed := 8, n := {N})").to_arrow_table(),
                duckmob.synthesize(con, "trips", 1.0, bbox=BBOX, seed=8, n=N, stream=True).read_all()]
            workers = {name for _, name in recorded if name.startswith("duckmob-draw")}
            assert bool(workers) == (threads == 2)           # one thread: every block on the reading thread
            assert len(workers) <= 2
    finally:
        con.execute("RESET threads")
    one, two = outputs[1], outputs[2]
    assert one[0].num_rows > N and one[0].column("traj_id").to_pylist() == sorted(one[0].column("traj_id").to_pylist())
    for a, b in zip(one, two):
        assert a.equals(b)
    assert one[1].equals(one[0]) and one[3].equals(one[2])    # the Python reader draws the SQL rows


def _model(con):
    from duckmob import release
    from duckmob.synth import store

    return release.read_ledger(release.database(con), lambda cur: store.load(cur, "m"))[1]


def test_a_block_is_the_same_drawn_alone_in_any_order_or_beside_another_output(con):
    """Block b's rows come from (seed, b) alone: drawn by itself, last to first, they are the rows of the output
    drawn in order; two outputs of one model drawn at once on threads (their blocks interleaved, one route
    cache) each give the rows they give alone."""
    model = _model(con)
    seeds = np.random.SeedSequence(21), np.random.SeedSequence(22)
    alone = [sampling.Output(model, N, s, threads=1).table() for s in seeds]
    backwards = {b: sampling.draw_block(_model(con), N, seeds[0], b) for b in reversed(range(sampling.n_blocks(N)))}
    in_order = pa.concat_tables([synthetic_table(backwards[b]) for b in sorted(backwards)]).combine_chunks()
    assert in_order.equals(alone[0])
    fresh = _model(con)
    barrier, got = threading.Barrier(2), [None, None]

    def read(i):
        barrier.wait()
        got[i] = sampling.Output(fresh, N, seeds[i], threads=2).table()

    readers = [threading.Thread(target=read, args=(i,)) for i in range(2)]
    for t in readers:
        t.start()
    for t in readers:
        t.join()
    assert got[0].equals(alone[0]) and got[1].equals(alone[1])


@pytest.mark.parametrize("threads", [1, 2])
def test_the_reader_yields_blocks_in_order_holding_at_most_threads_plus_one(con, recorded, threads):
    out = sampling.Output(_model(con), N, np.random.SeedSequence(5), threads=threads)
    seen = []
    for batch in out.reader():
        first = batch.column(0)[0].as_py() // sampling.BLOCK
        seen.append(first)
        started = len(recorded)
        # drawn so far: the blocks read (this one included) and at most `threads` ahead of it
        assert started - len(seen) <= (threads if threads > 1 else 0)
    assert seen == list(range(sampling.n_blocks(N)))
    assert sorted(b for b, _ in recorded) == list(range(sampling.n_blocks(N)))      # each block drawn once
