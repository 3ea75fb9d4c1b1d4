"""The ledger's tables made present, and checked intact: :func:`ensure_tables` and :func:`verify`.

:func:`verify` refuses (:class:`~duckmob.privacy.ledger.seals.LedgerTampered`) a ledger whose rows, declarations,
sequences or head file no longer agree: rows or declarations deleted, edited with seals recomputed or not,
inserted, the ledger dropped and recreated. It checks incrementally from what a
:class:`~duckmob.privacy.ledger.state.Verified` holds (:mod:`duckmob.privacy.ledger.state`), and brings it up to
date. What this protects against and what it does not: docs/threat_model.md.
"""

from __future__ import annotations

import duckdb

from duckmob.privacy.events import Event
from duckmob.privacy.ledger import headfile, schema, seals
from duckmob.privacy.ledger.schema import BUDGET, BUDGET_COLUMNS, BUDGET_SEQ, COLUMNS, LEDGER, LEDGER_SEQ, OBJECTS
from duckmob.privacy.ledger.seals import BUDGET_FINGERPRINT, FINGERPRINT, LedgerTampered
from duckmob.privacy.ledger.state import Declaration, Row, Verified


def ensure_tables(con, verified: Verified | None = None) -> None:
    """Create the ledger's tables and sequences when the database has none of them (idempotent; writes nothing
    when they exist, so a read-only database with a ledger works). A database whose ledger was written by an
    older duckmob (no sequences) is upgraded once. A partial set left by a reset is not recreated: it is
    reported by :func:`verify` instead. Nothing to do (not even a look at the catalog) once ``verified`` has
    found the tables."""
    if verified is not None and verified.tables:
        return
    tables, seqs = schema.present(con)
    if tables == {BUDGET, LEDGER} and seqs == {LEDGER_SEQ, BUDGET_SEQ}:
        return
    if not tables and not seqs:
        schema.create(con)
        return
    if tables == {BUDGET, LEDGER} and not seqs and not schema.has_column(con, LEDGER, "seal"):
        _upgrade(con)


def _upgrade(con) -> None:
    """A ledger from before sequences and seals: number budget rows in their old (time, insertion) order, mark
    every release spent, seal the rows and start the sequences after them."""
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(f"ALTER TABLE {BUDGET} ADD COLUMN seq BIGINT")
        con.execute(f"UPDATE {BUDGET} SET seq = o.n FROM (SELECT rowid AS r, row_number() OVER "
                    f"(ORDER BY declared_at, rowid) AS n FROM {BUDGET}) o WHERE {BUDGET}.rowid = o.r")
        con.execute(f"ALTER TABLE {LEDGER} ADD COLUMN status VARCHAR DEFAULT 'spent'")
        con.execute(f"ALTER TABLE {LEDGER} ADD COLUMN seal VARCHAR")
        con.execute(f"UPDATE {LEDGER} SET id = o.n FROM (SELECT rowid AS r, row_number() OVER (ORDER BY id, rowid) "
                    f"AS n FROM {LEDGER}) o WHERE {LEDGER}.rowid = o.r")
        for row in con.execute(f"SELECT {', '.join(COLUMNS)} FROM {LEDGER}").fetchall():
            con.execute(f"UPDATE {LEDGER} SET status = 'spent', seal = ? WHERE id = ?",
                        [seals.seal(dict(zip(COLUMNS, row[:-1]), status="spent")), row[0]])
        n_ledger = con.execute(f"SELECT count(*) FROM {LEDGER}").fetchall()[0][0]
        n_budget = con.execute(f"SELECT count(*) FROM {BUDGET}").fetchall()[0][0]
        con.execute(f"CREATE SEQUENCE {LEDGER_SEQ} START {n_ledger + 1}")
        con.execute(f"CREATE SEQUENCE {BUDGET_SEQ} START {n_budget + 1}")
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise


# One query for the per-release check: a missing table raises CatalogException, a missing sequence counts 0.
_SUMMARY = f"""SELECT count(*), count(*) FILTER (WHERE id <= $verified), coalesce(min(id), 1), coalesce(max(id), 0),
    coalesce(sum({FINGERPRINT}::HUGEINT) FILTER (WHERE id <= $verified), 0),
    (SELECT {{'known': count(*) FILTER (WHERE seq <= $budget_seq),
              'total': coalesce(sum({BUDGET_FINGERPRINT}::HUGEINT) FILTER (WHERE seq <= $budget_seq), 0)}}
     FROM {BUDGET}),
    (SELECT {{'sequences': count(*), 'handed_out': max(coalesce(last_value, start_value - 1))
                                                    FILTER (WHERE sequence_name = '{LEDGER_SEQ}')}}
     FROM duckdb_sequences() WHERE database_name = current_database() AND schema_name = current_schema()
     AND sequence_name IN ('{LEDGER_SEQ}', '{BUDGET_SEQ}'))
FROM {LEDGER}"""


def checked_row(values, seal: str, fingerprint: int, ledger_id: int) -> Row:
    """A fetched row (the :data:`~duckmob.privacy.ledger.schema.COLUMNS` values) checked against its seal."""
    row = dict(zip(COLUMNS, values))
    if seal != seals.seal(row):
        raise seals.tampered_row(ledger_id)
    return Row(int(fingerprint), seal, row["source"], row["status"], Event.from_json(row["event"]))


