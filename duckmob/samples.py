"""The data shipped inside the package (duckmob/data/): where its files are, so that the demo, the SQL layer
(``FROM mob_geolife_sample()``), the dbt plugin and notebooks find them without importing one another."""

from __future__ import annotations

from importlib import resources


def sample_path() -> str:
    """Path of the shipped GeoLife sample (10 users, 1,999 trajectories, 123,317 fixes)."""
    return str(resources.files("duckmob").joinpath("data/geolife_sample.parquet"))


__all__ = ["sample_path"]
