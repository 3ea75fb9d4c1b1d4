"""``python -m duckmob`` / ``duckmob``: a SQL shell with every duckmob function registered.

    duckmob [DATABASE] [-c SQL] [-f FILE.sql] [-o OUT] [--traceback]   run SQL (or read it from standard input)
    duckmob [DATABASE]                                          interactive prompt when standard input is a terminal
    duckmob demo                                                the demo on the shipped GeoLife sample

Statements end with ``;`` and may span lines. Results print as aligned tables with their run time. Errors print
as one line (``--traceback`` shows Python's traceback too). ``-o OUT.parquet`` (or ``.csv``) writes the result of
the last statement to a file. Dot commands: .tables, .schema [NAME], .timer on|off,
.help, .quit. Results go to files with plain SQL: ``COPY (FROM synthesize(...)) TO 'out.parquet'``.
"""

from __future__ import annotations

import argparse
import os
import sys
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


class Shell:
    def __init__(self, con: duckdb.DuckDBPyConnection, out=sys.stdout, err=sys.stderr, show_traceback=False):
        self.con, self.out, self.err = con, out, err
        self.show_traceback = show_traceback
        self.timer = True

    def run_sql(self, text: str, output: str | None = None) -> bool:
        """Run every statement in ``text``; return False if one failed (the rest are skipped).

        With ``output`` (a .parquet or .csv path) the last statement's result is written there instead of shown.
        """
        try:
            statements = self.con.extract_statements(text)
        except duckdb.Error as exc:
            return self._fail(exc)
        for i, stmt in enumerate(statements):
            t0 = time.perf_counter()
            try:
                rel = self.con.sql(_bare(stmt.query))
                if rel is not None and output is not None and i == len(statements) - 1:
                    write_result(rel, output)
                    self.err.write(f"wrote {output}\n")
                elif rel is not None:
                    self.out.write(str(rel))
                    self.out.write("\n")
            except (duckdb.Error, duckmob.DuckmobError, ValueError) as exc:
                return self._fail(exc, stmt.query)
            if self.timer and self.out.isatty():
                self.err.write(f"({time.perf_counter() - t0:.3f} s)\n")
        return True

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
    args = parser.parse_args(argv)
    try:
        con = duckmob.connect(args.database)
    except duckdb.Error as exc:
        sys.stderr.write(f"Error: cannot open {args.database}: {one_line(exc)}\n")
        return 1
    shell = Shell(con, show_traceback=args.traceback)
    try:
        if args.command is not None:
            return 0 if shell.run_sql(args.command, args.output) else 1
        if args.file is not None:
            try:
                with open(args.file, encoding="utf-8") as fh:
                    text = fh.read()
            except OSError as exc:
                sys.stderr.write(f"Error: cannot read {args.file}: {exc.strerror}\n")
                return 1
            return 0 if shell.run_sql(text, args.output) else 1
        if sys.stdin.isatty():
            # DuckDB's own progress bar for long statements, in a terminal only.
            con.execute("SET enable_progress_bar = true")
            return shell.interactive()
        return 0 if shell.run_sql(sys.stdin.read(), args.output) else 1
    finally:
        con.close()
