"""A public street grid over a bbox, from constants only: the road network of tests whose trips are not in San
Francisco (the shipped sample is in Beijing)."""

import numpy as np
import pyarrow as pa


def grid_roads(bbox, streets: int = 24) -> pa.Table:
    """``streets`` east-west and north-south streets over ``bbox`` ([min_lat, min_lon, max_lat, max_lon]), each cut
    at every crossing: a table of segments (lat1, lon1, lat2, lon2)."""
    lats = np.linspace(bbox[0], bbox[2], streets)
    lons = np.linspace(bbox[1], bbox[3], streets)
    a_lat, a_lon = np.meshgrid(lats, lons[:-1], indexing="ij")          # east-west pieces
    b_lat, b_lon = np.meshgrid(lats[:-1], lons, indexing="ij")          # north-south pieces
    return pa.table({"lat1": np.r_[a_lat.ravel(), b_lat.ravel()], "lon1": np.r_[a_lon.ravel(), b_lon.ravel()],
                     "lat2": np.r_[a_lat.ravel(), b_lat.ravel() + (lats[1] - lats[0])],
                     "lon2": np.r_[a_lon.ravel() + (lons[1] - lons[0]), b_lon.ravel()]})
