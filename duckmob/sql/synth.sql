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

-- The public arguments of a fit, as one STRUCT (validated in Python by the release core).
CREATE OR REPLACE TEMP MACRO _mob_fit_args(eps, delta, method, bbox, privacy_unit, k, params, outside, seed, n,
                                           name) AS
    {'eps': eps, 'delta': delta, 'method': method, 'bbox': bbox, 'privacy_unit': privacy_unit, 'k': k,
     'params': _mob_params_json(params), 'outside': outside, 'seed': seed, 'n': n, 'name': name};

-- The column mapping, as one STRUCT.
CREATE OR REPLACE TEMP MACRO _mob_mapping(traj_col, ts_col, lat_col, lon_col, user_col) AS
    {'traj_col': traj_col, 'ts_col': ts_col, 'lat_col': lat_col, 'lon_col': lon_col, 'user_col': user_col};

-- Every release reads through one input path (duckmob/source): when the release core's own connection can read
-- tbl (a committed table or view, or a query over them, as the caller's database and schema resolve it; decided
-- once when the statement is planned), the release resolves its lineage and column types on the schema, reserves,
-- and reads it itself out of core with TRY_CAST; the second branch below is then never scanned. Otherwise tbl must
-- be a temporary table of the caller: its rows are gathered as one list per column, values TRY_CAST, their column
-- types (typeof: the schema, the same on an empty table) passed along and checked before anything is reserved.
-- CTEs and temporary views are refused there (what they read cannot be seen from a UDF).

-- A synthetic trajectory table (traj_id, seq, lat, lon, ts; ts NULL where the method models no time):
-- fit + sample in one call, spending eps once from the budget of every base table tbl reads; the model is not stored.
CREATE OR REPLACE TEMP MACRO synthesize(tbl, eps := NULL, delta := NULL, method := 'privtrace', bbox := NULL,
                                       n := NULL, seed := NULL, privacy_unit := 'trajectory',
                                       max_trajectories_per_user := NULL, params := NULL, outside := 'drop',
                                       traj_col := 'traj_id', ts_col := 'ts', lat_col := 'lat', lon_col := 'lon',
                                       user_col := 'user_id') AS TABLE
SELECT unnest(_mob_synthesize_source(_mob_caller(tbl), _mob_mapping(traj_col, ts_col, lat_col, lon_col, user_col),
                                     _mob_fit_args(eps, delta, method, bbox, privacy_unit, max_trajectories_per_user,
                                                   params, outside, seed, n, NULL)), recursive := true)
WHERE _mob_out_of_core(tbl, current_database(), current_schema())
UNION ALL
SELECT unnest(_mob_synthesize(list(TRY_CAST(traj_id AS BIGINT)), list(TRY_CAST(user_id AS BIGINT)),
                              list(TRY_CAST(ts AS TIMESTAMP)), list(TRY_CAST(lat AS DOUBLE)),
                              list(TRY_CAST(lon AS DOUBLE)),
                              list(TRY_CAST(seq AS BIGINT)) FILTER (WHERE TRY_CAST(ts AS TIMESTAMP) IS NULL),
                              _mob_caller(tbl), _mob_point_types(traj_id, user_id, ts, lat, lon),
                              _mob_mapping(traj_col, ts_col, lat_col, lon_col, user_col),
                              _mob_fit_args(eps, delta, method, bbox, privacy_unit, max_trajectories_per_user,
                                            params, outside, seed, n, NULL)), recursive := true)
FROM _mob_raw_points(tbl, traj_col, ts_col, lat_col, lon_col, user_col)
WHERE NOT _mob_out_of_core(tbl, current_database(), current_schema()) HAVING NOT _mob_out_of_core(tbl, current_database(), current_schema());

-- Fit once (one ledger entry) and store the model in duckmob_models under `name`; returns one summary row.
CREATE OR REPLACE TEMP MACRO mob_fit(tbl, name, eps := NULL, delta := NULL, method := 'privtrace', bbox := NULL,
                                    seed := NULL, privacy_unit := 'trajectory', max_trajectories_per_user := NULL,
                                    params := NULL, outside := 'drop', traj_col := 'traj_id', ts_col := 'ts',
                                    lat_col := 'lat', lon_col := 'lon', user_col := 'user_id') AS TABLE
SELECT unnest(_mob_fit_source(_mob_caller(tbl), _mob_mapping(traj_col, ts_col, lat_col, lon_col, user_col),
                              _mob_fit_args(eps, delta, method, bbox, privacy_unit, max_trajectories_per_user,
                                            params, outside, seed, NULL, name)), recursive := true)
WHERE _mob_out_of_core(tbl, current_database(), current_schema())
UNION ALL
SELECT unnest(_mob_fit(list(TRY_CAST(traj_id AS BIGINT)), list(TRY_CAST(user_id AS BIGINT)),
                       list(TRY_CAST(ts AS TIMESTAMP)), list(TRY_CAST(lat AS DOUBLE)), list(TRY_CAST(lon AS DOUBLE)),
                       list(TRY_CAST(seq AS BIGINT)) FILTER (WHERE TRY_CAST(ts AS TIMESTAMP) IS NULL),
                       _mob_caller(tbl), _mob_point_types(traj_id, user_id, ts, lat, lon),
                       _mob_mapping(traj_col, ts_col, lat_col, lon_col, user_col),
                       _mob_fit_args(eps, delta, method, bbox, privacy_unit, max_trajectories_per_user, params,
                                     outside, seed, NULL, name)), recursive := true)
FROM _mob_raw_points(tbl, traj_col, ts_col, lat_col, lon_col, user_col)
WHERE NOT _mob_out_of_core(tbl, current_database(), current_schema()) HAVING NOT _mob_out_of_core(tbl, current_database(), current_schema());

-- Draw n trajectories from a stored model: no data is read and no budget is spent.
CREATE OR REPLACE TEMP MACRO mob_sample(name, n := NULL, seed := NULL) AS TABLE
SELECT unnest(_mob_sample(name, n, seed), recursive := true);

-- The stored models with their method, privacy unit, parameters (JSON), spend and whether the fit was seeded
-- ("seeded, not for release").
CREATE OR REPLACE TEMP MACRO mob_models() AS TABLE
SELECT name, method, source, coalesce(params->>'privacy_unit', 'trajectory') AS privacy_unit,
       coalesce((params->>'seeded')::BOOLEAN, false) AS seeded, params, eps, delta, created_at
FROM duckmob_models ORDER BY created_at, name;
