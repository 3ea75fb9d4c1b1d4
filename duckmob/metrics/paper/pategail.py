"""``pategail_paper``: PateGail's five statistical metrics (Table 1) as its reference evaluation computes them.

Reference: tsinghua-fib-lab/PateGail, ``utils/evaluations.py`` (line numbers below are of that file), run on its
GeoLife data: every row of ``dataset/geolife/test.data`` is one day of 48 half-hour slots, each slot a location
id, and ``dataset/geolife/gps`` gives each id's coordinates to 0.01 degree.

Preprocessing here (the reference ships its preprocessed rows, not the code that made them): each trajectory is
cut at midnight (of ``ts`` as stored: shift ``ts`` for local days) into days; a day is 48 half-hour slots; a
slot holds the location of the LAST fix inside it; a slot without a fix holds the previous slot's location, and
the slots before the day's first fix hold that fix's location, so every day has 48 locations as the reference's
rows do. A location is a point rounded to 0.01 degree (about 1.1 km north-south, 0.85 km east-west in Beijing);
its coordinates are the rounded degrees. The reference's rows are days of one person; synthetic tables carry no
users, so here a row is a day of one trajectory on both sides. Tables without timestamps get NULL.

Metrics (each a JSD by :func:`duckmob.metrics.paper.smoothed_jsd`, natural log, 1e-10 smoothing):

* Radius: mean over the 48 slots of the SQUARED distance in degrees to the day's centroid, no square root, no
  cos(latitude) (``get_gradius``, 217-235), histogrammed like Distance (375-382).
* DailyLoc: distinct locations of the day / 48 (``get_periodicity``, 237-247) on ``np.arange(0, 1, 1/48)``
  (330-332): 47 bins, the last one closed, so days with all 48 slots at distinct locations are not counted.
* Distance: squared Euclidean distance in degrees, no cos(latitude), between consecutive slots, 47 per day,
  stays included (``get_distances``, 193-202), on ``np.arange(0, 2101.45, 2101.45/1000)`` (GeoLife's
  ``max_distance``, 117; 303-308): 999 bins of 2.1 deg^2. A step of 1.45 degrees (about 160 km) is still in the
  first bin: on a city nearly every step lands there, so this metric barely reacts to anything a city's
  trajectories do (docs/metrics_papers.md).
* G-rank: each location's share of all slot entries (``CollectiveEval.get_visits``, 432-443); the 50 largest
  shares (``get_topk_visits``, 455-466) on ``np.arange(0, 1, 1/50)`` (394-402): a histogram of share VALUES in 49
  bins of 0.02, not a rank profile. The reference passes the helper's (shares, location ids) tuple to the
  histogram, so the 50 ids are histogrammed too: ids of 1 or more fall outside [0, 0.98]; id 0 (one fixed
  location of its vocabulary, 37.05 N 116.56 E) adds one count to bin 0 when it is among the top 50. Our tables
  have no such vocabulary: the ids are left out (at most one count of 50 in bin 0 differs).
* I-rank: per day, the counts of its 20 most frequent locations / 48, padded with zeros (``get_topk_visits``,
  121-137); the mean over days, normalised to sum 1 (``get_overall_topk_visits_freq``, 140-143; 413-416).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from duckmob.metrics.common import DAY_US, Metric, Options, Side, require_time
from duckmob.metrics.paper import histogram_arange, smoothed_jsd

SOURCE = "PateGail reference code (tsinghua-fib-lab/PateGail utils/evaluations.py), Table 1"
SLOTS = 48                 # half-hour slots per day (the reference's rows, seq_len = 48, 182/195/224)
SCALE = 100                # locations to 0.01 degree (the reference's gps file)
MAX_DISTANCE = 2101.45     # GeoLife max_distance, deg^2 (117)
DISTANCE_BINS = 1000       # 303-308, 375-378
DAILYLOC_BINS = 48         # 330
GRANK_K = 50               # 397-399
GRANK_BINS = 50            # 400-402
IRANK_K = 20               # 413-415


@dataclass(frozen=True)
class Days:
    """One row per (trajectory, calendar day), 48 slots each: the location's rounded degrees and its id."""

    lat: np.ndarray    # (n_days, 48) degrees, multiples of 0.01
    lon: np.ndarray
    loc: np.ndarray    # (n_days, 48) int64 location id (one per 0.01-degree point; never 0)

    @property
    def n(self) -> int:
        return self.lat.shape[0]


