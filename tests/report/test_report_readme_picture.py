"""The README's picture of a release report is what the code makes today: docs/report_demo.html (whose top
docs/report_demo.png shows) is the page ``python -m duckmob.report.screenshot`` writes, up to its times, and its
pictures up to rendering noise."""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path

import numpy as np

from duckmob.report import screenshot

DOCS = Path(__file__).resolve().parents[2] / "docs"
PICTURE = re.compile(r'src="data:image/png;base64,([^"]+)"')
TIMES = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d(:\d\d)? UTC")


def _parts(html: str):
    from matplotlib.image import imread

    pictures = [imread(io.BytesIO(base64.b64decode(b)))[..., :3] for b in PICTURE.findall(html)]
    return TIMES.sub("<time>", PICTURE.sub('src=""', html)), pictures


def test_docs_page_is_the_code_s(tmp_path):
    text, pictures = _parts(Path(screenshot.page(str(tmp_path / "page.html"))).read_text(encoding="utf-8"))
    shipped_text, shipped = _parts((DOCS / "report_demo.html").read_text(encoding="utf-8"))
    assert text == shipped_text, "docs/report_demo.* is stale: run python -m duckmob.report.screenshot"
    assert len(pictures) == len(shipped) == 2
    for new, old in zip(pictures, shipped):
        assert new.shape == old.shape and np.abs(new - old).mean() < 0.01
    assert (DOCS / "report_demo.png").stat().st_size > 50_000
