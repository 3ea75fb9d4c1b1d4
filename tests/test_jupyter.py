"""``%load_ext duckmob`` in an IPython shell without a browser: %sql works with every duckmob function, jupysql's
telemetry is off, and bad calls show duckmob's one-line message instead of a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("sql", reason="jupysql is in the [test] extra")
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402

import duckmob  # noqa: E402
from duckmob.demo import HRNET_BBOX  # noqa: E402
from duckmob.samples import sample_path  # noqa: E402

BBOX = "[" + ", ".join(map(str, HRNET_BBOX)) + "]"


@pytest.fixture(scope="module")
def ip():
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "duckmob")
    yield shell
    from sql.connection import ConnectionManager

    # close jupysql's connections while the shell is alive: its atexit hook prints through IPython's display,
    # which fails noisily once the test process tears the shell down
    ConnectionManager.close_all()


def run(shell, code: str):
    """Run a cell; return its ExecutionResult."""
    return shell.run_cell(code, store_history=False)


def test_telemetry_is_off_and_connection_is_exposed(ip):
    assert os.environ["PLOOMBER_STATS_ENABLED"] == "false"
    assert os.environ["PLOOMBER_VERSION_CHECK_DISABLED"] == "true"
    assert "duckmob_con" in ip.user_ns
    assert "sql" in ip.extension_manager.loaded


def test_sql_line_magic_runs_duckmob_macros(ip):
    # mob_cell is a TEMP macro: it only works if jupysql's per-statement cursor got the macros too
    r = run(ip, f"%sql SELECT mob_cell(39.99, 116.31, {BBOX}, 32) AS c, mob_parent(556, 32, 2) AS p")
    assert r.error_in_exec is None
    assert r.result.dict() == {"c": (556,), "p": (9,)}


def test_cell_magic_budget_synthesis_and_evaluation(ip, tmp_path):
    ip.user_ns["sample"] = sample_path()
    steps = [
        "%sql CREATE OR REPLACE TABLE trips AS FROM read_parquet('{{sample}}')",
        "%sql FROM mob_set_budget('trips', eps := 2.0, delta := 1e-5)",
        f"%%sql\nCREATE OR REPLACE TABLE synth AS\nFROM synthesize('trips', eps := 1.0, bbox := {BBOX}, "
        "outside := 'drop', seed := 7)",
    ]
    for step in steps:
        r = run(ip, step)
        assert r.error_in_exec is None, step
    n_synth = run(ip, "%sql SELECT count(DISTINCT traj_id) AS n FROM synth").result.dict()["n"][0]
    assert n_synth > 100
    spent = run(ip, "%sql SELECT spent FROM mob_budget() WHERE source = 'trips'").result.dict()["spent"][0]
    assert spent == pytest.approx(1.0, abs=0.01)
    rows = run(ip, f"%sql FROM mob_evaluate('trips', 'synth', bbox := {BBOX}, families := ['privtrace'])")
    metrics = dict(zip(rows.result.dict()["metric"], rows.result.dict()["value"]))
    assert 0 <= metrics["privtrace_length_jsd"] <= 1
    png = tmp_path / "density.png"
    r = run(ip, f"%sql FROM mob_plot_density('trips', 'synth', path := '{png}', bbox := {BBOX}, w := 32)")
    assert r.error_in_exec is None
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("code, expected", [
    ("%sql FROM synthesize('no_budget_here', eps := 1.0, bbox := " + BBOX + ")",
     "duckmob: no privacy budget declared for 'no_budget_here'"),
    ("%%sql\nFROM synthesize('trips', eps := 0.1, method := 'nope', bbox := " + BBOX + ")",
     "duckmob: unknown synthesis method 'nope'"),
    ("%sql FROM mob_cell_sequences('trips', bbox := " + BBOX + ", lat_col := 'latitude')",
     'duckmob: the input has no column latitude'),
    ("duckmob.synthesize(duckmob_con, 'trips', eps=0.1, method='nope', bbox=" + BBOX + ")",
     "duckmob: unknown synthesis method 'nope'"),
])
def test_bad_calls_show_one_line(ip, capsys, code, expected):
    run(ip, "%sql CREATE TABLE IF NOT EXISTS no_budget_here AS SELECT * FROM trips LIMIT 0")
    ip.user_ns["duckmob"] = duckmob
    capsys.readouterr()
    r = run(ip, code)
    out = capsys.readouterr()
    assert r.error_in_exec is not None
    shown = (out.out + out.err).strip().splitlines()
    shown = [line for line in shown if not line.startswith("Running query in")]
    assert len(shown) == 1 and shown[0].startswith(expected), shown
    assert "Traceback" not in out.out + out.err


def test_other_errors_keep_their_traceback(ip, capsys):
    capsys.readouterr()
    r = run(ip, "1 / 0")
    out = capsys.readouterr()
    assert isinstance(r.error_in_exec, ZeroDivisionError)
    assert "ZeroDivisionError" in out.out + out.err and "Traceback" in out.out + out.err


def test_duckmob_magic_switches_to_a_database_file(ip, tmp_path):
    path = tmp_path / "nb.duckdb"
    assert run(ip, f"%duckmob {path}").error_in_exec is None
    assert run(ip, "%sql CREATE TABLE kept AS SELECT mob_cell(40.0, 116.3, " + BBOX + ", 32) AS c").error_in_exec is None
    assert run(ip, "%sql FROM mob_set_budget('kept', eps := 1.0, delta := 1e-6)").error_in_exec is None
    run(ip, "%duckmob")  # back to memory: the file is closed
    con = duckmob.connect(str(path))
    try:
        assert con.execute("SELECT c FROM kept").fetchall() == [(587,)]  # row 18, column 11
        assert con.execute("SELECT eps FROM mob_budget() WHERE source = 'kept'").fetchone()[0] == 1.0
    finally:
        con.close()


def test_example_notebook_runs_top_to_bottom(tmp_path, capfd):
    """examples/notebook.ipynb in a real kernel (nbclient): every cell runs, the two cells tagged raises-exception
    show duckmob's one line and nothing else, the density picture is displayed, and the kernel exits without
    DuckDB's "nanobind: leaked ... instances" lines (the kernel writes to this process's standard error, which
    capfd reads; nbclient waits for the kernel to exit)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(Path(__file__).resolve().parents[1] / "examples" / "notebook.ipynb", as_version=4)
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    cells = [c for c in notebook.cells if c.cell_type == "code"]
    errors = [o for c in cells for o in c.outputs if o.output_type == "error"]
    expected = [c for c in cells if "raises-exception" in c.metadata.get("tags", [])]
    assert len(errors) == len(expected) == 2
    assert errors[0].traceback == ["duckmob: no privacy budget declared for 'trips': run FROM mob_set_budget("
                                   "'trips', eps := ..., delta := ...) first"]
    assert len(errors[1].traceback) == 1 and errors[1].traceback[0].startswith(
        "duckmob: unknown synthesis method 'no_such_method'")
    text = "\n".join(o.get("data", {}).get("text/plain", "") for c in cells for o in c.outputs)
    assert "privtrace_length_jsd" in text and "trips_privtrace" in text
    images = [o for c in cells for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(images) == 2 and (tmp_path / "density.png").is_file() and (tmp_path / "sf_density.png").is_file()
    kernel_stderr = capfd.readouterr().err
    assert "nanobind: leaked" not in kernel_stderr, kernel_stderr[-2000:]


def test_a_duckmob_error_in_a_notebook_leaves_nothing_printed_at_kernel_exit(tmp_path, capfd):
    """A release refused in a real kernel, through %sql and from Python: each cell shows duckmob's one line, and the
    kernel exits without DuckDB's "nanobind: leaked ..." lines. IPython keeps the last error's traceback, whose
    frames hold the release's connection and relations, until its very end (duckmob.jupyter._release_last_error);
    without that hook the kernel printed about 40 such lines, in each of the 7 runs tried."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    cells = ["%load_ext duckmob",
             "%sql CREATE TABLE trips AS FROM mob_geolife_sample()",
             f"%sql FROM synthesize('trips', eps := 1.0, bbox := {BBOX})",
             f"import duckmob\nduckmob.synthesize(duckmob_con, 'trips', eps=1.0, bbox={BBOX})"]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    capfd.readouterr()
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o.traceback for c in notebook.cells for o in c.outputs if o.output_type == "error"]
    assert [len(tb) for tb in errors] == [1, 1], errors
    assert all(tb[0].startswith("duckmob: no privacy budget declared for 'trips'") for tb in errors), errors
    kernel_stderr = capfd.readouterr().err
    assert "nanobind" not in kernel_stderr and "leaked" not in kernel_stderr, kernel_stderr[-2000:]


def test_an_interrupted_sql_statement_shows_one_line(ip, capsys):
    """What "interrupt the kernel" does to a running %sql statement, without a signal: DuckDB's own interrupt on
    jupysql's cursor. The cell shows the shell's one line, no traceback."""
    import threading

    from duckmob.cli import INTERRUPTED

    done = threading.Event()

    def interrupt_cursors():
        while not done.wait(0.2):
            for cur in list(ip.user_ns["_duckmob_notebook_connection"]._cursors):
                cur.interrupt()

    capsys.readouterr()
    threading.Thread(target=interrupt_cursors, daemon=True).start()
    try:
        r = run(ip, "%sql SELECT count(*) FROM range(100000000000) t(x) WHERE x % 7 = 3")
    finally:
        done.set()
    out = capsys.readouterr()
    shown = [line for line in (out.out + out.err).strip().splitlines() if not line.startswith("Running query in")]
    assert r.error_in_exec is not None
    assert shown == [INTERRUPTED] and "Traceback" not in out.out + out.err


def test_a_release_interrupted_inside_sql_shows_one_line(ip, capsys):
    """A duckmob release stopped by Ctrl-C inside a UDF reaches jupysql as DuckDB's wrapped UDF error."""
    from duckmob.cli import INTERRUPTED

    def stopped_release() -> int:
        raise RuntimeError("interrupted (Ctrl-C): the release stopped")  # the text of release.Interrupted

    ip.user_ns["duckmob_con"].create_function("stopped_release", stopped_release, [], "INTEGER")
    capsys.readouterr()
    r = run(ip, "%sql SELECT stopped_release() AS x")
    out = capsys.readouterr()
    shown = [line for line in (out.out + out.err).strip().splitlines() if not line.startswith("Running query in")]
    assert r.error_in_exec is not None and shown == [INTERRUPTED], shown