def days(side: Side) -> Days:
    """The side's 48-slot days (see the module docstring). Vectorised over points; memory ``n_days x 48``."""
    t = side.traj
    own = side.owner
    day = np.floor_divide(t.ts, DAY_US)
    slot = (t.ts - day * DAY_US) // (DAY_US // SLOTS)
    # points are sorted by trajectory, then time: (trajectory, day) runs are contiguous
    new_day = np.ones(len(day), dtype=bool)
    new_day[1:] = (own[1:] != own[:-1]) | (day[1:] != day[:-1])
    group = np.cumsum(new_day) - 1
    n_days = int(group[-1]) + 1 if len(group) else 0
    key = group * SLOTS + slot
    last = np.ones(len(key), dtype=bool)            # the last fix of each (day, slot)
    last[:-1] = key[1:] != key[:-1]
    grid = np.full((n_days, SLOTS), -1, dtype=np.int64)
    grid[group[last], slot[last]] = np.flatnonzero(last)
    has = grid >= 0
    col = np.where(has, np.arange(SLOTS), -1)
    filled = np.maximum.accumulate(col, axis=1)               # carry the last location forward
    first = np.argmax(has, axis=1)
    filled = np.where(filled < 0, first[:, None], filled)      # before the first fix: its location
    point = np.take_along_axis(grid, filled, axis=1)
    la = np.round(t.lat[point] * SCALE).astype(np.int64)
    lo = np.round(t.lon[point] * SCALE).astype(np.int64)
    loc = (la + 90 * SCALE) * (360 * SCALE + 1) + (lo + 180 * SCALE) + 1
    return Days(la / SCALE, lo / SCALE, loc)


def squared_steps(d: Days) -> np.ndarray:
    """Distance: ``dlat^2 + dlon^2`` (deg^2) between consecutive slots, 47 per day (193-202)."""
    return ((d.lat[:, 1:] - d.lat[:, :-1]) ** 2 + (d.lon[:, 1:] - d.lon[:, :-1]) ** 2).ravel()


def squared_radius(d: Days) -> np.ndarray:
    """Radius: mean over the 48 slots of the squared degree distance to the mean position (217-235)."""
    dy = d.lat - d.lat.mean(axis=1, keepdims=True)
    dx = d.lon - d.lon.mean(axis=1, keepdims=True)
    return (dx * dx + dy * dy).mean(axis=1)


def daily_locations(d: Days) -> np.ndarray:
    """DailyLoc: distinct locations of each day / 48 (237-247)."""
    s = np.sort(d.loc, axis=1)
    return (1 + (s[:, 1:] != s[:, :-1]).sum(axis=1)) / SLOTS


def _location_counts(d: Days) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(day, location, slots) for every distinct (day, location) pair."""
    rows = np.repeat(np.arange(d.n, dtype=np.int64), SLOTS)
    order = np.lexsort((d.loc.ravel(), rows))
    r, l = rows[order], d.loc.ravel()[order]
    start = np.ones(len(r), dtype=bool)
    start[1:] = (r[1:] != r[:-1]) | (l[1:] != l[:-1])
    idx = np.flatnonzero(start)
    counts = np.diff(np.append(idx, len(r)))
    return r[idx], l[idx], counts


def grank_values(d: Days) -> np.ndarray:
    """G-rank: the 50 largest location shares of all slot entries, padded with zeros (432-466)."""
    _, counts = np.unique(d.loc, return_counts=True)
    top = np.sort(counts)[::-1][:GRANK_K] / max(d.loc.size, 1)
    return np.pad(top, (0, GRANK_K - len(top)))


def irank_profile(d: Days) -> np.ndarray:
    """I-rank: mean over days of the r-th largest location count / 48 (r = 1..20), normalised (121-143)."""
    day, _, counts = _location_counts(d)
    order = np.lexsort((-counts, day))
    day, counts = day[order], counts[order]
    rank = np.arange(len(day)) - np.searchsorted(day, day, side="left")
    keep = rank < IRANK_K
    mean = np.bincount(rank[keep], weights=counts[keep] / SLOTS, minlength=IRANK_K) / max(d.n, 1)
    return mean / mean.sum()


def distributions(d: Days) -> dict[str, np.ndarray]:
    """The five histograms / profiles one table contributes, before the JSD."""
    return {
        "radius": histogram_arange(squared_radius(d), 0, MAX_DISTANCE, DISTANCE_BINS),
        "dailyloc": histogram_arange(daily_locations(d), 0, 1, DAILYLOC_BINS),
        "distance": histogram_arange(squared_steps(d), 0, MAX_DISTANCE, DISTANCE_BINS),
        "grank": histogram_arange(grank_values(d), 0, 1, GRANK_BINS),
        "irank": irank_profile(d),
    }


DESCRIPTIONS = {
    "radius": "JSD of the mean squared degree distance to the day's centroid (deg^2, no root), 999 fixed bins "
              "of 2.1 deg^2",
    "dailyloc": "JSD of distinct 0.01-degree locations per 48-slot day / 48, 47 bins",
    "distance": "JSD of squared degree distances between consecutive half-hour slots (deg^2), 999 fixed bins "
                "of 2.1 deg^2 (a city's steps all fall in the first)",
    "grank": "JSD of the histogram of the top-50 location shares (values, 49 bins of 0.02)",
    "irank": "JSD of the mean top-20 location counts per day / 48, normalised",
}


def metrics(real: Side, synth: Side, opts: Options, generator=None) -> list[Metric]:
    why = require_time(real, synth)
    names = ("radius", "dailyloc", "distance", "grank", "irank")
    if why:
        return [Metric(f"pategail_paper_{n}_jsd", None, True, SOURCE, f"{why}: 48-slot days need time")
                for n in names]
    do, ds = distributions(days(real)), distributions(days(synth))
    return [Metric(f"pategail_paper_{n}_jsd", smoothed_jsd(do[n], ds[n]), True, SOURCE,
                   f"{DESCRIPTIONS[n]}; natural log, 1e-10 smoothing") for n in names]
