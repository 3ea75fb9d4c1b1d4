import io
import json
import os
import re
import signal
import subprocess
import sys
import threading

import duckdb
import pyarrow.parquet as pq
import pytest

from duckmob import cli
from duckmob.cli import output
from waiting import cpu_seconds, wait_until


def run(args, stdin=""):
    return subprocess.run([sys.executable, "-m", "duckmob", *args], input=stdin, capture_output=True, text=True,
                          timeout=120)


def test_command_prints_aligned_table():
    r = run(["-c", "SELECT mob_cell(40.0, 116.3, [39.4, 115.4, 41.1, 117.6], 32) AS cell"])
    assert r.returncode == 0
    assert "cell" in r.stdout and "│" in r.stdout and str(11 * 32 + 13) in r.stdout


def test_stdin_multiple_statements_and_file(tmp_path):
    r = run([], stdin="CREATE TABLE t AS SELECT 1 AS a;\nSELECT a + 1\n  AS b FROM t;\n")
    assert r.returncode == 0 and "b" in r.stdout and "2" in r.stdout
    f = tmp_path / "q.sql"
    f.write_text("SELECT 41 + 1 AS answer;")
    r = run(["-f", str(f)])
    assert r.returncode == 0 and "42" in r.stdout


def test_errors_are_one_line_without_traceback():
    r = run(["-c", "FROM mob_cell_sequences('(SELECT 1 AS traj_id, now()::TIMESTAMP AS ts, 40.0 AS lat, 116.0 AS lon)')"])
    assert r.returncode == 1
    assert r.stderr.strip().startswith("Error: duckmob: a bounding box is required")
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run(["--traceback", "-c", "SELECT nope"])
    assert r.returncode == 1 and "Traceback" in r.stderr


def test_missing_column_names_the_column_and_the_mapping():
    table = "CREATE TABLE t AS SELECT 1 AS traj_id, now()::TIMESTAMP AS ts, 40.0 AS latitude, 116.0 AS lon;"
    r = run(["-c", table + " FROM mob_points('t');"])
    assert r.returncode == 1
    assert r.stderr.strip().startswith('Error: duckmob: the input has no column lat (closest: "latitude"')
    assert "lat_col := ..." in r.stderr
    r = run(["-c", table + " SELECT lat FROM t;"])  # plain SQL keeps DuckDB's own message
    assert r.stderr.strip().startswith('Error: Binder Error: Referenced column "lat" not found')


def test_comments_after_statements(tmp_path):
    f = tmp_path / "script.sql"
    f.write_text("-- set-up\nSELECT 1 AS a; -- first\nSELECT '--x;' AS s; -- a ';' inside a string stays\n"
                 "-- the end\n")
    r = run(["-f", str(f)])
    assert r.returncode == 0, r.stderr
    assert "--x;" in r.stdout and r.stderr == ""


def test_output_to_parquet_and_csv(tmp_path):
    out = tmp_path / "r.parquet"
    r = run(["-c", "SELECT range AS i FROM range(5)", "-o", str(out)])
    assert r.returncode == 0 and pq.read_table(out).column("i").to_pylist() == [0, 1, 2, 3, 4]
    out = tmp_path / "r.csv"
    assert run(["-c", "SELECT 7 AS x", "-o", str(out)]).returncode == 0
    assert out.read_text().splitlines() == ["x", "7"]


def test_dot_commands_and_statement_completion():
    import duckmob
    con = duckmob.connect()
    out, err = io.StringIO(), io.StringIO()
    shell = cli.Shell(con, out=out, err=err)
    shell.run_sql("CREATE TABLE trips (traj_id INT, ts TIMESTAMP, lat DOUBLE, lon DOUBLE);")
    shell.dot(".tables")
    shell.dot(".schema trips")
    assert "trips" in out.getvalue() and "TIMESTAMP" in out.getvalue()
    assert not shell.dot(".bogus") and "unknown command" in err.getvalue()
    assert cli.complete("SELECT 1;") and not cli.complete("SELECT ';") and not cli.complete("SELECT 1")
    con.close()


LONG = "SELECT count(*) FROM range(100000000000) t(x) WHERE x % 7 = 3;"  # minutes of work


