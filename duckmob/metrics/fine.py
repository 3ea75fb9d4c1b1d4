"""Fine-grained fidelity: what a person sees first on a map, at the resolution of the streets.

Coarse-cell metrics (the other families, 6 x 6 to 32 x 32 grids) cannot tell trajectories that follow the road
network from points scattered uniformly inside coarse cells, nor GPS-like sampling (a point every few seconds)
from one point per coarse cell. These metrics can:

* point density on a fine grid (``fine_point_w``, 200 x 200 over the bbox): where the points are;
* trajectory density on a fine grid (``fine_traj_w``, 100 x 100): where trajectories go, each trajectory
  counted once per distinct cell holding one of its points (the definition issue 16's targets were measured
  with), and route density, the same with consecutive points joined by straight segments (what
  ``mob_plot_density`` draws; it does not depend on how densely a route is sampled);
* consecutive-step length: how far apart consecutive points are (the sampling), on a fixed public binning;
* share of one-point trajectories and mean points per trajectory: degenerate and under-sampled output.

Every divergence is :func:`duckmob.metrics.common.jsd` (natural log, nats, in [0, ln 2]).
"""

from __future__ import annotations

import numpy as np

from duckmob.metrics.common import Metric, Options, Side, jsd
from duckmob.metrics.summary import Summary
from duckmob.grid import BBox, cell_of, haversine_m

SOURCE = "duckmob fine-grained fidelity"
STEP_SOURCE = "duckmob fine-grained fidelity (PateGail's per-record Distance on public log-spaced bins)"
MIN_STEP_M = 1.0  # lower edge of the first log-spaced step bin; shorter steps (0 = repeated fix) share one bin


def point_density(side: Side, w: int) -> np.ndarray:
    """Points per cell of the w x w grid over the bbox (``w*w`` counts; every point of every trajectory).

    As a distribution: ``P(c) = |{points in cell c}| / |{points}|``."""
    t = side.traj
    return np.bincount(cell_of(t.lat, t.lon, side.bbox, w), minlength=w * w).astype(np.float64)


def trajectory_density(side: Side, w: int) -> np.ndarray:
    """Trajectories with a point in each cell of the w x w grid (``w*w`` counts); a trajectory counts once per
    distinct cell holding one of its points (:meth:`Side.visits`), however many points it has there.

    As a distribution: ``T(c) = |{v : v has a point in c}| / sum_c' |{v : v has a point in c'}|``."""
    return side.visits(w).getnnz(axis=0).astype(np.float64)


def route_density(side: Side, w: int) -> np.ndarray:
    """Trajectories whose route passes each cell of the w x w grid (``w*w`` counts); a trajectory counts once
    per distinct cell its route passes, consecutive points joined by straight segments (:meth:`Side.routes`), so
    a route sampled sparsely counts like the same route sampled densely.

    As a distribution: ``R(c) = |{v : route of v passes c}| / sum_c' |{v : route of v passes c'}|``."""
    return side.routes(w).getnnz(axis=0).astype(np.float64)


def step_edges_m(bbox, bins: int) -> np.ndarray:
    """Public bin edges (metres) for consecutive-step lengths: ``[0, 1 m)`` then ``bins`` log-spaced bins from
    1 m to the bbox's diagonal (no step between two points inside the bbox is longer). Derived from the public
    bbox only, so the binning is the same for every table and no outlier of the real data moves it."""
    box = BBox.of(bbox)
    diagonal = float(haversine_m(box.min_lat, box.min_lon, box.max_lat, box.max_lon))
    top = max(diagonal, 10 * MIN_STEP_M)
    return np.concatenate([[0.0], np.logspace(np.log10(MIN_STEP_M), np.log10(top), int(bins) + 1)])


