-- The README's tour as one script ("From nothing to a synthetic table and its quality"): the shipped GeoLife
-- sample -> a budget -> a synthetic table under eps 1 -> its quality and a picture -> what was spent -> a model
-- fitted once and sampled for free. The statements are the README's, in its order (tests/test_sql_scripts.py
-- checks that they stay so). Run it on a new database file (about 15 s), from the folder where its picture
-- should land:
--
--     duckmob trips.duckdb -f sql/tour.sql
--
-- It spends eps 1.5 of the 2.0 it declares, so a second run on the same file is refused at step 4, before any
-- data is read (the message names the mob_set_budget call that would allow it). Leaves trips.duckdb (tables trips,
-- synth, synth_big, the model beijing_v1 and the ledger) and density.png in the current folder.

-- 1. the data: the shipped sample (your own: CREATE TABLE trips AS FROM read_parquet('your_file.parquet'))
CREATE OR REPLACE TABLE trips AS FROM mob_geolife_sample();

-- 2. what a release will drop, in exact counts for you, the data owner (NOT private: do not publish them)
FROM mob_check('trips', bbox := [39.8477, 116.1956, 40.1133, 116.4880]);

-- 3. the budget this table may ever spend; every release is checked against it and recorded
FROM mob_set_budget('trips', eps := 2.0, delta := 1e-5);

-- 4. a synthetic table under eps = 1 (PrivTrace, about a second). The bbox is public: you declare it, duckmob
--    never computes it from the data.
CREATE OR REPLACE TABLE synth AS
FROM synthesize('trips', eps := 1.0, method := 'privtrace', bbox := [39.8477, 116.1956, 40.1133, 116.4880]);

-- 5. how faithful is it? The papers' metrics beside two real halves (reference) and a naive table (baseline),
--    and a picture. Evaluation reads the real table exactly: it is NOT private, it is for you.
FROM mob_evaluate('trips', 'synth', bbox := [39.8477, 116.1956, 40.1133, 116.4880]);
FROM mob_plot_density('trips', 'synth', path := 'density.png', bbox := [39.8477, 116.1956, 40.1133, 116.4880]);

-- 6. what was spent: budget, spent (PLD composition of every release), remaining; one ledger row per release
FROM mob_budget();
FROM mob_ledger();

-- 7. or fit once (one spend, eps 0.5) and sample as often as you like (free: post-processing of the model)
FROM mob_fit('trips', 'beijing_v1', eps := 0.5, method := 'privtrace',
             bbox := [39.8477, 116.1956, 40.1133, 116.4880]);
CREATE OR REPLACE TABLE synth_big AS FROM mob_sample('beijing_v1', n := 10000);
FROM mob_models();
