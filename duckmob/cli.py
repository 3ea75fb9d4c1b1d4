"""``python -m duckmob`` / ``duckmob``: a SQL shell with every duckmob function registered.

    duckmob [DATABASE] [-c SQL] [-f FILE.sql] [-o OUT] [--traceback]   run SQL (or read it from standard input)
    duckmob [DATABASE] [-i]                     interactive prompt when standard input is a terminal (or with -i)
    duckmob demo [--save FILE.duckdb] [--png FILE.png]         the demo on the shipped GeoLife sample

Statements end with ``;`` and may span lines. Results print as aligned tables (at most ``.maxrows`` rows, 100 by
default: the first and last half of a longer result; a text wider than the table allows ends in an ellipsis) with
their run time. Errors print as one line, with DuckDB's hints (``Did you mean "trips"?``) kept; ``--traceback``
shows Python's traceback too. ``-o OUT.parquet`` (or ``.csv``) writes the result of the last statement to a file.
Dot commands (.tables, .schema [NAME], .maxrows N, .maxwidth N, .timer on|off, .help, .quit) work at the prompt and,
as in the DuckDB CLI, on a line of their own between statements in ``-c`` text, a ``-f`` file or piped SQL
(``echo .tables | duckmob trips.duckdb``). Results go to files with plain SQL too: ``COPY (FROM synthesize(...))
TO 'out.parquet'``.

Long statements: in a terminal DuckDB draws its progress bar, and HRNet's pre-training and DP-SGD draw their own
(on standard error, with the time left).

Ctrl-C while a statement runs stops it (DuckDB's query and any release in progress, which keeps the budget it
reserved) and prints one line, :data:`INTERRUPTED`; the prompt comes back, or ``-c`` / ``-f`` / piped SQL exits with
status 130. Ctrl-C at the prompt clears the line being typed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import sys
import textwrap
import threading
import time
import traceback

import duckdb

from duckmob import api
from duckmob.errors import one_line

HELP = """\
.tables            list tables and views          (SQL: SHOW TABLES)
.schema [NAME]     columns of a table             (SQL: DESCRIBE NAME)
.maxrows N         show at most N rows of a result (default 100: the first and last N/2 of a longer one)
.maxwidth N        tables at most N characters wide (default: the terminal's width); wider text ends in ...
.timer on|off      show how long each statement took
.help              this text
.quit              leave (also Ctrl-D)
Dot commands also work on a line of their own in -c text, -f files and piped SQL.
Write a result to a file: COPY (SELECT ...) TO 'result.parquet' (or .csv)."""

# Rows a result table shows by default: all of mob_evaluate's (38 metrics and growing; the DuckDB CLI shows 40).
DEFAULT_MAX_ROWS = 100
# Rows read to draw a result, as DuckDB's own display reads (a longer result shows as ">9999 rows").
SHOWN_LIMIT = 10_000

INTERRUPTED = "duckmob: interrupted (Ctrl-C); any privacy budget already spent stays recorded in mob_ledger()"
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a command stopped by Ctrl-C


class Shell:
    def __init__(self, con: duckdb.DuckDBPyConnection, out=None, err=None, show_traceback=False):
        # the streams as they are now (None), not as they were at import: a caller (or a test) may replace them
        self.con = con
        self.out, self.err = (sys.stdout if out is None else out), (sys.stderr if err is None else err)
        self.show_traceback = show_traceback
        self.timer = True
        self.maxrows = DEFAULT_MAX_ROWS
        self.maxwidth: int | None = None  # None: the terminal's width (DuckDB's default when not a terminal)
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
            except (duckdb.Error, api.DuckmobError, ValueError) as exc:
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
            self._show(rel)

    def _show(self, rel) -> None:
        """Draw ``rel`` as DuckDB's box table: at most ``maxrows`` rows, one line each.

        The statement runs once (its first :data:`SHOWN_LIMIT` rows are held). DuckDB's renderer spends the rows
        a result leaves below ``max_rows`` on wrapping long text over several lines (a 300-character value in a
        2-row result took 13 lines); asking for exactly the rows there are keeps every row on one line, its text
        cut with an ellipsis to fit ``maxwidth``.
        """
        if rel.columns == ["explain_key", "explain_value"]:  # EXPLAIN [ANALYZE]: the plan as DuckDB draws it
            for _, plan in rel.fetchall():
                self.out.write(plan + "\n")
            return
        held = rel.limit(SHOWN_LIMIT).materialize()
        if held.columns != rel.columns:  # the limit renamed repeated names (a, a_1): show the statement's own
            held = held.project(", ".join(f"{_quote(h)} AS {_quote(c)}" for h, c in zip(held.columns, rel.columns)))
        n = len(held)
        with contextlib.redirect_stdout(self.out):
            held.show(max_rows=n if 0 < n <= self.maxrows else self.maxrows, max_width=self._width())

    def _width(self) -> int | None:
        if self.maxwidth is not None:
            return self.maxwidth
        return shutil.get_terminal_size().columns if self.out.isatty() else None

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
        if cmd in (".maxrows", ".maxwidth"):
            return self._set_size(cmd, args)
        self.err.write(f"Error: unknown command {cmd}: try .help\n")
        return False

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


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


USAGE = """duckmob [DATABASE] [-c SQL | -f FILE] [-o OUT] [-i] [--traceback]
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
    parser.add_argument("-c", "--command", help="SQL (and dot commands) to run, then exit")
    parser.add_argument("-f", "--file", help="a .sql file (SQL and dot commands) to run, then exit")
    parser.add_argument("-o", "--output", help="write the last statement's result to this .parquet or .csv file")
    parser.add_argument("--traceback", action="store_true", help="show Python tracebacks on errors")
    parser.add_argument("-i", "--interactive", action="store_true",
                        help="the prompt even when standard input is not a terminal (a pipe from another program)")
    args = parser.parse_args(argv)
    try:
        con = api.connect(args.database)
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
            return status(shell.run_script(args.command, args.output))
        if args.file is not None:
            try:
                with open(args.file, encoding="utf-8") as fh:
                    text = fh.read()
            except OSError as exc:
                sys.stderr.write(f"Error: cannot read {args.file}: {exc.strerror}\n")
                return 1
            return status(shell.run_script(text, args.output))
        if sys.stdin.isatty() or args.interactive:
            return shell.interactive()
        return status(shell.run_script(sys.stdin.read(), args.output))
    except KeyboardInterrupt:  # Ctrl-C outside a statement: while reading piped SQL, say
        sys.stderr.write(INTERRUPTED + "\n")
        return EXIT_INTERRUPTED
    finally:
        con.close()
