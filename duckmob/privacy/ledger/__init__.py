"""The privacy ledger: per-source budgets and a record of every release, kept in the user's own database.

One module per concern; this package exports only the names its callers use:

- :mod:`~duckmob.privacy.ledger.schema`: the tables ``duckmob_budget`` and ``duckmob_ledger``, their sequences
  and columns, and the rows read back unverified (:func:`release_row`);
- :mod:`~duckmob.privacy.ledger.spending`: budgets, what is spent (PLD composition of every release not
  cancelled) and what is left; the :class:`Prior` a new release composes with, its ``fits`` and ``check``;
- :mod:`~duckmob.privacy.ledger.seals`: tamper evidence, the seal of each row and the hash chains over them;
- :mod:`~duckmob.privacy.ledger.headfile`: the head file ``<database file>.duckmob-ledger`` that keeps the
  chains' ends outside the database (:func:`head_file`);
- :mod:`~duckmob.privacy.ledger.renames`: the budget mark in a budgeted table's comment, so that a budget follows
  its table through ``ALTER TABLE ... RENAME`` (and across reopening the file);
- :mod:`~duckmob.privacy.ledger.state`: :class:`Verified`, what one process last found intact, so that each
  release checks the ledger incrementally;
- :mod:`~duckmob.privacy.ledger.integrity`: the tables created when absent (:func:`ensure_tables`) and the
  ledger checked intact (:func:`verify`);
- :mod:`~duckmob.privacy.ledger.reading`: the prior of a release (:func:`prior`, :func:`check_source`) and what
  ``mob_budget()`` and ``mob_ledger()`` show (:func:`shown_budgets`, :func:`shown_releases`);
- :mod:`~duckmob.privacy.ledger.writing`: budget declarations (:func:`set_budget`) and release rows
  (:func:`reserve`, :func:`update`, :func:`record`).

Protocol (``duckmob.release`` is the one caller): under the database's lock, :func:`prior` reads the budget and
the other releases (checking the ledger's integrity), :meth:`Prior.check` refuses a spend that would exceed the
budget, :func:`reserve` inserts a ``reserved`` row, all before any data is read and on the release core's own
connection (never inside the caller's transaction); :func:`update` then replaces the reserved event by the one a
method actually plans (checked again) and closes the row (``spent``, ``failed`` or ``cancelled``).

Integrity: :func:`verify` refuses a ledger whose rows, declarations, sequences or head file no longer agree
(rows or declarations deleted, edited with seals recomputed or not, inserted, the ledger dropped and recreated);
every write (:func:`reserve`, :func:`update`, :func:`set_budget`) keeps the head file in step. What this protects
against, what it does not, and what stays the data owner's responsibility (copies, derived tables, privacy
units): docs/threat_model.md.
"""

from duckmob.privacy.ledger.headfile import head_file
from duckmob.privacy.ledger.integrity import ensure_tables, verify
from duckmob.privacy.ledger.reading import check_source, prior, shown_budgets, shown_releases
from duckmob.privacy.ledger.schema import release_row
from duckmob.privacy.ledger.seals import LedgerTampered
from duckmob.privacy.ledger.spending import Prior, budget, budgets, events, join_keys, spent
from duckmob.privacy.ledger.state import Verified
from duckmob.privacy.ledger.writing import check_budget, record, reserve, set_budget, update

__all__ = ["Prior", "Verified", "LedgerTampered", "ensure_tables", "verify", "prior", "check_source", "check_budget",
           "set_budget", "reserve", "update", "record", "shown_budgets", "shown_releases", "budget", "budgets", "spent",
           "events", "release_row", "join_keys", "head_file"]