def step_histogram(side: Side, edges: np.ndarray) -> np.ndarray:
    """Counts of consecutive-step lengths ``d_i = haversine(p_i, p_{i+1})`` (metres, both points in one
    trajectory) on ``edges``; anything at or beyond the last edge counts in the last bin."""
    idx = np.clip(np.searchsorted(edges, side.step_m, side="right") - 1, 0, len(edges) - 2)
    return np.bincount(idx, minlength=len(edges) - 1).astype(np.float64)


def summary(side: Side, plan, parts: dict) -> None:
    """What ``side`` adds (:mod:`duckmob.metrics.summary`): the point, trajectory and route densities, the step
    histogram on the public edges and the number of one-point trajectories."""
    opts = plan.opts
    parts["fine.point"] = point_density(side, opts.fine_point_w)
    parts["fine.traj"] = trajectory_density(side, opts.fine_traj_w)
    parts["fine.route"] = route_density(side, opts.fine_traj_w)
    parts["fine.step"] = step_histogram(side, step_edges_m(side.bbox, opts.step_bins))
    parts["fine.one_point"] = int((side.traj.lengths == 1).sum())


def compare(real: Summary, synth: Summary, opts: Options, generator=None) -> list[Metric]:
    """The fine-grained rows between two summaries (:func:`summary`):

    * ``fine_point_density_jsd`` = ``JSD(P_real, P_synth)``, ``P`` of :func:`point_density` on the
      ``fine_point_w`` grid;
    * ``fine_traj_density_jsd`` = ``JSD(T_real, T_synth)``, ``T`` of :func:`trajectory_density` on the
      ``fine_traj_w`` grid;
    * ``fine_route_density_jsd`` = ``JSD(R_real, R_synth)``, ``R`` of :func:`route_density`, same grid;
    * ``fine_step_jsd`` = JSD of the step-length histograms of :func:`step_histogram` on :func:`step_edges_m`
      (``step_bins`` + 1 bins);
    * ``fine_one_point_share_real`` / ``_synth`` = ``|{v : |v| = 1}| / n`` of each table (informational: the
      best synthetic value is the real one, 0 for tables cleaned by the input contract);
    * ``fine_points_per_traj_ratio`` = ``mean_v |v| (synth) / mean_v |v| (real)`` (1 is best).
    """
    pw, tw, b = opts.fine_point_w, opts.fine_traj_w, opts.step_bins
    edges = step_edges_m(real.bbox, b)
    r, s = real.parts, synth.parts
    out = [
        Metric("fine_point_density_jsd", jsd(r["fine.point"], s["fine.point"]), True, SOURCE,
               f"JSD of the distribution of all points over a {pw}x{pw} grid on the bbox, nats"),
        Metric("fine_traj_density_jsd", jsd(r["fine.traj"], s["fine.traj"]), True,
               SOURCE, f"JSD of trajectories per cell of a {tw}x{tw} grid (each once per cell), nats"),
        Metric("fine_route_density_jsd", jsd(r["fine.route"], s["fine.route"]), True, SOURCE,
               f"JSD of trajectory routes per cell of a {tw}x{tw} grid (each once per cell), nats"),
        Metric("fine_step_jsd", jsd(r["fine.step"], s["fine.step"]), True, STEP_SOURCE,
               f"JSD of metres between consecutive points: [0, 1 m) and {b} log-spaced bins to "
               f"{edges[-1]:.0f} m, nats"),
    ]
    share_o, share_s = r["fine.one_point"] / real.n, s["fine.one_point"] / synth.n
    out.append(Metric("fine_one_point_share_real", share_o, None, SOURCE,
                      "share of real trajectories with exactly one point"))
    out.append(Metric("fine_one_point_share_synth", share_s, None, SOURCE,
                      f"share of synthetic trajectories with exactly one point (real: {share_o:.4f}; equal is best)"))
    mean_o, mean_s = real.n_points / real.n, synth.n_points / synth.n
    out.append(Metric("fine_points_per_traj_ratio", mean_s / mean_o, None, SOURCE,
                      f"mean points per trajectory, synthetic / real ({mean_s:.2f} / {mean_o:.2f}; 1 is best)"))
    return out
