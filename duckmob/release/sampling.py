"""Sampling a fitted model in blocks, so that an output of any size streams in bounded memory (free
post-processing: a model holds only differentially private statistics or weights).

Trajectory ``i`` of an output belongs to block ``i // BLOCK``. Block ``b`` is drawn by ONE call
``model.sample(size_b, rng_b)`` with its own generator ``rng_b = block_generator(seed, b)`` (a child of the
output's :class:`~numpy.random.SeedSequence` keyed by ``b``) and ``size_b = min(BLOCK, n - b * BLOCK)``; its
trajectories are numbered ``b * BLOCK ...``. So the rows of trajectory ``i`` depend on the model, the seed, ``n``
and ``i`` only: not on how the output is cut into chunks or record batches, nor on which engine (DuckDB, the Python
API, Spark executors) or which call draws the block. Memory is one block at a time per drawing thread (see drawing
ahead below): at most ``BLOCK`` trajectories of at most the model's public
:attr:`~duckmob.synth.base.Model.max_points` points each.

``BLOCK`` matches DuckDB's vector size (2048 rows): a SQL table macro feeds a drawing UDF one trajectory id per row,
2048 at a time, so each call draws exactly one block.

Drawing ahead: DuckDB asks for the blocks in order on one thread, and a block's draw is mostly NumPy work that
releases the GIL. So an output whose model says its :meth:`~duckmob.synth.base.Model.sample` may run on several
threads at once (``concurrent_sample``: PrivTrace) draws the next ``threads`` blocks on as many worker threads while
the caller converts and writes the current one (:class:`_Ahead`; ``threads`` is DuckDB's setting, at most
:data:`MAX_THREADS`). Each block is still one call with its own generator,
so the rows are the same with any number of threads; memory is ``threads + 1`` blocks at a time instead of one.

An :class:`Output` is what an output needs besides the ids (model, n, seed): SQL keeps it under a handle
(:class:`duckmob.release.registry.Outputs`), the Python API reads it whole (:meth:`Output.table`) or as a
``pyarrow.RecordBatchReader`` (:meth:`Output.reader`). Its size was checked before anything was drawn
(:func:`check_rows`: ``n * max_points <= max_rows``, public values only). Long outputs report their progress
(:class:`duckmob.progress.Rows`: trajectories and rows written, lines on stderr).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa

from duckmob.errors import DuckmobError
from duckmob.progress import Rows
from duckmob.source.batches import concat
from duckmob.trajectories import Trajectories, synthetic_table

BLOCK = 2048
# The most worker threads an output draws blocks on (DuckDB's threads setting, capped): each holds one block,
# and past two or three threads the GIL held between NumPy calls stops the gain.
MAX_THREADS = 4
# A block drawn on the caller's thread faster than this (seconds: the cell outputs' blocks) turns drawing ahead off
# for the rest of the output: handing such blocks between threads costs more than it saves. Speed only: the rows
# are the same either way.
CHEAP_BLOCK_S = 0.05


def n_blocks(n: int) -> int:
    """How many blocks an output of ``n`` trajectories has."""
    return -(-int(n) // BLOCK)


def block_generator(seed: np.random.SeedSequence, block: int) -> np.random.Generator:
    """The generator of block ``block`` of the output seeded by ``seed`` (its own stream: blocks are independent
    and each can be drawn anywhere)."""
    child = np.random.SeedSequence(seed.entropy, spawn_key=tuple(seed.spawn_key) + (int(block),))
    return np.random.Generator(np.random.PCG64(child))


def draw_block(model, n: int, seed: np.random.SeedSequence, block: int) -> Trajectories:
    """Block ``block`` of an output of ``n`` trajectories: its trajectories numbered ``block * BLOCK`` on."""
    start = int(block) * BLOCK
    if not 0 <= start < n:
        raise DuckmobError(f"block {block} is outside an output of {n} trajectories")
    part = model.sample(min(BLOCK, n - start), block_generator(seed, block))
    return Trajectories(part.offsets, np.asarray(part.traj_id, dtype=np.int64) + start, part.user_id, part.ts,
                        part.lat, part.lon)


def draw_ids(model, n: int, seed: np.random.SeedSequence, ids: np.ndarray) -> Trajectories:
    """The trajectories ``ids`` (each in ``[0, n)``, in the given order) of the output: every block they touch is
    drawn whole, once (a caller handing whole blocks, as DuckDB does, draws nothing twice)."""
    ids = _checked_ids(ids, n)
    touched = np.unique(ids // BLOCK)
    if not len(touched):
        return Trajectories.empty()
    return _taken([draw_block(model, n, seed, b) for b in touched], touched, ids)


def _checked_ids(ids, n: int) -> np.ndarray:
    ids = np.asarray(ids, dtype=np.int64)
    if len(ids) and (ids.min() < 0 or ids.max() >= n):
        raise DuckmobError(f"trajectory ids must lie in [0, {n}) for an output of {n} trajectories")
    return ids


def _taken(parts: list[Trajectories], touched: np.ndarray, ids: np.ndarray) -> Trajectories:
    """The trajectories ``ids`` out of the drawn blocks ``touched`` (``parts``, in that order)."""
    drawn = parts[0] if len(parts) == 1 else concat(parts)
    if len(parts) == 1 and len(ids) == drawn.n_trajectories and (ids == touched[0] * BLOCK + np.arange(len(ids))).all():
        return drawn                                      # the whole block in order, as DuckDB asks for it
    # row of id in `drawn`: where its block starts there, plus its place within the block
    starts = np.cumsum([0] + [p.n_trajectories for p in parts[:-1]])
    where = np.searchsorted(touched, ids // BLOCK)
    return drawn.take(starts[where] + ids - touched[where] * BLOCK)


def blocks(model, n: int, seed: np.random.SeedSequence) -> Iterator[Trajectories]:
    """Every block of an output of ``n`` trajectories, in order."""
    for b in range(n_blocks(n)):
        yield draw_block(model, n, seed, b)


def check_rows(n: int, max_points: int | None, max_rows: int, *, after_fit: bool = False) -> None:
    """Refuse an output of ``n`` trajectories that could have more than ``max_rows`` rows: ``n`` times the method's
    public cap on the points of one trajectory (``max_points``; None: no cap known, nothing checked). Public values
    only (``n`` is the caller's or the model's released noisy count), so the message may say them. ``after_fit``:
    n came from the model's noisy count, known only once the fit was spent."""
    if max_points is None or int(n) * int(max_points) <= int(max_rows):
        return
    fits = max(int(max_rows) // int(max_points), 0)
    when = (" The fit's spend stands (n came from its noisy count, known only after the fit): pass n := ... to have"
            " this checked before anything is spent." if after_fit else " Nothing was spent.")
    raise DuckmobError(f"the synthetic table could have up to {int(n) * int(max_points):,} rows ({int(n):,} "
                       f"trajectories of at most {int(max_points):,} points each, the method's public cap), more than "
                       f"max_rows := {int(max_rows):,}: raise it (max_rows := {int(n) * int(max_points):,}), ask for "
                       f"fewer trajectories{f' (n := {fits:,} fits)' if fits else ''} or lower the method's cap on "
                       f"points per trajectory (params max_points / max_len).{when}")


class _Ahead:
    """Blocks of one output drawn ahead on ``threads`` worker threads, in order: :meth:`get` returns block ``b``
    (drawn here when it was not started ahead) and starts the next ``threads`` blocks, so at most ``threads + 1``
    blocks are held or being drawn at once (the caller's, while it converts and writes it, and those ahead). The
    first block is drawn on the caller's thread before any worker starts, so the model's lazily built tables
    (PrivTrace's route tables) are built once, not by every thread at the same time; when it took less than
    :data:`CHEAP_BLOCK_S`, no worker starts at all. Worker threads end with the output (an idle executor is closed
    once its last block is handed out)."""

    def __init__(self, draw, n_blocks: int, threads: int):
        self.draw, self.n_blocks, self.threads = draw, int(n_blocks), max(int(threads), 1)
        self.pending: dict[int, Future] = {}
        self.pool: ThreadPoolExecutor | None = None
        self.lock = threading.Lock()

    def get(self, b: int):
        with self.lock:
            future = self.pending.pop(b, None)
            for stale in [k for k in self.pending if k < b]:    # a caller that skipped blocks: drop their draws
                self.pending.pop(stale).cancel()
        if future is not None:
            part = future.result()
        else:
            start = time.perf_counter()
            part = self.draw(b)
            if time.perf_counter() - start < CHEAP_BLOCK_S:     # threads would cost more than they save
                self.threads = 1
        self._start_after(b)
        return part

    def _start_after(self, b: int) -> None:
        with self.lock:
            last = b + 1 >= self.n_blocks
            if self.threads >= 2 and not last:
                if self.pool is None:
                    self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="duckmob-draw")
                for k in range(b + 1, min(b + 1 + self.threads, self.n_blocks)):
                    if k not in self.pending:
                        self.pending[k] = self.pool.submit(self.draw, k)
            elif self.pool is not None:     # the last block, or drawing ahead turned off: nothing more to start
                self.pool.shutdown(wait=False)
                self.pool = None


