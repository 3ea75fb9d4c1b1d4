"""Fine placement, shared by PrivTrace and HRNet: where synthetic points go inside a method's coarse cells, the
street-level route between consecutive coarse cells, and the spacing of points along it.

A method models trajectories on a coarse discretisation (PrivTrace's states, HRNet's grid). Left there, every
synthetic point is uniform inside a cell of a kilometre or more: a blob on the map, one point per cell. This stage
adds, as part of the method's fit and at ``eps * fine_share`` of its budget, two private releases on a public fine
grid (:mod:`.releases`: a trajectory density and a step-length histogram, sensitivity ``max_trajectories_per_user``
each, Laplace on every fine cell and bin), and samples from them (:mod:`.routes`: anchors, most probable routes;
:mod:`.spacing`: points along them; post-processing). ``output := 'cells'`` (or ``fine_share := 0``) keeps the
method's cell-level output and spends nothing here.
"""

from duckmob.synth.placement.releases import (EARTH_M_PER_DEG, MAX_POINTS, PARTS, ROAD_PIECE_M, SIGNAL_SHARE,
                                              STEP_BLOCKS_C, STEP_EDGES_M, STEP_TAU, TAU, FineStats, PlacementConfig,
                                              adaptive_density, fine_cells, fine_width, local_xy, part_eps, parts,
                                              privacy_events, release, release_road_density, release_statistics,
                                              road_sums, scales, statistics, step_bins, step_block,
                                              steps_mostly_noise)
from duckmob.synth.placement.routes import FLOOR, ROUTE_SPREAD, Placement, cell_centres, coarse_of_fine
from duckmob.synth.placement.spacing import spaced

__all__ = ["PlacementConfig", "FineStats", "Placement", "release", "release_statistics", "statistics",
           "privacy_events", "part_eps", "parts", "scales", "fine_width", "fine_cells", "step_bins", "step_block",
           "steps_mostly_noise", "adaptive_density", "coarse_of_fine", "cell_centres", "spaced", "PARTS",
           "STEP_EDGES_M", "STEP_BLOCKS_C", "STEP_TAU", "TAU", "SIGNAL_SHARE", "EARTH_M_PER_DEG", "MAX_POINTS",
           "FLOOR", "ROUTE_SPREAD", "ROAD_PIECE_M", "road_sums", "release_road_density", "local_xy"]
