"""How low can fine-grained density go at a given budget? (issue 16, NOT private: reads the real table exactly)

benchmarks/fidelity.py measures the methods. This script asks what the fine stage's release itself allows: it
releases the fine density of the real GeoLife trips (HRNet's box, as fidelity.py loads them) through the
production mechanism (``placement.statistics`` + ``placement.release_statistics``: length-normalised sums,
Laplace on every fine cell, the quadtree denoiser) at a density epsilon and a fine width, then draws every
synthetic point independently from the released density (uniform inside its fine cell), as many points as the
real table has fixes, and scores them against the real fixes with the fidelity metrics' grids:

    pt dens   JSD of the points over the 200 x 200 grid with the real fixes (fine_point_density_jsd)
    tr dens   JSD of the points over the 100 x 100 grid with the real (trajectory, cell) pairs
              (fine_traj_density_jsd's real side)

Drawing points independently by the released density is the best a sampler can do with that release alone
(routes, anchors and spacing only rearrange it); a method's coarse model can add what its own releases know. The
eps column is the density part's epsilon: PrivTrace at eps 1 spends eps 1 x fine_share 0.2 x 0.8 = 0.16 on it;
eps 1 is the whole budget given to the fine density (nothing left for the coarse model); inf is the exact
density (no noise: the grid's own floor).

    python benchmarks/fidelity_floor.py                  # widths 64, 128, 256; eps 0.16, 0.32, 1, inf; 2 seeds
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)


def floor_scores(real, bbox, w: int, eps: float, seed: int, draws: int) -> tuple[float, float]:
    """(point density JSD, trajectory density JSD) of ``draws`` points drawn from the fine density released at
    ``eps`` (math.inf: exact) on a w x w grid."""
    from duckmob.metrics.common import jsd
    from duckmob.metrics.fine import point_density, trajectory_density
    from duckmob.grid import BBox, cell_of
    from duckmob.privacy.noise import NoiseSource
    from duckmob.synth import placement

    box = BBox.of(bbox)
    scale = 1.0 / eps if math.isfinite(eps) else 1e-6
    sc = {"density": scale, "steps": scale}              # both parts, as the methods release them
    sums = placement.statistics(real.traj, bbox, w, sc)
    if math.isfinite(eps):
        density = placement.release_statistics(sums, w, sc, NoiseSource(seed)).density
    else:
        density = sums["fine_density"].astype(np.float64)   # exact: whole steps of the noise grid
    p = np.asarray(density, dtype=np.float64)
    rng = np.random.default_rng(seed)
    cells = rng.choice(w * w, draws, p=p / p.sum())
    r, c = np.divmod(cells, w)
    lat = box.min_lat + (r + rng.random(draws)) * (box.max_lat - box.min_lat) / w
    lon = box.min_lon + (c + rng.random(draws)) * (box.max_lon - box.min_lon) / w
    pt = jsd(point_density(real, 200), np.bincount(cell_of(lat, lon, bbox, 200), minlength=200 * 200))
    tr = jsd(trajectory_density(real, 100), np.bincount(cell_of(lat, lon, bbox, 100), minlength=100 * 100))
    return float(pt), float(tr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--widths", default="64,128,256")
    parser.add_argument("--eps", default="0.16,0.32,1,inf", help="density epsilons; inf = exact")
    parser.add_argument("--seeds", default="1,2")
    args = parser.parse_args()
    import duckmob
    from duckmob.metrics import load_side, table_points
    from fidelity import BOX, load_real

    con = duckmob.connect()
    n = load_real(con, {"trips": None})["trips"]
    real = load_side(table_points(con, "trips"), BOX, "real")[0]
    con.close()
    draws = real.traj.n_points
    print(f"GeoLife in HRNet's box: {n:,} trajectories, {draws:,} fixes; points drawn independently from the "
          "released fine density; mean over seeds " + args.seeds)
    print(f"{'fine w':>6s} {'cell m':>6s} {'eps':>6s} {'pt dens':>8s} {'tr dens':>8s}")
    for w in [int(v) for v in args.widths.split(",")]:
        for eps in [float(v) for v in args.eps.split(",")]:
            seeds = [int(s) for s in args.seeds.split(",")] if math.isfinite(eps) else [1]
            scores = np.mean([floor_scores(real, BOX, w, eps, s, draws) for s in seeds], axis=0)
            cell_m = (BOX[2] - BOX[0]) * 111_195.0 / w
            print(f"{w:6d} {cell_m:6.0f} {eps:6g} {scores[0]:8.4f} {scores[1]:8.4f}", flush=True)
    print("targets (issue 16, PrivTrace at eps 1): pt dens < 0.12, tr dens < 0.08")


if __name__ == "__main__":
    main()
