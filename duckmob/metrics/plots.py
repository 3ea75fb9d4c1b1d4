"""Pictures for a person comparing a synthetic table with the real one (matplotlib, Agg canvas, no pyplot state).

``density_png``: side-by-side maps of where trajectories go (like PrivTrace Fig. 3), each panel the share of its
table's trajectory-cell passes so that tables of different sizes compare on shape, one shared logarithmic
colour scale and one colourbar, panels shaped like the bbox in metres; with a public road network
(:class:`duckmob.roads.Roads`), its segments drawn as thin grey lines under both panels' cells, so a reader sees
whether the density follows the streets. ``distributions_png``: length and
diameter distributions on shared bins. Both write a PNG and return its absolute path. Like every evaluation
output, these pictures show the real data exactly: they are for the data owner, not for release.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from duckmob.errors import DuckmobError
from duckmob.grid import BBox
from duckmob.metrics.common import Side, bbox_sides_m, jsd, shared_histograms
from duckmob.metrics.fine import route_density


def _target(path) -> str:
    if not path:
        raise DuckmobError("a PNG path is required: pass path := 'density.png'")
    path = os.path.abspath(os.path.expanduser(str(path)))
    if not path.lower().endswith(".png"):
        raise DuckmobError(f"the picture is written as PNG: give a path ending in .png, got {path!r}")
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise DuckmobError(f"folder {folder!r} does not exist: create it or choose another path")
    return path


def new_figure(width: float, height: float, layout: str | None = None):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout=layout)
    FigureCanvasAgg(fig)
    return fig


@dataclass(frozen=True)
class Passes:
    """What :func:`density_figure` reads of a table, summed over its batches (:func:`passes`): its number of
    trajectories ``n`` and its route passes per cell of the w x w grid on ``bbox`` (``counts``, w*w)."""

    n: int
    counts: np.ndarray
    bbox: object


def passes(batches, bbox, w: int) -> Passes:
    """:class:`Passes` of a table given as batches of whole trajectories (:class:`Side` or Trajectories): a
    trajectory's route passes are its own, so the sums over batches are the table's
    (:func:`duckmob.metrics.fine.route_density`)."""
    from duckmob.source.batches import in_threads

    box = BBox.of(bbox)

    def one(batch) -> tuple[int, np.ndarray]:
        if hasattr(batch, "trajectories"):   # a bucket read out of core (metrics.stream.Raw): cleaned on this thread
            batch = batch.trajectories()
        side = batch if isinstance(batch, Side) else Side(batch, box)
        return side.n, route_density(side, w)

    n, counts = 0, np.zeros(w * w)
    for got, c in in_threads(one, batches):
        n, counts = n + got, counts + c
    return Passes(n, counts, box)


def pass_shares(side: Side | Passes, w: int) -> np.ndarray:
    """(w x w) share of the table's (trajectory, cell its route passes) pairs in each cell, summing to 1 (0 for
    an empty grid); row 0 is the southern edge. The distribution compared by ``fine_route_density_jsd``
    (:func:`duckmob.metrics.fine.route_density`): a table repeated k times has the same shares."""
    counts = side.counts if isinstance(side, Passes) else route_density(side, w)
    return (counts / max(counts.sum(), 1.0)).reshape(w, w)


ROAD_COLOUR = "#8c8c8c"
ROAD_WIDTH = 0.35   # points: a street of the 28,609-segment SF network stays a hairline at 64 x 64 cells
CELL_ALPHA = 0.8    # the cells let the roads under them show through


def road_lines(roads, box):
    """A LineCollection (lon, lat) of the segments of ``roads`` (a :class:`duckmob.roads.Roads`) with an endpoint
    inside ``box``, drawn under the cells (zorder 0.5); ``None`` when no segment touches the box. Roads are public:
    nothing here reads either table."""
    from matplotlib.collections import LineCollection

    inside = box.contains(roads.lat1, roads.lon1) | box.contains(roads.lat2, roads.lon2)
    if not inside.any():
        return None
    ends = np.stack([np.column_stack([roads.lon1[inside], roads.lat1[inside]]),
                     np.column_stack([roads.lon2[inside], roads.lat2[inside]])], axis=1)
    return LineCollection(ends, colors=ROAD_COLOUR, linewidths=ROAD_WIDTH, zorder=0.5)


CHAR_INCHES = 0.085   # one character of a 10 pt tick label (a digit is 0.64 em)
GAP_INCHES = 0.15     # the least space between two labels


def longitude_ticks(low: float, high: float, panel_inches: float) -> tuple[list[float], list[str]]:
    """(ticks, labels) for the longitude axis of a panel ``panel_inches`` wide over ``[low, high]`` degrees: the
    finest round step (1, 2 or 5 x 10^k degrees) whose labels, written with just the decimals the step needs,
    keep :data:`GAP_INCHES` apart, and none within half a label of the panel's edges, where the right panel's
    first label would run into the left one's last (matplotlib's default ticks overlapped by 45 px on San
    Francisco's box, the downtown box's edges falling on round longitudes)."""
    span = high - low
    for step in (m * 10.0 ** k for k in range(-5, 3) for m in (1, 2, 5)):
        decimals = max(0, -int(np.floor(np.log10(step) + 1e-9)))
        chars = max(len(f"{v:.{decimals}f}") for v in (low, high))
        label = chars * CHAR_INCHES
        if step / span * panel_inches >= label + GAP_INCHES:
            break
    margin = span * label / 2 / panel_inches
    ticks = [t for t in np.arange(np.ceil(low / step), np.floor(high / step) + 1) * step
             if low + margin <= t <= high - margin]
    return [float(t) for t in ticks], [f"{t:.{decimals}f}".replace("-", "\u2212") for t in ticks]


def density_figure(real: Side | Passes, synth: Side | Passes, w: int = 64, roads=None):
    """The figure of :func:`density_png`: panels ``fig.axes[0]`` (real) and ``[1]`` (synthetic), each one image of
    :func:`pass_shares` on one shared logarithmic colour scale, then the colourbar. With ``roads`` (a
    :class:`duckmob.roads.Roads`), each panel also holds one LineCollection of the segments touching the bbox,
    under the image (whose cells are then drawn at alpha ``CELL_ALPHA``), clipped to the panel."""
    from matplotlib.colors import LogNorm

    box = real.bbox
    grids = [pass_shares(real, w), pass_shares(synth, w)]
    positive = np.concatenate([g[g > 0] for g in grids])
    low, high = (float(positive.min()), float(positive.max())) if positive.size else (1e-6, 1.0)
    norm = LogNorm(vmin=low, vmax=max(high, low * 10))
    ns_m, ew_m = bbox_sides_m(box)
    panel_h = 5.0
    panel_w = panel_h * ew_m / ns_m  # each panel keeps the bbox's shape in metres
    fig = new_figure(2 * panel_w + 1.3, panel_h + 0.9, layout="constrained")
    axes = fig.subplots(1, 2, sharex=True, sharey=True)
    extent = (box.min_lon, box.max_lon, box.min_lat, box.max_lat)
    aspect = (ns_m / (box.max_lat - box.min_lat)) / (ew_m / (box.max_lon - box.min_lon))  # metres per degree
    image = None
    for ax, grid, side, label in zip(axes, grids, (real, synth), ("Real", "Synthetic")):
        image = ax.imshow(np.ma.masked_equal(grid, 0.0), origin="lower", extent=extent, norm=norm, cmap="inferno",
                          aspect=aspect, interpolation="nearest", zorder=1,
                          alpha=None if roads is None else CELL_ALPHA)
        ax.set_facecolor("#d9d9d9" if roads is None else "#f2f2f2")
        lines = None if roads is None else road_lines(roads, box)
        if lines is not None:
            ax.add_collection(lines, autolim=False)
            ax.set_xlim(box.min_lon, box.max_lon)
            ax.set_ylim(box.min_lat, box.max_lat)
        ax.set_title(f"{label}: {side.n:,} trajectories, {int((grid > 0).sum()):,} cells passed", fontsize=10)
        ax.set_xlabel("longitude (degrees)" + ("" if roads is None else "; grey lines: the roads"))
    axes[0].set_ylabel("latitude (degrees)")
    axes[0].set_xticks(*longitude_ticks(box.min_lon, box.max_lon, panel_w))
    bar = fig.colorbar(image, ax=list(axes), shrink=0.9, pad=0.01)
    # No suptitle: with the panels' aspect fixed, constrained layout leaves the spare height around the axes,
    # which the tight crop removes; a suptitle would pin it between the title and the panels.
    empty = "grey: none" if roads is None else "pale: none"   # no longer: the label would stretch the figure
    bar.set_label(f"share of the table's trajectory-cell passes, {w}x{w} grid (log; {empty})")
    return fig


def density_png(real: Side | Passes, synth: Side | Passes, path, w: int = 64, roads=None) -> str:
    """Write side-by-side heatmaps of the share of trajectory passes in each cell of the w x w grid (tables of
    different sizes compare on shape: a table repeated 25 times gives the same picture), with ``roads`` (a
    :class:`duckmob.roads.Roads`, public) drawn under both panels; return the path."""
    path = _target(path)
    density_figure(real, synth, w, roads).savefig(path, bbox_inches="tight", pad_inches=0.05)
    return path


def distributions_png(real: Side, synth: Side, path, bins: int = 50) -> str:
    """Write the length and diameter distributions of both tables (shared bins, km) with their JSD."""
    path = _target(path)
    fig = new_figure(12, 4.8)
    axes = fig.subplots(1, 2)
    quantities = (("Trajectory length", real.length_m, synth.length_m),
                  ("Trajectory diameter", real.diameter_m, synth.diameter_m))
    for ax, (title, r, s) in zip(axes, quantities):
        hr, hs = shared_histograms(r, s, bins)
        upper = float(r.max()) if len(r) and r.max() > 0 else 1.0
        edges = np.linspace(0, upper, bins + 1) / 1000
        for counts, label, colour in ((hr, f"real ({len(r):,})", "#1f77b4"),
                                      (hs, f"synthetic ({len(s):,})", "#d62728")):
            share = counts / max(counts.sum(), 1)
            ax.stairs(share, edges, label=label, color=colour, linewidth=1.8)
        ax.set_yscale("log")
        ax.set_xlabel("km (last bin also holds longer synthetic values)")
        ax.set_ylabel("share of trajectories")
        ax.set_title(f"{title}: JSD {jsd(hr, hs):.4f} nats ({bins} bins)")
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    return path
