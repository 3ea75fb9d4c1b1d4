"""duckmob's own error: one line that says what was wrong and what to do."""

import re


class DuckmobError(ValueError):
    """A user-facing error. The message names the problem and the fix, in one line.

    Raised inside UDFs it reaches SQL users as
    ``Invalid Input Error: Python exception occurred while executing the UDF: DuckmobError: ...``;
    :func:`one_line` strips that wrapper for the shell, notebooks and dbt. Numbers in the message read as people
    write them: a NumPy scalar formatted with ``!r`` (``np.float64(116.318417)``) is written ``116.318417``
    (see :func:`plain_numbers`).
    """

    def __init__(self, *args):
        if args and isinstance(args[0], str):
            args = (plain_numbers(args[0]), *args[1:])
        super().__init__(*args)


class BudgetError(DuckmobError):
    """A release was refused by the privacy ledger (no budget declared, or it would exceed it)."""


_WRAPPERS = (
    "Python exception occurred while executing the UDF: ",
    "Invalid Input Error: ",
)


# NumPy 2 writes its scalars' repr as np.float64(116.318417), np.int64(3), np.str_('a'), np.True_: what a message
# built with {value!r} or from a list of them shows. Only a call without parentheses inside is rewritten.
_NUMPY_SCALAR = re.compile(r"\bnp\.(?:float|int|uint|complex|longdouble|clongdouble|str_|bytes_)\w*\(([^()]*)\)")
_NUMPY_BOOL = re.compile(r"\bnp\.(True|False)_")


def plain_numbers(message: str) -> str:
    """``message`` with NumPy scalar reprs written as their values: ``got [np.float64(39.9), np.float64(nan)]``
    becomes ``got [39.9, nan]``."""
    return _NUMPY_BOOL.sub(r"\1", _NUMPY_SCALAR.sub(r"\1", message))


_MISSING = re.compile(r'Referenced column "([^"]+)" not found in FROM clause!(?:\s*Candidate bindings: ([^\n]*))?')
_DUCKMOB_CALL = re.compile(r"\b(mob_\w+|synthesize)\s*\(")
_UNREGISTERED = re.compile(r"Function with name \"?(mob_\w+|synthesize)\"? does not exist")
# DuckDB suggests a duckmob function only when duckmob is registered: the name was mistyped
_SUGGESTS_DUCKMOB = re.compile(r'Did you mean "(?:mob_\w+|synthesize)"')


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
    if unregistered and not _SUGGESTS_DUCKMOB.search(text):
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
    return _with_hints(text) if text else type(exc).__name__


_MAX_CANDIDATES = 3


def _with_hints(text: str) -> str:
    """DuckDB's message on one line: its first line, then its hints (``Did you mean "trips"?``, ``Candidate
    bindings: "lat"``, the first few ``Candidate functions:`` / ``Candidate macros:``), without the quoted
    statement and caret (``LINE 1: ...``) or anything else."""
    lines = text.splitlines()
    hints: list[str] = []
    i = 1
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if line.startswith("LINE "):
            break
        if line.startswith("Did you mean"):
            hints.append(line)
        elif line.startswith("Candidate"):
            header, _, rest = line.partition(":")
            items = [rest.strip().lstrip(":").strip()] if rest.strip().lstrip(":").strip() else []
            while i < len(lines) and lines[i].startswith("\t") and not lines[i].strip().startswith("Candidate"):
                items.append(lines[i].strip())
                i += 1
            more = len(items) - _MAX_CANDIDATES
            shown = "; ".join(items[:_MAX_CANDIDATES]) + (f"; ... ({more} more)" if more > 0 else "")
            hints.append(f"{header}: {shown}")
    return " ".join([lines[0].strip(), *hints])
