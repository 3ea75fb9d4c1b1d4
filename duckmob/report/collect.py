"""The facts of a release report, gathered from what was published or recorded, never from the real table.

:func:`release_facts` finds the release that made a synthetic table and reads what the database recorded about
it: the ledger row (method, privacy unit and cap k, eps and delta, its accounting event, seeded or not, status),
the source's budget (declared, spent, left: PLD composition, as ``mob_budget()`` shows it), the output record
(:mod:`duckmob.release.outputs`: size, public bbox, the model's public description, versions) and the stored
model's description when the output was drawn with ``mob_sample``. Each released statistic is listed from the
ledger's event (:func:`statistics`). The ledger is verified first, as ``mob_ledger()`` verifies it.

How the release is found (``Facts.found``): ``release := id`` given; else the output record whose trajectory 0 has
the same points as the table's (``"content"``); else the source's last synthesis, or the ledger's last one when
no source is known (``"last"``), which the page names as a guess.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np
import pyarrow.compute as pc

from duckmob.errors import DuckmobError
from duckmob.privacy.events import Event

# Ledger mechanisms that are counts (mob_noisy_count, mob_transitions), not a synthetic table.
COUNTS = ("noisy_count", "transitions")


@dataclass
class Facts:
    """What the page says about the release (public: recorded parameters, released values, the synthetic
    table)."""

    release: dict                  # the ledger row (id, recorded_at, source, mechanism, epsilon, delta, ...)
    params: dict                   # the ledger row's params (JSON)
    event: Event
    found: str                     # 'given', 'content' or 'last'
    budget: dict | None            # the source's row of mob_budget(), None without a declared budget
    output: dict | None            # the output record (duckmob.release.outputs.find), None when not found
    model: dict | None             # the stored model's row (name, params, created_at), None when not stored
    bbox: list[float] | None
    statistics: list[dict] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)

    @property
    def description(self) -> dict:
        """The model's public description (output record, else stored model), {} when neither is known."""
        if self.output and self.output.get("description"):
            return self.output["description"]
        return (self.model or {}).get("params") or {}

    @property
    def k(self) -> int:
        return int(self.params.get("max_trajectories_per_user") or 1)

    @property
    def eps_asked(self) -> float:
        """The eps the release was charged: the sum of its Laplace parts when it is pure, else the ledger's
        epsilon (at the budget's delta)."""
        leaves = self.event.leaves()
        if leaves and all(e.kind == "laplace" for e in leaves):
            return float(sum(e.param("eps") for e in leaves))
        return float(self.release["epsilon"])


def first_digest(points) -> str | None:
    """The digest of trajectory 0 of a synthetic table's points (an Arrow table or struct array with traj_id,
    lat, lon and seq), as :func:`duckmob.release.outputs.digest` records it; None without a trajectory 0."""
    from duckmob.release.outputs import digest

    col = points.field if hasattr(points, "field") and not hasattr(points, "column") else points.column
    traj = np.asarray(col("traj_id").to_numpy(zero_copy_only=False))
    rows = np.flatnonzero(traj == 0)
    if not len(rows):
        return None
    names = points.type.names if not hasattr(points, "column") else points.column_names
    if "seq" in names:
        seq = np.asarray(col("seq").to_numpy(zero_copy_only=False), dtype=np.float64)[rows]
        rows = rows[np.argsort(seq, kind="stable")]
    lat = np.asarray(col("lat").to_numpy(zero_copy_only=False), dtype=np.float64)[rows]
    lon = np.asarray(col("lon").to_numpy(zero_copy_only=False), dtype=np.float64)[rows]
    return digest(lat, lon)


def _size(points) -> int | None:
    """The number of trajectories an output with these points had: its largest traj_id + 1 (ids run 0 .. n-1)."""
    traj = points.field("traj_id") if not hasattr(points, "column") else points.column("traj_id")
    top = pc.max(traj).as_py()
    return None if top is None else int(top) + 1


