"""Both pages as a person sees them: rendered by headless Chromium (Debian's ``chromium``; .ci/run installs it) to
PNG, not blank, every section in the rendered document, and no request from the page to anywhere (Chromium's
network log: a control page with one remote picture shows the check sees such a request)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import numpy as np
import pytest

import duckmob

from report_helpers import SECTIONS, released

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y "
                                                         "chromium; .ci/run installs it)")


def chromium(tmp_path, page, *args: str) -> str:
    """Run headless Chromium on ``page`` (a file) with ``args``; its standard output."""
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    profile.mkdir()
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--disable-component-update", "--disable-sync", "--no-first-run",
                           f"--user-data-dir={profile}", *args, page.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def page_requests(tmp_path, page) -> list[str]:
    """The URLs the page itself asked for (its requests have an initiator; Chromium's own have none)."""
    log = tmp_path / f"{page.stem}.netlog.json"
    chromium(tmp_path, page, f"--log-net-log={log}", "--window-size=800,600", "--dump-dom")
    data = json.loads(log.read_text())
    start = data["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return [e["params"]["url"] for e in data["events"] if e["type"] == start
            and e.get("params", {}).get("initiator") not in (None, "not an origin")]


def screenshot(tmp_path, page) -> np.ndarray:
    from matplotlib.image import imread

    shot = tmp_path / f"{page.stem}.png"
    chromium(tmp_path, page, f"--screenshot={shot}", "--window-size=1100,2600")
    return imread(shot)[..., :3]


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    folder = tmp_path_factory.mktemp("browser")
    con = duckmob.connect(released(str(folder / "trips.duckdb")))
    try:
        public = duckmob.report(con, "synth", str(folder / "public.html"))
        owner = duckmob.report(con, "synth", str(folder / "owner.html"), real="trips")
    finally:
        con.close()
    return folder, public, owner


@pytest.mark.parametrize("which", ["public", "owner"])
def test_page_renders_every_section_and_is_not_blank(pages, tmp_path, which):
    folder, public, owner = pages
    page = folder / f"{which}.html"
    dom = chromium(tmp_path, page, "--dump-dom")
    for section in SECTIONS + (["comparison"] if which == "owner" else []):
        assert f'<section id="{section}">' in dom
    assert ("do not publish it" in dom) == (which == "owner")
    pixels = screenshot(tmp_path, page)
    ink = (pixels.min(axis=2) < 0.85).mean()   # share of pixels that are not white or near it
    assert pixels.std() > 0.05 and ink > 0.05
    if which == "owner":   # the red banner is drawn
        red = (pixels[..., 0] > 0.6) & (pixels[..., 1] < 0.1) & (pixels[..., 2] < 0.2)
        assert red.sum() > 2000


def test_no_request_leaves_the_page(pages, tmp_path):
    folder, _, _ = pages
    control = tmp_path / "control.html"
    control.write_text('<html><body><img src="http://127.0.0.1:9/x.png"><p>control</p></body></html>')
    assert page_requests(tmp_path, control) == ["http://127.0.0.1:9/x.png"]   # the check sees a request
    for which in ("public", "owner"):
        assert page_requests(tmp_path, folder / f"{which}.html") == []


def test_public_page_prints(pages, tmp_path):
    """Printed to PDF by Chromium (the print stylesheet): a document of a few pages."""
    folder, _, _ = pages
    pdf = tmp_path / "public.pdf"
    chromium(tmp_path, folder / "public.html", f"--print-to-pdf={pdf}", "--no-pdf-header-footer")
    data = pdf.read_bytes()
    assert data[:5] == b"%PDF-" and len(data) > 50_000
    assert 2 <= len(re.findall(rb"/Type\s*/Page[^s]", data)) <= 8
