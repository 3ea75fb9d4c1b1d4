"""duckmob's own error: one line that says what was wrong and what to do."""

import re


class DuckmobError(ValueError):
    """A user-facing error. The message names the problem and the fix, in one line.

    Raised inside UDFs it reaches SQL users as
    ``Invalid Input Error: Python exception occurred while executing the UDF: DuckmobError: ...``;
    :func:`one_line` strips that wrapper for the shell, notebooks and dbt.
    """


class BudgetError(DuckmobError):
    """A release was refused by the privacy ledger (no budget declared, or it would exceed it)."""


_WRAPPERS = (
    "Python exception occurred while executing the UDF: ",
    "Invalid Input Error: ",
)


_MISSING = re.compile(r'Referenced column "([^"]+)" not found in FROM clause!(?:\s*Candidate bindings: ([^\n]*))?')
_DUCKMOB_CALL = re.compile(r"\b(mob_\w+|synthesize)\s*\(")
_UNREGISTERED = re.compile(r"Function with name \"?(mob_\w+|synthesize)\"? does not exist")


def one_line(exc: BaseException, sql: str = "") -> str:
    """Return duckmob's own message from an exception that may have crossed DuckDB's UDF boundary.

    A column missing from the input of a duckmob table function (DuckDB's binder reports it before any duckmob
    code runs) becomes a message that says which column and how to map it, when the statement (``sql``, or the
    context DuckDB quotes in the message) calls one.
    """
    text = str(exc).strip()
    for name in ("BudgetError: ", "DuckmobError: "):
        if name in text:
            return "duckmob: " + text.split(name, 1)[1].splitlines()[0].removeprefix("duckmob: ")
    unregistered = _UNREGISTERED.search(text)
    if unregistered:
        return (f"duckmob: {unregistered.group(1)} is not registered on this connection: run duckmob.register(con) "
                "on it (macros are per connection: each cursor needs it once)")
    missing = _MISSING.search(text)
    if missing and (_DUCKMOB_CALL.search(text) or _DUCKMOB_CALL.search(sql)):
        column, candidates = missing.group(1), missing.group(2)
        has = f" (closest: {candidates.strip()})" if candidates else ""
        return (f"duckmob: the input has no column {column}{has}: name your columns with traj_col := ..., "
                "ts_col := ..., lat_col := ..., lon_col := ... (user_col := ... for users)")
    for wrapper in _WRAPPERS:
        text = text.replace(wrapper, "")
    first = text.splitlines()[0] if text else type(exc).__name__
    return first
