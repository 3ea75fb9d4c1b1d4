import io
import subprocess
import sys

import pyarrow.parquet as pq

from duckmob import cli


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
    assert cli._complete("SELECT 1;") and not cli._complete("SELECT ';") and not cli._complete("SELECT 1")
    con.close()


def test_demo_runs():
    r = run(["demo"])
    assert r.returncode == 0, r.stderr
    assert "1,999 trajectories" in r.stdout and "stay points" in r.stdout
    assert "PrivTrace at eps 1.0" in r.stdout and "of 2.0 spent" in r.stdout and "length JSD" in r.stdout
