"""What one process last found intact in a database's ledger (:class:`Verified`), so that checks are incremental.

The release core keeps one :class:`Verified` per database: what this process last found intact (every row's
fingerprint -- DuckDB's ``hash`` of all its columns, seal included -- its seal, source, status and event, the
chain's links; the same for budget declarations). Each release then runs one aggregate query (row count, min and
max id, the count and the sum of the fingerprints of the rows and declarations verified before, the sequence's
last id), reads the head file, and hashes in Python only the rows added since
(:func:`duckmob.privacy.ledger.verify`). Its own writes (reserve, update, set_budget) refresh the fingerprints from
the row DuckDB wrote (``RETURNING``) and extend the chain from the row written (an update of row k re-links k ..
the last row, from the seals in memory). The spend and the budget are taken from the verified rows, so an edit
committed between the check and the composition cannot lower them. A new process (or a caller without a
:class:`Verified`, e.g. :func:`duckmob.privacy.ledger.record`) starts empty: it hashes every row once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from duckmob.privacy.events import Event
from duckmob.privacy.ledger.headfile import Head
from duckmob.privacy.ledger.seals import GENESIS, link
from duckmob.privacy.ledger.spending import keys_of


@dataclass(frozen=True)
class Row:
    """What a :class:`Verified` holds of one ledger row."""

    fingerprint: int
    seal: str
    source: str
    status: str
    event: Event


@dataclass(frozen=True)
class Declaration:
    """What a :class:`Verified` holds of one budget declaration."""

    seq: int
    fingerprint: int
    seal: str
    source: str
    eps: float
    delta: float


class Verified:
    """What this process last found intact in one database's ledger, so that the next check reads only what
    changed (see the module docstring). The release core keeps one per database and uses it under the
    database's lock; a new one knows nothing, and its first :func:`verify` hashes every row.

    ``rows[i]`` is ledger row ``i + 1`` as verified or written by this process and ``links[i]`` the chain through
    it; ``total`` is the sum of their fingerprints; ``declarations``, ``budget_links`` and ``budget_total`` the
    same for budget declarations, in ``seq`` order. ``tables`` says the ledger's tables and sequences were found
    (so :func:`ensure_tables` has nothing to do). ``head_file`` is the database's head file (None in memory;
    found by the first :func:`verify`), ``anchored`` that it was seen or written, ``marked`` that the database
    carries :data:`MARK`.
    """

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.links: list[bytes] = []
        self.total = 0
        self.declarations: list[Declaration] = []
        self.budget_links: list[bytes] = []
        self.budget_total = 0
        self.tables = False
        self.located = False
        self.head_file: str | None = None
        self.read_only = False
        self.anchored = False
        self.marked = False

    @property
    def declared(self) -> bool:
        """Whether a budget was seen."""
        return bool(self.declarations)

    def remember(self, ledger_id: int, row: Row) -> None:
        """Record row ``ledger_id`` as written by this process. A row beyond the next one (rows were added by
        another caller since the last check) is left for :func:`verify` to hash."""
        if ledger_id <= len(self.rows):
            self.total += row.fingerprint - self.rows[ledger_id - 1].fingerprint
            self.rows[ledger_id - 1] = row
            del self.links[ledger_id - 1:]
            previous = self.links[-1] if self.links else GENESIS
            for r in self.rows[ledger_id - 1:]:
                previous = link(previous, r.seal)
                self.links.append(previous)
        elif ledger_id == len(self.rows) + 1:
            self.rows.append(row)
            self.total += row.fingerprint
            self.links.append(link(self.links[-1] if self.links else GENESIS, row.seal))

    def declare(self, declaration: Declaration) -> None:
        """Record a budget declaration (the next by ``seq``) as verified or written by this process."""
        self.declarations.append(declaration)
        self.budget_total += declaration.fingerprint
        self.budget_links.append(link(self.budget_links[-1] if self.budget_links else GENESIS,
                                       declaration.seal))

    def fingerprint(self, ledger_id: int) -> int | None:
        """The fingerprint of row ``ledger_id`` as this process last saw it (None if not seen yet)."""
        return self.rows[ledger_id - 1].fingerprint if ledger_id <= len(self.rows) else None

    def events(self, source: str, exclude: int | None = None) -> tuple:
        """Every verified release of ``source`` that counts (not cancelled), in order, leaving out ``exclude``."""
        return tuple(r.event for i, r in enumerate(self.rows, 1)
                     if source in keys_of(r.source) and r.status != "cancelled" and i != exclude)

    def budget(self, source: str) -> tuple[float, float] | None:
        """The verified (eps, delta) of ``source``: its declaration with the highest ``seq`` (None if none)."""
        return next(((d.eps, d.delta) for d in reversed(self.declarations) if d.source == source), None)

    def head(self) -> Head:
        """The state verified: what the head file must record."""
        return Head(len(self.rows), (self.links[-1] if self.links else GENESIS).hex(),
                    len(self.declarations), (self.budget_links[-1] if self.budget_links else GENESIS).hex())

    def after(self, *, ledger_id: int | None = None, seal: str | None = None, budget_seal: str | None = None) -> Head:
        """The state after one write: ledger row ``ledger_id`` (re)written with ``seal``, or a declaration with
        ``budget_seal`` added."""
        head = self.head()
        if budget_seal is not None:
            last = self.budget_links[-1] if self.budget_links else GENESIS
            return replace(head, budgets=head.budgets + 1, budget_chain=link(last, budget_seal).hex())
        k = min(ledger_id, len(self.rows) + 1)
        previous = self.links[k - 2] if k >= 2 else GENESIS
        for s in [seal] + [r.seal for r in self.rows[k:]]:
            previous = link(previous, s)
        return replace(head, releases=max(k, len(self.rows)), release_chain=previous.hex())


__all__ = ["Row", "Declaration", "Verified"]
