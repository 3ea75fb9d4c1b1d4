"""One input path: every release reads the same checked, (user_id, traj_id)-keyed, contribution-bounded points.

A :class:`PointSource` is what a release reads after its reservation (``Release.read``). Three backends give one:

- :class:`ArrowSource`: points already in memory (rows a SQL macro gathered from a temporary table);
- :class:`duckmob.source.table.TableSource`: a DuckDB table, view or query read out of core, bucket by bucket;
- ``duckmob.spark.SparkSource``: a Spark DataFrame, cleaned on the executors.

Each one's :meth:`PointSource.batches` cleans the points with ``from_points(private=True)`` (invalid points,
points outside the bbox and trajectories left with fewer than 2 points are dropped, per trajectory, silently) and,
under the user unit, keeps at most k trajectories per user chosen at random (:func:`batches.bound_keys`): so
every method, engine and entry point agrees on what a trajectory is -- the pair (user_id, traj_id), or traj_id
alone when the table has no user column -- and on each one's contribution. The checks that need no row (the
column types, whose budget a release draws on) come first: :mod:`duckmob.source.schema`,
:mod:`duckmob.source.lineage`, :func:`duckmob.source.table.prepare`.

Nothing here imports the SQL layer or the release core.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa

from duckmob.privacy.unit import PrivacyUnit
from duckmob.source.batches import Batches, clean


class PointSource:
    """Points a release reads after its reservation: :meth:`batches` cleans them and bounds contributions, and
    returns :class:`~duckmob.source.batches.Batches`; :meth:`close` frees what it holds."""

    def batches(self, *, bbox, time_required: bool, unit: PrivacyUnit,
                rng: Callable[[], np.random.Generator]) -> Batches:
        raise NotImplementedError

    def close(self) -> None:
        """Free what the source holds (temporary files, cursors, cached data)."""


class ArrowSource(PointSource):
    """Points in memory: an Arrow table (or a callable returning one, called when the release reads it) with the
    contract's columns, values already converted (TRY_CAST)."""

    def __init__(self, points: pa.Table | Callable[[], pa.Table]):
        self.points = points

    def batches(self, *, bbox, time_required, unit, rng) -> Batches:
        table = self.points() if callable(self.points) else self.points
        return clean(iter([table]), bbox=bbox, time_required=time_required, unit=unit, rng=rng)


__all__ = ["PointSource", "ArrowSource"]