class Running:
    """``python -m duckmob ARGS`` with piped standard streams; ``text()`` is everything it has printed so far
    (stdout and stderr together)."""

    def __init__(self, args, **kw):
        self.proc = subprocess.Popen([sys.executable, "-m", "duckmob", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, **kw)
        self.chunks = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for chunk in iter(lambda: self.proc.stdout.read(1), ""):
            self.chunks.append(chunk)

    def text(self):
        return "".join(self.chunks)

    def wait_for(self, needle, count=1, timeout=60.0):
        return wait_until(lambda: self.text().count(needle) >= count, timeout)

    def computing(self, since: float, seconds=0.3, timeout=60.0):
        """Whether the process has used ``seconds`` of CPU more than ``since`` (its :func:`cpu_seconds` before a
        statement was sent): the statement runs (an idle shell uses none), within ``timeout``."""
        return wait_until(lambda: cpu_seconds(self.proc.pid) >= since + seconds, timeout)

    def finish(self, timeout=60.0):
        """The exit status, once everything printed has been read."""
        status = self.proc.wait(timeout)
        self.reader.join(10)
        return status

    def interrupt_until_reported(self):
        """SIGINT, then wait for the report; again if the first one came before the statement started."""
        for _ in range(3):
            self.proc.send_signal(signal.SIGINT)
            if self.wait_for(cli.INTERRUPTED, timeout=20):
                return
        pytest.fail("no interrupted line: " + self.text())


def test_ctrl_c_during_a_statement_prints_one_line_and_returns_to_the_prompt():
    shell = Running(["-i"], stdin=subprocess.PIPE)
    try:
        assert shell.wait_for("duckmob> "), shell.text()
        idle = cpu_seconds(shell.proc.pid)
        shell.proc.stdin.write(LONG + "\n")
        shell.proc.stdin.flush()
        assert shell.computing(since=idle), shell.text()
        shell.interrupt_until_reported()
        shell.proc.stdin.write("SELECT 42 AS answer;\n")
        shell.proc.stdin.close()
        assert shell.finish() == 0
    finally:
        shell.proc.kill()
    out = shell.text()
    assert out.count(cli.INTERRUPTED) == 1 and "Traceback" not in out, out
    assert "answer" in out and "42" in out.split(cli.INTERRUPTED)[1]


def test_ctrl_c_in_a_command_exits_130_without_running_the_rest():
    shell = Running(["-c", "SELECT 'ready' AS r; " + LONG + " SELECT 4343 AS never;"], stdin=subprocess.DEVNULL,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert shell.wait_for("ready"), shell.text()
        assert shell.computing(since=cpu_seconds(shell.proc.pid)), shell.text()
        shell.interrupt_until_reported()
        assert shell.finish() == cli.EXIT_INTERRUPTED == 130
    finally:
        shell.proc.kill()
    out = shell.text()
    assert out.count(cli.INTERRUPTED) == 1 and "Traceback" not in out and "4343" not in out, out


class Interrupting:
    """A connection whose statements fail as DuckDB reports an interrupted query."""

    def __init__(self, con, exc):
        self.con, self.exc = con, exc

    def extract_statements(self, text):
        return self.con.extract_statements(text)

    def sql(self, query):
        raise self.exc

    def interrupt(self):
        pass


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), duckdb.InterruptException("INTERRUPT Error: Interrupted!"),
                                 RuntimeError("Query interrupted"),
                                 duckdb.InvalidInputException("Invalid Input Error: Python exception occurred while "
                                                              "executing the UDF: Interrupted: interrupted (Ctrl-C)")])
def test_every_form_of_an_interrupted_query_is_one_line(exc):
    con = duckdb.connect()
    out, err = io.StringIO(), io.StringIO()
    shell = cli.Shell(Interrupting(con, exc), out=out, err=err)
    assert not shell.run_sql("SELECT 1; SELECT 2;") and shell.interrupted
    assert err.getvalue() == cli.INTERRUPTED + "\n" and out.getvalue() == ""
    shell.con = con
    assert shell.run_sql("SELECT 42 AS answer;") and not shell.interrupted and "42" in out.getvalue()
    con.close()


