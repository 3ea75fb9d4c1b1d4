"""The report's pictures as PNG bytes (matplotlib's Agg canvas, as :mod:`duckmob.metrics.plots`, whose density
code draws them).

The public page's pictures are drawn from the synthetic table alone (:class:`duckmob.metrics.common.Side` of it);
the owner's page draws the real table beside or over it, on the same scale (:func:`density` with ``real``:
:func:`duckmob.metrics.plots.density_figure`, one shared colour scale). Kept small (about 90 dpi) so the page
stays well under a megabyte.
"""

from __future__ import annotations

import io

import numpy as np

from duckmob.metrics.common import Side, bbox_sides_m, time_of_day_us
from duckmob.metrics.plots import new_figure, density_figure, pass_shares

DPI = 90
SYNTH, REAL = "#d62728", "#1f77b4"


def _png(fig, tight: bool = True) -> bytes:
    """The figure as PNG bytes; ``tight`` crops it (costs a second layout pass: not for a tight_layout figure)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, **({"bbox_inches": "tight", "pad_inches": 0.05} if tight else {}))
    return buf.getvalue()


def density(synth: Side, real: Side | None = None, w: int = 64) -> bytes:
    """Where trajectories go: the share of trajectory-cell passes in each cell of a ``w`` x ``w`` grid
    (:func:`duckmob.metrics.plots.pass_shares`). Without ``real``, one panel of the synthetic table; with it,
    :func:`duckmob.metrics.plots.density_figure` (real beside synthetic, one colour scale)."""
    if real is not None:
        return _png(density_figure(real, synth, w))
    from matplotlib.colors import LogNorm

    grid = pass_shares(synth, w)
    positive = grid[grid > 0]
    low, high = (float(positive.min()), float(positive.max())) if positive.size else (1e-6, 1.0)
    box = synth.bbox
    ns_m, ew_m = bbox_sides_m(box)
    fig = new_figure(5.0 * ew_m / ns_m + 1.6, 5.6, layout="constrained")
    ax = fig.subplots()
    aspect = (ns_m / (box.max_lat - box.min_lat)) / (ew_m / (box.max_lon - box.min_lon))
    image = ax.imshow(np.ma.masked_equal(grid, 0.0), origin="lower", cmap="inferno", interpolation="nearest",
                      extent=(box.min_lon, box.max_lon, box.min_lat, box.max_lat), aspect=aspect,
                      norm=LogNorm(vmin=low, vmax=max(high, low * 10)))
    ax.set_facecolor("#d9d9d9")
    ax.set_title(f"Synthetic: {synth.n:,} trajectories, {int((grid > 0).sum()):,} cells passed", fontsize=10)
    ax.set_xlabel("longitude (degrees)")
    ax.set_ylabel("latitude (degrees)")
    fig.colorbar(image, ax=ax, shrink=0.9, pad=0.01).set_label(f"share of trajectory-cell passes, {w}x{w} (log)")
    return _png(fig)


def quantities(side: Side) -> dict[str, np.ndarray | None]:
    """The four distributions the page shows, per trajectory or per step (None: the table has no time)."""
    hours = None
    if side.has_time:
        ts = side.traj.ts[side.traj.offsets[:-1][side.traj.lengths > 0]]
        hours = time_of_day_us(ts) / 3.6e9
    return {"Trip length (km)": side.length_m / 1000.0,
            "Points per trajectory": side.traj.lengths.astype(np.float64),
            "Step between points (m)": side.step_m,
            "Hour of day of the first point (as stored)": hours}


def _edges(title: str, values: list[np.ndarray], bins: int) -> np.ndarray:
    if title.startswith("Hour"):
        return np.arange(25, dtype=np.float64)
    upper = max((float(np.quantile(v, 0.99)) for v in values if v is not None and len(v)), default=1.0)
    return np.linspace(0.0, max(upper, 1e-9), bins + 1)


def distributions(synth: Side, real: Side | None = None, bins: int = 40) -> bytes:
    """Trip length, points per trajectory, step length and hour of day: the synthetic table's shares (real
    overlaid with ``real``), on shared bins up to the 99th percentile (the last bin holds the longer values)."""
    fig = new_figure(11, 6.4)
    axes = fig.subplots(2, 2).ravel()
    s_q = quantities(synth)
    r_q = quantities(real) if real is not None else {}
    for ax, title in zip(axes, s_q):
        shown = [(s_q[title], "synthetic", SYNTH)] + ([(r_q[title], "real", REAL)] if real is not None else [])
        if all(v is None for v, _, _ in shown):
            ax.text(0.5, 0.5, "no time in the table", ha="center", va="center", transform=ax.transAxes)
            ax.set_title(title, fontsize=10)
            ax.set_axis_off()
            continue
        edges = _edges(title, [v for v, _, _ in shown], bins)
        for values, label, colour in shown:
            if values is None:
                continue
            counts, _ = np.histogram(np.clip(values, edges[0], edges[-1] - 1e-9 * (edges[-1] - edges[0])), edges)
            ax.stairs(counts / max(counts.sum(), 1), edges, label=f"{label} ({len(values):,})", color=colour,
                      linewidth=1.6)
        missing = [label for values, label, _ in shown if values is None]
        ax.set_title(title + (f" (no time in the {missing[0]} table)" if missing else ""), fontsize=10)
        ax.set_ylabel("share")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return _png(fig, tight=False)
