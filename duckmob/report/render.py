"""One self-contained HTML page: inline CSS, pictures as ``data:image/png;base64`` URIs, no script, no font, no
link or source outside the page, so it opens offline and prints cleanly (a print stylesheet keeps sections and
pictures whole). Every text is escaped."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from html import escape

CSS = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; color: #1b1b1b;
       max-width: 60rem; margin: 1.5rem auto; padding: 0 1rem; }
h1 { font-size: 1.55rem; margin-bottom: .2rem; } h2 { font-size: 1.2rem; border-bottom: 1px solid #ccc;
     padding-bottom: .2rem; margin-top: 1.8rem; }
.sub { color: #555; margin-top: 0; } .summary { font-weight: 600; }
table { border-collapse: collapse; width: 100%; font-size: .9rem; margin: .5rem 0; }
th, td { text-align: left; padding: .25rem .5rem; border-bottom: 1px solid #e3e3e3; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.banner { background: #b00020; color: #fff; padding: .8rem 1rem; font-weight: 700; border-radius: 4px; }
.public { background: #e6f2e6; border: 1px solid #8bbf8b; padding: .6rem 1rem; border-radius: 4px; }
.notice { background: #fff6d6; border-left: 4px solid #e0a800; padding: .4rem .8rem; margin: .4rem 0; }
.gap { color: #a4000f; font-weight: 600; } .close { color: #1b6e1b; }
img { max-width: 100%; height: auto; display: block; margin: .5rem 0; }
footer { color: #666; font-size: .8rem; margin-top: 2rem; }
@media print { body { max-width: none; margin: 0; font-size: 11pt; } section, tr, img { break-inside: avoid; }
  .banner { -webkit-print-color-adjust: exact; print-color-adjust: exact; } }
"""


@dataclass
class Section:
    """One section of the page: its id (the row mob_report returns), heading, one-line summary and body HTML."""

    id: str
    title: str
    summary: str
    body: str


def png(data: bytes, alt: str) -> str:
    """An inline picture."""
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'


def table(header: list[str] | None, rows: list[list], numeric: set[int] = frozenset()) -> str:
    """An HTML table of already formatted cells (escaped here); columns in ``numeric`` right-aligned; no header
    row when ``header`` is None."""
    head = "".join(f"<th>{escape(h)}</th>" for h in header or [])
    body = "".join("<tr>" + "".join(f'<td class="num">{escape(str(c))}</td>' if i in numeric else
                                    f"<td>{escape(str(c))}</td>" for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table>{f'<thead><tr>{head}</tr></thead>' if head else ''}<tbody>{body}</tbody></table>"


def paragraphs(lines: list[str], cls: str | None = None) -> str:
    attr = f' class="{cls}"' if cls else ""
    return "".join(f"<p{attr}>{escape(line)}</p>" for line in lines)


def items(lines: list[str]) -> str:
    return "<ul>" + "".join(f"<li>{escape(line)}</li>" for line in lines) + "</ul>"


def page(title: str, subtitle: str, sections: list[Section], *, owner: bool, footer: str) -> str:
    """The whole page."""
    if owner:
        top = ('<p class="banner">This page holds exact statistics of the real data: do not publish it. '
               "Share the public version (the same report without real :=).</p>")
    else:
        top = ('<p class="public">Public version: built from the release alone (the ledger, the recorded '
               "parameters and the synthetic table); it reads nothing from the real table.</p>")
    parts = [f'<section id="{escape(s.id)}"><h2>{escape(s.title)}</h2><p class="summary">{escape(s.summary)}</p>'
             f"{s.body}</section>" for s in sections]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{escape(title)}</h1><p class=\"sub\">{escape(subtitle)}</p>{top}{''.join(parts)}"
            f"<footer>{escape(footer)}</footer></body></html>\n")