def release_facts(db, synth_points, *, release=None, bbox=None) -> Facts:
    """The :class:`Facts` of the release that made ``synth_points`` (``release``: a ledger id to use instead).
    ``db``: the release core (:func:`duckmob.release.database`); reads the ledger, the output records and the
    stored models, never a data table."""
    from duckmob.privacy import ledger
    from duckmob.release import outputs
    from duckmob.release.protocol import read_ledger

    with db.lock:
        rows = read_ledger(db, lambda cur: ledger.shown_releases(cur, db.verified))
        budgets = read_ledger(db, lambda cur: ledger.shown_budgets(cur, db.verified))
    by_id = {int(r["id"]): r for r in rows}
    output = None
    if release is not None:
        if int(release) not in by_id:
            known = ", ".join(str(i) for i in sorted(by_id)[-5:]) or "none"
            raise DuckmobError(f"mob_report: release := {int(release)} is not in the ledger (its last ids: {known}): "
                               "pass an id that FROM mob_ledger() lists, or leave release out")
        row, found = by_id[int(release)], "given"
    else:
        fingerprint, n = first_digest(synth_points), _size(synth_points)
        output = None if fingerprint is None else read_ledger(db, lambda cur: outputs.find(cur, fingerprint, n))
        if output is not None and int(output["ledger_id"]) in by_id:
            row, found = by_id[int(output["ledger_id"])], "content"
        else:
            output = None
            syntheses = [r for r in rows if r["mechanism"] not in COUNTS and r["status"] == "spent"]
            if not syntheses:
                raise DuckmobError("mob_report: the ledger records no synthesis, so no release can be described: "
                                   "report on a table made by synthesize or mob_sample in this database, or pass "
                                   "release := <ledger id>")
            row, found = syntheses[-1], "last"
    if output is None:   # the release's own output record (its bbox and model description), if it drew one
        output = _output_of(db, int(row["id"]))
    params = json.loads(row["params"] or "{}")
    model = _stored_model(db, (output or {}).get("model") or params.get("model"))
    box = bbox if bbox is not None else (output or {}).get("bbox") or params.get("roads_bbox") or \
        ((model or {}).get("params") or {}).get("bbox")
    facts = Facts(release=row, params=params, event=Event.from_json(row["event"]), found=found,
                  budget=next((b for b in budgets if b["source"] == row["source"]), None), output=output,
                  model=model, bbox=None if box is None else [float(v) for v in box])
    facts.statistics = statistics(facts)
    facts.notices = notices(facts)
    return facts


def _output_of(db, ledger_id: int) -> dict | None:
    """The latest output record of a release (when it was not found by the table's content)."""
    from duckmob.release import outputs
    from duckmob.release.protocol import read_ledger

    def read(cur):
        import duckdb
        try:
            row = cur.execute(f"SELECT first_digest FROM {outputs.TABLE} WHERE ledger_id = ? "
                              "ORDER BY created_at DESC LIMIT 1", [ledger_id]).fetchone()
        except duckdb.CatalogException:
            return None
        return None if row is None else outputs.find(cur, row[0])
    return read_ledger(db, read)


def _stored_model(db, name) -> dict | None:
    if not name:
        return None
    from duckmob.release.protocol import read_ledger
    from duckmob.synth import store

    def read(cur):
        store.ensure_table(cur)
        return cur.execute(f"SELECT name, params, created_at, ledger_id FROM {store.TABLE} WHERE name = ?",
                           [str(name)]).fetchone()
    try:
        row = read_ledger(db, read)
    except Exception:   # a read-only database without the models table
        return None
    if row is None:
        return None
    return {"name": row[0], "params": json.loads(row[1] or "{}"), "created_at": row[2], "ledger_id": row[3]}


# PrivTrace's released parts (duckmob.synth.privtrace: config.fractions(); the fine stage's, placement.PARTS), in
# words for the page.
PART_NAMES = {
    "count": "number of trajectories",
    "level1": "cell visits, first grid level",
    "level2": "cell visits, second grid level",
    "lengths": "trip lengths (cells per trajectory)",
    "first": "first-order transitions between cells",
    "second": "second-order transitions between cells",
    "density": "fine density of points (placement grid)",
    "steps": "step lengths between points (placement)",
}