def test_other_errors_are_not_taken_for_an_interrupt():
    con = duckdb.connect()
    err = io.StringIO()
    shell = cli.Shell(Interrupting(con, duckdb.BinderException("Binder Error: nope")), out=io.StringIO(), err=err)
    assert not shell.run_sql("SELECT 1;") and not shell.interrupted
    assert err.getvalue() == "Error: Binder Error: nope\n"
    con.close()


def shell_on(con):
    out, err = io.StringIO(), io.StringIO()
    return cli.Shell(con, out=out, err=err), out, err


def clear(buffer: io.StringIO) -> None:
    buffer.seek(0)
    buffer.truncate()


def test_dot_commands_from_a_pipe_a_file_and_c(tmp_path):
    db = str(tmp_path / "t.duckdb")
    assert run([db, "-c", "CREATE TABLE trips AS SELECT 1 AS traj_id"]).returncode == 0
    r = run([db], stdin=".tables\n")  # echo .tables | duckmob t.duckdb: a parser error before
    assert r.returncode == 0 and "trips" in r.stdout and r.stderr == "", r.stderr
    script = tmp_path / "s.sql"
    script.write_text("-- a comment\nSELECT 1 AS a;\n.maxrows 4\nSELECT * FROM range(10);\n.schema trips\n"
                      ".quit\nSELECT 'never' AS n;\n")
    r = run([db, "-f", str(script)])
    assert r.returncode == 0, r.stderr
    assert "(4 shown)" in r.stdout and "traj_id" in r.stdout and "never" not in r.stdout
    r = run([db, "-c", ".bogus"])
    assert r.returncode == 1 and "unknown command .bogus" in r.stderr


def test_scripts_mix_sql_and_dot_commands_at_statement_starts_only(tmp_path):
    import duckmob
    con = duckmob.connect()
    shell, out, err = shell_on(con)
    # a line starting with '.' inside a statement or a string is SQL, as in the DuckDB CLI
    assert shell.run_script("SELECT\n.5 AS half;\nSELECT 'x\n.tables' AS s;\n.tables\n")
    assert "half" in out.getvalue() and ".5 │" in out.getvalue() and "x\\n.tables" in out.getvalue()
    assert "duckmob_ledger" in out.getvalue() and err.getvalue() == ""
    assert not shell.run_script(".maxrows zero\nSELECT 42 AS never;") and "42" not in out.getvalue()
    clear(out)
    # -o gets the last SQL statement's result even when a dot command follows it
    path = tmp_path / "r.csv"
    assert shell.run_script("SELECT 1 AS a;\nSELECT 7 AS x;\n.timer off\n", output=str(path))
    assert path.read_text().splitlines() == ["x", "7"] and "a" in out.getvalue()
    con.close()


def test_in_process_main_reads_the_current_streams(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("SELECT 6 * 7 AS answer;\n.maxrows\n"))
    assert cli.main([]) == 0
    captured = capsys.readouterr()
    assert "42" in captured.out and f".maxrows {cli.DEFAULT_MAX_ROWS}" in captured.out


def test_a_31_row_result_shows_whole_and_maxrows_cuts_it():
    con = duckdb.connect()
    shell, out, _ = shell_on(con)

    def shown_rows():
        return [int(m) for m in re.findall(r"^│\s+(\d+) │$", out.getvalue(), re.M)]

    shell.run_sql("SELECT range AS i FROM range(31);")  # mob_evaluate's size when the issue was filed
    assert shown_rows() == list(range(31)) and "shown" not in out.getvalue()
    clear(out)
    assert shell.dot(".maxrows 10")
    shell.run_sql("SELECT range AS i FROM range(31);")
    assert shown_rows() == [0, 1, 2, 3, 4, 26, 27, 28, 29, 30] and "(10 shown)" in out.getvalue()
    con.close()


def test_wide_text_is_cut_with_an_ellipsis_and_rows_stay_one_line():
    con = duckdb.connect()
    shell, out, _ = shell_on(con)
    shell.dot(".maxwidth 80")
    # DuckDB's renderer wrapped this 300-character value over 13 lines
    shell.run_sql("SELECT repeat('x', 300) AS s, i FROM range(2) t(i);")
    lines = out.getvalue().splitlines()
    rows = [line for line in lines if line.startswith("│ x")]
    assert len(rows) == 2 and all(line.rstrip().endswith("│") and "…" in line for line in rows), lines
    assert max(len(line) for line in lines) <= 80
    clear(out)
    shell.run_sql("SELECT 1 AS a, 2 AS a;")  # a repeated name shows as written
    assert out.getvalue().splitlines()[1].count(" a ") == 2
    clear(out)
    shell.run_sql("EXPLAIN SELECT 42 AS x;")  # the plan as DuckDB draws it, not one escaped line
    assert "Projection" in out.getvalue() and "\\n" not in out.getvalue() and "explain_value" not in out.getvalue()
    con.close()


