"""Reading the verified ledger: the :class:`~duckmob.privacy.ledger.spending.Prior` a new release composes with
(:func:`prior`, :func:`check_source`), and what ``mob_budget()`` and ``mob_ledger()`` show.

Every read here verifies the ledger first (:func:`duckmob.privacy.ledger.integrity.verify`, incremental with the
:class:`~duckmob.privacy.ledger.state.Verified` a caller keeps) and takes what it returns from the verified rows,
not from a second read that an edit could slip in before.
"""

from __future__ import annotations

from duckmob.privacy import accounting
from duckmob.privacy.events import Event
from duckmob.privacy.ledger import seals
from duckmob.privacy.ledger.integrity import verify
from duckmob.privacy.ledger.renames import renamed_from
from duckmob.privacy.ledger.schema import BUDGET, COLUMNS, LEDGER
from duckmob.privacy.ledger.seals import FINGERPRINT
from duckmob.privacy.ledger.spending import Prior, join_keys, keys_of, no_budget
from duckmob.privacy.ledger.state import Verified
from duckmob.validators import source_name


def prior(con, source: str, exclude: int | None = None, verified: Verified | None = None) -> Prior:
    """The budget of ``source`` and the releases a new one composes with; refuses a source with no budget and
    a tampered ledger (:func:`~duckmob.privacy.ledger.integrity.verify`, incremental with the ``verified`` the
    release core keeps)."""
    source = source_name(source)
    verified = Verified() if verified is None else verified
    verify(con, verified)
    keys = _followed(con, verified, keys_of(source))
    if len(keys) > 1:   # a release over several base tables: each one's budget (the verification is done)
        parts = tuple(_prior_of(verified, key, exclude) for key in keys)
        tight = min(parts, key=lambda p: p.eps - p.spent())
        return Prior(join_keys(keys), tight.eps, min(p.delta for p in parts), tight.events, parts)
    return _prior_of(verified, keys[0], exclude)


def _followed(con, verified: Verified, keys: tuple[str, ...]) -> tuple[str, ...]:
    """``keys`` with a renamed table's key replaced by the key its budget mark names (both kept when it has a
    budget of its own): :mod:`duckmob.privacy.ledger.renames`. The catalog is read only when some budget is
    declared under a key outside ``keys`` (one a mark could name)."""
    if not verified.tables or all(d.source in keys for d in verified.declarations):
        return keys
    out = []
    for key in keys:
        other = renamed_from(con, key)
        if other is not None and verified.budget(other) is not None:
            out.append(other)
            if verified.budget(key) is None:
                continue
        out.append(key)
    return tuple(sorted(set(out)))


def _prior_of(verified: Verified, source: str, exclude: int | None) -> Prior:
    declared = verified.budget(source) if verified.tables else None
    if declared is None:
        raise no_budget(source)
    return Prior(source, declared[0], declared[1], verified.events(source, exclude))


def check_source(con, source: str, event: Event) -> None:
    """Refuse (BudgetError, saying what to run) if the release ``event`` would take ``source`` past its budget,
    reading its prior first (:func:`prior`; with a prior at hand: :meth:`Prior.check`). Writes nothing."""
    prior(con, source).check(event)


def shown_budgets(con, verified: Verified | None = None) -> list[dict]:
    """What ``mob_budget()`` shows, from the ledger as :func:`~duckmob.privacy.ledger.integrity.verify` found it
    (a tampered ledger is refused with the same LedgerTampered a release gets, never shown clean): one dict per
    source (source, eps, delta, spent, remaining, releases, declared_at), its latest declaration and the PLD
    composition of its verified releases that count, at that declaration's delta."""
    verified = Verified() if verified is None else verified
    verify(con, verified)
    if not verified.tables:
        return []
    latest = {d.source: d for d in verified.declarations}   # in seq order: the last one wins
    declared_at = dict(con.execute(f"SELECT seq, declared_at FROM {BUDGET}").fetchall())
    out = []
    for source in sorted(latest):
        d = latest[source]
        recorded = verified.events(source)
        used = accounting.epsilon(accounting.compose(list(recorded)), d.delta)
        out.append({"source": source, "eps": d.eps, "delta": d.delta, "spent": used,
                    "remaining": max(d.eps - used, 0.0), "releases": len(recorded),
                    "declared_at": declared_at.get(d.seq)})
    return out


def shown_releases(con, verified: Verified | None = None) -> list[dict]:
    """What ``mob_ledger()`` shows: every release row, oldest first, after
    :func:`~duckmob.privacy.ledger.integrity.verify`; each row read is the one verified (its fingerprint), so an
    edit made between the check and the read is refused too."""
    verified = Verified() if verified is None else verified
    verify(con, verified)
    if not verified.tables:
        return []
    out = []
    for *values, fingerprint in con.execute(f"SELECT {', '.join(COLUMNS)}, {FINGERPRINT} FROM {LEDGER} ORDER BY id"
                                            ).fetchall():
        if verified.fingerprint(values[0]) != int(fingerprint):
            raise seals.tampered_row(values[0])
        out.append(dict(zip(COLUMNS, values)))
    return out


__all__ = ["prior", "check_source", "shown_budgets", "shown_releases"]