def locate(con, verified: Verified) -> None:
    """Find (once) the head file of ``con``'s database and whether it is read-only, kept in ``verified``."""
    if not verified.located:
        verified.head_file, verified.read_only = headfile.locate(con)
        verified.located = True


def verify(con, verified: Verified | None = None) -> None:
    """Refuse (LedgerTampered, saying what happened) when the ledger lost or changed a release or a budget.

    Checked: the budget table, ledger table and both sequences exist together (or none does, ``verified`` saw no
    budget and the head file records nothing); the ledger ids are exactly 1 .. the number the sequence handed
    out, and no fewer than ``verified`` holds (a DELETE leaves a gap or a short tail); the rows and declarations
    ``verified`` holds are unchanged (their count and the sum of their fingerprints -- which hash the ids too --
    then row by row to name the edited one); the other rows are numbered on from there and their seals match
    their columns; last, both chains end where the head file says
    (:func:`~duckmob.privacy.ledger.headfile.check_head`). ``verified`` is then brought up to date; without it
    every row is hashed.
    """
    verified = Verified() if verified is None else verified
    locate(con, verified)
    known = len(verified.rows)
    known_seq = verified.declarations[-1].seq if verified.declarations else 0
    try:
        n, n_known, first, last, total, budgets, seqs = con.execute(
            _SUMMARY, {"verified": known, "budget_seq": known_seq}).fetchall()[0]
    except duckdb.CatalogException:
        _missing(con, verified)
        return
    if seqs["sequences"] != 2:
        _missing(con, verified)   # the tables are there: this raises
    if (n and (first != 1 or last != n)) or n != int(seqs["handed_out"]) or n_known != known:
        raise seals.tampered_rows()
    if int(total) != verified.total:
        fingerprints = con.execute(f"SELECT id, {FINGERPRINT} FROM {LEDGER} WHERE id <= ? ORDER BY id",
                                   [known]).fetchall()
        changed = next((i for i, fp in fingerprints if int(fp) != verified.fingerprint(i)), known)
        raise seals.tampered_row(changed)
    if budgets["known"] != len(verified.declarations):
        raise seals.tampered_budget("budget declarations were deleted (or inserted with old numbers)")
    if int(budgets["total"]) != verified.budget_total:
        raise seals.tampered_budget("a budget declaration was edited")
    added = con.execute(f"SELECT {', '.join(COLUMNS)}, seal, {FINGERPRINT} FROM {LEDGER} WHERE id > ? ORDER BY id",
                        [known]).fetchall()
    if [r[0] for r in added] != list(range(known + 1, n + 1)):   # a repeated id stands in for a deleted one
        raise seals.tampered_rows()
    for *values, seal, fingerprint in added:
        verified.remember(values[0], checked_row(values, seal, fingerprint, values[0]))
    declared = con.execute(f"SELECT {', '.join(BUDGET_COLUMNS)}, {BUDGET_FINGERPRINT} FROM {BUDGET} "
                           "WHERE seq > ? ORDER BY seq", [known_seq]).fetchall()
    for *values, fingerprint in declared:
        row = dict(zip(BUDGET_COLUMNS, values))
        verified.declare(Declaration(int(row["seq"]), int(fingerprint), seals.budget_seal(row), row["source"],
                                     float(row["eps"]), float(row["delta"])))
    verified.tables = True
    if verified.head_file is not None:
        stored = headfile.recorded_head(con, verified.head_file, verified.anchored)
        if stored is not None:
            verified.anchored = True
            headfile.check_head(verified.head_file, verified.head(), stored)


def _missing(con, verified: Verified) -> None:
    """Some of the ledger's tables and sequences are missing: fine when all are, ``verified`` saw no budget and
    the head file (if any) records nothing (a new database: :func:`ensure_tables` creates them), a reset
    otherwise."""
    tables, seqs = schema.present(con)
    missing = [f"{kind} {name}" for kind, name in OBJECTS if name not in tables | seqs]
    if len(missing) == len(OBJECTS) and not verified.declared and not verified.rows:
        stored = headfile.read_head(verified.head_file) if verified.head_file else None
        if stored is None or all(h is None or h.empty() for h in stored):
            verified.tables = False
            return
        raise headfile.stale(verified.head_file, stored[0] if not stored[0].empty() else stored[1])
    if len(missing) == len(OBJECTS):
        raise LedgerTampered("the tables duckmob_budget and duckmob_ledger and their sequences were dropped after "
                             "this process saw a privacy budget declared: the record of earlier releases is lost, "
                             "so no spend can be checked. Restore the database from a backup taken before the drop; "
                             "releases are refused until then")
    raise LedgerTampered(f"{' and '.join(missing)} {'was' if len(missing) == 1 else 'were'} dropped while a privacy "
                         "budget is declared: the record of earlier releases is lost, so no spend can be checked. "
                         "Restore the database from a backup taken before the drop; releases are refused until then")


__all__ = ["ensure_tables", "verify", "checked_row", "locate"]