@dataclass
class Output:
    """One synthetic output: ``n`` trajectories of ``model`` under ``seed`` (its rows are fixed by these three,
    see the module docstring). ``desc`` names it in progress lines. ``threads``: how many blocks may be drawn at
    once when the model allows it (its ``concurrent_sample``; see the module docstring); the rows do not depend
    on it."""

    model: Any
    n: int
    seed: np.random.SeedSequence
    desc: str = "output"
    progress: Rows | None = None
    threads: int = 1
    on_first: Callable[[Trajectories, int], None] | None = None   # given block 0 once (release.outputs records it)
    _ahead: _Ahead | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        if self.progress is None:
            self.progress = Rows(self.desc, self.n)
        concurrent = getattr(self.model, "concurrent_sample", False)
        threads = min(max(int(self.threads), 1), MAX_THREADS) if concurrent else 1
        self._ahead = _Ahead(lambda b: draw_block(self.model, self.n, self.seed, b), n_blocks(self.n), threads)

    def _blocks(self, touched) -> list[Trajectories]:
        parts = [self._ahead.get(int(b)) for b in touched]
        for part in parts:
            self.progress.update(part.n_trajectories, part.n_points)
        if self.on_first is not None and int(touched[0]) == 0:
            first, self.on_first = self.on_first, None
            first(parts[0], self.n)
        return parts

    def draw(self, ids) -> Trajectories:
        """The trajectories ``ids`` (as :func:`draw_ids`), counted for progress; blocks are drawn ahead when the
        model allows it."""
        ids = _checked_ids(ids, self.n)
        touched = np.unique(ids // BLOCK)
        if not len(touched):
            return Trajectories.empty()
        return _taken(self._blocks(touched), touched, ids)

    def blocks(self) -> Iterator[Trajectories]:
        """Every block in order, counted for progress (drawn ahead when the model allows it)."""
        for b in range(n_blocks(self.n)):
            yield self._blocks([b])[0]

    def trajectories(self) -> Trajectories:
        """The whole output at once (memory: all of it)."""
        parts = list(self.blocks())
        return parts[0] if len(parts) == 1 else concat(parts)

    def table(self) -> pa.Table:
        """The whole output as one synthetic table (traj_id, seq, lat, lon, ts): memory all of it."""
        return pa.concat_tables([synthetic_table(p) for p in self.blocks()]).combine_chunks()

    def reader(self, batch_size: int | None = None) -> pa.RecordBatchReader:
        """The output as a RecordBatchReader drawn block by block as it is read (memory: one block, or
        ``threads + 1`` when drawn ahead). Batches hold one block each, cut to at most ``batch_size`` rows when given;
        the rows are the same whatever the cut."""
        if batch_size is not None and int(batch_size) < 1:
            raise DuckmobError(f"batch_size must be a positive integer, got {batch_size!r}")

        def batches():
            for part in self.blocks():
                yield from synthetic_table(part).to_batches(max_chunksize=batch_size)
        return pa.RecordBatchReader.from_batches(SCHEMA, batches())


# synthetic_table's schema, written out (building it from an empty table imports pandas at every start)
SCHEMA = pa.schema([("traj_id", pa.int64()), ("seq", pa.int64()), ("lat", pa.float64()), ("lon", pa.float64()),
                    ("ts", pa.timestamp("us"))])
