"""examples/dbt_project under `dbt run` and `dbt test` (dbt-core 1.11, dbt-duckdb, the duckmob.dbt plugin), in a temp
copy of the project: it builds the synthetic table and its evaluation from the shipped sample, spends the declared
budget once, its tests pass (and catch a point outside the box), it runs from another working directory, and a run
that would overspend fails with duckmob's one-line message."""

from __future__ import annotations

import gc
import shutil
from pathlib import Path

import pytest

pytest.importorskip("dbt.adapters.duckdb", reason="dbt-duckdb is in the [test] extra")
from dbt.adapters.duckdb.connections import DuckDBConnectionManager  # noqa: E402
from dbt.cli.main import dbtRunner  # noqa: E402

import duckmob  # noqa: E402

PROJECT = Path(__file__).resolve().parents[1] / "examples" / "dbt_project"


def dbt(project: Path, *args: str, **vars_):
    """Run dbt in-process on ``project``; returns dbt's result object."""
    argv = [*args, "--project-dir", str(project), "--profiles-dir", str(project), "--no-use-colors",
            "--no-send-anonymous-usage-stats"]
    if vars_:
        argv += ["--vars", "{" + ", ".join(f"{k}: {v}" for k, v in vars_.items()) + "}"]
    try:
        return dbtRunner().invoke(argv)
    finally:
        # in-process dbt-duckdb keeps the file open otherwise (its per-thread cursors are only closed when freed)
        DuckDBConnectionManager.close_all_connections()
        gc.collect()


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A copy of the example project whose first `dbt run` (seeded: reproducible, not for release) has finished."""
    root = tmp_path_factory.mktemp("dbt")
    copy = root / "dbt_project"
    shutil.copytree(PROJECT, copy, ignore=shutil.ignore_patterns("target", "logs", "*.duckdb*"))
    mp = pytest.MonkeyPatch()
    mp.setenv("DUCKMOB_DBT_PATH", str(root / "example.duckdb"))
    mp.setenv("DBT_SEND_ANONYMOUS_USAGE_STATS", "false")
    mp.chdir(copy)
    result = dbt(copy, "run", synth_seed=7, density_png=str(root / "density.png"),
                 report_html=str(root / "report.html"))
    yield copy, root, result
    mp.undo()


def test_dbt_run_builds_synthetic_and_evaluation_tables(project):
    copy, root, result = project
    assert result.success, [r.message for r in result.result]
    assert {r.node.name for r in result.result} == {"trips", "cell_sequences", "synthetic_trips",
                                                    "synthetic_quality"}
    con = duckmob.connect(str(root / "example.duckdb"), read_only=True)
    try:
        n_real = con.execute("SELECT count(DISTINCT traj_id) FROM trips").fetchone()[0]
        n_traj, n_points = con.execute("SELECT count(DISTINCT traj_id), count(*) FROM synthetic_trips").fetchone()
        assert n_real == 1999
        assert 1000 < n_traj < 3000 and n_points > n_traj  # the noisy count is near the 1,968 kept trajectories
        assert con.execute("SELECT count(*) FROM cell_sequences").fetchone()[0] > 1000
        metrics = dict(con.execute("SELECT metric, value FROM synthetic_quality").fetchall())
        assert metrics["real_trajectories"] == 1968  # 25 under 2 fixes dropped, 6 wholly outside the box
        assert 0 <= metrics["privtrace_length_jsd"] <= 1 and 0 <= metrics["hrnet_destination_jsd"] <= 1
        # the pre-hook declared the budget, the model spent eps 1 of it once, seeded (marked not for release)
        ledger = con.execute("SELECT mechanism, epsilon, seeded FROM duckmob_ledger").fetchall()
        assert len(ledger) == 1 and ledger[0][0] == "privtrace" and ledger[0][2] is True
        assert ledger[0][1] == pytest.approx(1.0, abs=0.01)
        eps, spent = con.execute("SELECT eps, spent FROM mob_budget()").fetchone()
        assert eps == 2.0 and spent == pytest.approx(1.0, abs=0.01)
        # the profile's storage_compatibility_version: the DuckDB 1.5 CLI can open the file
        tags = con.execute("SELECT tags FROM duckdb_databases() WHERE database_name = 'example'").fetchone()[0]
        assert tags["storage_version"].startswith("v1.5.0")
    finally:
        con.close()
    assert (root / "density.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the evaluation's post-hook


def test_the_synthetic_model_writes_its_release_report(project):
    """synthetic_trips' post-hook writes the publishable page: the release found by the table's content (the
    ledger's one release, not a guess), its eps, no comparison with the real table."""
    copy, root, result = project
    assert result.success, [r.message for r in result.result]
    html = (root / "report.html").read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and "Release report: " in html
    assert "privtrace on" in html and "release 1" in html
    assert "No record links this table" not in html              # found by its content, not guessed
    assert "do not publish" not in html and 'id="comparison"' not in html


def test_dbt_test_checks_the_synthetic_table_and_the_ledger(project):
    copy, root, first = project
    assert first.success
    result = dbt(copy, "test")
    assert result.success, [(r.node.name, r.message) for r in result.result if r.status != "pass"]
    names = {r.node.name for r in result.result}
    assert {"budget_never_exceeded", "every_release_has_a_budget", "inside_bbox_synthetic_trips_",
            "not_null_synthetic_trips_lat", "unique_synthetic_quality_metric"} <= names, names
    assert all(r.status == "pass" for r in result.result)


def test_the_project_runs_from_another_working_directory(project, tmp_path, monkeypatch):
    """`dbt ... --project-dir` from elsewhere: the density picture goes to the project's target/ (it went to
    ./target, which did not exist), and nothing is written where dbt was started."""
    copy, root, first = project
    assert first.success
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    picture = copy / "target" / "density.png"
    picture.unlink(missing_ok=True)
    result = dbt(copy, "run", "--select", "synthetic_quality")  # no spend: the synthetic table is only read
    assert result.success, [r.message for r in result.result]
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert dbt(copy, "test").success
    assert list(elsewhere.iterdir()) == []


def test_the_tests_catch_a_point_outside_the_box(project):
    copy, root, first = project
    assert first.success
    con = duckmob.connect(str(root / "example.duckdb"))
    try:
        con.execute("INSERT INTO synthetic_trips (traj_id, seq, lat, lon) VALUES (-1, 0, 0.0, 0.0)")
    finally:
        con.close()
    try:
        result = dbt(copy, "test", "--select", "synthetic_trips")
    finally:
        con = duckmob.connect(str(root / "example.duckdb"))
        con.execute("DELETE FROM synthetic_trips WHERE traj_id = -1")
        con.close()
    assert not result.success
    assert {r.node.name for r in result.result if r.status == "fail"} == {"inside_bbox_synthetic_trips_"}


def test_overspending_run_fails_with_duckmob_message(project):
    copy, root, first = project
    assert first.success
    result = dbt(copy, "run", "--select", "synthetic_trips", synth_eps=1.5)
    assert not result.success
    (failed,) = [r for r in result.result if r.status == "error"]
    assert failed.node.name == "synthetic_trips"
    message = [line.strip() for line in failed.message.strip().splitlines()]
    # dbt names the model's source "db"."main"."trips": the budget is the base table's, whatever the spelling
    assert message[-1].startswith("duckmob: privacy budget of 'trips'") and "exceeded" in message[-1]
    # the next step where a dbt user declares the budget: the project's var, not SQL typed by hand
    assert "dbt run --vars '{budget_eps: " in message[-1] and "FROM mob_set_budget" not in message[-1]
    assert "Python exception occurred" not in failed.message
    con = duckmob.connect(str(root / "example.duckdb"), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM duckmob_ledger").fetchone()[0] == 1  # refused before any spend
        assert con.execute("SELECT count(*) FROM synthetic_trips").fetchone()[0] > 0  # the last table stays
    finally:
        con.close()


def test_unknown_method_fails_with_duckmob_message(project):
    copy, root, _ = project
    result = dbt(copy, "run", "--select", "synthetic_trips", synth_eps=0.1, synth_method="nope")
    assert not result.success
    (failed,) = [r for r in result.result if r.status == "error"]
    assert failed.message.strip().splitlines()[-1].strip().startswith("duckmob: unknown synthesis method 'nope'")


def test_wrong_column_fails_with_duckmob_message(project):
    copy, root, _ = project
    model = copy / "models" / "bad_columns.sql"
    model.write_text("from mob_cell_sequences('{{ ref(\"trips\") }}', bbox := {{ var('bbox') }}, "
                     "lat_col := 'latitude')\n")
    try:
        result = dbt(copy, "run", "--select", "bad_columns")
    finally:
        model.unlink()
    assert not result.success
    (failed,) = [r for r in result.result if r.status == "error"]
    last = failed.message.strip().splitlines()[-1].strip()
    assert last.startswith("duckmob: the input has no column latitude"), last


def test_the_synthetic_model_puts_its_points_on_public_roads(project):
    """The var roads names a model of public road segments: synthetic_trips is released on them (every point on a
    road, the roads recorded in the ledger); here a street grid over the bbox built from constants."""
    import json

    from duckmob.roads import Roads, snap

    copy, root, first = project
    assert first.success
    model = copy / "models" / "street_grid.sql"
    model.write_text("""-- a public street grid over the bbox: constants only (stands in for an OpenStreetMap extract)
{%- set b = var('bbox') %}
select {{ b[0] }} + ({{ b[2] }} - {{ b[0] }}) * i / 23.0 as lat1,
       {{ b[1] }} + ({{ b[3] }} - {{ b[1] }}) * j / 23.0 as lon1,
       {{ b[0] }} + ({{ b[2] }} - {{ b[0] }}) * i / 23.0 as lat2,
       {{ b[1] }} + ({{ b[3] }} - {{ b[1] }}) * (j + 1) / 23.0 as lon2
from range(24) r(i), range(23) c(j)
union all
select {{ b[0] }} + ({{ b[2] }} - {{ b[0] }}) * j / 23.0, {{ b[1] }} + ({{ b[3] }} - {{ b[1] }}) * i / 23.0,
       {{ b[0] }} + ({{ b[2] }} - {{ b[0] }}) * (j + 1) / 23.0, {{ b[1] }} + ({{ b[3] }} - {{ b[1] }}) * i / 23.0
from range(24) r(i), range(23) c(j)
""")
    try:
        result = dbt(copy, "run", "--select", "street_grid", "synthetic_trips", synth_eps=0.5, synth_seed=3,
                     roads="street_grid", report_html=str(root / "report_roads.html"))
    finally:
        model.unlink()
    assert result.success, [r.message for r in result.result]
    con = duckmob.connect(str(root / "example.duckdb"), read_only=True)
    try:
        grid = Roads.of(con.sql("FROM street_grid").to_arrow_table())
        rows = con.sql("SELECT lat, lon FROM synthetic_trips").to_arrow_table()
        params = json.loads(con.execute("SELECT params FROM duckmob_ledger ORDER BY id DESC LIMIT 1").fetchone()[0])
    finally:
        con.close()
    assert rows.num_rows > 0
    assert snap(grid, rows.column("lat").to_numpy(), rows.column("lon").to_numpy())[4].max() < 1e-3
    assert params["roads"] == '"example"."main"."street_grid"' and params["roads_digest"] == grid.digest