def test_errors_keep_duckdb_hints_on_one_line():
    import duckmob
    con = duckmob.connect()
    shell, _, err = shell_on(con)
    shell.run_sql("CREATE TABLE trips AS SELECT 1 AS traj_id, 40.0 AS lat;")
    for sql, expected in [
        ("SELECT * FROM trip;", 'Catalog Error: Table with name trip does not exist! Did you mean "trips"?'),
        ("SELECT latt FROM trips;", 'Referenced column "latt" not found in FROM clause! Candidate bindings: "lat"'),
        ("SELECT mob_cel(1);", 'Did you mean "mob_cell"?'),  # a typo, not "not registered"
        ("SELECT mob_cell(1);", "Candidate macros: mob_cell(lat, lon, bbox, w)"),
        ("SELECT CAST('a' AS INT);", "Conversion Error: Could not convert string 'a' to INT32"),
    ]:
        clear(err)
        assert not shell.run_sql(sql)
        assert len(err.getvalue().splitlines()) == 1 and expected in err.getvalue(), err.getvalue()
        assert "LINE 1" not in err.getvalue()
    con.close()
    cur = duckdb.connect()  # no duckmob here: the message says so
    try:
        cur.sql("SELECT mob_cell(1, 2, [1, 2, 3, 4], 2)").fetchall()
    except duckdb.Error as exc:
        assert "duckmob.register" in cli.one_line(exc)
    cur.close()


def test_long_candidate_lists_are_cut():
    con = duckdb.connect()
    try:
        con.sql("SELECT abs('a', 1)").fetchall()
    except duckdb.Error as exc:
        text = cli.one_line(exc)
    assert "Candidate functions: abs(x TINYINT) -> TINYINT; " in text and "more)" in text and "\n" not in text
    con.close()


def test_numbers_in_duckmob_messages_read_as_written():
    import numpy as np

    from duckmob.errors import DuckmobError
    exc = DuckmobError(f"bbox must be finite, got {[np.float64(116.318417), np.float64('nan')]!r}; "
                       f"k = {np.int64(3)!r}, {np.True_!r}")
    assert str(exc) == "bbox must be finite, got [116.318417, nan]; k = 3, True"


def test_help_lists_every_subcommand():
    r = run(["--help"])
    assert r.returncode == 0 and "demo" in r.stdout and "-c" in r.stdout and "-f" in r.stdout
    r = run(["demo", "--help"])
    assert r.returncode == 0 and "GeoLife sample" in r.stdout and "--save" in r.stdout and "--png" in r.stdout
    # the demo itself: tests/test_demo.py


def test_statement_completion_uses_duckdbs_tokenizer():
    assert cli.complete("SELECT 1;") and cli.complete("SELECT 1; -- it's done") and cli.complete("-- only")
    assert not cli.complete("SELECT ';") and not cli.complete("SELECT 1") and not cli.complete("SELECT 'a;")
    assert cli.complete("SELECT $$ a; $$;") and not cli.complete("SELECT 1 /* ; */")


def test_version_names_duckmob_and_duckdb():
    r = run(["--version"])
    assert r.returncode == 0 and r.stdout.strip() == f"duckmob {cli.api.__version__} (DuckDB {duckdb.__version__})"


def test_several_c_and_f_run_in_the_order_given_and_stop_at_a_failure(tmp_path):
    f = tmp_path / "q.sql"
    f.write_text("SELECT 'second' AS s;")
    r = run(["-c", "SELECT 'first' AS s", "-f", str(f), "-c", "SELECT 'third' AS s"])
    assert r.returncode == 0, r.stderr
    assert 0 < r.stdout.index("first") < r.stdout.index("second") < r.stdout.index("third")
    r = run(["-c", "SELECT nope", "-c", "SELECT 'never' AS s"])
    assert r.returncode == 1 and "never" not in r.stdout and "nope" in r.stderr
    out = tmp_path / "r.csv"  # -o: the last statement of the last script
    assert run(["-c", "SELECT 1 AS a", "-c", "SELECT 7 AS x", "-o", str(out)]).returncode == 0
    assert out.read_text().splitlines() == ["x", "7"]


