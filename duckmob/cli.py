"""``python -m duckmob`` / ``duckmob``: a SQL shell with every duckmob function registered.

    duckmob [DATABASE] [-c SQL] [-f FILE.sql] [-o OUT] [--traceback]   run SQL (or read it from standard input)
    duckmob [DATABASE] [-i]                     interactive prompt when standard input is a terminal (or with -i)
    duckmob demo                                                the demo on the shipped GeoLife sample

Statements end with ``;`` and may span lines. Results print as aligned tables with their run time. Errors print
as one line (``--traceback`` shows Python's traceback too). ``-o OUT.parquet`` (or ``.csv``) writes the result of
the last statement to a file. Dot commands: .tables, .schema [NAME], .timer on|off,
.help, .quit. Results go to files with plain SQL: ``COPY (FROM synthesize(...)) TO 'out.parquet'``.

Ctrl-C while a statement runs stops it (DuckDB's query and any release in progress, which keeps the budget it
reserved) and prints one line, :data:`INTERRUPTED`; the prompt comes back, or ``-c`` / ``-f`` / piped SQL exits with
status 130. Ctrl-C at the prompt clears the line being typed.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
import time
import traceback

import duckdb

import duckmob
from duckmob.errors import one_line

HELP = """\
.tables            list tables and views          (SQL: SHOW TABLES)
.schema [NAME]     columns of a table             (SQL: DESCRIBE NAME)
.timer on|off      show how long each statement took
.help              this text
.quit              leave (also Ctrl-D)
Write a result to a file: COPY (SELECT ...) TO 'result.parquet' (or .csv)."""

INTERRUPTED = "duckmob: interrupted (Ctrl-C); any privacy budget already spent stays recorded in mob_ledger()"
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a command stopped by Ctrl-C


class Shell:
    def __init__(self, con: duckdb.DuckDBPyConnection, out=sys.stdout, err=sys.stderr, show_traceback=False):
        self.con, self.out, self.err = con, out, err
        self.show_traceback = show_traceback
        self.timer = True
        self.interrupted = False  # whether the last run_sql was stopped by Ctrl-C

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
        for i, stmt in enumerate(statements):
            t0 = time.perf_counter()
            last = output is not None and i == len(statements) - 1
            try:
                self._interruptible(lambda: self._statement(stmt.query, output if last else None))
            except _Interrupted:
                self.interrupted = True
                # in a terminal, first erase what is on the line: DuckDB's unfinished progress bar, the ^C echo
                self.err.write(("\r\033[K" if self.err.isatty() else "") + INTERRUPTED + "\n")
                return False
            except (duckdb.Error, duckmob.DuckmobError, ValueError) as exc:
                return self._fail(exc, stmt.query)
            if self.timer and self.out.isatty():
                self.err.write(f"({time.perf_counter() - t0:.3f} s)\n")
        return True

    def _statement(self, query: str, output: str | None) -> None:
        rel = self.con.sql(_bare(query))
        if rel is not None and output is not None:
            write_result(rel, output)
            self.err.write(f"wrote {output}\n")
        elif rel is not None:
            self.out.write(str(rel))
            self.out.write("\n")

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
        parts = line.split()
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
        self.err.write(f"Error: unknown command {cmd}: try .help\n")
        return False

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
        self.out.write(f"duckmob {duckmob.__version__} (DuckDB {duckdb.__version__}). "
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
                if not buffer and line.strip().startswith("."):
                    self.dot(line.strip())
                    continue
                buffer.append(line)
                text = "\n".join(buffer)
                if text.strip() and _complete(text):
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


def write_result(rel, path: str) -> None:
    """Write a query result to Parquet or CSV, chosen by the file's extension."""
    if path.endswith(".parquet"):
        rel.write_parquet(path)
    elif path.endswith(".csv"):
        rel.write_csv(path, header=True)
    else:
        raise duckmob.DuckmobError(f"cannot write {path!r}: name a .parquet or .csv file")


def _complete(text: str) -> bool:
    """True when ``text`` ends a statement: a ';' at the end, outside quotes."""
    stripped = text.rstrip()
    if not stripped.endswith(";"):
        return False
    quote = None
    for ch in stripped:
        if quote:
            if ch == quote:
                quote = None
        elif ch in ("'", '"'):
            quote = ch
    return quote is None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["demo"]:
        from duckmob.demo import run
        run()
        return 0
    parser = argparse.ArgumentParser(prog="duckmob", description="DuckDB with duckmob's functions registered.")
    parser.add_argument("database", nargs="?", default=":memory:", help="database file (default: in memory)")
    parser.add_argument("-c", "--command", help="SQL to run, then exit")
    parser.add_argument("-f", "--file", help="a .sql file to run, then exit")
    parser.add_argument("-o", "--output", help="write the last statement's result to this .parquet or .csv file")
    parser.add_argument("--traceback", action="store_true", help="show Python tracebacks on errors")
    parser.add_argument("-i", "--interactive", action="store_true",
                        help="the prompt even when standard input is not a terminal (a pipe from another program)")
    args = parser.parse_args(argv)
    try:
        con = duckmob.connect(args.database)
    except duckdb.Error as exc:
        sys.stderr.write(f"Error: cannot open {args.database}: {one_line(exc)}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write(INTERRUPTED + "\n")
        return EXIT_INTERRUPTED
    # DuckDB's own progress bar for long statements, in a terminal only: it draws on standard output, so a
    # redirected result would hold it (and it is on by default).
    con.execute(f"SET enable_progress_bar = {str(sys.stdout.isatty()).lower()}")
    shell = Shell(con, show_traceback=args.traceback)

    def status(ok: bool) -> int:
        return EXIT_INTERRUPTED if shell.interrupted else 0 if ok else 1

    try:
        if args.command is not None:
            return status(shell.run_sql(args.command, args.output))
        if args.file is not None:
            try:
                with open(args.file, encoding="utf-8") as fh:
                    text = fh.read()
            except OSError as exc:
                sys.stderr.write(f"Error: cannot read {args.file}: {exc.strerror}\n")
                return 1
            return status(shell.run_sql(text, args.output))
        if sys.stdin.isatty() or args.interactive:
            return shell.interactive()
        return status(shell.run_sql(sys.stdin.read(), args.output))
    except KeyboardInterrupt:  # Ctrl-C outside a statement: while reading piped SQL, say
        sys.stderr.write(INTERRUPTED + "\n")
        return EXIT_INTERRUPTED
    finally:
        con.close()
