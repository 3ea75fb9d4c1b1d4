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

The shell (statements, dot commands, the prompt, Ctrl-C) is :mod:`duckmob.cli.shell`, how results print
:mod:`duckmob.cli.output`, how SQL text is cut into statements :mod:`duckmob.cli.statements`; this module parses
the command line.
"""

from __future__ import annotations

import argparse
import sys
import textwrap

import duckdb

from duckmob import api
from duckmob.cli.output import PIPE_WIDTH, format_double, text_width
from duckmob.cli.shell import DEFAULT_MAX_ROWS, EXIT_INTERRUPTED, INTERRUPTED, MODES, Shell, is_interrupt
from duckmob.cli.statements import _complete  # noqa: F401  (cli._complete, in the tests)
from duckmob.errors import one_line

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


__all__ = ["main", "Shell", "INTERRUPTED", "EXIT_INTERRUPTED", "is_interrupt", "DEFAULT_MAX_ROWS", "MODES",
           "PIPE_WIDTH", "format_double", "text_width"]