def test_dot_commands_take_a_trailing_semicolon():
    r = run(["-c", ".maxrows 4;\nSELECT * FROM range(10);\n.mode csv;\nSELECT 1 AS a;\n.timer off ;"])
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "10 rows (4 shown)" in r.stdout and r.stdout.endswith("a\n1\n")
    con = duckdb.connect()
    shell, out, err = shell_on(con)
    con.execute("CREATE TABLE trips AS SELECT 1 AS traj_id")
    assert shell.dot(".schema trips;") and shell.dot(".tables;") and shell.dot(".maxwidth 60;")
    assert shell.maxwidth == 60 and "traj_id" in out.getvalue() and err.getvalue() == ""
    con.close()


def test_modes_print_as_the_duckdb_cli():
    con = duckdb.connect()
    shell, out, err = shell_on(con)
    query = "SELECT 1 AS n, 'x,\"y\"' AS s, NULL AS z, 0.1::DOUBLE AS d UNION ALL SELECT 22, 'b|c', 'w', 2.5;"
    assert shell.dot(".mode") and out.getvalue() == "current output mode: duckbox\n"
    for mode, expected in [
        ("csv", 'n,s,z,d\n1,"x,""y""",,0.1\n22,b|c,w,2.5\n'),
        ("markdown", '| n   | s     | z    | d   |\n|----:|-------|------|----:|\n'
                     '|   1 | x,"y" | NULL | 0.1 |\n|  22 | b\\|c  | w    | 2.5 |\n'),
        ("line", 'n = 1\ns = x,"y"\nz = NULL\nd = 0.1\n\nn = 22\ns = b|c\nz = w\nd = 2.5\n'),
        ("json", '[{"n":1,"s":"x,\\"y\\"","z":null,"d":0.1},\n{"n":22,"s":"b|c","z":"w","d":2.5}]\n'),
    ]:
        clear(out)
        assert shell.dot(f".mode {mode}") and shell.run_sql(query), err.getvalue()
        assert out.getvalue() == expected, (mode, out.getvalue())
    assert json.loads(out.getvalue()) == [{"n": 1, "s": 'x,"y"', "z": None, "d": 0.1},
                                          {"n": 22, "s": "b|c", "z": "w", "d": 2.5}]
    clear(out)
    assert shell.run_sql("SELECT * FROM range(3) WHERE false;") and out.getvalue() == "[]\n"
    assert not shell.dot(".mode box") and "csv" in err.getvalue() and shell.mode == "json"
    assert shell.dot(".mode duckbox") and shell.run_sql("SELECT 42 AS x;") and "│" in out.getvalue()
    con.close()


def test_a_large_result_shows_its_first_and_last_rows_and_its_true_count():
    con = duckdb.connect()
    shell, out, _ = shell_on(con)

    def shown_rows():
        return [int(m) for m in re.findall(r"^│\s+(\d+) │$", out.getvalue(), re.M)]

    assert shell.run_sql("FROM range(30000);")  # 15 Arrow batches
    assert shown_rows() == list(range(50)) + list(range(29950, 30000))
    assert "30,000 rows (100 shown)" in out.getvalue() and "?" not in out.getvalue()
    clear(out)
    assert shell.dot(".maxrows 7") and shell.run_sql("SELECT range AS i FROM range(30001);")  # an odd split
    assert shown_rows() == [0, 1, 2, 3, 29998, 29999, 30000] and "30,001 rows (7 shown)" in out.getvalue()
    clear(out)
    assert shell.dot(".maxrows 1") and shell.run_sql("SELECT range AS i FROM range(5);")
    assert shown_rows() == [0] and "5 rows (1 shown)" in out.getvalue()
    clear(out)
    assert shell.run_sql("SELECT range AS i FROM range(1);") and shown_rows() == [0] and "shown" not in out.getvalue()
    con.close()


