"""Sampling a fitted model in blocks, so that an output of any size streams in bounded memory (free
post-processing: a model holds only differentially private statistics or weights).

Trajectory ``i`` of an output belongs to block ``i // BLOCK``. Block ``b`` is drawn by ONE call
``model.sample(size_b, rng_b)`` with its own generator ``rng_b = block_generator(seed, b)`` (a child of the
output's :class:`~numpy.random.SeedSequence` keyed by ``b``) and ``size_b = min(BLOCK, n - b * BLOCK)``; its
trajectories are numbered ``b * BLOCK ...``. So the rows of trajectory ``i`` depend on the model, the seed, ``n``
and ``i`` only: not on how the output is cut into chunks or record batches, nor on which engine (DuckDB, the Python
API, Spark executors) or which call draws the block. Memory is one block at a time per drawing thread: at most
``BLOCK`` trajectories of at most the model's public :attr:`~duckmob.synth.base.Model.max_points` points each.

``BLOCK`` matches DuckDB's vector size (2048 rows): a SQL table macro feeds a drawing UDF one trajectory id per row,
2048 at a time, so each call draws exactly one block.
"""

from __future__ import annotations

from typing import Callable, Iterator

import numpy as np

from duckmob.errors import DuckmobError
from duckmob.source.batches import concat
from duckmob.trajectories import Trajectories

BLOCK = 2048


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
    ids = np.asarray(ids, dtype=np.int64)
    if len(ids) and (ids.min() < 0 or ids.max() >= n):
        raise DuckmobError(f"trajectory ids must lie in [0, {n}) for an output of {n} trajectories")
    touched = np.unique(ids // BLOCK)
    if not len(touched):
        return Trajectories.empty()
    parts = [draw_block(model, n, seed, b) for b in touched]
    drawn = parts[0] if len(parts) == 1 else concat(parts)
    # row of id in `drawn`: where its block starts there, plus its place within the block
    starts = np.cumsum([0] + [p.n_trajectories for p in parts[:-1]])
    where = np.searchsorted(touched, ids // BLOCK)
    return drawn.take(starts[where] + ids - touched[where] * BLOCK)


def blocks(model, n: int, seed: np.random.SeedSequence, *,
           progress: Callable[[int, int], None] | None = None) -> Iterator[Trajectories]:
    """Every block of an output of ``n`` trajectories, in order; ``progress(trajectories drawn, n)`` after each."""
    done = 0
    for b in range(n_blocks(n)):
        part = draw_block(model, n, seed, b)
        done += part.n_trajectories
        if progress is not None:
            progress(done, n)
        yield part
