"""``python -m duckmob.report.screenshot [OUT.png]``: the README's picture of a release report, made from code.

The shipped GeoLife sample, a budget of eps 2, PrivTrace at eps 1 under seed 7 (as ``duckmob demo``), the public
page written beside the picture and rendered by headless Chromium (Debian's ``chromium``) at 1000 x 1500 pixels:
the top of the page, as a reader first sees it. Needs Chromium; nothing else leaves the machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

DEFAULT = os.path.join("docs", "report_demo.png")
BBOX = "[39.8477, 116.1956, 40.1133, 116.4880]"


def render(page: str, out: str, size: str = "1000,1500") -> str:
    """Screenshot ``page`` (an HTML file) into ``out`` with headless Chromium; returns ``out``."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise SystemExit("Chromium is needed for the screenshot: apt-get install -y chromium")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                        f"--user-data-dir={profile}", f"--screenshot={os.path.abspath(out)}", f"--window-size={size}",
                        "file://" + os.path.abspath(page)], check=True, capture_output=True, timeout=120)
    return out


def page(path: str) -> str:
    """Release the shipped sample in a temporary database and write its public page to ``path``."""
    from duckmob import api

    with tempfile.TemporaryDirectory() as folder:
        con = api.connect(os.path.join(folder, "demo.duckdb"))
        try:
            con.execute("CREATE TABLE trips AS FROM mob_geolife_sample()")
            con.execute("FROM mob_set_budget('trips', eps := 2.0, delta := 1e-5)").fetchall()
            con.execute(f"CREATE TABLE synth AS FROM synthesize('trips', eps := 1.0, bbox := {BBOX}, seed := 7)")
            api.report(con, "synth", path)
        finally:
            con.close()
    return path


def make(out: str = DEFAULT) -> str:
    """The page (:func:`page`) written beside ``out`` (same name, ``.html``) and its screenshot in ``out``."""
    return render(page(os.path.splitext(out)[0] + ".html"), out)


if __name__ == "__main__":
    print(make(sys.argv[1] if len(sys.argv) > 1 else DEFAULT))
