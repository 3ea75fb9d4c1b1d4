"""SQL layer for the shipped sample: ``FROM mob_geolife_sample()`` (demo.sql) reads the GeoLife sample that comes
inside the package, so a tour can start from nothing in any shell, notebook or dbt model."""

from __future__ import annotations

from duckmob.samples import sample_path
from duckmob.sql.udf import Udf


def setup(con) -> None:
    """Nothing to create: the sample is a file inside the package."""


def udfs(db) -> list[Udf]:
    path = sample_path()
    return [Udf("_mob_sample_path", lambda: path, [], "VARCHAR", native=True)]
