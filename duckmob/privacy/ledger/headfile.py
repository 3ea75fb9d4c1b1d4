"""The ledger's head file, ``<database file>.duckmob-ledger``: its state kept outside the database.

For a database file, the head of both hash chains (:mod:`duckmob.privacy.ledger.seals`: how many rows, how many
declarations, the last link of each) is kept in a file beside it (:func:`head_file`), replaced atomically with
every reservation, update and declaration, under the release lock; :func:`duckmob.privacy.ledger.verify` compares
the database with it (:func:`check_head`), so a new process too sees rows or declarations deleted, edited (seals
recomputed or not), inserted, or the ledger dropped and recreated. A write records the state it leads to as
``pending`` first, then commits, then records it as done (a crash in between leaves a head file that accepts
either state). The first write marks ``duckmob_ledger`` with a comment (:data:`MARK`): from then on a missing
head file is a lost one, while a ledger with neither was written by an older duckmob and gets its head file at
its next write. An in-memory database has no head file (no other process can open it); a read-only one is read
without writing it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

from duckmob.errors import DuckmobError
from duckmob.privacy.ledger.schema import LEDGER
from duckmob.privacy.ledger.seals import GENESIS, LedgerTampered

HEAD_SUFFIX = ".duckmob-ledger"
# The comment on duckmob_ledger once its head file was written: a missing head file is then a lost one. (No quote
# in it: it is written into the COMMENT statement.)
MARK = ("duckmob privacy ledger: its head is the file <database file>.duckmob-ledger beside the database; keep "
        "the two together (see docs/threat_model.md in duckmob)")


@dataclass(frozen=True)
class Head:
    """A ledger's state as its head file records it: the number of release rows and of budget declarations, and
    the last link of the hash chain over each (hex)."""

    releases: int = 0
    release_chain: str = GENESIS.hex()
    budgets: int = 0
    budget_chain: str = GENESIS.hex()

    def empty(self) -> bool:
        return self.releases == 0 and self.budgets == 0


def head_file(database: str) -> str:
    """The head file of the database file ``database``: ``<database file>.duckmob-ledger`` beside it (links
    resolved). Whoever deletes, moves or copies a database file must do the same with this one."""
    return os.path.realpath(database) + HEAD_SUFFIX


def locate(con) -> tuple[str | None, bool]:
    """(the head file of ``con``'s database or None where it can have none, whether the database is read-only)."""
    rows = con.execute("SELECT path, readonly FROM duckdb_databases() WHERE database_name = current_database()"
                       ).fetchall()
    path = rows[0][0] if rows else None
    # an in-memory database has no path; a remote one (s3://, md:) no place for a file beside it
    local = bool(path) and path != ":memory:" and "://" not in path and not path.startswith("md:")
    return (head_file(path) if local else None), (bool(rows[0][1]) if rows else False)


def read_head(path: str) -> tuple[Head, Head | None] | None:
    """(head, pending) as the head file at ``path`` records them; None when there is no such file."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        head = Head(**data["head"])
        pending = Head(**data["pending"]) if data.get("pending") else None
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise LedgerTampered(f"the ledger's head file {path} cannot be read ({type(exc).__name__}: {exc}): it was "
                             "damaged or replaced, so the ledger cannot be checked. Restore it together with the "
                             "database from a backup; releases are refused until then") from None
    return head, pending


def write_head(path: str, head: Head, pending: Head | None = None) -> None:
    """Replace the head file atomically (a temporary file, flushed to disk, renamed over it). A pending state
    must be on disk before the database commits, so its rename is flushed too (the folder, where POSIX allows)."""
    data = {"about": "duckmob's privacy ledger head for the database file beside it: keep the two together",
            "format": 1, "head": asdict(head)}
    if pending is not None:
        data["pending"] = asdict(pending)
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
        if pending is not None and hasattr(os, "O_DIRECTORY"):
            folder = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
    except OSError as exc:
        try:
            os.remove(temporary)
        except OSError:
            pass
        raise DuckmobError(f"cannot write the ledger's head file {path} ({exc}): every release and budget "
                           "declaration is recorded there too; make its folder writable") from None


def recorded_head(con, path: str, anchored: bool) -> tuple[Head, Head | None] | None:
    """(head, pending) as the head file ``path`` records them, for :func:`check_head`; None when there is none,
    which is fine for a ledger never anchored (``anchored``: its head file was seen or written before) nor marked
    (an older duckmob's, or nothing recorded yet: the next write creates it), and refused as a loss otherwise."""
    stored = read_head(path)
    if stored is None and (anchored or comment(con) == MARK):
        raise LedgerTampered(
            f"the ledger's head file {path} is missing, but this database's ledger was recorded "
            "with one: it was deleted, or the database was copied or moved without it (copy it along, to the "
            "same name with the suffix .duckmob-ledger). Releases are refused until it is restored")
    return stored


def check_head(path: str, now: Head, stored: tuple[Head, Head | None]) -> None:
    """Refuse when the verified ledger, whose state is ``now``, is not one the head file ``path`` records
    (``stored``: :func:`recorded_head`; its head, or the pending state of a write that may have committed)."""
    if now not in stored:
        raise _diverged(path, now, stored[0])


def stale(path: str, head: Head) -> LedgerTampered:
    """The refusal when the database holds no ledger (none, or empty tables) while its head file ``path`` records
    ``head``: a new database where a deleted one was (whose head file was left behind), or a ledger dropped. Which
    one only the data owner knows, so the message names the file and both ways out; nothing is deleted here."""
    return LedgerTampered(f"this database holds no privacy ledger, but the ledger's head file {path} beside it "
                          f"records {_count(head.releases, 'release')} and "
                          f"{_count(head.budgets, 'budget declaration')}: if the database file was deleted to start "
                          f"over, delete {path} too (docs/threat_model.md, 'Starting over'); otherwise its ledger "
                          "was dropped, so restore the database together with its head file from the same backup; "
                          "releases are refused until then")


def _diverged(path: str, now: Head, head: Head) -> LedgerTampered:
    if now.empty() and not head.empty():
        return stale(path, head)
    if (now.releases, now.budgets) == (head.releases, head.budgets):
        what = ("a row of duckmob_ledger was edited" if now.release_chain != head.release_chain else
                "a budget declaration in duckmob_budget was edited")
        found = f"its rows, seals included, no longer hash to the chain its head file {path} records"
    else:
        what = ("releases or budget declarations were deleted, the ledger dropped and recreated, or the database "
                "replaced by an older copy" if now.releases < head.releases or now.budgets < head.budgets else
                "rows were added to it, or its head file was replaced by an older copy")
        found = (f"the database holds {_count(now.releases, 'release')} and {_count(now.budgets, 'budget declaration')}"
                 f", its head file {path} records {head.releases} and {head.budgets}")
    return LedgerTampered(f"the privacy ledger was rewritten outside duckmob: {what} ({found}), so the spent budget "
                          "cannot be known. Restore the database together with its head file from the same backup; "
                          "releases are refused until then")


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def comment(con) -> str | None:
    """The comment on ``duckmob_ledger`` (None when there is no such table)."""
    rows = con.execute("SELECT comment FROM duckdb_tables() WHERE database_name = current_database() AND "
                       "schema_name = current_schema() AND table_name = ?", [LEDGER]).fetchall()
    return rows[0][0] if rows else None


__all__ = ["HEAD_SUFFIX", "MARK", "Head", "head_file", "locate", "read_head", "write_head", "recorded_head",
           "check_head", "stale", "comment"]
