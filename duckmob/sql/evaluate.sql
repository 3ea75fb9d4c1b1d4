-- Evaluation of a synthetic trajectory table against the real one (duckmob/metrics). NOT differentially
-- private: these functions read the real table exactly; they are for the data owner, before a release.
-- Tables need traj_id, ts (may be all NULL in a synthetic table), lat, lon and optionally user_id, seq
-- (see mob_points); points outside the declared bbox are dropped on both sides. mob_evaluate and mob_plot_density
-- read a committed table or view out of core, in memory bounded by their grids (docs/scale.md, "Evaluation in
-- bounded memory"); a temporary table is gathered whole, as the other macros gather theirs.

-- All points of a table (through the mob_points contract) as the one LIST(STRUCT) the UDFs take.
CREATE OR REPLACE TEMP MACRO _mob_eval_points(tbl) AS (
    SELECT list({'traj_id': traj_id, 'user_id': user_id, 'ts': ts, 'lat': lat, 'lon': lon, 'seq': seq})
    FROM mob_points(tbl));

-- The same, but NULL (no row scanned: _mob_readable is folded when the statement is planned) for a table the UDF
-- reads itself out of core, one batch of whole trajectories at a time (mob_evaluate, mob_plot_density); a
-- temporary table's points are gathered.
CREATE OR REPLACE TEMP MACRO _mob_eval_gathered(tbl) AS (
    SELECT list({'traj_id': traj_id, 'user_id': user_id, 'ts': ts, 'lat': lat, 'lon': lon, 'seq': seq})
    FROM mob_points(tbl) WHERE NOT _mob_readable(tbl));

-- One row per metric: exact_not_private (always true: the first column of every exact result, so that each row says
-- it, in any order), metric, value, reference, baseline, lower_is_better, source (paper, section), description.
-- reference: the same metric between two halves of the real table, split by a fixed hash of (user_id, traj_id)
-- (the scale to read value against; also read exactly from the real table: NOT private either). It costs
-- about a fifth more time; reference := false skips it (NULL column). baseline: the same metric between real
-- half 0 and a naive table (half 1's trajectories as straight trips between uniformly random places in the
-- bbox): (value - reference) / (baseline - reference) is 0 as good as real, 1 no better than naive. It costs
-- about as much as the reference (its naive table has at most 1,000 trajectories); baseline := false skips it.
-- families: any of ['hrnet', 'privtrace', 'pategail', 'lestyan', 'adatrace', 'fine'] (NULL = all), or by name the
-- papers' reference-code definitions 'pategail_paper', 'hrnet_paper', 'privtrace_paper', 'cleanslate_paper'; w: grid
-- width; bins: histogram bins; n_queries: random queries; seed: evaluation randomness (NULL = fixed default);
-- fine_point_w / fine_traj_w / step_bins: the fine family's grids (200, 100) and step bins (50);
-- further options as in duckmob.metrics.common.Options.
CREATE OR REPLACE TEMP MACRO mob_evaluate(real, synth, bbox := NULL, families := NULL, w := NULL, bins := NULL,
                                         n_queries := NULL, seed := NULL, phi := NULL, top_starts := NULL,
                                         top_patterns := NULL, pattern_w := NULL, n_times := NULL,
                                         query_w := NULL, radius_range := NULL, adatrace_radius := NULL,
                                         top_k := NULL, emd_sample := NULL, fine_point_w := NULL,
                                         fine_traj_w := NULL, step_bins := NULL, reference := NULL,
                                         baseline := NULL) AS TABLE
SELECT unnest(_mob_evaluate(_mob_eval_gathered(real), _mob_eval_gathered(synth), {'bbox': bbox, 'options':
    json_object('families', families, 'w', w, 'bins', bins, 'n_queries', n_queries, 'seed', seed, 'phi', phi,
                'top_starts', top_starts, 'top_patterns', top_patterns, 'pattern_w', pattern_w,
                'n_times', n_times, 'query_w', query_w, 'radius_range', radius_range,
                'adatrace_radius', adatrace_radius, 'top_k', top_k, 'emd_sample', emd_sample,
                'fine_point_w', fine_point_w, 'fine_traj_w', fine_traj_w, 'step_bins', step_bins,
                'reference', reference, 'baseline', baseline)::VARCHAR,
    'real': real, 'synth': synth, 'database': current_database(), 'schema': current_schema(),
     'real_out_of_core': _mob_readable(real), 'synth_out_of_core': _mob_readable(synth)}),
    recursive := true);

-- The segments of a public roads table (lat1, lon1, lat2, lon2; a name, a view or any FROM item such as
-- 'mob_sf_roads()') as one LIST(STRUCT); NULL when roads is NULL (the fallback query reads nothing).
CREATE OR REPLACE TEMP MACRO _mob_plot_roads(roads) AS (
    SELECT list({'lat1': TRY_CAST(lat1 AS DOUBLE), 'lon1': TRY_CAST(lon1 AS DOUBLE),
                 'lat2': TRY_CAST(lat2 AS DOUBLE), 'lon2': TRY_CAST(lon2 AS DOUBLE)})
    FROM query(coalesce('SELECT lat1, lon1, lat2, lon2 FROM ' || roads,
                        'SELECT NULL AS lat1, NULL AS lon1, NULL AS lat2, NULL AS lon2 LIMIT 0')));

-- Side-by-side heatmaps of how many trajectories pass each cell of a w x w grid (like PrivTrace Fig. 3):
-- shared logarithmic colour scale, colourbar; with roads := 'table' (public segments), the roads drawn as thin
-- grey lines under both panels. Writes a PNG; returns one row with its absolute path.
CREATE OR REPLACE TEMP MACRO mob_plot_density(real, synth, path := 'density.png', bbox := NULL, w := 64,
                                             roads := NULL) AS TABLE
SELECT unnest(_mob_plot_density(_mob_eval_gathered(real), _mob_eval_gathered(synth), _mob_plot_roads(roads),
    {'bbox': bbox, 'path': path, 'w': w, 'roads': roads,
     'real': real, 'synth': synth, 'database': current_database(), 'schema': current_schema(),
     'real_out_of_core': _mob_readable(real), 'synth_out_of_core': _mob_readable(synth)}), recursive := true);

-- Length and diameter distributions of both tables on shared bins, with their JSD. Writes a PNG; returns its path.
CREATE OR REPLACE TEMP MACRO mob_plot_distributions(real, synth, path := 'distributions.png', bbox := NULL,
                                                   bins := 50) AS TABLE
SELECT unnest(_mob_plot_distributions(_mob_eval_points(real), _mob_eval_points(synth),
    {'bbox': bbox, 'path': path, 'bins': bins}), recursive := true);

-- Privacy audit by attacks (PateGail): membership inference (members = real trajectories the synthesizer was
-- trained on, non_members = real ones it never saw; the attacker scores by distance to the nearest synthetic
-- trajectory) and uniqueness (highest overlap of each real trajectory with one synthetic trajectory).
-- Same row shape as mob_evaluate (reference NULL). An attack can show a leak, never prove there is none.
CREATE OR REPLACE TEMP MACRO mob_audit(members, non_members, synth, bbox := NULL, w := 32, k := 16,
                                      seed := NULL) AS TABLE
SELECT unnest(_mob_audit(_mob_eval_points(members), _mob_eval_points(non_members), _mob_eval_points(synth),
    {'bbox': bbox, 'w': w, 'k': k, 'seed': seed::BIGINT}), recursive := true);

-- Downstream utility, trained on the synthetic table and tested on the real one (pass HELD-OUT real
-- trajectories): task := 'next_location' (Acc@1, Acc@5), 'mode' (transport-mode accuracy and macro F1; the
-- synthetic table needs a mode column, one mode per trajectory, and modes := a Parquet path or table of labels
-- user_id, start, end, mode joined to the real fixes by user and time) or 'commute' (mean commute distance per
-- destination cell). Same row shape as mob_evaluate (reference NULL), with real-trained reference rows where
-- they apply.
CREATE OR REPLACE TEMP MACRO mob_downstream(real, synth, bbox := NULL, task := 'next_location', w := 32,
                                           modes := NULL, seed := NULL) AS TABLE
SELECT unnest(_mob_downstream(_mob_eval_points(real), _mob_eval_points(synth),
    (SELECT list(DISTINCT {'traj_id': traj_id::BIGINT, 'mode': m::VARCHAR})
     FROM query('SELECT traj_id, coalesce(*COLUMNS(''^(mode|__mob_no_mode)$'')) AS m FROM (SELECT *, NULL AS '
                || '__mob_no_mode FROM ' || synth || ')')
     WHERE task = 'mode'),
    {'bbox': bbox, 'task': task, 'w': w, 'modes': modes, 'seed': seed::BIGINT}), recursive := true);

-- The real trips with a transport mode, for task := 'mode': runs of fixes inside one label interval
-- (modes := Parquet path or table of user_id, start, end, mode; joined by user and time), one traj_id per
-- trip, with its mode. Synthesize each mode's trips separately and stack the results with a mode column.
CREATE OR REPLACE TEMP MACRO mob_mode_trips(real, modes := NULL) AS TABLE
SELECT unnest(_mob_mode_trips(_mob_eval_points(real), {'modes': modes}), recursive := true);
