"""SQL layer for public road networks (roads.sql): ``FROM mob_sf_roads()`` reads the downtown San Francisco roads
shipped inside the package (OpenStreetMap, ODbL: duckmob/data/ROADS_README.md), and ``FROM mob_roads_from_osm(path,
bbox := [...], classes := [...])`` reads an OpenStreetMap extract into a roads table. Roads are public: nothing here
reads a private table or spends budget (docs/roads.md)."""

from __future__ import annotations

from importlib import resources

from duckmob.sql.udf import Request, Udf, one_row

FROM_OSM = Request(path="VARCHAR", bbox="DOUBLE[]", classes="VARCHAR[]")
ROAD_ROW = "STRUCT(lat1 DOUBLE, lon1 DOUBLE, lat2 DOUBLE, lon2 DOUBLE, highway VARCHAR)[]"


def setup(con) -> None:
    """Nothing to create: these macros name no table."""


def sf_roads_path() -> str:
    """Path of the shipped downtown San Francisco roads (28,609 segments; duckmob/data/ROADS_README.md)."""
    return str(resources.files("duckmob").joinpath("data", "roads_sf_downtown.parquet"))


def _from_osm(request):
    r = FROM_OSM.parse(request, "_mob_roads_from_osm")
    if r["path"] is None:
        from duckmob.errors import DuckmobError
        raise DuckmobError("mob_roads_from_osm: give the path of an .osm or .osm.pbf extract")
    from duckmob import roads   # here, not at registration: it imports SciPy's spatial and sparse modules
    from duckmob.road_osm import read_osm

    table = read_osm(r["path"], bbox=r["bbox"], classes=r["classes"])
    if not table.num_rows:
        return one_row(table)
    checked = roads.Roads.of(table, name="mob_roads_from_osm").to_arrow()   # drops zero-length segments
    return one_row(checked.select(["lat1", "lon1", "lat2", "lon2", "highway"]))


def udfs(db) -> list[Udf]:
    path = sf_roads_path()
    return [
        Udf("_mob_sf_roads_path", lambda: path, [], "VARCHAR", native=True),
        Udf("_mob_roads_from_osm", _from_osm, [], ROAD_ROW, FROM_OSM, special_nulls=True),
    ]
