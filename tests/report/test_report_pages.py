"""The release report: its sections, the publishable page built without the real table, a self-contained file,
the numbers of the ledger on the page, the release found by the table's content, the owner's comparison."""

from __future__ import annotations

import json
import os
import re

import duckdb
import pytest

import duckmob
from duckmob import cli
from duckmob.errors import DuckmobError
from duckmob.report import compare, words
from duckmob.report.collect import Facts, statistics
from duckmob.privacy.events import Event

from report_helpers import BBOX, SECTIONS, released, without_time


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return released(str(tmp_path_factory.mktemp("report") / "trips.duckdb"))


@pytest.fixture
def con(db):
    c = duckmob.connect(db)
    yield c
    c.close()


def test_sql_returns_one_row_per_section_and_writes_the_page(con, tmp_path):
    path = str(tmp_path / "public.html")
    rows = con.sql(f"FROM mob_report('synth', path := '{path}')").fetchall()
    assert [r[0] for r in rows] == SECTIONS
    assert all(r[1] and "\n" not in r[1] for r in rows)
    assert {r[2] for r in rows} == {path}
    html = open(path, encoding="utf-8").read()
    for section in SECTIONS:
        assert f'<section id="{section}">' in html
    assert "Public version" in html and "do not publish" not in html
    assert 'id="comparison"' not in html


def test_public_page_is_self_contained_and_small(con, tmp_path):
    path = tmp_path / "public.html"
    duckmob.report(con, "synth", str(path))
    html = path.read_text(encoding="utf-8")
    assert path.stat().st_size < 3_000_000
    assert not re.search(r"https?://|<script|@import|url\(|<link|<iframe|<object|<embed", html, re.I)
    assert "href=" not in html
    sources = re.findall(r'src="([^"]*)"', html)
    assert len(sources) == 2 and all(s.startswith("data:image/png;base64,") for s in sources)


def test_numbers_on_the_page_are_the_ledger_s(con):
    html = duckmob.report(con, "synth").html
    budget = con.execute("SELECT eps, spent, remaining, releases FROM mob_budget() WHERE source = 'trips'").fetchone()
    ledger_id, epsilon, delta, event = con.execute(
        "SELECT id, epsilon, delta, event FROM mob_ledger() WHERE id = 1").fetchone()
    assert f"ledger id {ledger_id} (recorded when the table was drawn" in html
    assert f"eps 1 (ledger: {epsilon:.4g} at the budget&#x27;s delta), delta {delta:.3g}" in html
    assert f"spent {budget[1]:.4g} over {budget[3]} release(s); left {budget[2]:.4g}" in html
    n, points = con.execute("SELECT count(DISTINCT traj_id), count(*) FROM synth").fetchone()
    assert f"synth: {n:,} trajectories, {points:,} points" in html
    leaves = Event.from_json(event).leaves()
    assert len(leaves) == 8 and abs(sum(e.param("eps") for e in leaves) - 1.0) < 1e-12
    for leaf in leaves:   # every released statistic with its eps and its Laplace scale k / eps (k = 1)
        assert f"scale {1 / leaf.param('eps'):,.4g}" in html
    assert "<td>number of trajectories</td><td>Laplace</td><td class=\"num\">0.016</td>" in html
    assert "none (noise from the operating system" not in html and "explicit seed" in html


def test_release_is_found_by_the_table_s_content(con, tmp_path):
    assert con.sql("SELECT ledger_id, model, n FROM duckmob_outputs ORDER BY ledger_id").fetchall() == \
        [(1, None, con.execute("SELECT count(DISTINCT traj_id) FROM synth").fetchone()[0]), (2, "m", 600)]
    drawn = duckmob.report(con, "drawn")
    assert "release 2 of trips" in drawn.rows()[0][1]
    assert "Stored model</td><td>m (mob_fit" in drawn.html
    # a table duckmob did not draw: the last synthesis, said to be a guess
    con.execute("CREATE OR REPLACE TABLE edited AS SELECT traj_id, seq, lat + 1e-6 AS lat, lon, ts FROM synth")
    guess = duckmob.report(con, "edited")
    assert "a guess: the last synthesis" in guess.html and "release 2 of trips" in guess.rows()[0][1]
    named = duckmob.report(con, "edited", release=1)
    assert "named by release :=" in named.html and "release 1 of trips" in named.rows()[0][1]
    with pytest.raises(duckdb.Error, match=r"release := 99 is not in the ledger"):
        con.sql("FROM mob_report('synth', path := 'x.html', release := 99)").fetchall()