def test_an_error_while_a_result_streams_is_one_line_and_the_connection_stays_usable():
    con = duckdb.connect()
    shell, out, err = shell_on(con)
    bad = "SELECT CAST(CASE WHEN range = 20000 THEN 'a' ELSE '1' END AS INT) AS x FROM range(30000);"
    assert not shell.run_sql(bad)
    assert err.getvalue() == "Error: Conversion Error: Could not convert string 'a' to INT32\n"
    assert shell.run_sql("SELECT 42 AS answer;") and "42" in out.getvalue()
    con.close()


def test_doubles_show_about_4_significant_digits():
    # A value that is not whole never prints as a whole number (issue 40: 3.0003 printed as 3).
    cases = {0.021534: "0.02153", 1234.5678: "1234.6", 1234567.0: "1.235e+06", 2.0: "2.0", 1968.0: "1968.0",
             1e-05: "1e-05", 3.14159265: "3.142", 999.96: "999.96", 123456.7: "123456.7", 0.0: "0.0",
             float("nan"): "nan", float("-inf"): "-inf", 3.0003: "3.0003", -3.0003: "-3.0003",
             2.99999999: "2.99999999", 1234.04: "1234.04", 3801.22851: "3801.2", 12.35: "12.35",
             1 + 2 ** -40: "1.000000000001"}
    assert {x: cli.format_double(x) for x in cases} == cases
    con = duckdb.connect()
    shell, out, _ = shell_on(con)
    shell.run_sql("SELECT 0.021534::DOUBLE AS d, 2.5::FLOAT AS f, NULL::DOUBLE AS n, 3.14159::DECIMAL(10, 5) AS e, "
                  "[1.23456::DOUBLE] AS l;")
    cells = [c.strip() for c in out.getvalue().splitlines()[4].split("│")[1:-1]]
    assert cells == ["0.02153", "2.5", "NULL", "3.14159", "[1.23456]"]  # DECIMAL and lists as DuckDB writes them
    con.close()


def test_long_text_is_cut_widest_column_first_and_every_column_stays():
    con = duckdb.connect()
    shell, out, _ = shell_on(con)
    # the shape of mob_ledger(): narrow columns beside two long JSON ones, at the default (pipe) width
    shell.run_sql("SELECT 1 AS id, now()::TIMESTAMP AS recorded_at, 'trips' AS source, 'privtrace' AS mechanism, "
                  "0.9974 AS epsilon, 1e-5 AS delta, 'trajectory' AS privacy_unit, repeat('p', 200) AS params, "
                  "repeat('e', 300) AS event, true AS seeded, 'spent' AS status;")
    lines = out.getvalue().splitlines()
    assert max(map(len, lines)) <= cli.PIPE_WIDTH and len(lines[3]) == len(lines[0])
    for name in ("mechanism", "epsilon", "source", "status", "seeded"):
        assert f" {name} " in lines[1]
    row = lines[4]
    assert "privtrace" in row and "0.9974" in row and "pppp…" in row and "eeee…" in row
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert len(cells) == 11 and abs(len(cells[7]) - len(cells[8])) <= 1  # the two widest cut to one width
    clear(out)
    # too many columns for even 5 characters each: middle ones are left out, a "…" column in their place
    shell.dot(".maxwidth 40")
    shell.run_sql("SELECT " + ", ".join(f"{i} AS column_{i}" for i in range(20)) + ";")
    lines = out.getvalue().splitlines()
    assert max(map(len, lines)) <= 40 and "… │" in lines[1] and "20 columns (" in out.getvalue()
    assert "colu…" in lines[1]
    con.close()


def test_mob_check_actions_wrap_whole_at_the_pipe_width():
    """Issue 40: mob_check's action column was cut at the pipe width; its sentences now wrap onto the row's lines."""
    import duckmob

    con = duckmob.connect()
    con.execute("CREATE TABLE trips AS FROM mob_geolife_sample()")
    query = "FROM mob_check('trips', bbox := [39.8477, 116.1956, 40.1133, 116.4880])"
    actions = [a for (a,) in con.sql(f"SELECT action FROM ({query})").fetchall()]
    shell, out, _ = shell_on(con)
    shell.run_sql(query + ";")
    lines = out.getvalue().splitlines()
    assert max(map(len, lines)) <= cli.PIPE_WIDTH and "…" not in out.getvalue()
    body = [[c.strip() for c in line.split("│")[1:-1]] for line in lines[4:] if line.startswith("│")]
    rows = []       # a row's lines: the first names its check, the next ones leave it blank
    for cells in body:
        if cells[1]:
            rows.append(cells[3])
        else:
            rows[-1] += " " + cells[3]
    assert rows == actions and any(len(a) > 60 for a in actions)
    assert len(body) > len(actions)     # some action took more than one line
    con.close()


