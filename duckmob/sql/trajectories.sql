-- Trajectories, grids and stay points. Scalar functions that SQL can express are plain SQL macros (an order
-- of magnitude faster than a Python UDF); table functions gather points into one list for a hidden UDF.

-- A bbox is [min_lat, min_lon, max_lat, max_lon] in degrees, declared by the user (never from the data).
CREATE OR REPLACE TEMP MACRO _mob_bbox_ok(bbox) AS
    CASE WHEN bbox IS NULL OR len(bbox) <> 4 OR list_has(bbox, NULL)
              OR NOT (bbox[1] < bbox[3] AND bbox[2] < bbox[4])
              OR bbox[1] < -90 OR bbox[3] > 90 OR bbox[2] < -180 OR bbox[4] > 180
         THEN error('duckmob: bbox must be [min_lat, min_lon, max_lat, max_lon] with min < max, latitudes in [-90, 90] and longitudes in [-180, 180]; got ' || coalesce(bbox::VARCHAR, 'NULL'))
         ELSE true END;

CREATE OR REPLACE TEMP MACRO _mob_w_ok(w) AS
    CASE WHEN w IS NULL OR w < 1 OR w <> floor(w)
         THEN error('duckmob: grid width w must be a positive integer; got ' || coalesce(w::VARCHAR, 'NULL'))
         ELSE true END;

CREATE OR REPLACE TEMP MACRO _mob_pow2_ok(w) AS
    CASE WHEN _mob_w_ok(w) AND (w::BIGINT & (w::BIGINT - 1)) <> 0
         THEN error('duckmob: quadtree functions need w = 2^d (2, 4, 8, 16, 32, ...); got ' || w::VARCHAR)
         ELSE true END;

-- Cell id on a w x w grid (HRNet §2.2.1): row * w + col; max edges fall in the last row/column; NULL outside.
CREATE OR REPLACE TEMP MACRO mob_cell(lat, lon, bbox, w) AS
    CASE WHEN NOT (_mob_bbox_ok(bbox) AND _mob_w_ok(w)) THEN NULL
         WHEN lat BETWEEN bbox[1] AND bbox[3] AND lon BETWEEN bbox[2] AND bbox[4]
         THEN least(floor((lat - bbox[1]) / (bbox[3] - bbox[1]) * w), w - 1)::BIGINT * w::BIGINT
              + least(floor((lon - bbox[2]) / (bbox[4] - bbox[2]) * w), w - 1)::BIGINT
    END;

