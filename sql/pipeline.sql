-- A release pipeline in the style of a dbt project: one table per stage, each built from the one before it, so
-- every stage's result stays in the database to inspect (examples/dbt_project is the same pipeline as a real dbt
-- project, with tests). Run it on a new database file, from the folder where its outputs should land (about 10 s):
--
--     duckmob pipeline.duckdb -f sql/pipeline.sql
--
-- Stages: trips (the data) -> budget (declared once) -> fitted_model (the one release: eps 1.0) -> synth (sampled
-- from the model, free) -> quality and density.png (NOT private: for the data owner) -> report (release_report.html,
-- the page to publish with synth) -> spend (what the ledger recorded). A second run on the same file is refused at
-- the fit, before any data is read: the model name is in use (a new release needs a new name, and budget left).

-- trips: the data (yours: CREATE OR REPLACE TABLE trips AS FROM read_parquet('your_file.parquet'))
CREATE OR REPLACE TABLE trips AS FROM mob_geolife_sample();

-- budget: the most this table may ever spend, pure eps-DP (delta 0: PrivTrace needs no delta). Costs nothing;
-- declaring the same budget again never resets what was spent.
CREATE OR REPLACE TABLE budget AS FROM mob_set_budget('trips', eps := 2.0, delta := 0);

-- fitted_model: the release. Checked against the budget and reserved in the ledger before trips is read; the
-- stored model holds only noisy statistics and public parameters. The bbox is public: declared, never computed.
CREATE OR REPLACE TABLE fitted_model AS
FROM mob_fit('trips', 'beijing_pipeline', eps := 1.0, method := 'privtrace',
             bbox := [39.8477, 116.1956, 40.1133, 116.4880]);

-- synth: trajectories drawn from the stored model; post-processing, so any n and any number of draws cost nothing
CREATE OR REPLACE TABLE synth AS FROM mob_sample('beijing_pipeline', n := 1000);

-- quality: the papers' metrics of synth against trips, each beside two real halves (reference) and a naive table
-- (baseline), and both density maps side by side. Both read trips exactly: NOT private, keep them in-house.
CREATE OR REPLACE TABLE quality AS
FROM mob_evaluate('trips', 'synth', bbox := [39.8477, 116.1956, 40.1133, 116.4880], families := ['privtrace']);
CREATE OR REPLACE TABLE density AS
FROM mob_plot_density('trips', 'synth', path := 'density.png', bbox := [39.8477, 116.1956, 40.1133, 116.4880]);

-- report: the release report, one self-contained page built from the release and synth alone (it never reads
-- trips): the page to publish with the table. The owner's version, with the comparison and a do-not-publish
-- banner: FROM mob_report('synth', path := 'owner_report.html', real := 'trips');
CREATE OR REPLACE TABLE report AS FROM mob_report('synth', path := 'release_report.html');

-- spend: the budget, what the composition of every release spent and what is left, and the ledger's rows
CREATE OR REPLACE TABLE spend AS
SELECT b.source, b.eps AS budget, b.spent, b.remaining, l.id, l.mechanism, l.epsilon, l.params->>'model' AS model,
       l.seeded, l.status
FROM mob_budget() b JOIN mob_ledger() l USING (source);

FROM quality SELECT metric, value, reference, baseline, lower_is_better;
FROM report SELECT section, summary;
FROM spend;
