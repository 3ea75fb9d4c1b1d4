-- Roads: a public road network loaded as a table, a release whose every point lies on a street, and a picture with
-- the streets drawn under it (README, "On the real streets"; docs/roads.md). Run it on a new database file, from
-- the folder where its picture should land (about 10 s):
--
--     duckmob roads.duckdb -f sql/roads.sql
--
-- Streets are public geography: loading, matching and drawing them cost no budget. The one release here is the
-- synthesis from sf_trips (eps 1.0 of its budget of 1.0), so a second run on the same file is refused before any
-- data is read. Leaves roads.duckdb (tables roads, sf_trips, sf_synth and the ledger) and sf_density.png.

-- roads: the downtown San Francisco roads shipped inside duckmob, 28,609 drivable OpenStreetMap segments
-- (lat1, lon1, lat2, lon2, highway). (c) OpenStreetMap contributors, ODbL 1.0: a copy you ship keeps the notice
-- of duckmob/data/ROADS_README.md.
CREATE OR REPLACE TABLE roads AS FROM mob_sf_roads();

-- Your own city: the drivable ways of an OpenStreetMap extract of it (.osm, .osm.gz, .osm.bz2; .osm.pbf with
-- pip install -e ".[roads]"), the segments with an endpoint in the box; keep the extract's ODbL attribution:
--   CREATE OR REPLACE TABLE roads AS FROM mob_roads_from_osm('city.osm.pbf', bbox := [52.50, 13.35, 52.54, 13.43]);

SELECT highway, count(*) AS segments FROM roads GROUP BY highway ORDER BY segments DESC LIMIT 5;

-- sf_trips: stand-in trips for the example (yours come from your data): each OpenStreetMap way's chain of
-- segments is one trip, a fix every 30 s, the primary and secondary streets carrying four times the traffic.
CREATE OR REPLACE TABLE sf_trips AS
WITH seg AS (SELECT row_number() OVER () AS i, *,
                    (lat1, lon1) IS DISTINCT FROM (lag(lat2) OVER (), lag(lon2) OVER ()) AS starts FROM roads),
     way AS (SELECT *, sum(starts::INT) OVER (ORDER BY i) AS way_id FROM seg)
SELECT way_id * 4 + copy AS traj_id, TIMESTAMP '2024-05-01 08:00' + INTERVAL 30 SECOND * i AS ts,
       lat1 AS lat, lon1 AS lon
FROM way, range(CASE WHEN highway IN ('primary', 'secondary') THEN 4 ELSE 1 END) r(copy);

-- the release: roads := 'roads' puts every synthetic point on a street and walks consecutive points along the
-- road graph. A roads table built from a table with a budget (sf_trips, say) is refused before anything is spent.
FROM mob_set_budget('sf_trips', eps := 1.0, delta := 0);
CREATE OR REPLACE TABLE sf_synth AS
FROM synthesize('sf_trips', eps := 1.0, bbox := [37.76, -122.45, 37.80, -122.38], roads := 'roads');

-- the picture: both density maps with the streets in grey under them, sf_density.png (NOT private: it draws
-- sf_trips exactly). In the real panel the street grid shows, the arterials brightest.
FROM mob_plot_density('sf_trips', 'sf_synth', path := 'sf_density.png', bbox := [37.76, -122.45, 37.80, -122.38],
                      w := 128, roads := 'roads');

-- what the release used: the roads' name and the digest of the segments clipped to the bbox, in its ledger row
SELECT id, mechanism, epsilon, params->>'roads' AS roads, params->>'roads_digest' AS roads_digest FROM mob_ledger();
