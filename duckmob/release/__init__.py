"""The release core: the one protocol every release of a sensitive table goes through.

Every release (``synthesize``, ``mob_fit``, ``mob_transitions``, ``mob_noisy_count``, and any future method; from
SQL, Python, the shell, Jupyter or dbt) is :func:`run`, in this order:

1. **check** what needs no row: every public argument (``duckmob.validators``, the method's config), and the
   input's schema and lineage (:func:`duckmob.source.table.prepare`: column types, the base tables whose budgets
   it draws on). Nothing is read and nothing is spent.
2. **plan** the spend from public parameters and the ledger as it is (a method may calibrate it to what is left),
   outside the database's lock: a calibration that takes tens of seconds holds up no other release. The request's
   ``price(prior)`` gives the event to reserve and the plan the computation follows (``release.plan``).
3. **reserve**, under the lock and on the core's own connection (never the caller's transaction: a ROLLBACK cannot
   undo it): re-read the budget of every base table and every other release of them, check the ledger's
   integrity, re-plan if others took room meanwhile, check the event fits, insert a ``reserved`` ledger row and
   commit. Concurrent releases (threads, cursors, one statement with several releases) see each other's
   reservations, so together they never exceed the budget. A model name is claimed just before. Ctrl-C at any
   moment before the read cancels the release (:mod:`duckmob.release.interrupts`): nothing is spent.
4. **read** the data (:meth:`Release.read`). From here on the reservation stands whatever happens: an
   exception, Ctrl-C (:meth:`Release.check_interrupt`), a full disk while saving.
5. **compute** (the mechanism). A method whose spend depends on a noisy count (HRNet) re-plans with
   :meth:`Release.settle`; if its new plan does not fit, the reservation is cut to what it had drawn noise for,
   and the release is refused.
6. **finish**: the row becomes ``spent`` (or ``failed`` after an error), with the event actually spent.

Messages on this path never carry anything computed from the table (``duckmob.trajectories.from_points`` with
``private=True`` drops what it cannot use, silently; ``mob_check`` is the exact, non-private diagnostic).

The modules: :mod:`~duckmob.release.registry` (one :class:`Database` per DuckDB database instance, one lock per
database file), :mod:`~duckmob.release.interrupts` (Ctrl-C), :mod:`~duckmob.release.protocol` (plan, reserve,
run, finish), :mod:`~duckmob.release.fitting` (fit and sample), :mod:`~duckmob.release.counting` (the counting
releases), :mod:`~duckmob.release.inputs` (a release's input, resolved once: a relation read out of core or rows a
SQL macro gathered) and :mod:`~duckmob.release.tables` (each release written once against its input, called by SQL
and Python).
"""

from duckmob.release.counting import CountArgs, TransitionArgs, noisy_count, transitions
from duckmob.release.fitting import FitArgs, FitRequest, fit, fit_request, sample
from duckmob.release.interrupts import Interrupted, install_interrupt_handler, interrupt_all
from duckmob.release.protocol import Release, Request, read_ledger, run, set_budget
from duckmob.release.registry import Database, database

__all__ = ["Database", "database", "Release", "Request", "Interrupted", "run", "FitArgs", "FitRequest", "fit_request",
           "fit", "sample", "CountArgs", "TransitionArgs", "noisy_count", "transitions", "set_budget", "read_ledger",
           "install_interrupt_handler", "interrupt_all"]
