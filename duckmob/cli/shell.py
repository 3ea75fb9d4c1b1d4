"""The shell itself (:class:`Shell`): statements, dot commands, the prompt, and Ctrl-C.

Dot commands (.tables, .schema [NAME], .mode [NAME], .maxrows N, .maxwidth N, .timer on|off, .help, .quit) work at
the prompt and, as in the DuckDB CLI, on a line of their own between statements in ``-c`` text, a ``-f`` file or
piped SQL (``echo .tables | duckmob trips.duckdb``); a trailing ``;`` is allowed. Results go to files with plain
SQL too: ``COPY (FROM synthesize(...)) TO 'out.parquet'``.

Start-up: the shell opens the database with DuckDB alone and registers duckmob's functions (which imports the
release core and its dependencies) before the first statement that names one (``mob_...``, ``synthesize``,
``duckmob_...``), or when a statement fails with a catalog error (a view over a duckmob macro, say; the
statement, stopped before it ran, is then run again once). ``duckmob -c "SELECT 1"`` starts as fast as
duckmob's package imports allow (``benchmarks/startup.py``).

Long statements: in a terminal DuckDB draws its progress bar, and HRNet's pre-training and DP-SGD draw their own
(on standard error, with the time left).

Ctrl-C while a statement runs stops it (DuckDB's query and any release in progress: cancelled, nothing spent, if
it had not read its data yet, even when the press came before DuckDB called it; else charged what it computed, a
DP-SGD fit the steps that ran) and prints one line, :data:`INTERRUPTED`; the prompt comes back, or ``-c`` / ``-f``
/ piped SQL exits with status 130. Ctrl-C at the prompt clears the line being typed.

How results look: :mod:`duckmob.cli.output`.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shutil
import signal
import sys
import threading
import time
import traceback

import duckdb
import pyarrow as pa

from duckmob import api
from duckmob.cli.output import (PIPE_WIDTH, CsvWriter, JsonWriter, LineWriter, MarkdownWriter, display_type,
                                double_cell, draw_box, is_number, scan, text_cell, text_rows, write_result)
from duckmob.cli.statements import NEEDS_DUCKMOB, bare, complete, has_statement
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
            if line.lstrip().startswith(".") and complete("\n".join(sql)):
                if has_statement("\n".join(sql)):
                    chunks.append(("sql", "\n".join(sql)))
                sql = []
                chunks.append(("dot", line.strip()))
            else:
                sql.append(line)
        if has_statement("\n".join(sql)):
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
        if NEEDS_DUCKMOB.search(text) and not self._registered():
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
        rel = self.con.sql(bare(query))
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
        scan(rel, ["#%d" % (i + 1) if d else "CAST(#%d AS VARCHAR)" % (i + 1) for i, d in enumerate(doubles)], keep)
        cells = [double_cell if d else text_cell for d in doubles]
        last = text_rows(list(tail), cells)[-tail_n:] if tail_n else []
        table = draw_box(rel.columns, [display_type(t) for t in types], [is_number(t) for t in types],
                         text_rows(head, cells), last, total, self._width())
        self.out.write("\n".join(table) + "\n\n")

    def _records(self, rel) -> None:
        """Print every row of ``rel`` as csv, markdown, line or json, batch by batch (markdown holds them all)."""
        names = rel.columns
        if self.mode == "json":
            exprs = ["CAST(to_json(#%d) AS VARCHAR)" % (i + 1) for i in range(len(names))]
        else:
            exprs = ["CAST(#%d AS VARCHAR)" % (i + 1) for i in range(len(names))]
        write = {"csv": CsvWriter, "markdown": MarkdownWriter, "line": LineWriter,
                 "json": JsonWriter}[self.mode](self.out, names, [is_number(str(t)) for t in rel.types])
        scan(rel, exprs, write.batch)
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
        (measured: 80 s for a count over range(1e10) on two cores). The handler also stops every release in
        progress (:func:`duckmob.release.interrupt_all`: their loops stop at their next check, whichever DuckDB
        thread runs them) and calls the previous handler, without letting it raise.

        The statement runs as one :func:`duckmob.release.interrupts.statement`: a release it makes stops on a
        press from the statement's first moment, even one that came before DuckDB called the release's UDF.
        """
        core = _release_interrupts()
        with core.statement() if core is not None else contextlib.nullcontext():
            self._run_interruptibly(work)

    def _run_interruptibly(self, work) -> None:
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
            core = _release_interrupts()
            if core is not None:   # counted here whatever the previous handler is (counted twice: no matter)
                core.interrupt_all()
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
                if not has_statement("\n".join(buffer)) and line.strip().startswith("."):
                    buffer = []
                    self.dot(line.strip())
                    continue
                buffer.append(line)
                text = "\n".join(buffer)
                if has_statement(text) and complete(text):
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


def _release_interrupts():
    """duckmob's Ctrl-C module (:mod:`duckmob.release.interrupts`) once the release core is loaded, else None: no
    release can run before it is, and the shell starts without loading it (module docstring: start-up)."""
    return sys.modules.get("duckmob.release.interrupts")


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


__all__ = ["Shell", "HELP", "DEFAULT_MAX_ROWS", "MODES", "INTERRUPTED", "EXIT_INTERRUPTED", "is_interrupt"]