def _privtrace_parts(description: dict, eps: float) -> dict[str, float]:
    """The epsilon of each named part a PrivTrace release spent, from its public description."""
    split = description.get("budget_split") or {}
    share = float(description.get("fine_share") or 0.0)
    placing = share > 0 and description.get("output", "points") != "cells"
    own = eps * (1.0 - share) if placing else eps
    parts = {name: own * float(f) for name, f in split.items()}
    if placing:
        from duckmob.synth.placement.releases import PARTS

        fine = {"density": 1.0} if description.get("output") == "stays" or description.get("step_m") else PARTS
        parts.update((name, eps * share * float(f)) for name, f in fine.items())
    return parts


def statistics(facts: Facts) -> list[dict]:
    """Every released statistic of the release: one dict per part of its accounting event (name, mechanism,
    eps, sensitivity, noise scale), named where the method's description says which part it is.

    Sensitivity: a Laplace part counts each trajectory at most once (duckmob's methods bound one trajectory's
    contribution to 1), so one privacy unit moves it by at most k (the cap on trajectories per user; 1 under the
    trajectory unit), and its noise scale is k / eps. A Gaussian part's noise is its multiplier times its L2
    clipping norm; DP-SGD's is that on every step's clipped gradients."""
    k, out = facts.k, []
    named = _privtrace_parts(facts.description, facts.eps_asked) if facts.release["mechanism"] == "privtrace" \
        else {}
    unused = dict(named)
    for i, leaf in enumerate(facts.event.leaves(), 1):
        if leaf.kind == "laplace":
            eps = float(leaf.param("eps"))
            name = next((n for n, e in unused.items() if math.isclose(e, eps, rel_tol=1e-6)), None)
            if name is not None:
                unused.pop(name)
            out.append({"statistic": PART_NAMES.get(name, name) if name else f"release {i}",
                        "mechanism": "Laplace", "eps": eps, "sensitivity": f"{k} (trajectories per privacy unit)",
                        "noise": f"scale {k / eps:,.4g}"})
        elif leaf.kind == "gaussian":
            out.append({"statistic": f"release {i}", "mechanism": "Gaussian", "eps": None,
                        "sensitivity": "L2 clipping norm", "noise": f"sd {leaf.param('noise_multiplier'):.4g} x norm"})
        elif leaf.kind == "dp_sgd":
            out.append({"statistic": f"model weights (release {i})", "mechanism": "DP-SGD", "eps": None,
                        "sensitivity": "L2 clipping norm per example",
                        "noise": (f"sd {leaf.param('noise_multiplier'):.4g} x norm, sample rate "
                                  f"{leaf.param('sample_rate'):.4g}, {int(leaf.param('steps')):,} steps")})
    return out


LAPLACE_95 = math.log(20)   # a Laplace value lies within ln(20) scales of the truth with probability 95%


def notices(facts: Facts) -> list[str]:
    """What a reader should know before publishing, from recorded facts and released values only."""
    out = []
    if facts.release.get("seeded"):
        out.append("Made with an explicit seed: its noise can be reproduced by anyone who knows the seed. "
                   "Seeded, not for release: make the release again without a seed before publishing.")
    if facts.release.get("status") != "spent":
        out.append(f"The ledger records this release as '{facts.release.get('status')}', not 'spent'.")
    d = facts.description
    if d.get("n_noisy") is not None and d.get("count_scale"):
        margin = float(d["count_scale"]) * LAPLACE_95
        value = float(d["n_noisy"])
        line = f"The released trajectory count is {value:,.0f} ± {margin:,.0f} (95%)."
        if value < 2 * margin:
            line += " Low signal: the count is mostly noise, so sizes and shares in the table are unreliable."
        out.append(line)
    if facts.output is not None and facts.output.get("n") is not None and d.get("n_noisy") is not None:
        n = int(facts.output["n"])
        if n > 2 * float(d["n_noisy"]) + 1:
            out.append(f"The table holds {n:,} trajectories, more than twice the released count: a larger sample "
                       "of the same model (free), not more information.")
    if facts.found == "last":
        out.append("No record links this table to a release (it was edited, or made before duckmob recorded "
                   "outputs): the page describes the last synthesis in the ledger, which may not be the one that "
                   "made it. Pass release := <ledger id> to name it.")
    return out
