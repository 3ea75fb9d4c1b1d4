-- The GeoLife sample shipped inside the package (10 users, 1,999 trajectories, 123,317 fixes; columns user_id,
-- traj_id, ts, lat, lon): CREATE OR REPLACE TABLE trips AS FROM mob_geolife_sample();
CREATE OR REPLACE TEMP MACRO mob_geolife_sample() AS TABLE
SELECT * FROM read_parquet(_mob_sample_path());