def test_public_page_never_reads_the_real_table(tmp_path):
    """The same public page with the real table there and after it was dropped: nothing on it comes from it."""
    path = released(str(tmp_path / "drop.duckdb"))
    c = duckmob.connect(path)
    try:
        before = without_time(c.sql(f"FROM mob_report('synth', path := '{tmp_path / 'a.html'}')").fetchall() and
                              (tmp_path / "a.html").read_text(encoding="utf-8"))
        c.execute("DROP TABLE trips")
        rows = c.sql(f"FROM mob_report('synth', path := '{tmp_path / 'b.html'}')").fetchall()
        after = without_time((tmp_path / "b.html").read_text(encoding="utf-8"))
        assert [r[0] for r in rows] == SECTIONS
        assert after == before
        with pytest.raises(duckdb.Error, match="trips"):   # the owner's page does read it
            c.sql(f"FROM mob_report('synth', path := '{tmp_path / 'c.html'}', real := 'trips')").fetchall()
    finally:
        c.close()


def test_owner_page_compares_every_metric_under_the_banner(con, tmp_path):
    path = tmp_path / "owner.html"
    rows = con.sql(f"FROM mob_report('synth', path := '{path}', real := 'trips')").fetchall()
    assert [r[0] for r in rows] == SECTIONS + ["comparison"]
    html = path.read_text(encoding="utf-8")
    assert "holds exact statistics of the real data: do not publish it" in html
    evaluated = con.sql(f"FROM mob_evaluate('trips', 'synth', bbox := {BBOX})").fetchall()
    judged = []
    for _, metric, value, reference, baseline, lower, *_ in evaluated:
        assert f"<td>{metric}</td>" in html
        judged.append(compare.verdict(value, reference, baseline, lower))
        assert judged[-1] in html
    n = compare.counts(judged)
    assert rows[-1][1] == (f"{n['close to real']} of {sum(n.values())} metrics close to real, {n['between']} "
                           f"between, {n['no better than the baseline']} no better than the baseline")
    # Every metric with a direction is judged on this sample: the naive table is worse than real data on each.
    assert sum(n.values()) == sum(lower is not None and value is not None
                                  for _, _, value, _, _, lower, *_ in evaluated)
    assert len(re.findall(r'src="data:image/png', html)) == 2
    assert path.stat().st_size < 3_000_000


def test_verdicts():
    """The value placed between its anchors: 0 at the real-vs-real reference, 1 at the naive baseline."""
    # Lower is better (the sample's hrnet_travel_distance_jsd: 0.0205, reference 0.0129, baseline 0.1076).
    assert compare.position(0.0205, 0.0129, 0.1076, True) == pytest.approx(0.0803, abs=1e-4)
    assert compare.verdict(0.0205, 0.0129, 0.1076, True) == "close to real"
    assert compare.verdict(0.4129, 0.1134, 0.5576, True) == "between (67% of the way to the baseline)"
    assert compare.verdict(0.326, 0.0029, 0.307, True) == "no better than the baseline"
    assert compare.verdict(0.05, 0.1, 0.6, True) == "close to real"           # better than the reference
    # A reference of 0 (a huge table) no longer flags everything: the baseline gives the scale.
    assert compare.verdict(0.05, 0.0, 0.6, True) == "close to real"
    assert compare.verdict(0.15, 0.0, 0.6, True) == "between (25% of the way to the baseline)"
    assert compare.verdict(0.0247, 0.0121, 0.0978, True) == "close to real"   # 15%: privtrace_length_jsd
    # Higher is better (lestyan_pattern_tp_ratio: 0.39, reference 0.82, baseline 0.03).
    assert compare.position(0.39, 0.82, 0.03, False) == pytest.approx(0.5443, abs=1e-4)
    assert compare.verdict(0.39, 0.82, 0.03, False) == "between (54% of the way to the baseline)"
    assert compare.verdict(0.80, 0.82, 0.03, False) == "close to real"
    assert compare.verdict(0.02, 0.82, 0.03, False) == "no better than the baseline"
    # The naive table scores as well as real data: the metric cannot tell.
    assert compare.position(0.2, 0.1, 0.1, True) is None
    assert compare.verdict(0.2, 0.1, 0.05, True).startswith("not telling")
    assert compare.verdict(0.2, 0.8, 0.9, False).startswith("not telling")
    # Worse, but by less than a quarter of the reference: the anchors too close to measure a way between them.
    assert compare.position(0.43, 0.56, 0.58, True) is None
    assert compare.position(0.43, 0.56, 0.71, True) == pytest.approx(-0.8667, abs=1e-4)
    assert compare.verdict(1932.0, 974.0, 974.0, None) == "compare by eye"
    assert compare.verdict(0.2, 0.1, None, True) == "compare by eye"
    assert compare.verdict(None, 0.2, 0.5, True) == "not measured"
    assert compare.counts(["close to real", "between (50% of the way to the baseline)", "not telling (x)",
                           "no better than the baseline", "close to real"]) == \
        {"close to real": 2, "between": 1, "no better than the baseline": 1}


