-- Synthesis from SQL: fit a method on a trajectory table under the source's privacy budget, store it, sample it.
-- Every macro shares one parameter list (see duckmob/sql/synth.py for what each one means):
--   eps, delta (NULL: the method's default), method ('privtrace', 'hrnet', 'baseline', 'cleanslate', 'pategail'), bbox (required,
--   [min_lat, min_lon, max_lat, max_lon], public), n (NULL: the model's noisy trajectory count), seed (NULL:
--   OS entropy), privacy_unit ('trajectory' | 'user'), max_trajectories_per_user (k, for 'user'),
--   params (method-specific: a JSON string '{"K": 8}' or a STRUCT {'K': 8}), outside ('drop': a private
--   release drops points outside the bbox, it cannot refuse because of them),
--   and the column mapping of mob_points (traj_col, ts_col, lat_col, lon_col, user_col).

-- params as a JSON string whether given as JSON text, a STRUCT or a MAP.
CREATE OR REPLACE TEMP MACRO _mob_params_json(params) AS
    CASE WHEN params IS NULL THEN NULL
         WHEN typeof(params) = 'VARCHAR' THEN params::VARCHAR
         ELSE to_json(params)::VARCHAR END;

-- The points reach the hidden UDFs as one list per column (aligned: one ungrouped aggregate), which costs DuckDB
-- about half the memory of one list of structs; user ids are only gathered when the privacy unit is a user
-- (the CASE folds away otherwise), sequence numbers only for rows without a timestamp.
CREATE OR REPLACE TEMP MACRO _mob_user_list(user_id, privacy_unit) AS
    CASE WHEN lower(coalesce(privacy_unit, 'trajectory')) = 'user' THEN list(user_id) END;

-- Out of core (duckmob/stream.py): when the release core's own connection can read tbl (a committed table or
-- view, or a query over them; decided once when the statement is planned), the release reads it itself in buckets
-- of whole trajectories after its reservation, and memory follows the model; the second branch below is then
-- never scanned. Temp tables and CTEs are gathered as lists (the in-memory path). Both give the same release.
-- A temp table or view named like the table read out of core is refused (it would hide it from the caller):
-- _mob_shadowed, defined in privacy.sql (loaded first).

-- A synthetic trajectory table (traj_id, seq, lat, lon, ts; ts NULL where the method models no time):
-- fit + sample in one call, spending eps once from the budget of tbl; the model is not stored.
CREATE OR REPLACE TEMP MACRO synthesize(tbl, eps := NULL, delta := NULL, method := 'privtrace', bbox := NULL,
                                       n := NULL, seed := NULL, privacy_unit := 'trajectory',
                                       max_trajectories_per_user := NULL, params := NULL, outside := 'drop',
                                       traj_col := 'traj_id', ts_col := 'ts', lat_col := 'lat', lon_col := 'lon',
                                       user_col := 'user_id') AS TABLE
SELECT unnest(_mob_synthesize_source(tbl, traj_col, ts_col, lat_col, lon_col, user_col, _mob_shadowed(tbl), eps,
                                     delta, method, bbox, privacy_unit, max_trajectories_per_user,
                                     _mob_params_json(params), outside, n, seed), recursive := true)
WHERE _mob_out_of_core(tbl)
UNION ALL
SELECT unnest(_mob_synthesize(list(traj_id), _mob_user_list(user_id, privacy_unit), list(ts), list(lat),
                              list(lon), list(seq) FILTER (WHERE ts IS NULL),
                              tbl, eps, delta, method, bbox, privacy_unit, max_trajectories_per_user,
                              _mob_params_json(params), outside, n, seed), recursive := true)
FROM mob_points(tbl, traj_col := traj_col, ts_col := ts_col, lat_col := lat_col, lon_col := lon_col,
                user_col := user_col)
WHERE NOT _mob_out_of_core(tbl) HAVING NOT _mob_out_of_core(tbl);

-- Fit once (one ledger entry) and store the model in duckmob_models under `name`; returns one summary row.
CREATE OR REPLACE TEMP MACRO mob_fit(tbl, name, eps := NULL, delta := NULL, method := 'privtrace', bbox := NULL,
                                    seed := NULL, privacy_unit := 'trajectory', max_trajectories_per_user := NULL,
                                    params := NULL, outside := 'drop', traj_col := 'traj_id', ts_col := 'ts',
                                    lat_col := 'lat', lon_col := 'lon', user_col := 'user_id') AS TABLE
SELECT unnest(_mob_fit_source(tbl, traj_col, ts_col, lat_col, lon_col, user_col, _mob_shadowed(tbl), name, eps,
                              delta, method, bbox, privacy_unit, max_trajectories_per_user, _mob_params_json(params),
                              outside, seed), recursive := true)
WHERE _mob_out_of_core(tbl)
UNION ALL
SELECT unnest(_mob_fit(list(traj_id), _mob_user_list(user_id, privacy_unit), list(ts), list(lat), list(lon),
                       list(seq) FILTER (WHERE ts IS NULL),
                       tbl, name, eps, delta, method, bbox, privacy_unit, max_trajectories_per_user,
                       _mob_params_json(params), outside, seed), recursive := true)
FROM mob_points(tbl, traj_col := traj_col, ts_col := ts_col, lat_col := lat_col, lon_col := lon_col,
                user_col := user_col)
WHERE NOT _mob_out_of_core(tbl) HAVING NOT _mob_out_of_core(tbl);

-- Draw n trajectories from a stored model: no data is read and no budget is spent.
CREATE OR REPLACE TEMP MACRO mob_sample(name, n := NULL, seed := NULL) AS TABLE
SELECT unnest(_mob_sample(name, n, seed), recursive := true);

-- The stored models with their method, privacy unit, parameters (JSON), spend and whether the fit was seeded
-- ("seeded, not for release").
CREATE OR REPLACE TEMP MACRO mob_models() AS TABLE
SELECT name, method, source, coalesce(params->>'privacy_unit', 'trajectory') AS privacy_unit,
       coalesce((params->>'seeded')::BOOLEAN, false) AS seeded, params, eps, delta, created_at
FROM duckmob_models ORDER BY created_at, name;
