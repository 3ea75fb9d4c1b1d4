"""duckmob's own error: one line that says what was wrong and what to do."""


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


def one_line(exc: BaseException) -> str:
    """Return duckmob's own message from an exception that may have crossed DuckDB's UDF boundary."""
    text = str(exc).strip()
    for name in ("BudgetError: ", "DuckmobError: "):
        if name in text:
            return "duckmob: " + text.split(name, 1)[1].splitlines()[0].removeprefix("duckmob: ")
    for wrapper in _WRAPPERS:
        text = text.replace(wrapper, "")
    first = text.splitlines()[0] if text else type(exc).__name__
    return first