def test_wrapping_is_for_words_and_bounded():
    assert output._wrap("one two three", 20) == ["one two three"]
    assert output._wrap("one two three four", 9) == ["one two", "three", "four"]
    assert output._wrap("a b c d e f g h", 3) == ["a b", "c d", "e…"]      # at most WRAP_LINES lines
    assert output._wrap("abcdefgh ij", 3) == ["abc", "def", "gh…"]            # a long word split
    assert output._wrap("x" * 30, 8) == ["xxxxxxx…"]                          # no words: cut, one line
    con = duckdb.connect()
    shell, out, _ = shell_on(con)
    shell.dot(".maxwidth 30")
    shell.run_sql("SELECT 'a fairly long sentence of plain words to wrap' AS words, 7 AS n;")
    lines = out.getvalue().splitlines()
    assert len({cli.text_width(line) for line in lines[:6]}) == 1 and cli.text_width(lines[0]) <= 30
    assert [line.split("│")[2].strip() for line in lines[4:7]] == ["7", "", ""]   # numbers on the row's first line
    con.close()


def test_wide_characters_keep_the_table_aligned():
    con = duckdb.connect()
    shell, out, _ = shell_on(con)
    shell.dot(".maxwidth 30")
    shell.run_sql("SELECT '北京市海淀区中关村大街' AS place, 1 AS n UNION ALL SELECT 'x', 2;")
    lines = out.getvalue().splitlines()[:6]
    assert len({cli.text_width(line) for line in lines}) == 1 and cli.text_width(lines[0]) <= 30, lines
    assert "…" in lines[4]
    con.close()


HEAVY = ("torch", "scipy", "pandas", "matplotlib", "dp_accounting", "duckmob.metrics", "duckmob.release")


def test_start_up_imports_no_torch_nor_the_release_core():
    code = "import duckmob.cli, sys; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "False", r.stderr
    code = (f"import sys; from duckmob import cli; status = cli.main(['-c', 'SELECT 1']); "
            f"print(status, sorted(m for m in {HEAVY!r} if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip().splitlines()[-1] == "0 []", r.stdout + r.stderr


def test_duckmob_functions_are_registered_when_a_statement_needs_them(tmp_path):
    db = str(tmp_path / "v.duckdb")
    cell = "mob_cell(40.0, 116.3, [39.4, 115.4, 41.1, 117.6], 32)"
    r = run([db, "-c", f"SELECT 1 AS plain; CREATE VIEW v AS SELECT {cell} AS cell;"])
    assert r.returncode == 0, r.stderr
    r = run([db, "-c", "FROM v"])  # no duckmob name in the statement: the catalog error registers, then it reruns
    assert r.returncode == 0 and str(11 * 32 + 13) in r.stdout, r.stderr
    r = run([db, "-c", "FROM nope"])
    assert r.returncode == 1 and r.stderr.startswith("Error: Catalog Error: Table with name nope does not exist")


def test_readme_set_up_matches_the_pins_and_the_demo():
    """The README's set-up (issue 40 item 7): every torch pin is pyproject's, the CPU index an ordinary machine
    needs is given with that pin, and the files the demo leaves are the ones it writes."""
    from pathlib import Path

    from duckmob import demo

    root = Path(__file__).resolve().parents[1]
    readme = root.joinpath("README.md").read_text(encoding="utf-8")
    pin = re.search(r'"(torch==[0-9.]+)"', root.joinpath("pyproject.toml").read_text(encoding="utf-8")).group(1)
    assert set(re.findall(r"torch==[0-9.]+", readme)) == {pin}
    setup = " ".join(readme[readme.index("## Set-up"):readme.index("## From nothing")].split())
    assert f"pip install {pin} --index-url https://download.pytorch.org/whl/cpu" in setup
    assert f"`{demo.REPORT}`" in setup and "duckmob_demo_density.png" in setup
