"""The release core: the one protocol every release of a sensitive table goes through.

Every release (``synthesize``, ``mob_fit``, ``mob_transitions``, ``mob_noisy_count``, and any future method; from
SQL, Python, the shell, Jupyter or dbt) is :func:`run`, in this order:

1. **validate** every public argument (``duckmob.validators``, the method's config, its planned event: an eps
   the mechanism cannot honour is refused here). Nothing is read and nothing is spent.
2. **reserve**, under the database's lock and on the core's own connection (never the caller's transaction:
   a ROLLBACK cannot undo it): read the budget and every other release of the source, check the ledger's
   integrity, plan the spend (a method may calibrate it to what is left), check it fits, insert a ``reserved``
   ledger row and commit. Concurrent releases (threads, cursors, one statement with several releases) see each
   other's reservations, so together they never exceed the budget. A model name is claimed just before.
3. **read** the data (:meth:`Release.read`). From here on the reservation stands whatever happens: an
   exception, Ctrl-C (:meth:`Release.check_interrupt`), a full disk while saving. A failure before the read
   cancels the reservation (the row stays, marked ``cancelled``, counting nothing).
4. **compute** (the mechanism). A method whose spend depends on a noisy count (HRNet) re-plans with
   :meth:`Release.settle`, under the lock and against the ledger as it is then; if its new plan does not fit,
   the reservation is cut to what it had drawn noise for, and the release is refused.
5. **finish**: the row becomes ``spent`` (or ``failed`` after an error), with the event actually spent.

Messages on this path never carry anything computed from the table (``duckmob.trajectories.from_points`` with
``private=True`` drops what it cannot use, silently; ``mob_check`` is the exact, non-private diagnostic).

One :class:`Database` per DuckDB database instance in this process holds the core's own connection, the lock,
the releases in progress, the model names being fitted (claimed by :func:`fit` before it reserves) and what was
last verified of the ledger (so each release checks it incrementally). DuckDB lets one process at a time write a
database file, so a per-process lock is a per-database lock.
"""

from duckmob.release.counting import noisy_count, transitions
from duckmob.release.fitting import FitRequest, fit, fit_request, sample
from duckmob.release.interrupts import Interrupted, install_interrupt_handler, interrupt_all
from duckmob.release.protocol import Release, Request, read_ledger, run, set_budget
from duckmob.release.registry import Database, database

__all__ = ["Database", "database", "Release", "Request", "Interrupted", "run", "FitRequest", "fit_request", "fit", "sample",
           "noisy_count", "transitions", "set_budget", "read_ledger", "install_interrupt_handler", "interrupt_all"]
