"""``python -m duckmob`` / ``duckmob``: a SQL shell with every duckmob function registered.

    duckmob [DATABASE] [-c SQL]... [-f FILE.sql]... [-o OUT] [--traceback]   run SQL (or read it from standard input)
    duckmob [DATABASE] [-i]                     interactive prompt when standard input is a terminal (or with -i)
    duckmob --version                           duckmob's and DuckDB's versions
    duckmob demo [--save FILE.duckdb] [--png FILE.png]         the demo on the shipped GeoLife sample

Statements end with ``;`` and may span lines. Several ``-c`` and ``-f`` run in the order given, and stop at the first
that fails. Errors print as one line, with DuckDB's hints (``Did you mean "trips"?``) kept; ``--traceback`` shows
Python's traceback too. ``-o OUT.parquet`` (or ``.csv``) writes the result of the last statement to a file.
Dot commands (.tables, .schema [NAME], .mode [NAME], .maxrows N, .maxwidth N, .timer on|off, .help, .quit) work at
the prompt and, as in the DuckDB CLI, on a line of their own between statements in ``-c`` text, a ``-f`` file or
piped SQL (``echo .tables | duckmob trips.duckdb``); a trailing ``;`` is allowed. Results go to files with plain
SQL too: ``COPY (FROM synthesize(...)) TO 'out.parquet'``.

Results print in the mode ``.mode`` sets, as the DuckDB CLI prints them:

- ``duckbox`` (the default): an aligned box table with each column's type. At most ``.maxrows`` rows (100 by
  default): a longer result shows its first and its last ``maxrows / 2`` rows and its true row count (it is
  read once, as a stream of Arrow batches: memory holds the rows shown and one batch of :data:`BATCH_ROWS`, not
  the result). A table fits ``.maxwidth`` (default: the terminal's width; :data:`PIPE_WIDTH` when standard
  output is not a terminal): the widest columns are cut first, all to the same width, their text ending in
  ``…``; only when every column is down to :data:`MIN_COLUMN` characters are middle columns left out (a ``…``
  column stands for them). DOUBLE and FLOAT values show about 4 significant digits (:func:`format_double`):
  a whole value as DuckDB writes it (2.0, 1968.0); otherwise from 1e-4 up to 1,000 as Python's ``{:.4g}``
  (0.02153, 12.35), from 1,000 up to 1e6 rounded to a whole number without a decimal point (1235, 123457),
  below 1e-4 and from 1e6 on in scientific notation (2.1e-05, 1.235e+06); nan, inf and NULL as DuckDB writes
  them. A value without ``.0`` was rounded. Other types (DECIMAL, integers, timestamps, lists...) show as DuckDB
  casts them to text.
- ``csv``: a header line, then one line per row, quoted as CSV quotes (Python's ``csv`` module); NULL is empty.
- ``markdown``: a pipe table (numbers right-aligned); the whole result is held to size its columns.
- ``line``: one ``column = value`` line per column, names right-aligned, rows separated by a blank line.
- ``json``: a JSON array of objects, one per row, each value as DuckDB's ``to_json`` writes it.

All but duckbox print every row and every digit (``.maxrows`` and the 4 digits are for reading at a terminal).

Start-up: the shell opens the database with DuckDB alone and registers duckmob's functions (which imports the
release core and its dependencies) before the first statement that names one (``mob_...``, ``synthesize``,
``duckmob_...``), or when a statement fails with a catalog error (a view over a duckmob macro, say; the
statement, stopped before it ran, is then run again once). ``duckmob -c "SELECT 1"`` starts as fast as
duckmob's package imports allow (``benchmarks/startup.py``).

Long statements: in a terminal DuckDB draws its progress bar, and HRNet's pre-training and DP-SGD draw their own
(on standard error, with the time left).

Ctrl-C while a statement runs stops it (DuckDB's query and any release in progress, which keeps the budget it
reserved) and prints one line, :data:`INTERRUPTED`; the prompt comes back, or ``-c`` / ``-f`` / piped SQL exits with
status 130. Ctrl-C at the prompt clears the line being typed.
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import math
import os
import re
import shutil
import signal
import sys
import textwrap
import threading
import time
import traceback
import unicodedata

import duckdb
import pyarrow as pa

from duckmob import api
from duckmob.errors import one_line

HELP = """\
.tables            list tables and views          (SQL: SHOW TABLES)
.schema [NAME]     columns of a table             (SQL: DESCRIBE NAME)
.mode [NAME]       how results print: duckbox (default), csv, markdown, line, json; alone: the current mode
.maxrows N         show at most N rows of a result (default 100: the first and last N/2 of a longer one)
.maxwidth N        tables at most N characters wide (default: the terminal's width); wider text ends in ...
.timer on|off      show how long each statement took
.help              this text
.quit              leave (also Ctrl-D)
Dot commands also work on a line of their own in -c text, -f files and piped SQL; a trailing ';' is allowed.
Write a result to a file: COPY (SELECT ...) TO 'result.parquet' (or .csv)."""

# Rows a result table shows by default: all of mob_evaluate's (38 metrics and growing; the DuckDB CLI shows 40).
DEFAULT_MAX_ROWS = 100
# How results print (.mode NAME), as the DuckDB CLI names them; the first is the default.
MODES = ("duckbox", "csv", "markdown", "line", "json")
# Rows per Arrow batch read from a result (DuckDB's vector size): the most a result holds beyond the rows shown.
BATCH_ROWS = 2048
# A table's width when standard output is not a terminal (as DuckDB's renderer draws there).
PIPE_WIDTH = 120
# The narrowest a column is cut to (4 characters and an ellipsis) before columns are left out of a table.
MIN_COLUMN = 5
# A result of at most this many rows prints without its row count under the table (as DuckDB's renderer).
QUIET_ROWS = 10
# A statement that names one of these needs duckmob's functions registered first (see the module docstring).
_NEEDS_DUCKMOB = re.compile(r"(?i)\b_?(?:mob_|duckmob_)\w*|\bsynthesize\b")

INTERRUPTED = "duckmob: interrupted (Ctrl-C); any privacy budget already spent stays recorded in mob_ledger()"
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a command stopped by Ctrl-C


class Shell:
    """The shell on ``con``. ``register``: called with ``con`` before the first statement that needs duckmob's
    functions (see the module docstring); None when ``con`` has them already."""

    def __init__(self, con: duckdb.DuckDBPyConnection, out=None, err=None, show_traceback=False, register=None):
        # the streams as they are now (None), not as they were at import: a caller (or a test) may replace them
        self.con = con
        self.out, self.err = (sys.stdout if out is None else out), (sys.stderr if err is None else err)
        self.show_traceback = show_traceback
        self.register = register
        self.timer = True
        self.mode = MODES[0]
        self.maxrows = DEFAULT_MAX_ROWS
        self.maxwidth: int | None = None  # None: the terminal's width (PIPE_WIDTH when not a terminal)
        self.interrupted = False  # whether the last run_sql or run_script was stopped by Ctrl-C

    def run_script(self, text: str, output: str | None = None) -> bool:
        """Run SQL with dot commands, as ``-c``, ``-f`` and piped input are run: a line starting with ``.`` where
        a statement could begin is a dot command (as in the DuckDB CLI); the SQL between them runs with
        :meth:`run_sql`. Returns False at the first statement or dot command that fails (the rest are skipped);
        ``.quit`` ends the script there. ``output`` receives the result of the last SQL statement.
        """
        chunks: list[tuple[str, str]] = []  # ("sql", text) or ("dot", line)
        sql: list[str] = []
        for line in text.splitlines():
            if line.lstrip().startswith(".") and _complete("\n".join(sql)):
                if _has_statement("\n".join(sql)):
                    chunks.append(("sql", "\n".join(sql)))
                sql = []
                chunks.append(("dot", line.strip()))
            else:
                sql.append(line)
        if _has_statement("\n".join(sql)):
            chunks.append(("sql", "\n".join(sql)))
        last_sql = max((i for i, (kind, _) in enumerate(chunks) if kind == "sql"), default=-1)
        for i, (kind, chunk) in enumerate(chunks):
            if kind == "dot":
                try:
                    ok = self.dot(chunk)
                except EOFError:  # .quit
                    return True
            else:
                ok = self.run_sql(chunk, output if i == last_sql else None)
            if not ok:
                return False
        return True

    def run_sql(self, text: str, output: str | None = None) -> bool:
        """Run every statement in ``text``; return False if one failed or was interrupted (the rest are skipped;
        ``self.interrupted`` tells which).

        With ``output`` (a .parquet or .csv path) the last statement's result is written there instead of shown.
        """
        self.interrupted = False
        try:
            statements = self.con.extract_statements(text)
        except duckdb.Error as exc:
            return self._fail(exc)
        if _NEEDS_DUCKMOB.search(text) and not self._registered():
            return False
        for i, stmt in enumerate(statements):
            t0 = time.perf_counter()
            last = output is not None and i == len(statements) - 1
            try:
                try:
                    self._interruptible(lambda: self._statement(stmt.query, output if last else None))
                except duckdb.CatalogException:
                    # perhaps a view over a duckmob macro: the statement stopped in its binder, so it can run again
                    if self.register is None:
                        raise
                    if not self._registered():
                        return False
                    self._interruptible(lambda: self._statement(stmt.query, output if last else None))
            except _Interrupted:
                return self._stopped()
            except (duckdb.Error, api.DuckmobError, ValueError) as exc:
                return self._fail(exc, stmt.query)
            if self.timer and self.out.isatty():
                self.err.write(f"({time.perf_counter() - t0:.3f} s)\n")
        return True

    def _registered(self) -> bool:
        """Register duckmob's functions if that is still to do (on this thread: it installs a SIGINT handler);
        False, with the error or the interruption reported, if that failed."""
        if self.register is None:
            return True
        try:
            self.register(self.con)
        except KeyboardInterrupt:
            return self._stopped()
        except (duckdb.Error, api.DuckmobError, ValueError) as exc:
            return self._fail(exc)
        self.register = None
        return True

    def _stopped(self) -> bool:
        self.interrupted = True
        # in a terminal, first erase what is on the line: DuckDB's unfinished progress bar, the ^C echo
        self.err.write(("\r\033[K" if self.err.isatty() else "") + INTERRUPTED + "\n")
        return False

    def _statement(self, query: str, output: str | None) -> None:
        rel = self.con.sql(_bare(query))
        if rel is not None and output is not None:
            write_result(rel, output)
            self.err.write(f"wrote {output}\n")
        elif rel is not None:
            self._show(rel)

    def _show(self, rel) -> None:
        """Print ``rel`` in the current mode (the module docstring says how each looks)."""
        if rel.columns == ["explain_key", "explain_value"]:  # EXPLAIN [ANALYZE]: the plan as DuckDB draws it
            for _, plan in rel.fetchall():
                self.out.write(plan + "\n")
            return
        if self.mode == "duckbox":
            self._duckbox(rel)
        else:
            self._records(rel)

    def _duckbox(self, rel) -> None:
        """Draw ``rel`` as DuckDB's box table, reading it once as a stream: the first ``maxrows / 2`` rows and a
        rolling buffer of the last ``maxrows / 2`` are kept, every row is counted."""
        types = [str(t) for t in rel.types]
        doubles = [t in ("DOUBLE", "FLOAT") for t in types]
        head_n, tail_n = (self.maxrows + 1) // 2, self.maxrows // 2
        head: list[pa.RecordBatch] = []
        tail: collections.deque[pa.RecordBatch] = collections.deque()  # holds the last tail_n rows, or a few more
        head_rows = tail_rows = total = 0

        def keep(batch: pa.RecordBatch) -> None:
            nonlocal head_rows, tail_rows, total
            taken = min(head_n - head_rows, batch.num_rows)
            if taken:
                head.append(batch.slice(0, taken))
                head_rows += taken
            rest = batch.slice(taken)
            if rest.num_rows and tail_n:
                tail.append(rest)
                tail_rows += rest.num_rows
                while tail_rows - tail[0].num_rows >= tail_n:
                    tail_rows -= tail.popleft().num_rows
            total += batch.num_rows

        # doubles stay numbers (formatted here), everything else is text as DuckDB casts it
        _scan(rel, ["#%d" % (i + 1) if d else "CAST(#%d AS VARCHAR)" % (i + 1) for i, d in enumerate(doubles)], keep)
        cells = [_double_cell if d else _text_cell for d in doubles]
        last = _rows(list(tail), cells)[-tail_n:] if tail_n else []
        table = draw_box(rel.columns, [_display_type(t) for t in types], [_is_number(t) for t in types],
                         _rows(head, cells), last, total, self._width())
        self.out.write("\n".join(table) + "\n\n")

    def _records(self, rel) -> None:
        """Print every row of ``rel`` as csv, markdown, line or json, batch by batch (markdown holds them all)."""
        names = rel.columns
        if self.mode == "json":
            exprs = ["CAST(to_json(#%d) AS VARCHAR)" % (i + 1) for i in range(len(names))]
        else:
            exprs = ["CAST(#%d AS VARCHAR)" % (i + 1) for i in range(len(names))]
        write = {"csv": _CsvWriter, "markdown": _MarkdownWriter, "line": _LineWriter,
                 "json": _JsonWriter}[self.mode](self.out, names, [_is_number(str(t)) for t in rel.types])
        _scan(rel, exprs, write.batch)
        write.end()

    def _width(self) -> int:
        if self.maxwidth is not None:
            return self.maxwidth
        return shutil.get_terminal_size().columns if self.out.isatty() else PIPE_WIDTH

    def _interruptible(self, work) -> None:
        """Run ``work()``; raise :class:`_Interrupted` if Ctrl-C came meanwhile or DuckDB reports an interrupted
        query (as ``KeyboardInterrupt``, ``duckdb.InterruptException`` or an error saying "interrupted").

        On the main thread (unless SIGINT is ignored, as in a background job) ``work`` runs on a helper thread
        while this one waits, with a SIGINT handler that calls ``con.interrupt()``: DuckDB looks at Python's
        signals only between its tasks, which can be a minute apart while the main thread waits for its workers
        (measured: 80 s for a count over range(1e10) on two cores). The handler also calls the previous one
        (duckmob's, which flags releases in progress so their loops stop), without letting it raise.
        """
        previous = signal.getsignal(signal.SIGINT)
        if threading.current_thread() is not threading.main_thread() or previous == signal.SIG_IGN:
            try:
                work()
            except BaseException as exc:
                if is_interrupt(exc):
                    raise _Interrupted from exc
                raise
            return
        outcome: list[BaseException] = []
        pressed = threading.Event()

        def run():
            try:
                work()
            except BaseException as exc:  # handed to the main thread below
                outcome.append(exc)

        def on_sigint(signum, frame):
            pressed.set()
            self.con.interrupt()
            if callable(previous):
                try:
                    previous(signum, frame)
                except KeyboardInterrupt:
                    pass

        signal.signal(signal.SIGINT, on_sigint)
        try:
            worker = threading.Thread(target=run, name="duckmob statement", daemon=True)
            worker.start()
            while worker.is_alive():
                worker.join(0.1)  # the handler runs here, within 0.1 s of Ctrl-C
        finally:
            signal.signal(signal.SIGINT, previous)
        error = outcome[0] if outcome else None
        if pressed.is_set() or (error is not None and is_interrupt(error)):
            raise _Interrupted from error
        if error is not None:
            raise error

    def _fail(self, exc: BaseException, sql: str = "") -> bool:
        if self.show_traceback:
            traceback.print_exception(exc, file=self.err)
        self.err.write(f"Error: {one_line(exc, sql)}\n")
        return False

    def dot(self, line: str) -> bool:
        """Run one dot command (``.maxrows 4`` or ``.maxrows 4;``); False if it failed."""
        parts = line.strip().removesuffix(";").split()
        if not parts:
            return True
        cmd, args = parts[0], parts[1:]
        if cmd in (".quit", ".exit"):
            raise EOFError
        if cmd == ".help":
            self.out.write(HELP + "\n")
            return True
        if cmd == ".tables":
            return self.run_sql("SHOW TABLES;")
        if cmd == ".schema":
            if args:
                return self.run_sql(f"DESCRIBE {args[0]};")
            return self.run_sql("SELECT table_name, column_name, data_type FROM information_schema.columns "
                                "ORDER BY table_name, ordinal_position;")
        if cmd == ".timer":
            self.timer = not args or args[0] == "on"
            return True
        if cmd in (".maxrows", ".maxwidth"):
            return self._set_size(cmd, args)
        if cmd == ".mode":
            return self._set_mode(args)
        self.err.write(f"Error: unknown command {cmd}: try .help\n")
        return False

    def _set_mode(self, args: list[str]) -> bool:
        """``.mode NAME``; without NAME, print the current mode (as the DuckDB CLI words it)."""
        if not args:
            self.out.write(f"current output mode: {self.mode}\n")
            return True
        if args[0] not in MODES:
            self.err.write(f"Error: .mode takes one of {', '.join(MODES)}, e.g. .mode csv\n")
            return False
        self.mode = args[0]
        return True

    def _set_size(self, cmd: str, args: list[str]) -> bool:
        """``.maxrows N`` / ``.maxwidth N``; without N, print the current value."""
        rows = cmd == ".maxrows"
        if not args:
            current = self.maxrows if rows else self.maxwidth
            self.out.write(f"{cmd} {'the terminal width' if current is None else current}\n")
            return True
        minimum = 1 if rows else 20
        if not args[0].isdigit() or int(args[0]) < minimum:
            self.err.write(f"Error: {cmd} takes a whole number of at least {minimum}, e.g. {cmd} 100\n")
            return False
        if rows:
            self.maxrows = int(args[0])
        else:
            self.maxwidth = int(args[0])
        return True

    def interactive(self) -> int:
        try:
            import readline  # noqa: F401  (line editing and history)
            history = os.path.expanduser("~/.duckmob_history")
            try:
                readline.read_history_file(history)
            except OSError:
                pass
        except ImportError:
            readline, history = None, None
        self.out.write(f"duckmob {api.__version__} (DuckDB {duckdb.__version__}). "
                       "End statements with ';'. .help for help.\n")
        buffer: list[str] = []
        try:
            while True:
                try:
                    line = input("   ...> " if buffer else "duckmob> ")
                except KeyboardInterrupt:
                    buffer = []
                    self.out.write("\n")
                    continue
                if not _has_statement("\n".join(buffer)) and line.strip().startswith("."):
                    buffer = []
                    self.dot(line.strip())
                    continue
                buffer.append(line)
                text = "\n".join(buffer)
                if _has_statement(text) and _complete(text):
                    buffer = []
                    self.run_sql(text)
        except EOFError:
            self.out.write("\n")
        finally:
            if readline is not None:
                try:
                    readline.write_history_file(history)
                except OSError:
                    pass
        return 0


class _Interrupted(Exception):
    """A statement stopped by Ctrl-C."""


# How an interrupted statement reads once it is an exception: DuckDB's "INTERRUPT Error: Interrupted!", its Python
# client's "Query interrupted", a duckmob release's Interrupted ("interrupted (Ctrl-C): ...") through a UDF.
_INTERRUPT_TEXT = re.compile(r"\bInterrupted\b|Query interrupted|interrupted \(Ctrl-C\)")


def is_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` is DuckDB's (or duckmob's) report of an interrupted statement (also used by
    :mod:`duckmob.jupyter`)."""
    return (isinstance(exc, (KeyboardInterrupt, duckdb.InterruptException))
            or _INTERRUPT_TEXT.search(str(exc)) is not None)


def _bare(query: str) -> str:
    """A statement without its trailing ';' and comments (DuckDB keeps them in the statement's text, and a
    relation shown as a table re-reads that text inside a subquery, where they break the parse). DuckDB's own
    tokenizer finds them, so a ';' or '--' inside a string is left alone."""
    tokens = duckdb.tokenize(query)
    end = len(query)
    for start, kind in reversed(tokens):
        if kind == duckdb.token_type.comment or (kind == duckdb.token_type.operator
                                                  and query[start:end].strip().startswith(";")):
            end = start
        else:
            break
    return query[:end].rstrip()


def _scan(rel, exprs: list[str], each) -> None:
    """Run ``rel`` once, projected on ``exprs`` (positional: repeated column names stay apart), and call
    ``each`` with every Arrow batch of :data:`BATCH_ROWS` rows. The reader is closed however it ends (DuckDB
    refuses the connection's next query while a result is open); an error while the result streams (Arrow
    raises it as OSError, with DuckDB's message) is raised as a ``duckdb.Error``."""
    reader = rel.project(", ".join(exprs)).to_arrow_reader(BATCH_ROWS)
    try:
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                return
            except (OSError, pa.ArrowException) as exc:
                raise duckdb.Error(str(exc)) from exc
            each(batch)
    finally:
        reader.close()


def _rows(batches: list[pa.RecordBatch], cells) -> list[list[str]]:
    """The rows of ``batches`` as text, column ``i`` written by ``cells[i]``."""
    rows: list[list[str]] = []
    for batch in batches:
        columns = [[cell(v) for v in column.to_pylist()] for cell, column in zip(cells, batch.columns)]
        rows.extend(map(list, zip(*columns)))
    return rows


def format_double(x: float) -> str:
    """A DOUBLE or FLOAT as the shell shows it: 4 significant digits (the rule is in the module docstring)."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    size = abs(x)
    if size == 0 or 1e-4 <= size < 1e6:
        if x.is_integer():
            return f"{x:.1f}"
        return f"{x:.4g}" if size < 1000 else f"{x:.0f}"
    return f"{x:.4g}"


# Control characters would break a table's lines: written as escapes (a newline as \n, as DuckDB's renderer does).
_ESCAPES = {i: f"\\x{i:02x}" for i in range(32)} | {9: "\\t", 10: "\\n", 13: "\\r", 127: "\\x7f"}


def _text_cell(value) -> str:
    return "NULL" if value is None else value.translate(_ESCAPES)


def _double_cell(value) -> str:
    return "NULL" if value is None else format_double(value)


_INTEGERS = {"TINYINT": "int8", "SMALLINT": "int16", "INTEGER": "int32", "BIGINT": "int64", "HUGEINT": "int128",
             "UTINYINT": "uint8", "USMALLINT": "uint16", "UINTEGER": "uint32", "UBIGINT": "uint64",
             "UHUGEINT": "uint128"}
_INTEGER_NAME = re.compile(r"\b(?:" + "|".join(_INTEGERS) + r")\b")


def _display_type(duckdb_type: str) -> str:
    """A column's type as DuckDB's renderer writes it under the name: ``int64``, ``double``, ``varchar[]``."""
    return _INTEGER_NAME.sub(lambda m: _INTEGERS[m.group(0)], duckdb_type).lower()


def _is_number(duckdb_type: str) -> bool:
    """Whether a column is numeric (right-aligned)."""
    return duckdb_type in _INTEGERS or duckdb_type in ("DOUBLE", "FLOAT") or duckdb_type.startswith("DECIMAL")


def _char_width(char: str) -> int:
    if unicodedata.combining(char):
        return 0
    return 2 if unicodedata.east_asian_width(char) in "WF" else 1


def text_width(text: str) -> int:
    """The columns ``text`` takes in a terminal (a CJK character takes two, a combining accent none)."""
    return len(text) if text.isascii() else sum(map(_char_width, text))


def _cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` columns, ending in an ellipsis where it was cut."""
    if text_width(text) <= width:
        return text
    kept, used = [], 0
    for char in text:
        used += _char_width(char)
        if used > width - 1:
            break
        kept.append(char)
    return "".join(kept) + "…"


def _pad(text: str, width: int, align: str) -> str:
    gap = width - text_width(text)
    if align == ">":
        return " " * gap + text
    if align == "^":
        return " " * (gap // 2) + text + " " * (gap - gap // 2)
    return text + " " * gap


def fit_columns(natural: list[int], room: int) -> list[int] | None:
    """Column widths that fit ``room`` characters of cells: the widest columns are cut first, all to the same
    cap (the largest that fits; what is left over widens the cut ones by a character each). None when even
    :data:`MIN_COLUMN` characters each would not fit."""
    if sum(natural) <= room:
        return list(natural)
    if sum(min(w, MIN_COLUMN) for w in natural) > room:
        return None
    low, high = MIN_COLUMN, max(natural)
    while low < high:
        cap = (low + high + 1) // 2
        if sum(min(w, cap) for w in natural) <= room:
            low = cap
        else:
            high = cap - 1
    widths = [min(w, low) for w in natural]
    spare = room - sum(widths)
    for i, w in enumerate(natural):
        if spare and w > widths[i]:
            widths[i] += 1
            spare -= 1
    return widths


def draw_box(names: list[str], types: list[str], right: list[bool], first: list[list[str]],
             last: list[list[str]], total: int, width: int) -> list[str]:
    """The lines of a duckbox table at most ``width`` characters wide: ``first`` and ``last`` rows (text), with
    a row of dots between them when the result has ``total`` rows, more than they hold. Columns are cut (the
    widest first) by :func:`fit_columns`; only if that cannot fit them, middle columns are left out."""
    rows = first + last
    natural = [max([text_width(n), text_width(t)] + [text_width(r[i]) for r in rows])
               for i, (n, t) in enumerate(zip(names, types))]
    keep = list(range(len(names)))
    while True:
        gap = len(keep) < len(names)  # a "…" column stands for the columns left out
        room = width - 3 * (len(keep) + gap) - 1 - gap
        widths = fit_columns([natural[i] for i in keep], room)
        if widths is not None or len(keep) == 1:
            break
        del keep[len(keep) // 2]
    if widths is None:
        widths = [max(1, room)]
    aligns = [">" if right[i] else "<" for i in keep]
    at = next((j for j in range(1, len(keep)) if keep[j] != keep[j - 1] + 1), None)
    if at is not None:
        widths.insert(at, 1)
        aligns.insert(at, "<")

    def line(values: list[str], align: str | None = None) -> str:
        values = [values[i] for i in keep]
        if at is not None:
            values.insert(at, "…")
        return "│" + "│".join(" " + _pad(_cut(v, w), w, align or a) + " "
                              for v, w, a in zip(values, widths, aligns)) + "│"

    def rule(left: str, middle: str, end: str) -> str:
        return left + middle.join("─" * (w + 2) for w in widths) + end

    out = [rule("┌", "┬", "┐"), line(names, "^"), line(types, "^")]
    if rows:
        out.append(rule("├", "┼", "┤"))
        out += [line(r) for r in first]
        if total > len(rows):
            out += [line(["·"] * len(names))] * 3
        out += [line(r) for r in last]
    out.append(rule("└", "┴", "┘"))
    notes = []
    if total > len(rows) or total > QUIET_ROWS or total == 0:
        shown = f" ({len(rows):,} shown)" if total > len(rows) else ""
        notes.append(f"{total:,} row{'' if total == 1 else 's'}{shown}")
    if len(keep) < len(names):
        notes.append(f"{len(names)} columns ({len(keep)} shown)")
    spaces = len(out[0]) - 4 - sum(map(len, notes))  # both notes on one line under the table, where they fit
    if len(notes) == 2 and spaces > 0:
        notes = [notes[0] + " " * spaces + notes[1]]
    return out + ["  " + note for note in notes]


class _CsvWriter:
    """``.mode csv``: a header, then the rows as CSV quotes them; NULL is an empty field."""

    def __init__(self, out, names: list[str], right: list[bool]):
        self.writer = csv.writer(out, lineterminator="\n")
        self.writer.writerow(names)

    def batch(self, batch: pa.RecordBatch) -> None:
        self.writer.writerows(zip(*(["" if v is None else v for v in c.to_pylist()] for c in batch.columns)))

    def end(self) -> None:
        pass


class _LineWriter:
    """``.mode line``: ``name = value`` per column, names right-aligned, a blank line between rows."""

    def __init__(self, out, names: list[str], right: list[bool]):
        self.out, self.first = out, True
        size = max(map(text_width, names))
        self.labels = [_pad(n, size, ">") for n in names]

    def batch(self, batch: pa.RecordBatch) -> None:
        for row in zip(*(c.to_pylist() for c in batch.columns)):
            self.out.write(("" if self.first else "\n") + "".join(
                f"{label} = {'NULL' if v is None else v}\n" for label, v in zip(self.labels, row)))
            self.first = False

    def end(self) -> None:
        pass


class _JsonWriter:
    """``.mode json``: an array of one object per row, each value as DuckDB's ``to_json`` writes it."""

    def __init__(self, out, names: list[str], right: list[bool]):
        self.out, self.first = out, True
        self.keys = [json.dumps(n) + ":" for n in names]

    def batch(self, batch: pa.RecordBatch) -> None:
        for row in zip(*(c.to_pylist() for c in batch.columns)):
            self.out.write(("[" if self.first else ",\n") + "{" + ",".join(
                k + ("null" if v is None else v) for k, v in zip(self.keys, row)) + "}")
            self.first = False

    def end(self) -> None:
        self.out.write("[]\n" if self.first else "]\n")


class _MarkdownWriter:
    """``.mode markdown``: a pipe table, numbers right-aligned (every row is held, to size the columns)."""

    def __init__(self, out, names: list[str], right: list[bool]):
        self.out, self.names, self.right = out, names, right
        self.rows: list[list[str]] = []

    def batch(self, batch: pa.RecordBatch) -> None:
        columns = [[_text_cell(v).replace("|", "\\|") for v in c.to_pylist()] for c in batch.columns]
        self.rows.extend(map(list, zip(*columns)))

    def end(self) -> None:
        names = [n.replace("|", "\\|") for n in self.names]
        widths = [max([3, text_width(n)] + [text_width(r[i]) for r in self.rows]) for i, n in enumerate(names)]
        aligns = [">" if r else "<" for r in self.right]

        def line(values, align=None):
            return "| " + " | ".join(_pad(v, w, align or a) for v, w, a in zip(values, widths, aligns)) + " |\n"

        self.out.write(line(names, "<") + "|" + "|".join("-" * (w + 1) + (":" if r else "-")
                                                           for w, r in zip(widths, self.right)) + "|\n")
        self.out.writelines(line(r) for r in self.rows)


def write_result(rel, path: str) -> None:
    """Write a query result to Parquet or CSV, chosen by the file's extension."""
    if path.endswith(".parquet"):
        rel.write_parquet(path)
    elif path.endswith(".csv"):
        rel.write_csv(path, header=True)
    else:
        raise api.DuckmobError(f"cannot write {path!r}: name a .parquet or .csv file")


def _code_tokens(text: str) -> list[tuple[int, object]]:
    """DuckDB's tokens of ``text`` without its comments."""
    return [t for t in duckdb.tokenize(text) if t[1] != duckdb.token_type.comment]


def _complete(text: str) -> bool:
    """True when ``text`` ends where a statement may begin: nothing but comments, or a last ';' outside strings,
    quoted names and comments (DuckDB's tokenizer decides; an unclosed string is one token, so it ends nothing)."""
    tokens = _code_tokens(text)
    if not tokens:
        return True
    start, kind = tokens[-1]
    return kind == duckdb.token_type.operator and text[start] == ";"


def _has_statement(text: str) -> bool:
    """Whether ``text`` holds any SQL (not only blanks and comments)."""
    return bool(_code_tokens(text))


USAGE = """duckmob [DATABASE] [-c SQL]... [-f FILE]... [-o OUT] [-i] [--traceback]
       duckmob --version
       duckmob demo [--save FILE.duckdb] [--png FILE.png]"""
DEMO = ("the whole pipeline on the GeoLife sample shipped with duckmob: load, clean, stay points, a synthetic "
        "table under differential privacy and its quality beside real-vs-real scores (about 15 seconds); leaves "
        "a database and a density picture in the current folder")
COMMANDS = f"""commands:
  demo  {textwrap.fill(DEMO, 100, subsequent_indent=' ' * 8)}

Without a command: run SQL with every duckmob function registered, from -c, -f or standard input, or at a
prompt (.help there lists the dot commands; they also work in -c, -f and piped SQL)."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["demo"]:
        from duckmob import demo
        parser = argparse.ArgumentParser(prog="duckmob demo", description=DEMO)
        parser.add_argument("--save", default=demo.DEFAULT_SAVE, metavar="FILE.duckdb",
                            help=f"the database the demo leaves behind (default: {demo.DEFAULT_SAVE} in the current "
                                 "folder; an earlier demo's file is replaced, any other file is refused)")
        parser.add_argument("--png", default=demo.DEFAULT_PNG, metavar="FILE.png",
                            help=f"the density picture (default: {demo.DEFAULT_PNG} in the current folder)")
        args = parser.parse_args(argv[1:])
        try:
            demo.run(save=args.save, png=args.png)
        except (api.DuckmobError, duckdb.Error) as exc:
            sys.stderr.write(f"Error: {one_line(exc)}\n")
            return 1
        return 0
    parser = argparse.ArgumentParser(prog="duckmob", usage=USAGE, epilog=COMMANDS,
                                     description="DuckDB with duckmob's functions registered.",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("database", nargs="?", default=":memory:", help="database file (default: in memory)")
    # -c and -f share one list, so that they run in the order given
    parser.add_argument("-c", "--command", dest="scripts", action="append", type=lambda sql: ("sql", sql),
                        metavar="SQL", help="SQL (and dot commands) to run, then exit; may be given several times")
    parser.add_argument("-f", "--file", dest="scripts", action="append", type=lambda path: ("file", path),
                        metavar="FILE", help="a .sql file (SQL and dot commands) to run, then exit; may be repeated")
    parser.add_argument("-o", "--output", help="write the last statement's result to this .parquet or .csv file")
    parser.add_argument("--traceback", action="store_true", help="show Python tracebacks on errors")
    parser.add_argument("-i", "--interactive", action="store_true",
                        help="the prompt even when standard input is not a terminal (a pipe from another program)")
    parser.add_argument("--version", action="version",
                        version=f"duckmob {api.__version__} (DuckDB {duckdb.__version__})")
    args = parser.parse_args(argv)
    try:
        # duckmob's functions are registered when a statement first needs them (module docstring: start-up)
        con = duckdb.connect(args.database)
    except duckdb.Error as exc:
        sys.stderr.write(f"Error: cannot open {args.database}: {one_line(exc)}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write(INTERRUPTED + "\n")
        return EXIT_INTERRUPTED
    # DuckDB's own progress bar for long statements, in a terminal only: it draws on standard output, so a
    # redirected result would hold it (and it is on by default).
    con.execute(f"SET enable_progress_bar = {str(sys.stdout.isatty()).lower()}")
    shell = Shell(con, show_traceback=args.traceback, register=api.register)

    def status(ok: bool) -> int:
        return EXIT_INTERRUPTED if shell.interrupted else 0 if ok else 1

    try:
        for i, (kind, source) in enumerate(args.scripts or []):
            if kind == "sql":
                text = source
            else:
                try:
                    with open(source, encoding="utf-8") as fh:
                        text = fh.read()
                except OSError as exc:
                    sys.stderr.write(f"Error: cannot read {source}: {exc.strerror}\n")
                    return 1
            if not shell.run_script(text, args.output if i == len(args.scripts) - 1 else None):
                return status(False)
        if args.scripts:
            return 0
        if sys.stdin.isatty() or args.interactive:
            return shell.interactive()
        return status(shell.run_script(sys.stdin.read(), args.output))
    except KeyboardInterrupt:  # Ctrl-C outside a statement: while reading piped SQL, say
        sys.stderr.write(INTERRUPTED + "\n")
        return EXIT_INTERRUPTED
    finally:
        con.close()
