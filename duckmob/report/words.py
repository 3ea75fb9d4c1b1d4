"""What the guarantee means for one person, in plain words (docs/choosing_eps.md), and what it does not cover
(docs/threat_model.md). Pure functions of public numbers."""

from __future__ import annotations

import math


def odds_factor(eps: float) -> float:
    """How far one release may move any observer's odds about one privacy unit: at most a factor e^eps."""
    return math.exp(eps)


def belief_after(prior: float, eps: float) -> float:
    """The most an observer who held ``prior`` (a probability) can believe after the release: odds times e^eps."""
    odds = prior / (1.0 - prior) * math.exp(eps)
    return odds / (1.0 + odds)


def strength(eps: float) -> str:
    """docs/choosing_eps.md's rough guide."""
    if eps <= 1:
        return "strong protection (0.1 to 1)"
    if eps <= 3:
        return "the range most published data sits in (1 to 3)"
    if eps <= 5:
        return "weaker than usual (3 to 5)"
    return "a weak formal promise (above 5)"


def unit_words(unit: str, k: int) -> str:
    if unit == "user":
        return f"one person's whole contribution (at most {k} trajectories each were used)"
    return "one trajectory (a person with several trajectories is protected per trajectory, not as a whole)"


def guarantee(eps: float, delta: float, unit: str, k: int) -> list[str]:
    """The paragraphs of the guarantee section."""
    who = unit_words(unit, k)
    lines = [
        f"Whoever looks at this synthetic table, whatever else they know, can change their odds that {who} was in "
        f"the data by at most a factor of {odds_factor(eps):,.3g} (e^eps, eps = {eps:.3g}): a 10% guess becomes at "
        f"most {100 * belief_after(0.1, eps):.1f}%, a 50/50 guess at most {100 * belief_after(0.5, eps):.1f}%. "
        f"This eps is {strength(eps)}.",
    ]
    if delta > 0:
        lines.append(f"With probability delta = {delta:.3g} the promise may fail outright; keep delta far below "
                     "1 / the number of people (or trajectories) in the data.")
    else:
        lines.append("delta = 0: the promise holds without exception (pure differential privacy).")
    lines.append("The bound is a worst case over every observer and every trajectory; most releases move the odds "
                 "far less, but it is the only thing duckmob promises.")
    return lines


NOT_COVERED = [
    "Other releases of the same data: each spends its own budget; the ledger adds them up (budget spent and left "
    "above), copies of the real table made outside duckmob have no budget.",
    "The real table itself, its copies and derived tables: protecting them is the data owner's job.",
    "Facts true of everyone (a city's busy streets): differential privacy hides individuals, not the population.",
    "Under the trajectory unit, a person with many trajectories: each is protected, the person as a whole is not.",
    "Someone who can write the database files can rewrite the ledger; the head file beside the database makes "
    "that visible, not impossible (docs/threat_model.md).",
    "Any evaluation against the real data (mob_evaluate, the owner's version of this page): exact, not private.",
]
