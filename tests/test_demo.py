"""``duckmob demo``: its numbers come with a real-vs-real reference, it leaves a database and a picture, and it
ends with three commands that run on what it left."""

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from duckmob import demo

ROOT = Path(__file__).resolve().parents[1]


def duckmob_cli(args, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "duckmob", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """The demo run once with its defaults, in an empty folder."""
    folder = tmp_path_factory.mktemp("demo")
    r = duckmob_cli(["demo"], folder)
    assert r.returncode == 0, r.stderr
    return folder, r.stdout


def test_summary_and_reference_column(ran):
    _, out = ran
    assert "1,999 trajectories" in out and "stay points" in out and "PrivTrace at eps 1.0" in out
    assert "of 2.0 spent" in out
    header = next(line for line in out.splitlines() if "quality" in line)
    assert "synthetic" in header and "real vs real" in header and "naive" in header
    for label in demo.SHOWN.values():
        (row,) = [line for line in out.splitlines() if line.strip().startswith(label + " ")]
        synthetic, real, naive = row.split()[-3:]
        assert float(synthetic) >= 0 and float(real) >= 0 and float(naive) >= 0, row  # every column holds a number
    assert "two halves of the real sample" in out and "naive:" in out  # what the anchors are is said


def test_leaves_a_database_and_a_picture_and_says_where(ran):
    folder, out = ran
    png, db = folder / demo.DEFAULT_PNG, folder / demo.DEFAULT_SAVE
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"{demo.DEFAULT_SAVE} (in {folder})" in out and f"{demo.DEFAULT_PNG} (in {folder})" in out
    with duckdb.connect(str(db), read_only=True) as con:
        tables = {r[0] for r in con.execute("SHOW TABLES").fetchall()}
        assert {"trips", "seqs", "synth"} <= tables
        assert con.execute("SELECT count(*) FROM trips").fetchone()[0] == 123_317
        assert con.execute("SELECT count(DISTINCT traj_id) FROM synth").fetchone()[0] > 1000
        ledger = [t for t in tables if "ledger" in t]
        assert ledger and con.execute(f"SELECT count(*) FROM {ledger[0]} WHERE source = 'trips' "
                                      "AND status = 'spent'").fetchone()[0] == 1


def test_ends_with_three_commands_that_run(ran):
    folder, out = ran
    lines = out.rstrip("\n").splitlines()
    assert lines[-4] == "next, try:"
    commands = lines[-3:]
    assert all(c.startswith(f"  duckmob {demo.DEFAULT_SAVE} -c ") for c in commands)
    # the cheap one runs as printed (the other two are a full evaluation and a release: minutes of CI together)
    r = duckmob_cli([demo.DEFAULT_SAVE, "-c", "FROM mob_budget(); FROM mob_ledger()"], folder)
    assert r.returncode == 0, r.stderr
    assert "mob_budget(); FROM mob_ledger()" in commands[1] and "trips" in r.stdout and "spent" in r.stdout


def test_next_commands_quote_the_path():
    lines = demo.next_commands("my folder/d.duckdb", "[1, 2, 3, 4]")
    assert len(lines) == 4 and all(line.startswith("  duckmob 'my folder/d.duckdb' -c ") for line in lines[1:])


def test_replaces_its_own_file_and_refuses_any_other(tmp_path):
    mine = tmp_path / "mine.duckdb"
    with duckdb.connect(str(mine)) as con:
        con.execute("CREATE TABLE trips AS SELECT 1 AS traj_id")  # a user's table, no demo mark
    r = duckmob_cli(["demo", "--save", str(mine), "--png", str(tmp_path / "d.png")], tmp_path)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines()[-1] == (f"Error: {mine} exists and was not written by duckmob "
                                                 "demo: name a new file with duckmob demo --save FILE.duckdb")
    with duckdb.connect(str(mine), read_only=True) as con:  # untouched
        assert con.execute("FROM trips").fetchall() == [(1,)]
    # a file an earlier demo wrote is replaced (the mark checked here is the one run() writes)
    earlier = tmp_path / "earlier.duckdb"
    with duckdb.connect(str(earlier)) as con:
        con.execute("CREATE TABLE trips AS SELECT 1 AS traj_id; CREATE TABLE stale AS SELECT 1 AS x")
        con.execute(f"COMMENT ON TABLE trips IS '{demo.MARK}'")
    demo._clear(str(earlier))
    assert not earlier.exists()
