"""Pictures for a person comparing a synthetic table with the real one (matplotlib, Agg canvas, no pyplot state).

``density_png``: side-by-side maps of how many trajectories pass each cell (like PrivTrace Fig. 3), one shared
logarithmic colour scale and one colourbar. ``distributions_png``: length and diameter distributions on shared
bins. Both write a PNG and return its absolute path. Like every evaluation output, these pictures show the real
data exactly: they are for the data owner, not for release.
"""

from __future__ import annotations

import os

import numpy as np

from duckmob.errors import DuckmobError
from duckmob.evaluate.common import Side, jsd, shared_histograms


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


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def pass_counts(side: Side, w: int) -> np.ndarray:
    """(w x w) number of trajectories whose route passes each cell; row 0 is the southern edge."""
    return side.routes(w).getnnz(axis=0).reshape(w, w)


def density_png(real: Side, synth: Side, path, w: int = 64) -> str:
    """Write side-by-side heatmaps of trajectories passing each cell of the w x w grid; return the path."""
    from matplotlib.colors import LogNorm

    path = _target(path)
    box = real.bbox
    grids = [pass_counts(real, w), pass_counts(synth, w)]
    top = max(1, int(max(g.max() for g in grids)))
    norm = LogNorm(vmin=1, vmax=max(top, 2))
    mid = np.radians((box.min_lat + box.max_lat) / 2)
    aspect = 1 / np.cos(mid)  # degrees of latitude are longer than degrees of longitude away from the equator
    fig = _figure(12, 5.6)
    axes = fig.subplots(1, 2, sharex=True, sharey=True)
    extent = (box.min_lon, box.max_lon, box.min_lat, box.max_lat)
    cmap = "inferno"
    image = None
    for ax, grid, side, label in zip(axes, grids, (real, synth), ("Real", "Synthetic")):
        shown = np.ma.masked_less(grid.astype(float), 1)
        image = ax.imshow(shown, origin="lower", extent=extent, norm=norm, cmap=cmap, aspect=aspect,
                          interpolation="nearest")
        ax.set_facecolor("#d9d9d9")
        ax.set_title(f"{label}: {side.n:,} trajectories, {int((grid > 0).sum()):,} cells passed")
        ax.set_xlabel("longitude (degrees)")
    axes[0].set_ylabel("latitude (degrees)")
    bar = fig.colorbar(image, ax=list(axes), shrink=0.85, pad=0.02)
    bar.set_label("trajectories passing the cell (log scale; grey = none)")
    fig.suptitle(f"Trajectory density on a {w}x{w} grid over the bounding box (shared colour scale)")
    fig.savefig(path)
    return path


def distributions_png(real: Side, synth: Side, path, bins: int = 50) -> str:
    """Write the length and diameter distributions of both tables (shared bins, km) with their JSD."""
    path = _target(path)
    fig = _figure(12, 4.8)
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
