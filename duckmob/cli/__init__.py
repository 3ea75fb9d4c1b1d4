"""``python -m duckmob`` / ``duckmob``: a SQL shell with every duckmob function registered.

    duckmob [DATABASE] [-c SQL]... [-f FILE.sql]... [-o OUT] [--traceback]   run SQL (or read it from standard input)
    duckmob [DATABASE] [-i]                     interactive prompt when standard input is a terminal (or with -i)
    duckmob --version                           duckmob's and DuckDB's versions
    duckmob demo [--save FILE.duckdb] [--png FILE.png]         the demo on the shipped GeoLife sample
    duckmob report DATABASE --synth TABLE [--real TABLE] -o FILE.html   a release report (duckmob.report)

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
from duckmob.cli.statements import complete  # noqa: F401  (cli.complete, in the tests)
from duckmob.errors import one_line

USAGE = """duckmob [DATABASE] [-c SQL]... [-f FILE]... [-o OUT] [-i] [--traceback]
       duckmob --version
       duckmob demo [--save FILE.duckdb] [--png FILE.png]
       duckmob report DATABASE --synth TABLE [--real TABLE] [--bbox ...] [--release ID] -o FILE.html"""
DEMO = ("the whole pipeline on the GeoLife sample shipped with duckmob: load, clean, stay points, a synthetic "
        "table under differential privacy and its quality beside real-vs-real scores (about 15 seconds); leaves "
        "a database, a density picture and the release report in the current folder")
REPORT = ("one self-contained HTML page on the release that made a synthetic table, for whoever decides whether "
          "it may be published; with --real, the owner's version that compares it with the real table (exact: do "
          "not publish that one)")
COMMANDS = f"""commands:
  demo  {textwrap.fill(DEMO, 100, subsequent_indent=' ' * 8)}
  report {textwrap.fill(REPORT, 99, subsequent_indent=' ' * 9)}

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
    if argv[:1] == ["report"]:
        return report(argv[1:])
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


def _bbox(text: str) -> list[float]:
    try:
        box = [float(v) for v in text.replace("[", "").replace("]", "").split(",")]
    except ValueError:
        box = []
    if len(box) != 4:
        raise argparse.ArgumentTypeError(f"--bbox takes min_lat,min_lon,max_lat,max_lon (four numbers), got {text!r}")
    return box


def report(argv: list[str]) -> int:
    """``duckmob report DATABASE --synth TABLE [--real TABLE] -o FILE.html``: write the release report, print its
    path and one line per section."""
    parser = argparse.ArgumentParser(prog="duckmob report", description=REPORT)
    parser.add_argument("database", help="the database file holding the synthetic table and the privacy ledger")
    parser.add_argument("--synth", required=True, metavar="TABLE", help="the synthetic table to report on")
    parser.add_argument("--real", metavar="TABLE",
                        help="the real table: adds the comparison (the page then holds exact statistics of the real "
                             "data and must not be published); without it the real table is never read")
    parser.add_argument("-o", "--output", default="report.html", metavar="FILE.html",
                        help="the page to write (default: report.html)")
    parser.add_argument("--bbox", type=_bbox, metavar="MIN_LAT,MIN_LON,MAX_LAT,MAX_LON",
                        help="the public box (default: the one the release recorded)")
    parser.add_argument("--release", type=int, metavar="ID",
                        help="a ledger id (default: the release that made the table)")
    args = parser.parse_args(argv)
    try:
        con = duckdb.connect(args.database)
        try:
            done = api.report(con, args.synth, args.output, real=args.real, bbox=args.bbox, release=args.release)
        finally:
            con.close()
    except (api.DuckmobError, duckdb.Error) as exc:
        sys.stderr.write(f"Error: {one_line(exc)}\n")
        return 1
    print(done.path)
    for section, summary in done.rows():
        print(f"  {section}: {summary}")
    return 0


__all__ = ["main", "report", "Shell", "INTERRUPTED", "EXIT_INTERRUPTED", "is_interrupt", "DEFAULT_MAX_ROWS", "MODES",
           "PIPE_WIDTH", "format_double", "text_width"]
