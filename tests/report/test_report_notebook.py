"""The example notebook's release report cell (issue 40 item 8): the notebook stays valid, its cell comes after
``import duckmob`` and the synthetic table, and run in a real kernel it shows the public page inline and writes it.
(tests/test_jupyter.py runs the whole notebook.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from report_helpers import BOX_SQL

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "notebook.ipynb"


def _report_cell(notebook):
    cells = [c for c in notebook.cells if c.cell_type == "code"]
    (at,) = [i for i, c in enumerate(cells) if "duckmob.report(" in c.source]
    return at, cells


def test_the_notebook_is_valid_and_reports_after_its_release():
    nbformat = pytest.importorskip("nbformat")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    at, cells = _report_cell(notebook)
    before = "\n".join(c.source for c in cells[:at])
    assert "import duckmob" in before and "CREATE OR REPLACE TABLE synth AS" in before
    assert "real=" not in cells[at].source           # the publishable page
    assert cells[at].source.splitlines()[-1] == "page"   # the page is the cell's value: shown inline


def test_the_report_cell_shows_the_page_inline(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    at, cells = _report_cell(nbformat.read(NOTEBOOK, as_version=4))
    prelude = ["%load_ext duckmob",
               "%sql CREATE TABLE trips AS FROM mob_geolife_sample()",
               "%sql FROM mob_set_budget('trips', eps := 2.0, delta := 1e-5)",
               f"%sql CREATE TABLE synth AS FROM synthesize('trips', eps := 1.0, bbox := {BOX_SQL}, seed := 7)",
               "import duckmob"]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in prelude + [cells[at].source]])
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    (shown,) = [o for o in notebook.cells[-1].outputs if o.output_type == "execute_result"]
    html = shown["data"]["text/html"]
    assert html.startswith('<iframe sandbox=""') and "Release report: synth" in html
    assert "do not publish" not in html
    assert (tmp_path / "report.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