def test_odds_follow_choosing_eps():
    """docs/choosing_eps.md's table: eps 1 moves a 10% guess to at most 23.2%, a 50/50 one to 73.1%."""
    assert round(100 * words.belief_after(0.1, 1.0), 1) == 23.2
    assert round(100 * words.belief_after(0.5, 1.0), 1) == 73.1
    assert round(100 * words.belief_after(0.5, 0.5), 1) == 62.2
    assert words.strength(0.5).startswith("strong") and words.strength(6).startswith("a weak")


def test_statistics_under_the_user_unit_scale_with_k():
    event = Event.from_json(json.dumps({"kind": "compose", "events": [{"kind": "laplace", "eps": 0.25},
                                                                      {"kind": "laplace", "eps": 0.75}]}))
    facts = Facts(release={"mechanism": "privtrace", "epsilon": 1.0}, params={"max_trajectories_per_user": 4},
                  event=event, found="given", budget=None, output=None, model=None, bbox=None)
    facts.output = {"description": {"budget_split": {"count": 0.25, "first": 0.75}, "fine_share": 0.0}}
    stats = statistics(facts)
    assert [s["statistic"] for s in stats] == ["number of trajectories", "first-order transitions between cells"]
    assert [s["noise"] for s in stats] == ["scale 16", "scale 5.333"]


def test_python_api_and_jupyter(con, tmp_path):
    import duckmob.report as package

    assert callable(package) and callable(duckmob.report)
    done = duckmob.report(con, "synth", str(tmp_path / "p.html"))
    assert done.path == str(tmp_path / "p.html") and not done.owner
    shown = done._repr_html_()
    assert shown.startswith("<iframe sandbox=") and "&lt;section id=&quot;release&quot;&gt;" in shown
    assert duckmob.report(con, "synth").path is None
    with pytest.raises(DuckmobError, match="ending in .html"):
        duckmob.report(con, "synth", str(tmp_path / "p.pdf"))


def test_shell_command(db, tmp_path, capsys):
    out = str(tmp_path / "cli.html")
    assert cli.main(["report", db, "--synth", "synth", "-o", out]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == out and [line.split(":")[0].strip() for line in printed[1:]] == SECTIONS
    assert os.path.getsize(out) > 10_000
    with pytest.raises(SystemExit):
        cli.main(["report", db, "--synth", "synth", "--bbox", "1,2,3", "-o", out])
    assert "--bbox takes min_lat,min_lon,max_lat,max_lon" in capsys.readouterr().err


def test_outputs_of_one_model_and_seed_are_told_apart_by_size(con):
    """Two samples of one model under one seed, of other sizes: each table finds its own output record."""
    from duckmob import release
    from duckmob.metrics import table_points
    from duckmob.report.collect import release_facts

    con.execute("CREATE OR REPLACE TABLE bigger AS FROM mob_sample('m', n := 900, seed := 3)")
    assert con.execute("SELECT count(*) FROM duckmob_outputs WHERE ledger_id = 2").fetchone() == (2,)
    db = release.database(con)
    for table, n in (("drawn", 600), ("bigger", 900)):
        facts = release_facts(db, table_points(con, table))
        assert (facts.found, int(facts.release["id"]), facts.output["n"]) == ("content", 2, n)
