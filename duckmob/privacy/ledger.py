"""The privacy ledger: per-source budgets and a record of every release, kept in the user's own database.

Tables (created by :func:`ensure_tables`, plain DuckDB tables in the connection's default schema):

- ``duckmob_budget(source, eps, delta, declared_at)``: every declaration (times in UTC), append-only; a source's
  budget is its latest row. Raising a budget is allowed (and stays visible as history); lowering it below what is
  already spent is refused.
- ``duckmob_ledger(id, recorded_at, source, mechanism, epsilon, delta, privacy_unit, params JSON, event JSON,
  seeded)``: one row per release. ``event`` is the accounting event (``duckmob.privacy.accounting``); ``epsilon`` is that
  release's own epsilon at the budget's ``delta`` (for reading; the spend is always recomposed from ``event``);
  ``seeded`` marks releases made with an explicit seed ("seeded, not for release": anyone who knows the seed
  can subtract the noise, so such output has no privacy guarantee — it is still charged to the budget).

Spent = ``accounting.epsilon(compose(all recorded events of the source), budget delta)``: the PLD accountant
over everything released from that source, or the exact sum when all releases are pure Laplace
(whichever is smaller). Protocol for every mechanism: :func:`check` before reading any data (refuses with a
:class:`BudgetError` naming what to run), then :func:`record` once after the release.

Threat model. The ledger protects analysts from over-spending by mistake: a release that would take a source
past its declared (eps, delta) is refused before the data is read, and every release is recorded with its
parameters. It is NOT a security boundary: whoever can write the database file can edit or delete the ledger
and budget rows, run another tool on the raw table, or call the numpy functions directly. The budget is per
source NAME: the same data under two table names (a copy, a view) has two budgets, and two different tables
under one name share one; releases over a derived table (a filter, a join) are charged to the name given. The
privacy unit (trajectory, or user with a public cap on trajectories) is recorded per release; composing
releases made with different units is the data owner's responsibility. The noise generator is a statistical
PRNG seeded from OS entropy (see ``duckmob.privacy.noise``).
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone

from duckmob.errors import BudgetError, DuckmobError
from duckmob.privacy import accounting
from duckmob.privacy.accounting import Event
from duckmob.privacy.checks import positive

BUDGET = "duckmob_budget"
LEDGER = "duckmob_ledger"
# Spends are compared with a tolerance: the PLD epsilon is a floating-point estimate.
_SLACK = 1e-9


def ensure_tables(con) -> None:
    """Create the budget and ledger tables if they do not exist (idempotent; creates nothing when both exist,
    so a read-only database with a ledger works). Times are UTC."""
    present = {r[0] for r in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = current_schema() AND table_name IN (?, ?)", [BUDGET, LEDGER]).fetchall()}
    if BUDGET not in present:
        con.execute(f"""CREATE TABLE IF NOT EXISTS {BUDGET} (
            source VARCHAR NOT NULL, eps DOUBLE NOT NULL, delta DOUBLE NOT NULL, declared_at TIMESTAMP NOT NULL)""")
    if LEDGER not in present:
        con.execute(f"""CREATE TABLE IF NOT EXISTS {LEDGER} (
            id BIGINT NOT NULL, recorded_at TIMESTAMP NOT NULL, source VARCHAR NOT NULL, mechanism VARCHAR NOT NULL,
            epsilon DOUBLE, delta DOUBLE, privacy_unit VARCHAR, params JSON, event JSON NOT NULL,
            seeded BOOLEAN NOT NULL)""")


def has_tables(con) -> bool:
    """Whether both ledger tables exist (without creating them)."""
    return con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = current_schema() AND table_name IN (?, ?)", [BUDGET, LEDGER]).fetchall()[0][0] == 2


def budgets(con) -> list[dict]:
    """One dict per source (source, eps, delta, spent, remaining, releases, declared_at): what mob_budget() shows."""
    if not has_tables(con):
        return []
    rows = con.execute(f"""SELECT source, eps, delta, declared_at FROM {BUDGET}
        QUALIFY row_number() OVER (PARTITION BY source ORDER BY declared_at DESC, rowid DESC) = 1
        ORDER BY source""").fetchall()
    out = []
    for source, eps, delta, declared_at in rows:
        recorded = events(con, source)
        used = accounting.epsilon(accounting.compose(recorded), delta)
        out.append({"source": source, "eps": eps, "delta": delta, "spent": used,
                    "remaining": max(eps - used, 0.0), "releases": len(recorded), "declared_at": declared_at})
    return out


def releases(con) -> list[dict]:
    """Every recorded release, oldest first (what mob_ledger() shows)."""
    if not has_tables(con):
        return []
    cols = ["id", "recorded_at", "source", "mechanism", "epsilon", "delta", "privacy_unit", "params", "event",
            "seeded"]
    rows = con.execute(f"SELECT {', '.join(cols)} FROM {LEDGER} ORDER BY id").fetchall()
    return [dict(zip(cols, r)) for r in rows]


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _source(source) -> str:
    if not isinstance(source, str) or not source.strip():
        raise DuckmobError(f"source must be a table name (a non-empty string); got {source!r}")
    return source


def budget(con, source: str) -> tuple[float, float] | None:
    """The declared (eps, delta) of ``source``, or None when none was declared."""
    ensure_tables(con)
    rows = con.execute(f"SELECT eps, delta FROM {BUDGET} WHERE source = ? ORDER BY declared_at DESC, rowid DESC "
                       "LIMIT 1", [_source(source)]).fetchall()  # fetchall: no result left open on con
    return (float(rows[0][0]), float(rows[0][1])) if rows else None


def events(con, source: str) -> list[Event]:
    """Every recorded release of ``source``, in order."""
    ensure_tables(con)
    rows = con.execute(f"SELECT event FROM {LEDGER} WHERE source = ? ORDER BY id", [_source(source)]).fetchall()
    return [Event.from_json(r[0]) for r in rows]


def spent(con, source: str, delta: float | None = None) -> float:
    """Epsilon spent on ``source`` so far, composed at ``delta`` (default: the declared budget's delta)."""
    if delta is None:
        declared = budget(con, source)
        delta = declared[1] if declared else 0.0
    return accounting.epsilon(accounting.compose(events(con, source)), delta)


def _no_budget(source: str) -> BudgetError:
    return BudgetError(f"no privacy budget declared for '{source}': run FROM mob_set_budget('{source}', "
                       "eps := ..., delta := ...) first")


def set_budget(con, source: str, eps: float, delta: float) -> None:
    """Declare (or raise) the (eps, delta) budget of ``source``; refuses one below what is already spent."""
    source = _source(source)
    eps = positive("eps", eps)
    delta = _delta(delta)
    ensure_tables(con)
    used = spent(con, source, delta)
    if used > eps + _SLACK:
        raise BudgetError(f"cannot set the budget of '{source}' to eps {eps:g} at delta {delta:g}: "
                          f"eps {used:.6g} is already spent; a budget can only be raised, to at least {used:.6g}")
    con.execute(f"INSERT INTO {BUDGET} (source, eps, delta, declared_at) VALUES (?, ?, ?, ?)",
                [source, eps, delta, _now()])


def check(con, source: str, event: Event) -> None:
    """Refuse (BudgetError, saying what to run) if ``source`` has no budget or ``event`` would exceed it.

    Writes nothing. Call it before reading any data.
    """
    source = _source(source)
    if not isinstance(event, Event):
        raise DuckmobError(f"check takes a privacy event; got {type(event).__name__}")
    declared = budget(con, source)
    if declared is None:
        raise _no_budget(source)
    eps, delta = declared
    before = spent(con, source, delta)
    after = accounting.epsilon(accounting.compose(events(con, source) + [event]), delta)
    if after > eps + _SLACK:
        need = "" if math.isinf(after) else f" (total {after:.6g})"
        raise BudgetError(
            f"privacy budget of '{source}' exceeded: eps {before:.6g} of {eps:g} spent at delta {delta:g}, this "
            f"release ({event}) needs more{need}; use a smaller eps or raise the budget with "
            f"FROM mob_set_budget('{source}', eps := ..., delta := {delta:g})")


def record(con, source: str, event: Event, *, mechanism: str, privacy_unit: str, params: dict,
           seeded: bool) -> None:
    """Record one release of ``source`` (once, after it was made) with its event and public parameters."""
    source = _source(source)
    if not isinstance(event, Event):
        raise DuckmobError(f"record takes a privacy event; got {type(event).__name__}")
    ensure_tables(con)
    declared = budget(con, source)
    delta = declared[1] if declared else 0.0
    own = accounting.epsilon(event, delta)
    con.execute(
        f"INSERT INTO {LEDGER} (id, recorded_at, source, mechanism, epsilon, delta, privacy_unit, params, event, "
        "seeded) "
        f"SELECT coalesce(max(id), 0) + 1, ?, ?, ?, ?, ?, ?, ?, ?, ? FROM {LEDGER}",
        [_now(), source, str(mechanism), own if math.isfinite(own) else None, delta, str(privacy_unit),
         json.dumps(params, default=_jsonable, sort_keys=True), event.to_json(), bool(seeded)])


def _jsonable(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def _delta(value) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = math.nan
    if not 0 <= v < 1:
        raise DuckmobError(f"delta must be in [0, 1) (typically 1e-5, below 1 / number of trajectories); "
                           f"got {value!r}")
    return v


__all__ = ["ensure_tables", "has_tables", "set_budget", "check", "record", "budget", "budgets", "spent", "events",
           "releases", "BUDGET", "LEDGER"]
