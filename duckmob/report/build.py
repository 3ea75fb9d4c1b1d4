"""Assemble the release report: the sections from the facts (:mod:`duckmob.report.collect`), the pictures
(:mod:`duckmob.report.pictures`) and, on the owner's page only, the comparison with the real table
(:mod:`duckmob.report.compare`); write the page (:mod:`duckmob.report.render`).

Two audiences, decided by what is read: without ``real`` nothing here touches the real table (its name is not
even known); with it, the comparison and the real pictures are added under the do-not-publish banner.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from html import escape

from duckmob.errors import DuckmobError
from duckmob.report import compare, pictures, render, words
from duckmob.report.collect import Facts, release_facts
from duckmob.report.render import Section

# Recorded parameters that the card shows in their own rows (or that are bookkeeping).
_OWN_ROWS = ("method", "max_trajectories_per_user", "model", "model_checksum", "roads", "roads_digest", "roads_bbox")


@dataclass
class Report:
    """A written release report: its HTML, its sections, the file it was written to (None: not written) and
    whether it is the owner's version (holds exact statistics of the real data). In Jupyter it shows inline
    (:meth:`_repr_html_`: the page in a sandboxed frame, so its style cannot touch the notebook's)."""

    html: str
    sections: list[Section]
    path: str | None
    owner: bool

    def rows(self) -> list[tuple[str, str]]:
        """(section, one-line summary) per section: what ``mob_report`` returns."""
        return [(s.id, s.summary) for s in self.sections]

    def _repr_html_(self) -> str:
        return (f'<iframe sandbox="" style="width:100%;height:48rem;border:1px solid #ccc" '
                f'srcdoc="{escape(self.html, quote=True)}"></iframe>')

    def __repr__(self) -> str:
        where = self.path or "not written"
        return f"<duckmob report ({'owner, do not publish' if self.owner else 'public'}): {where}>"


def target(path) -> str:
    """The absolute path to write, checked: ends in .html, its folder exists."""
    path = os.path.abspath(os.path.expanduser(str(path)))
    if not path.lower().endswith((".html", ".htm")):
        raise DuckmobError(f"mob_report writes an HTML page: give a path ending in .html, got {path!r}")
    if not os.path.isdir(os.path.dirname(path)):
        raise DuckmobError(f"folder {os.path.dirname(path)!r} does not exist: create it or choose another path")
    return path


def _write(path: str, html: str) -> None:
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"   # beside it, so the replace is atomic
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(html)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _num(x, digits: int = 4) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{digits}g}" if abs(x) < 1e6 else f"{x:,.0f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def _when(t) -> str:
    if t is None:
        return "-"
    return t.strftime("%Y-%m-%d %H:%M:%S UTC") if hasattr(t, "strftime") else str(t)


def _found_words(facts: Facts) -> str:
    return {"given": "named by release :=",
            "content": "recorded when the table was drawn (its trajectory 0 matches the recorded output)",
            "last": "a guess: the last synthesis in the ledger (no record links the table to a release)"}[facts.found]


def release_section(facts: Facts, synth, synth_name: str, n_points: int) -> Section:
    """The release card."""
    r, p, d = facts.release, facts.params, facts.description
    unit, k, eps, delta = r["privacy_unit"] or "trajectory", facts.k, facts.eps_asked, float(r["delta"] or 0.0)
    b = facts.budget
    method_params = {key: v for key, v in p.items() if key not in _OWN_ROWS}
    rows = [
        ["Synthetic table", f"{synth_name}: {synth.n:,} trajectories, {n_points:,} points"],
        ["Release", f"ledger id {r['id']} ({_found_words(facts)}), status {r['status']}"],
        ["Source table", r["source"]],
        ["Method", r["mechanism"] + (f"; parameters {method_params}" if method_params else "; default parameters")],
        ["Privacy unit", f"{unit}, cap k = {k} trajectories per {'user' if unit == 'user' else 'unit'}"],
        ["eps, delta", f"eps {eps:.4g} (ledger: {float(r['epsilon']):.4g} at the budget's delta), delta {delta:.3g}"],
    ]
    if b is not None:
        rows.append(["Budget of the source", f"declared eps {b['eps']:.4g} (delta {b['delta']:.3g}); spent "
                     f"{b['spent']:.4g} over {b['releases']} release(s); left {b['remaining']:.4g}"])
    else:
        rows.append(["Budget of the source", "no budget declared"])
    box = facts.bbox
    grid = ", ".join(f"{key} {d[key]}" for key in ("K", "depth", "states", "w", "fine_w") if d.get(key) is not None)
    rows.append(["Area and grid", (f"bbox [{', '.join(f'{v:.6g}' for v in box)}]" if box else "bbox not recorded")
                 + (f"; {grid}" if grid else "")])
    if p.get("roads"):
        rows.append(["Roads", f"{p['roads']} (public; digest {str(p.get('roads_digest'))[:16]}...)"])
    rows.append(["Seed", "explicit seed: reproducible, not for release" if r["seeded"] else
                 "none (noise from the operating system's entropy)"])
    if facts.model is not None:
        rows.append(["Stored model", f"{facts.model['name']} (mob_fit, {_when(facts.model['created_at'])})"])
    out = facts.output or {}
    from duckmob.release.outputs import code_version

    now = code_version()
    rows.append(["Versions", f"duckmob {out.get('duckmob_version') or now} when drawn, {now} now; "
                 f"model format {out.get('format_version') or '-'}"])
    rows.append(["Time", f"released {_when(r['recorded_at'])}" + (f"; drawn {_when(out['created_at'])}"
                                                                     if out.get("created_at") else "")])
    summary = (f"{r['mechanism']} release {r['id']} of {r['source']}: eps {eps:.3g}, delta {delta:.3g}, "
               f"{unit} unit (k = {k})" + (f"; budget {b['spent']:.3g} of {b['eps']:.3g} spent" if b else ""))
    body = render.table(None, rows)
    if d:
        shown = [[key, _num(v) if isinstance(v, (int, float)) else str(v)] for key, v in sorted(d.items())
                 if not isinstance(v, (list, dict))]
        body += "<details><summary>Model description (public: released values and configuration)</summary>" + \
            render.table(["field", "value"], shown, {1}) + "</details>"
    return Section("release", "The release", summary, body)


def guarantee_section(facts: Facts) -> Section:
    eps, unit = facts.eps_asked, facts.release["privacy_unit"] or "trajectory"
    lines = words.guarantee(eps, float(facts.release["delta"] or 0.0), unit, facts.k)
    who = "one person" if unit == "user" else "one trajectory"
    return Section("guarantee", "What the guarantee means", f"Odds about {who} move by at most "
                   f"{words.odds_factor(eps):,.3g}x (eps {eps:.3g}): {words.strength(eps)}", render.paragraphs(lines))


def not_covered_section() -> Section:
    return Section("not-covered", "What it does not cover", f"{len(words.NOT_COVERED)} things outside the "
                   "guarantee: other releases, the real table's copies, population facts, ...",
                   render.items(words.NOT_COVERED))


def statistics_section(facts: Facts) -> Section:
    stats = facts.statistics
    rows = [[s["statistic"], s["mechanism"], _num(s["eps"]), s["sensitivity"], s["noise"]] for s in stats]
    kinds = sorted({s["mechanism"] for s in stats})
    summary = f"{len(stats)} released statistic(s), {', '.join(kinds) or 'none'}; everything else is computed from them"
    body = render.paragraphs(["Everything in the synthetic table is drawn from these noisy statistics (or "
                              "weights): drawing more is free and reveals nothing more about the real data."])
    return Section("statistics", "Released statistics", summary,
                   body + render.table(["statistic", "mechanism", "eps", "sensitivity", "noise"], rows, {2}))


def notices_section(facts: Facts) -> Section:
    n = len(facts.notices)
    summary = "no notice" if not n else f"{n} notice(s): " + facts.notices[0].split(":")[0].split(".")[0]
    body = "".join(f'<p class="notice">{escape(line)}</p>' for line in facts.notices) or \
        render.paragraphs(["The release raised no notice."])
    return Section("notices", "Notices", summary, body)


def pictures_section(synth, real) -> Section:
    body = render.png(pictures.density(synth, real), "density map") + \
        render.png(pictures.distributions(synth, real), "distributions")
    what = "real beside synthetic, on one scale" if real is not None else "the synthetic table alone"
    return Section("pictures", "What the table looks like", f"density map and four distributions ({what})",
                   render.paragraphs(["Where trajectories go (share of trajectory-cell passes per cell), then trip "
                                      "length, points per trajectory, step length and hour of day."]) + body)


def comparison_section(real, synth, bbox) -> Section:
    rows = compare.comparison(real, synth, bbox)
    cells = [[r["metric"], _num(r["value"]), _num(r["reference"]), _num(r["baseline"]),
              {True: "lower", False: "higher", None: "-"}[r["lower_is_better"]], r["verdict"], r["description"]]
             for r in rows]
    body = render.paragraphs([
        "Exact, not private: every number below reads the real table. value: the synthetic table against the real "
        "one. Two anchors say what the value is worth: reference, two halves of the real table against each other "
        "(as close as real data gets); baseline, half of the real table against a naive table of straight trips "
        "between random places in the area (what a synthesizer that learnt nothing about places scores). Verdict: "
        f"close to real within {100 * compare.CLOSE:.0f}% of the way from the reference to the baseline, no better "
        "than the baseline at or past it, between otherwise."])
    table = render.table(["metric", "value", "reference", "baseline", "better", "verdict", "what"], cells,
                         {1, 2, 3})
    table = table.replace("<td>close to real</td>", '<td class="close">close to real</td>')
    table = table.replace("<td>no better than the baseline", '<td class="gap">no better than the baseline')
    n = compare.counts([r["verdict"] for r in rows])
    summary = (f"{n['close to real']} of {sum(n.values())} metrics close to real, {n['between']} between, "
               f"{n['no better than the baseline']} no better than the baseline")
    return Section("comparison", "Compared with the real data (owner only)", summary, body + table)


def build(db, synth_points, *, real_points=None, bbox=None, release=None, path=None, synth_name: str = "synth",
          real_name: str | None = None) -> Report:
    """The report on the synthetic table ``synth_points`` (Arrow points through the ``mob_points`` contract),
    written to ``path`` when given. ``real_points`` (owner's page only) adds the comparison. ``bbox``: the
    public box (default: the one the release recorded). ``release``: a ledger id (default: the release that made
    the table, see :mod:`duckmob.report.collect`)."""
    from duckmob.metrics import load_side

    out = target(path) if path is not None else None
    facts = release_facts(db, synth_points, release=release, bbox=bbox)
    if facts.bbox is None:
        raise DuckmobError("mob_report: the release recorded no bbox: pass bbox := [min_lat, min_lon, max_lat, "
                           "max_lon] (the public box the release used)")
    synth, _ = load_side(synth_points, facts.bbox, "synth")
    real = load_side(real_points, facts.bbox, "real")[0] if real_points is not None else None
    sections = [release_section(facts, synth, synth_name, len(synth_points)), guarantee_section(facts),
                not_covered_section(), statistics_section(facts), notices_section(facts),
                pictures_section(synth, real)]
    if real is not None:
        sections.append(comparison_section(real, synth, facts.bbox))
    now = datetime.now(timezone.utc)
    title = f"Release report: {synth_name}"
    subtitle = (f"{facts.release['mechanism']} on {facts.release['source']}, release {facts.release['id']}"
                + (f"; compared with {real_name}" if real is not None and real_name else ""))
    html = render.page(title, subtitle, sections, owner=real is not None,
                       footer=f"Written by duckmob on {now.strftime('%Y-%m-%d %H:%M UTC')}.")
    if out is not None:
        _write(out, html)
    return Report(html, sections, out, real is not None)
