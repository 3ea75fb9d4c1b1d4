-- Synthesis from SQL: fit a method on a trajectory table under the source's privacy budget, store it, sample it.
-- Every macro shares one parameter list (see duckmob/sql/synth.py for what each one means):
--   eps, delta (NULL: the method's default), method ('privtrace', 'hrnet', 'baseline', 'cleanslate', 'pategail'), bbox (required,
--   [min_lat, min_lon, max_lat, max_lon], public), n (NULL: the model's noisy trajectory count), seed (NULL:
--   OS entropy), privacy_unit ('trajectory' | 'user'), max_trajectories_per_user (k, for 'user'),
--   params (method-specific: a JSON string '{"K": 8}' or a STRUCT {'K': 8}), outside ('drop': a private
--   release drops points outside the bbox, it cannot refuse because of them), max_rows (NULL: 30 billion; an output
--   that could have more rows, n times the method's public cap on points per trajectory, is refused before any row
--   is drawn, and with an explicit n before anything is spent),
--   the column mapping of mob_points (traj_col, ts_col, lat_col, lon_col, user_col), and stability (NULL: a
--   relation whose plan can turn one base row into several -- a join, union, unnest, window, aggregate -- is refused;
--   s: the public most rows one base row becomes, every sensitivity times s; privtrace only), and roads (NULL, or a
--   public table of road segments lat1, lon1, lat2, lon2: every synthetic point is placed on a road, and consecutive
--   points are joined by a road path), scatter_m (NULL: points exactly on the roads; e.g. 4: a public GPS-like
--   scatter of that many metres, post-processing; needs roads).
--
-- Output streams: synthesize and mob_sample open the output once per query (a MATERIALIZED CTE: the fit, or the
-- stored model loaded, and the output's seed, kept under a handle), then hand _mob_draw the trajectory ids 0 .. n-1,
-- 2048 at a time, one block per block of ids (ranges of 2048 per block: no list of n ids is built). Each call draws
-- exactly its block from its own seed stream (duckmob/release/sampling.py), so memory stays a few blocks (one, plus
-- one per drawing thread) whatever n is, and the rows under a seed do not depend on how DuckDB cuts them. The CTEs' columns are named _mob_*: a plain
-- `n` there would be the macro's parameter n (NULL by default), not the column.

-- params as a JSON string whether given as JSON text, a STRUCT or a MAP.
CREATE OR REPLACE TEMP MACRO _mob_params_json(params) AS
    CASE WHEN params IS NULL THEN NULL
         WHEN typeof(params) = 'VARCHAR' THEN params::VARCHAR
         ELSE to_json(params)::VARCHAR END;

-- Every release reads through one input path (duckmob/source), one of two ways chosen once when the statement is
-- planned (_mob_readable, in privacy.sql). When the release core's own connection can read tbl (a committed table or
-- view, or a query over them, as the caller's database and schema resolve it), the WHERE below is false, so the rows
-- are never scanned, and the UDF, told so by the request's out_of_core, resolves the lineage and column types on the
-- schema, reserves, and reads the table itself out of core with TRY_CAST. Otherwise tbl must be a temporary table of
-- the caller: its rows are gathered as one list per column, values TRY_CAST, their column types (typeof: the schema,
-- the same on an empty table) passed along in the request and checked before anything is reserved. CTEs and
-- temporary views are refused there (what they read cannot be seen from a UDF).
-- The request STRUCT holds every argument by name (duckmob/sql/synth.py, FIT, says what the UDF expects).

-- A synthetic trajectory table (traj_id, seq, lat, lon, ts; ts NULL where the method models no time):
-- fit + sample in one call, spending eps once from the budget of every base table tbl reads; the model is not stored.
CREATE OR REPLACE TEMP MACRO synthesize(tbl, eps := NULL, delta := NULL, method := 'privtrace', bbox := NULL,
                                       n := NULL, seed := NULL, privacy_unit := 'trajectory',
                                       max_trajectories_per_user := NULL, params := NULL, outside := 'drop',
                                       traj_col := 'traj_id', ts_col := 'ts', lat_col := 'lat', lon_col := 'lon',
                                       user_col := 'user_id', max_rows := NULL, stability := NULL,
                                       roads := NULL, scatter_m := NULL) AS TABLE
WITH _mob_out AS MATERIALIZED (
SELECT _mob_synthesize(list(TRY_CAST(traj_id AS BIGINT)), list(TRY_CAST(user_id AS BIGINT)),
                              list(TRY_CAST(ts AS TIMESTAMP)), list(TRY_CAST(lat AS DOUBLE)),
                              list(TRY_CAST(lon AS DOUBLE)),
                              list(CASE WHEN TRY_CAST(ts AS TIMESTAMP) IS NULL THEN TRY_CAST(seq AS BIGINT) END),
                              {'source': _mob_caller(tbl), 'out_of_core': _mob_readable(tbl),
                               'types': _mob_point_types(traj_id, user_id, ts, lat, lon),
                               'mapping': {'traj_col': traj_col, 'ts_col': ts_col, 'lat_col': lat_col,
                                           'lon_col': lon_col, 'user_col': user_col},
                               'eps': eps, 'delta': delta, 'method': method, 'bbox': bbox,
                               'privacy_unit': privacy_unit, 'max_trajectories_per_user': max_trajectories_per_user,
                               'params': _mob_params_json(params), 'outside': outside, 'seed': seed, 'n': n,
                               'max_rows': max_rows, 'name': NULL, 'stability': stability,
                               'roads': roads, 'scatter_m': scatter_m}) AS _mob_o
FROM _mob_raw_points(tbl, traj_col, ts_col, lat_col, lon_col, user_col)
WHERE NOT _mob_readable(tbl)),
_mob_blocks AS (SELECT struct_extract(_mob_o, 'handle') AS _mob_h, struct_extract(_mob_o, 'n') AS _mob_n,
                       unnest(range(struct_extract(_mob_o, 'blocks'))) AS _mob_b FROM _mob_out),
_mob_ids AS (SELECT _mob_h, unnest(range(_mob_b * 2048, least(_mob_b * 2048 + 2048, _mob_n))) AS _mob_i
             FROM _mob_blocks)
SELECT unnest(_mob_draw(_mob_h, _mob_i), recursive := true) FROM _mob_ids;

-- Fit once (one ledger entry) and store the model in duckmob_models under `name`; returns one summary row.
CREATE OR REPLACE TEMP MACRO mob_fit(tbl, name, eps := NULL, delta := NULL, method := 'privtrace', bbox := NULL,
                                    seed := NULL, privacy_unit := 'trajectory', max_trajectories_per_user := NULL,
                                    params := NULL, outside := 'drop', traj_col := 'traj_id', ts_col := 'ts',
                                    lat_col := 'lat', lon_col := 'lon', user_col := 'user_id',
                                    stability := NULL, roads := NULL, scatter_m := NULL) AS TABLE
SELECT unnest(_mob_fit(list(TRY_CAST(traj_id AS BIGINT)), list(TRY_CAST(user_id AS BIGINT)),
                       list(TRY_CAST(ts AS TIMESTAMP)), list(TRY_CAST(lat AS DOUBLE)), list(TRY_CAST(lon AS DOUBLE)),
                       list(CASE WHEN TRY_CAST(ts AS TIMESTAMP) IS NULL THEN TRY_CAST(seq AS BIGINT) END),
                       {'source': _mob_caller(tbl), 'out_of_core': _mob_readable(tbl),
                        'types': _mob_point_types(traj_id, user_id, ts, lat, lon),
                        'mapping': {'traj_col': traj_col, 'ts_col': ts_col, 'lat_col': lat_col, 'lon_col': lon_col,
                                    'user_col': user_col},
                        'eps': eps, 'delta': delta, 'method': method, 'bbox': bbox, 'privacy_unit': privacy_unit,
                        'max_trajectories_per_user': max_trajectories_per_user, 'params': _mob_params_json(params),
                        'outside': outside, 'seed': seed, 'n': NULL, 'max_rows': NULL, 'name': name,
                        'stability': stability, 'roads': roads, 'scatter_m': scatter_m}),
              recursive := true)
FROM _mob_raw_points(tbl, traj_col, ts_col, lat_col, lon_col, user_col)
WHERE NOT _mob_readable(tbl);

-- Draw n trajectories from a stored model: no data is read and no budget is spent. Streams as synthesize does.
CREATE OR REPLACE TEMP MACRO mob_sample(name, n := NULL, seed := NULL, max_rows := NULL) AS TABLE
WITH _mob_out AS MATERIALIZED (
    SELECT _mob_sample({'name': name, 'n': n, 'seed': seed, 'max_rows': max_rows}) AS _mob_o),
_mob_blocks AS (SELECT struct_extract(_mob_o, 'handle') AS _mob_h, struct_extract(_mob_o, 'n') AS _mob_n,
                       unnest(range(struct_extract(_mob_o, 'blocks'))) AS _mob_b FROM _mob_out),
_mob_ids AS (SELECT _mob_h, unnest(range(_mob_b * 2048, least(_mob_b * 2048 + 2048, _mob_n))) AS _mob_i
             FROM _mob_blocks)
SELECT unnest(_mob_draw(_mob_h, _mob_i), recursive := true) FROM _mob_ids;

-- The stored models with their method, privacy unit, parameters (JSON), spend and whether the fit was seeded
-- ("seeded, not for release").
CREATE OR REPLACE TEMP MACRO mob_models() AS TABLE
SELECT name, method, source, coalesce(params->>'privacy_unit', 'trajectory') AS privacy_unit,
       coalesce((params->>'seeded')::BOOLEAN, false) AS seeded, params, eps, delta, created_at
FROM duckmob_models ORDER BY created_at, name;
