"""Budgets and spending: what a source may spend, what it spent, and whether one more release fits.

Spent = ``accounting.epsilon(compose(events of every row not cancelled), budget delta)``: the releases of a
source are composed by :mod:`duckmob.privacy.accounting` (PLD composition), never summed. A release that reads
several base tables draws on each one's budget (:func:`join_keys`, :attr:`Prior.parts`). The functions here read
the tables as they are, unverified; a release decides from the verified rows instead
(:func:`duckmob.privacy.ledger.prior`), and ``mob_budget()`` shows them
(:func:`duckmob.privacy.ledger.shown_budgets`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from duckmob.errors import BudgetError, DuckmobError
from duckmob.privacy import accounting
from duckmob.privacy.budget import needs_delta
from duckmob.privacy.events import Event
from duckmob.privacy.ledger.schema import BUDGET, LEDGER, has_tables
from duckmob.validators import source_name

# Spends are compared with a tolerance: the PLD epsilon is a floating-point estimate.
SLACK = 1e-9


@dataclass(frozen=True)
class Prior:
    """What a new release of ``source`` composes with: the budget and every other release not cancelled.

    A release that reads several base tables (a join) draws on each one's budget: its ``source`` is their keys
    joined (:func:`join_keys`), ``parts`` holds the :class:`Prior` of each, and it fits only if it fits every one;
    ``eps`` and ``events`` are then those of the part with the least left, ``delta`` the smallest."""

    source: str
    eps: float
    delta: float
    events: tuple
    parts: tuple = ()

    def spent(self) -> float:
        return accounting.epsilon(accounting.compose(list(self.events)), self.delta)

    def fits(self, event: Event) -> bool:
        if self.parts:
            return all(p.fits(event) for p in self.parts)
        composed = accounting.compose(list(self.events) + [event])
        # a composition of Laplace events only: the sum of their epsilons bounds its epsilon at every delta, so
        # when the sum fits, the PLD (tighter, but slow to build: most of a fit's bookkeeping) cannot refuse it
        basic = accounting.pure_epsilon(composed)
        if basic is not None and basic <= self.eps + SLACK:
            return True
        return accounting.epsilon(composed, self.delta) <= self.eps + SLACK

    def check(self, event: Event) -> None:
        """Refuse (BudgetError, saying what to run) if ``event`` would take the source past its budget (every
        part's, for a release over several tables)."""
        if not isinstance(event, Event):
            raise DuckmobError(f"check takes a privacy event; got {type(event).__name__}")
        for part in self.parts:   # a release over several tables: refused by the first budget it does not fit
            part.check(event)
        if self.fits(event):
            return
        before = self.spent()
        after = accounting.epsilon(accounting.compose(list(self.events) + [event]), self.delta)
        if math.isinf(after) and self.delta == 0:
            raise needs_delta(self.source, self.eps, f"this release ({event})")
        own = accounting.epsilon(event, self.delta)
        raise BudgetError(
            f"privacy budget of '{self.source}' exceeded: eps {before:.4g} of {self.eps:g} is spent "
            f"({max(self.eps - before, 0):.4g} left) and this release needs eps {own:.4g}; use a smaller eps, or "
            f"raise the budget to at least {rounded_up(after)}: FROM mob_set_budget('{self.source}', eps := {rounded_up(after)}, "
            f"delta := {self.delta:g})")


    def check_asked(self, event: Event, eps: float, delta: float) -> None:
        """Refuse (BudgetError, before anything is reserved) a release planned for ``eps`` at its own ``delta``
        whose ``event`` costs more than ``eps`` at the budget's delta, where the ledger records and composes it.

        A release asked at a delta above the budget's (a default of 1e-5 against a budget at 1e-7) would
        otherwise be recorded at a larger epsilon than the caller asked for (eps 1.093 for 1.0), with no word. At
        a delta at or below the budget's the cost cannot exceed the eps asked (epsilon falls as delta grows), and
        a pure (Laplace) event costs its eps at every delta: neither is recomputed. Public parameters only."""
        if self.delta <= 0 or delta <= self.delta:   # a pure budget: check() refuses a release that needs delta
            return
        basic = accounting.pure_epsilon(event)
        if basic is not None and basic <= eps + SLACK:
            return
        cost = accounting.epsilon(event, self.delta)
        if cost <= eps + SLACK:
            return
        raise BudgetError(
            f"this release asks eps {eps:g} at delta {delta:g}, but the budget of '{self.source}' is kept at delta "
            f"{self.delta:g}, where it would cost eps {cost:.4g}, more than asked: pass delta := {self.delta:g} to "
            "plan it at the budget's delta")


def join_keys(keys) -> str:
    """The ledger's source text of a release that reads the base tables ``keys`` (sorted, comma-separated; one key:
    the table's name)."""
    return ", ".join(sorted(set(keys)))


@lru_cache(maxsize=4096)
def keys_of(source: str) -> tuple[str, ...]:
    """The base tables of a ledger source text (:func:`join_keys`); a quoted key may hold ', '."""
    out, cur, quoted, i = [], [], False, 0
    while i < len(source):
        ch = source[i]
        if ch == '"':
            quoted = not quoted
        if not quoted and source.startswith(", ", i):
            out.append("".join(cur))
            cur = []
            i += 2
            continue
        cur.append(ch)
        i += 1
    out.append("".join(cur))
    return tuple(out)


def budget(con, source: str) -> tuple[float, float] | None:
    """The declared (eps, delta) of ``source`` (its latest declaration by sequence), or None."""
    source = source_name(source)
    return _declared(con, source) if has_tables(con) else None


def _declared(con, source: str) -> tuple[float, float] | None:
    rows = con.execute(f"SELECT eps, delta FROM {BUDGET} WHERE source = ? ORDER BY seq DESC LIMIT 1",
                       [source]).fetchall()
    return (float(rows[0][0]), float(rows[0][1])) if rows else None


def events(con, source: str, exclude: int | None = None) -> list[Event]:
    """Every release of ``source`` that counts (not cancelled), in order, leaving out the row ``exclude``."""
    source = source_name(source)
    if not has_tables(con):
        return []
    rows = con.execute(f"SELECT source, event FROM {LEDGER} WHERE status <> 'cancelled' AND id <> ? ORDER BY id",
                       [-1 if exclude is None else int(exclude)]).fetchall()
    return [Event.from_json(e) for s, e in rows if source in keys_of(s)]


def spent(con, source: str, delta: float | None = None) -> float:
    """Epsilon spent on ``source`` so far (reserved releases included), composed at ``delta`` (default: the
    declared budget's)."""
    if delta is None:
        declared = budget(con, source)
        delta = declared[1] if declared else 0.0
    return accounting.epsilon(accounting.compose(events(con, source)), delta)


def no_budget(source: str) -> BudgetError:
    """The refusal of a release from ``source``, which has no budget, saying what to run."""
    return BudgetError(f"no privacy budget declared for '{source}': run FROM mob_set_budget('{source}', "
                       "eps := ..., delta := ...) first")


def rounded_up(x: float) -> str:
    """``x`` rounded up to 3 significant digits (a budget to raise to)."""
    if not math.isfinite(x) or x <= 0:
        return f"{x:g}"
    step = 10 ** (math.floor(math.log10(x)) - 2)
    return f"{math.ceil(x / step - 1e-9) * step:.3g}"


def budgets(con) -> list[dict]:
    """One dict per source (source, eps, delta, spent, remaining, releases, declared_at), read unverified (what
    ``mob_budget()`` shows is :func:`duckmob.privacy.ledger.shown_budgets`, verified first)."""
    if not has_tables(con):
        return []
    rows = con.execute(f"""SELECT source, eps, delta, declared_at FROM {BUDGET}
        QUALIFY row_number() OVER (PARTITION BY source ORDER BY seq DESC) = 1 ORDER BY source""").fetchall()
    out = []
    for source, eps, delta, declared_at in rows:
        recorded = events(con, source)
        used = accounting.epsilon(accounting.compose(recorded), delta)
        out.append({"source": source, "eps": eps, "delta": delta, "spent": used,
                    "remaining": max(eps - used, 0.0), "releases": len(recorded), "declared_at": declared_at})
    return out


__all__ = ["SLACK", "Prior", "join_keys", "keys_of", "budget", "events", "spent", "budgets", "no_budget", "rounded_up"]
