"""The public Python API (re-exported by :mod:`duckmob`): :func:`connect`, :func:`register`, :func:`synthesize`,
:func:`sample`, :func:`evaluate`, :func:`noisy_count`, :func:`transitions`, :func:`budgets`, :func:`releases`,
:func:`report`.
Entry points (the shell, the demo, notebooks) import it from here, so nothing imports the package root."""

from __future__ import annotations

import atexit
import functools

import duckdb

from duckmob.errors import BudgetError, DuckmobError
from duckmob.sql import register

__version__ = "0.1.0"


def _entered(fn):
    """A release's entry point: Ctrl-C from its first moment stops the release (duckmob.release.interrupts.entered;
    imported at the call, so that importing this module, as the shell does at start, stays light)."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        from duckmob.release import interrupts
        with interrupts.entered():
            return fn(*args, **kwargs)
    return call


def connect(database: str = ":memory:", **kwargs) -> duckdb.DuckDBPyConnection:
    """Open a DuckDB connection with every duckmob function registered.

    The connection is closed at interpreter exit if the caller has not closed it (an open one makes DuckDB's
    bindings print "leaked instances" warnings); closing it twice is harmless.
    """
    con = duckdb.connect(database, **kwargs)
    try:
        register(con)
    except BaseException:   # e.g. a second path (a hard link) to a file another registered instance holds
        con.close()
        raise
    atexit.register(con.close)
    return con


def evaluate(con: duckdb.DuckDBPyConnection, real: str, synth: str, bbox=None, **options):
    """Compare table ``synth`` with table ``real`` on ``con``: the rows of ``FROM mob_evaluate(...)`` as a pyarrow
    Table (metric, value, reference, lower_is_better, source, description; ``.to_pylist()`` gives a list of dicts).
    ``real`` and ``synth`` name tables or views visible to ``con`` (temp tables included); ``bbox=[...]`` is
    required, other options as in :class:`duckmob.metrics.common.Options`. NOT differentially private (value and
    reference read the real table exactly): for the data owner only.
    The metrics themselves are in :mod:`duckmob.metrics`; both tables are read on ``con`` out of core, in memory
    bounded by the grids (:func:`duckmob.metrics.evaluate_relations`)."""
    from duckmob.metrics import evaluate_relations, to_table
    from duckmob.metrics.stream import relation_select

    register(con)
    return to_table(evaluate_relations(con, relation_select(con, real), relation_select(con, synth), bbox, **options))


@_entered
def synthesize(con: duckdb.DuckDBPyConnection, table: str, eps: float, method: str = "privtrace", *, delta=None,
               bbox=None, n=None, seed=None, privacy_unit: str = "trajectory", max_trajectories_per_user=None,
               params=None, outside: str = "drop", traj_col: str = "traj_id", ts_col: str = "ts",
               lat_col: str = "lat", lon_col: str = "lon", user_col: str = "user_id", max_rows=None, stability=None,
               roads=None, scatter_m=None, stream: bool = False, batch_size: int | None = None, **method_params):
    """Fit ``method`` on ``table`` under (eps, delta)-DP (one spend of the budget of every base table ``table``
    reads) and sample a synthetic table.

    The Python twin of ``FROM synthesize('table', eps := ..., method := ..., bbox := [...], ...)``: the same
    keyword parameters (``bbox``, ``delta``, ``n``, ``seed``, ``privacy_unit``, ``max_trajectories_per_user``,
    ``outside``, ``max_rows``, the column mapping ``traj_col`` ... ``user_col``, ``params``) plus method
    hyper-parameters as keywords (e.g. ``K=8``). Returns a pyarrow Table (traj_id, seq, lat, lon, ts), already
    materialised, so reading it again spends nothing. ``stream=True`` returns a ``pyarrow.RecordBatchReader``
    instead, drawn block by block (2048 trajectories) as it is read, in memory bounded by a few blocks (one, plus
    one per drawing thread) whatever ``n`` (batches of at most ``batch_size`` rows when given): the same rows as
    the table and as the SQL output under a seed. The spend happens at the call; reading the reader spends nothing.

    ``table`` is resolved and read on ``con`` (which sees its temporary tables and views), out of core, after the
    reservation. The ledger is written on the release core's own connection: a ROLLBACK of ``con``'s transaction
    does not undo the spend.
    """
    from duckmob import release, synth, validators
    from duckmob.release import tables
    from duckmob.release.fitting import FitArgs
    from duckmob.source.schema import Mapping

    register(con)
    db, relation = release.database(con), validators.source_name(table)
    mapping = Mapping.of(traj_col=traj_col, ts_col=ts_col, lat_col=lat_col, lon_col=lon_col, user_col=user_col)
    args = FitArgs(eps=eps, delta=delta, method=method, bbox=bbox, privacy_unit=privacy_unit,
                   max_trajectories_per_user=max_trajectories_per_user,
                   params={**synth.parse_params(params), **method_params}, outside=outside, seed=seed, n=n,
                   max_rows=max_rows, stability=stability, roads=roads, scatter_m=scatter_m)
    output = tables.synthesize(db, tables.Relation(db, con, relation, mapping, shape="points"), args)
    return output.reader(batch_size) if stream else output.table()


def sample(con: duckdb.DuckDBPyConnection, name: str, n: int | None = None, seed: int | None = None, *,
           stream: bool = False, max_rows: int | None = None, batch_size: int | None = None):
    """Draw ``n`` trajectories (None: the model's noisy count) from the model stored as ``name`` by ``mob_fit``:
    free post-processing, no data read, nothing spent. The Python twin of ``FROM mob_sample('name', n := ...,
    seed := ...)``, with the same rows under a seed. A pyarrow Table, or with ``stream=True`` a
    ``pyarrow.RecordBatchReader`` drawn block by block as it is read. Refused before any row is drawn when the output
    could have more than ``max_rows`` rows (n times the method's public cap on points per trajectory)."""
    from duckmob import release
    from duckmob.release import tables

    register(con)
    output = tables.sample(release.database(con), name, n=n, seed=seed, max_rows=max_rows)
    return output.reader(batch_size) if stream else output.table()


@_entered
def noisy_count(con: duckdb.DuckDBPyConnection, table: str, *, eps, seed=None, privacy_unit: str = "trajectory",
                max_trajectories_per_user=None, what: str = "trajectories", traj_col: str = "traj_id",
                user_col: str = "user_id", stability=None) -> float:
    """The Python twin of ``FROM mob_noisy_count('table', eps := ...)``: an eps-DP count of the trajectories (or
    users) of ``table``, counted by DuckDB on ``con`` (which sees its temporary tables) after the reservation; one
    spend of the budget of every base table ``table`` reads. The arguments are checked first
    (:class:`duckmob.release.counting.CountArgs`), before ``table`` is resolved."""
    from duckmob import release
    from duckmob.release import tables
    from duckmob.release.counting import CountArgs
    from duckmob.source.schema import Mapping

    args = CountArgs(eps=eps, seed=seed, privacy_unit=privacy_unit,
                     max_trajectories_per_user=max_trajectories_per_user, what=what, stability=stability)
    register(con)
    db = release.database(con)
    mapping = Mapping.of(traj_col=traj_col, user_col=user_col)
    return tables.noisy_count(db, tables.Relation(db, con, table, mapping, shape="ids"), args)


@_entered
def transitions(con: duckdb.DuckDBPyConnection, table: str, *, order=1, eps, n_states, seed=None,
                privacy_unit: str = "trajectory", max_trajectories_per_user=None, max_length=None, support=None,
                w=None, traj_col: str = "traj_id", user_col: str = "user_id", cells_col: str = "cells",
                stability=None):
    """The Python twin of ``FROM mob_transitions('table', ...)``: eps-DP length-normalised transition counts of a
    table of cell sequences read on ``con`` in record batches; ``(states (n, order + 1), counts)`` of the entries
    left positive by NormCut. The arguments are checked first (:class:`duckmob.release.counting.TransitionArgs`),
    before ``table`` is resolved."""
    from duckmob import release
    from duckmob.release import tables
    from duckmob.release.counting import TransitionArgs
    from duckmob.source.schema import Mapping

    args = TransitionArgs(order=order, eps=eps, n_states=n_states, seed=seed, privacy_unit=privacy_unit,
                          max_trajectories_per_user=max_trajectories_per_user, max_length=max_length,
                          support=support, w=w, stability=stability)
    register(con)
    db = release.database(con)
    mapping = Mapping.of(traj_col=traj_col, user_col=user_col, cells_col=cells_col)
    return tables.transitions(db, tables.Relation(db, con, table, mapping, shape="sequences"), args)


def report(con: duckdb.DuckDBPyConnection, synth: str, path: str | None = None, *, real: str | None = None,
           bbox=None, release: int | None = None):
    """The release report on table ``synth`` (the Python twin of ``FROM mob_report('synth', path := ...)``): a
    :class:`duckmob.report.Report` (its ``html``, its sections' one-line summaries in ``rows()``), written to
    ``path`` when given and shown inline in Jupyter. Without ``real`` it is the publishable page and ``real`` is
    never read; with ``real`` (a table name) it adds the comparison with the real table (exact, NOT private: the
    page says not to publish it). ``bbox``: the public box (default: the release's); ``release``: a ledger id
    (default: the release that made ``synth``)."""
    from duckmob import release as core
    from duckmob.metrics import table_points
    from duckmob.report import build

    register(con)
    return build(core.database(con), table_points(con, synth),
                 real_points=None if real is None else table_points(con, real), bbox=bbox, release=release,
                 path=path, synth_name=synth, real_name=real)


def budgets(con: duckdb.DuckDBPyConnection):
    """The Python twin of ``FROM mob_budget()``: one row per source (source, eps, delta, spent, remaining, releases,
    declared_at) as a pyarrow Table. The ledger is verified first, as a release verifies it: a tampered or reset
    ledger raises LedgerTampered (docs/threat_model.md). Read by the release core, as ``mob_budget()`` reads it."""
    from duckmob import release
    from duckmob.release import shown

    register(con)
    return shown.budgets(release.database(con))


def releases(con: duckdb.DuckDBPyConnection):
    """The Python twin of ``FROM mob_ledger()``: every recorded release, oldest first, as a pyarrow Table; verified
    first like :func:`budgets` (params and event as JSON text). Read by the release core, as ``mob_ledger()``."""
    from duckmob import release
    from duckmob.release import shown

    register(con)
    return shown.releases(release.database(con))


__all__ = ["connect", "register", "evaluate", "synthesize", "sample", "noisy_count", "transitions", "budgets",
           "releases", "report", "DuckmobError", "BudgetError", "__version__"]
