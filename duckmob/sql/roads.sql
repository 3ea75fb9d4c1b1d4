-- Public road networks (docs/roads.md): tables of straight segments lat1, lon1, lat2, lon2 (degrees) and highway.
-- Roads are public geography (OpenStreetMap, a city's GIS): reading them spends no budget.

-- Downtown San Francisco, shipped inside the package: 28,609 drivable OpenStreetMap segments (620 km),
-- lat 37.7525..37.8081, lon -122.4594..-122.3673.
-- (c) OpenStreetMap contributors, ODbL 1.0 (duckmob/data/ROADS_README.md).
CREATE OR REPLACE TEMP MACRO mob_sf_roads() AS TABLE
SELECT * FROM read_parquet(_mob_sf_roads_path());

-- The drivable ways (duckmob.road_osm.DRIVABLE; classes := [...] another list of highway classes) of an OpenStreetMap
-- extract (.osm, .osm.gz, .osm.bz2; .osm.pbf with pip install 'duckmob[roads]'), one row per consecutive pair of a
-- way's nodes; with bbox, the segments with an endpoint inside it.
CREATE OR REPLACE TEMP MACRO mob_roads_from_osm(path, bbox := NULL, classes := NULL) AS TABLE
SELECT unnest(_mob_roads_from_osm({'path': path, 'bbox': bbox, 'classes': classes}), recursive := true);