-- Id of the cell covering `cell` in the 2^level x 2^level grid (HRNet's up_i); w = 2^d, 0 <= level <= d.
CREATE OR REPLACE TEMP MACRO mob_parent(cell, w, level) AS
    CASE WHEN NOT _mob_pow2_ok(w) THEN NULL
         WHEN level < 0 OR (1::BIGINT << level::INTEGER) > w
         THEN error('duckmob: level must be between 0 and log2(w) = ' || (log2(w))::BIGINT::VARCHAR || '; got ' || level::VARCHAR)
         ELSE ((cell // w) // (w // (1::BIGINT << level::INTEGER))) * (1::BIGINT << level::INTEGER)
              + ((cell % w) // (w // (1::BIGINT << level::INTEGER)))
    END;

-- The four children (at level + 1) of a cell of the 2^level x 2^level grid, in id order.
CREATE OR REPLACE TEMP MACRO mob_children(cell, level) AS
    [((cell // (1::BIGINT << level::INTEGER)) * 2 + k // 2) * (2::BIGINT << level::INTEGER)
      + (cell % (1::BIGINT << level::INTEGER)) * 2 + k % 2
     FOR k IN range(4)];

-- Bounds and centre of a cell, in degrees.
CREATE OR REPLACE TEMP MACRO mob_cell_bounds(cell, bbox, w) AS
    CASE WHEN _mob_bbox_ok(bbox) AND _mob_w_ok(w) THEN {
        'min_lat': bbox[1] + (cell // w) * (bbox[3] - bbox[1]) / w,
        'min_lon': bbox[2] + (cell % w) * (bbox[4] - bbox[2]) / w,
        'max_lat': bbox[1] + (cell // w + 1) * (bbox[3] - bbox[1]) / w,
        'max_lon': bbox[2] + (cell % w + 1) * (bbox[4] - bbox[2]) / w} END;

CREATE OR REPLACE TEMP MACRO mob_cell_center(cell, bbox, w) AS
    CASE WHEN _mob_bbox_ok(bbox) AND _mob_w_ok(w) THEN {
        'lat': bbox[1] + (cell // w + 0.5) * (bbox[3] - bbox[1]) / w,
        'lon': bbox[2] + (cell % w + 0.5) * (bbox[4] - bbox[2]) / w} END;

-- Slot 0 .. n_slots - 1 of the time of day (HRNet's n_time).
CREATE OR REPLACE TEMP MACRO mob_time_slot(ts, n_slots) AS
    CASE WHEN n_slots IS NULL OR n_slots < 1 OR n_slots <> floor(n_slots)
         THEN error('duckmob: n_slots must be a positive integer; got ' || coalesce(n_slots::VARCHAR, 'NULL'))
         ELSE ((epoch_us(ts::TIMESTAMP) % 86400000000 + 86400000000) % 86400000000) * n_slots::BIGINT // 86400000000
    END;

-- The user's column `name` (any case) of a relation, or NULL when it has none (typeof '"NULL"': the private paths
-- then say which mapping to set, from the schema alone). Inside query(): the select item for one column.
CREATE OR REPLACE TEMP MACRO _mob_column_sql(name, alias) AS
    'coalesce(*COLUMNS(''(?i)^(' || regexp_escape(name) || '|__mob_none)$'')) AS ' || alias;

-- The user's columns under the contract's names (traj_id, ts, lat, lon, user_id, seq), values as they are (NULL
-- for a column the table does not have; the time column must exist, NULL-typed for a table without time). `tbl`
-- may name a table, a view, a CTE or a parenthesised query.
CREATE OR REPLACE TEMP MACRO _mob_raw_points(tbl, traj_col, ts_col, lat_col, lon_col, user_col, seq_col := 'seq')
AS TABLE
SELECT __mob_traj_id AS traj_id, __mob_ts AS ts, __mob_lat AS lat, __mob_lon AS lon, __mob_user_id AS user_id,
       __mob_seq AS seq
FROM query('SELECT ' || _mob_column_sql(traj_col, '__mob_traj_id') || ', ' ||
           ts_col || ' AS __mob_ts, ' || _mob_column_sql(lat_col, '__mob_lat') || ', ' ||
           _mob_column_sql(lon_col, '__mob_lon') || ', ' || _mob_column_sql(user_col, '__mob_user_id') || ', ' ||
           _mob_column_sql(seq_col, '__mob_seq') || ' FROM (SELECT *, NULL AS __mob_none FROM ' || tbl || ')');

-- The column types of a points table, as typeof spells them, for the schema check of duckmob/source/schema.py
-- (inside an aggregate: the same on an empty table, and never a value).
CREATE OR REPLACE TEMP MACRO _mob_point_types(traj_id, user_id, ts, lat, lon) AS
    [typeof(any_value(traj_id)), typeof(any_value(user_id)), typeof(any_value(ts)), typeof(any_value(lat)),
     typeof(any_value(lon))];

-- The trajectory contract: maps the user's column names to traj_id, user_id, ts, lat, lon (and seq, used to
-- order points of a table without time) and checks their types, failing with a message that says the fix.
-- `tbl` may name a table, a view, a CTE or a parenthesised query. The input is only read.
CREATE OR REPLACE TEMP MACRO mob_points(tbl, traj_col := 'traj_id', ts_col := 'ts', lat_col := 'lat',
                                       lon_col := 'lon', user_col := 'user_id', seq_col := 'seq') AS TABLE
SELECT
    CASE WHEN typeof(traj_id) NOT IN ('TINYINT', 'SMALLINT', 'INTEGER', 'BIGINT', 'UTINYINT', 'USMALLINT',
                                      'UINTEGER', 'UBIGINT', 'HUGEINT')
         THEN error('duckmob: trajectory id column ' || traj_col || ' has type ' || typeof(traj_id) ||
                    ', not an integer: number the trajectories, e.g. dense_rank() OVER (ORDER BY ' || traj_col || '), or name another column with traj_col := ...')
         ELSE TRY_CAST(traj_id AS BIGINT) END AS traj_id,
    CASE WHEN typeof(user_id) NOT IN ('NULL', '"NULL"', 'TINYINT', 'SMALLINT', 'INTEGER', 'BIGINT', 'UTINYINT',
                                      'USMALLINT', 'UINTEGER', 'UBIGINT', 'HUGEINT')
         THEN error('duckmob: user id column ' || user_col || ' has type ' || typeof(user_id) ||
                    ', not an integer: number the users, e.g. dense_rank() OVER (ORDER BY ' || user_col || ')')
         ELSE TRY_CAST(user_id AS BIGINT) END AS user_id,
    CASE WHEN typeof(ts) NOT IN ('NULL', '"NULL"', 'TIMESTAMP', 'TIMESTAMP_S', 'TIMESTAMP_MS', 'TIMESTAMP_NS', 'DATE')
         THEN error('duckmob: time column ' || ts_col || ' has type ' || typeof(ts) ||
                    ', not TIMESTAMP: ' ||
                    -- the hints of duckmob.source.schema.time_fix: epoch seconds and TIMESTAMPTZ as UTC time
                    CASE WHEN typeof(ts) = 'TIMESTAMP WITH TIME ZONE'
                         THEN 'take its UTC time, e.g. ' || ts_col || ' AT TIME ZONE ''UTC'''
                         WHEN typeof(ts) IN ('TINYINT', 'SMALLINT', 'INTEGER', 'BIGINT', 'UTINYINT', 'USMALLINT',
                                             'UINTEGER', 'UBIGINT', 'HUGEINT', 'UHUGEINT', 'FLOAT', 'DOUBLE')
                              OR starts_with(typeof(ts), 'DECIMAL')
                         THEN 'convert epoch seconds to UTC time, e.g. to_timestamp(' || ts_col || ') AT TIME ZONE ''UTC'''
                         ELSE 'cast it, e.g. ' || ts_col || '::TIMESTAMP' END ||
                    ', or name another column with ts_col := ...')
         ELSE TRY_CAST(ts AS TIMESTAMP) END AS ts,
    CASE WHEN typeof(lat) NOT IN ('DOUBLE', 'FLOAT', 'DECIMAL', 'TINYINT', 'SMALLINT', 'INTEGER', 'BIGINT')
              AND NOT starts_with(typeof(lat), 'DECIMAL')
         THEN error('duckmob: latitude column ' || lat_col || ' has type ' || typeof(lat) ||
                    ', not a number: cast it with ' || lat_col || '::DOUBLE (WGS 84 degrees)')
         ELSE TRY_CAST(lat AS DOUBLE) END AS lat,
    CASE WHEN typeof(lon) NOT IN ('DOUBLE', 'FLOAT', 'DECIMAL', 'TINYINT', 'SMALLINT', 'INTEGER', 'BIGINT')
              AND NOT starts_with(typeof(lon), 'DECIMAL')
         THEN error('duckmob: longitude column ' || lon_col || ' has type ' || typeof(lon) ||
                    ', not a number: cast it with ' || lon_col || '::DOUBLE (WGS 84 degrees)')
         ELSE TRY_CAST(lon AS DOUBLE) END AS lon,
    TRY_CAST(seq AS BIGINT) AS seq
-- the columns referenced directly (not _mob_raw_points' stand-ins), so a missing one is reported as not found,
-- with DuckDB's closest candidates
FROM (SELECT __mob_traj_id AS traj_id, __mob_ts AS ts, __mob_lat AS lat, __mob_lon AS lon,
             __mob_user_id AS user_id, __mob_seq AS seq
      FROM query('SELECT ' || traj_col || ' AS __mob_traj_id, ' || ts_col || ' AS __mob_ts, ' || lat_col ||
                 ' AS __mob_lat, ' || lon_col || ' AS __mob_lon, ' || _mob_column_sql(user_col, '__mob_user_id') ||
                 ', ' || _mob_column_sql(seq_col, '__mob_seq') ||
                 ' FROM (SELECT *, NULL AS __mob_none FROM ' || tbl || ')'));

-- Stay points (Li et al. 2008; HRNet §5.1.2): one row per stay (traj_id, seq from 0, arrive_ts, leave_ts, lat, lon).
CREATE OR REPLACE TEMP MACRO mob_staypoints(tbl, radius_m := 200, min_minutes := 30, traj_col := 'traj_id',
                                           ts_col := 'ts', lat_col := 'lat', lon_col := 'lon',
                                           user_col := 'user_id') AS TABLE
SELECT unnest(_mob_staypoints(list({'traj_id': traj_id, 'user_id': user_id, 'ts': ts, 'lat': lat, 'lon': lon,
                                    'seq': seq}), {'radius_m': radius_m, 'min_minutes': min_minutes}),
              recursive := true)
FROM mob_points(tbl, traj_col := traj_col, ts_col := ts_col, lat_col := lat_col, lon_col := lon_col,
                user_col := user_col);

-- One row per trajectory: (traj_id, user_id, cells BIGINT[], ts TIMESTAMP[]), consecutive duplicate cells
-- collapsed; with stay_points the cells are HRNet's first fix, stay points, last fix. The input of every
-- synthesizer. outside := 'fail' | 'drop' decides what happens to points outside the bbox.
CREATE OR REPLACE TEMP MACRO mob_cell_sequences(tbl, bbox := NULL, w := 32, stay_points := true,
                                               radius_m := 200, min_minutes := 30, outside := 'fail',
                                               traj_col := 'traj_id', ts_col := 'ts', lat_col := 'lat',
                                               lon_col := 'lon', user_col := 'user_id') AS TABLE
SELECT unnest(_mob_cell_sequences(list({'traj_id': traj_id, 'user_id': user_id, 'ts': ts, 'lat': lat,
                                        'lon': lon, 'seq': seq}),
                                  {'bbox': bbox, 'w': w, 'stay_points': stay_points, 'radius_m': radius_m,
                                   'min_minutes': min_minutes, 'outside': outside}), recursive := true)
FROM mob_points(tbl, traj_col := traj_col, ts_col := ts_col, lat_col := lat_col, lon_col := lon_col,
                user_col := user_col);

-- A data-quality report for the data owner, one row (check, count, action) per check: the cleaning every private
-- release applies (what it drops silently: NULL ids, timestamps and coordinates, coordinates out of range, points
-- outside the bbox, repeated timestamps, trajectories left with fewer than 2 points), traj_ids shared by several
-- users (a trajectory is the pair (user_id, traj_id)), and what mob_staypoints / mob_cell_sequences refuse.
-- The counts are EXACT, NOT differentially private: do not share or publish the output. Every row says so in its
-- first column, exact_not_private (always true), as mob_evaluate's do, so it survives ORDER BY and filters. Points
-- out of time order are counted in the table's own row order (not the order a parallel scan happens to read).
CREATE OR REPLACE TEMP MACRO mob_check(tbl, bbox := NULL, traj_col := 'traj_id', ts_col := 'ts',
                                      lat_col := 'lat', lon_col := 'lon', user_col := 'user_id') AS TABLE
SELECT true AS exact_not_private, unnest(_mob_check(list({'traj_id': traj_id, 'user_id': user_id, 'ts': ts, 'lat': lat, 'lon': lon,
                               'seq': seq} ORDER BY __mob_row), {'bbox': bbox}), recursive := true)
FROM (SELECT *, row_number() OVER () AS __mob_row   -- the table's own row order, whatever the scan's threads
      FROM mob_points(tbl, traj_col := traj_col, ts_col := ts_col, lat_col := lat_col, lon_col := lon_col,
                      user_col := user_col));

-- Scattered points of interest (poi_id, lat, lon) -> distinct quadtree leaves minimising total distance
-- (HRNet §3.2.2): one row (poi_id, cell) per POI.
CREATE OR REPLACE TEMP MACRO mob_assign_pois(tbl, bbox := NULL, w := 32, id_col := 'poi_id',
                                            lat_col := 'lat', lon_col := 'lon') AS TABLE
SELECT unnest(_mob_assign_pois(list({'poi_id': poi_id, 'lat': lat, 'lon': lon}), {'bbox': bbox, 'w': w}),
              recursive := true)
FROM query('SELECT ' || id_col || '::BIGINT AS poi_id, ' || lat_col || '::DOUBLE AS lat, ' || lon_col ||
           '::DOUBLE AS lon FROM ' || tbl);
