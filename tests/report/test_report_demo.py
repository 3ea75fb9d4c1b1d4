"""``duckmob demo`` writes the release report beside its picture and says where."""

from __future__ import annotations

from duckmob import demo


def test_demo_writes_the_report_beside_its_picture(tmp_path):
    lines = []
    (tmp_path / "pictures").mkdir()
    demo.run(out=lines.append, save=str(tmp_path / "d.duckdb"), png=str(tmp_path / "pictures" / "d.png"))
    page = tmp_path / "pictures" / demo.REPORT
    said = [line for line in lines if line.startswith("  report ")]
    assert said == [f"  report       {page}: the release report, the page to publish with the table (docs/report.md)"]
    html = page.read_text(encoding="utf-8")
    assert "Public version" in html and "Seeded, not for release" in html and 'id="pictures"' in html
