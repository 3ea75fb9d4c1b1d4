-- Privacy budgets and the ledger (duckmob.privacy.ledger), noisy counts and noisy transition counts.
-- No function here ever returns an exact count computed from a table.

-- Whether `name` names a table or view this connection sees (TEMP ones included): bare, or qualified by schema
-- and/or database, quoted or not, in any case; a parenthesised query counts as present (reading it will tell).
-- A fact about the catalog, not the data.
CREATE OR REPLACE TEMP MACRO _mob_relation_exists(name) AS (
    starts_with(trim(name), '(') OR EXISTS (
        SELECT 1
        FROM (SELECT database_name AS d, schema_name AS s, table_name AS n FROM duckdb_tables()
              UNION ALL
              SELECT database_name, schema_name, view_name FROM duckdb_views() WHERE NOT internal)
        WHERE lower(replace(trim(name), '"', '')) IN (lower(n), lower(s || '.' || n), lower(d || '.' || n),
                                                      lower(d || '.' || s || '.' || n))));

-- Declare or raise the (eps, delta) budget of a source table; lowering it below what is spent is refused. A first
-- declaration for a name that is no table or view is refused (a typo would otherwise budget nothing).
CREATE OR REPLACE TEMP MACRO mob_set_budget(source, eps := NULL, delta := NULL) AS TABLE
SELECT unnest(_mob_set_budget(source, eps, delta, _mob_relation_exists(source)), recursive := true);

-- One row per source: its latest budget, what is spent (PLD composition of every recorded release at the
-- budget's delta, or the exact sum for pure Laplace), what remains, and how many releases were recorded.
CREATE OR REPLACE TEMP MACRO mob_budget() AS TABLE
SELECT unnest(_mob_budgets(true), recursive := true);

-- Every recorded release, oldest first; params and event are JSON; status is reserved (in progress), spent,
-- failed (after the data was read: it counts) or cancelled (refused before any data was read: it does not).
CREATE OR REPLACE TEMP MACRO mob_ledger() AS TABLE
SELECT * REPLACE (params::JSON AS params, event::JSON AS event)
FROM (SELECT unnest(_mob_ledger(true), recursive := true));

-- The user column's name, or NULL when the table has none (only the NULL stand-in matched): a fact about the
-- schema (typeof is the column's type, the same on an empty table), passed so a release that needs user ids is
-- refused before anything is reserved.
CREATE OR REPLACE TEMP MACRO _mob_user_col(user_type, user_col) AS
    CASE WHEN user_type IN ('NULL', '"NULL"') THEN NULL ELSE user_col END;

-- Whether a column type (typeof) is an integer type (or the NULL stand-in of a missing user column).
CREATE OR REPLACE TEMP MACRO _mob_integer_type(t) AS
    t IN ('NULL', '"NULL"', 'TINYINT', 'SMALLINT', 'INTEGER', 'BIGINT', 'UTINYINT', 'USMALLINT', 'UINTEGER',
          'UBIGINT', 'HUGEINT', 'UHUGEINT');

-- `tbl` when its id columns are integers and its cells (cells_type NULL: none) lists of integers; otherwise an
-- error naming the column and its type. The types are typeof(any_value(column)) of the release's one aggregate
-- row: the column's type, the same on an empty table, so the check depends on the schema only and never quotes a
-- value (a plain ::BIGINT cast refused the first value it could not convert, quoting it). The values are then
-- TRY_CAST: an integer beyond BIGINT (UBIGINT, HUGEINT) becomes NULL (no id; a sequence with a NULL cell is
-- dropped).
CREATE OR REPLACE TEMP MACRO _mob_typed_source(tbl, traj_type, user_type, cells_type, traj_col, user_col,
                                               cells_col) AS
    CASE WHEN NOT _mob_integer_type(traj_type)
         THEN error('duckmob: trajectory id column ' || traj_col || ' has type ' || traj_type || ', not an integer: '
                    || 'number the trajectories, e.g. dense_rank() OVER (ORDER BY ' || traj_col || '), or name '
                    || 'another column with traj_col := ...')
         WHEN NOT _mob_integer_type(user_type)
         THEN error('duckmob: user id column ' || user_col || ' has type ' || user_type || ', not an integer: '
                    || 'number the users, e.g. dense_rank() OVER (ORDER BY ' || user_col || '), or name another '
                    || 'column with user_col := ...')
         WHEN cells_type IS NOT NULL AND NOT (ends_with(cells_type, '[]')
                                              AND _mob_integer_type(left(cells_type, length(cells_type) - 2)))
         THEN error('duckmob: cells column ' || cells_col || ' has type ' || cells_type || ', not a list of '
                    || 'integer cell ids (the cells of mob_cell_sequences): name it with cells_col := ...')
         ELSE tbl END;

-- Whether a temporary table or view of this connection is named `tbl`: it would hide the committed table of that
-- name that a release reads out of core (on the release core's own connection), so such a release is refused. A
-- fact about the catalog, not the data. (synth.sql's macros use it too.)
CREATE OR REPLACE TEMP MACRO _mob_shadowed(tbl) AS
    EXISTS (SELECT 1 FROM duckdb_tables() WHERE temporary AND table_name = tbl)
    OR EXISTS (SELECT 1 FROM duckdb_views() WHERE temporary AND NOT internal AND view_name = tbl);

-- Both counting macros below have two branches, of which exactly one runs: _mob_out_of_core(tbl) is folded once
-- when the statement is planned (as in synth.sql). When the release core's own connection can read `tbl` (a
-- committed table or view, or a query over them), the first branch checks the column types on zero rows
-- (LIMIT 0: the schema, never a value) and hands only the table's name to a UDF that reads it out of core after
-- the reservation (duckmob.stream: DuckDB counts the pairs, or the cell sequences come in record batches of whole
-- sequences); memory follows the batch and the model, not the table. Otherwise (temp tables, CTEs) the second
-- branch gathers the rows (one per trajectory) as one list, as before. The same release either way.

-- eps-DP length-normalised transition counts (PrivTrace §4.3, App. B.2) of a table of cell sequences
-- (traj_id, user_id, cells BIGINT[]: the output of mob_cell_sequences), noised on the whole data-independent
-- support and NormCut per row: rows (prev_state, from_state, to_state, count) with count > 0; prev_state is NULL
-- for markov_order 1; state n_states is the virtual start, n_states + 1 the virtual end. Checks and records the
-- budget of the source `tbl`. n_states is public (w * w); support := 'neighbours' (with w) restricts to
-- neighbouring cells; privacy_unit := 'user' needs max_trajectories_per_user := k.
CREATE OR REPLACE TEMP MACRO mob_transitions(tbl, markov_order := 1, eps := NULL, n_states := NULL, seed := NULL,
                                            privacy_unit := 'trajectory', max_trajectories_per_user := NULL,
                                            max_length := NULL, support := NULL, w := NULL,
                                            traj_col := 'traj_id', user_col := 'user_id',
                                            cells_col := 'cells') AS TABLE
SELECT unnest(_mob_transitions_source(_mob_typed_source(tbl, typeof(any_value(traj_id)),
                                                        typeof(any_value(user_id)), typeof(any_value(cells)),
                                                        traj_col, user_col, cells_col),
                                      traj_col, user_col, cells_col, _mob_shadowed(tbl), markov_order, eps, n_states,
                                      seed, privacy_unit, max_trajectories_per_user, max_length, support, w,
                                      _mob_user_col(typeof(any_value(user_id)), user_col)),
              recursive := true)
FROM query('SELECT ' || traj_col || ' AS traj_id, ' ||
           'coalesce(*COLUMNS(''^(' || user_col || '|__mob_no_user)$'')) AS user_id, ' ||
           cells_col || ' AS cells FROM (SELECT *, NULL AS __mob_no_user FROM ' || tbl || ') LIMIT 0')
HAVING _mob_out_of_core(tbl)
UNION ALL
SELECT unnest(_mob_transitions(list({'traj_id': TRY_CAST(traj_id AS BIGINT), 'user_id': TRY_CAST(user_id AS BIGINT),
                                     'cells': TRY_CAST(cells AS BIGINT[])}),
                               _mob_typed_source(tbl, typeof(any_value(traj_id)), typeof(any_value(user_id)),
                                                 typeof(any_value(cells)), traj_col, user_col, cells_col),
                               markov_order, eps, n_states, seed, privacy_unit, max_trajectories_per_user,
                               max_length, support, w, _mob_user_col(typeof(any_value(user_id)), user_col)),
              recursive := true)
FROM query('SELECT ' || traj_col || ' AS traj_id, ' ||
           'coalesce(*COLUMNS(''^(' || user_col || '|__mob_no_user)$'')) AS user_id, ' ||
           cells_col || ' AS cells FROM (SELECT *, NULL AS __mob_no_user FROM ' || tbl || ')')
WHERE NOT _mob_out_of_core(tbl) HAVING NOT _mob_out_of_core(tbl);

-- An eps-DP count of the trajectories (distinct traj_id) or users of a table: one row (count DOUBLE).
-- Sensitivity 1 per trajectory; with privacy_unit := 'user', at most max_trajectories_per_user := k are counted
-- per user and the sensitivity is k. A trajectory is a (user_id, traj_id) pair, as everywhere (one traj_id used
-- by two users is two trajectories). Checks and records the budget of `tbl`.
CREATE OR REPLACE TEMP MACRO mob_noisy_count(tbl, eps := NULL, seed := NULL, privacy_unit := 'trajectory',
                                            max_trajectories_per_user := NULL, what := 'trajectories',
                                            traj_col := 'traj_id', user_col := 'user_id') AS TABLE
SELECT unnest(_mob_noisy_count_source(_mob_typed_source(tbl, typeof(any_value(traj_id)),
                                                        typeof(any_value(user_id)), NULL, traj_col, user_col, NULL),
                                      traj_col, user_col, _mob_shadowed(tbl), eps, seed, privacy_unit,
                                      max_trajectories_per_user, what,
                                      _mob_user_col(typeof(any_value(user_id)), user_col)), recursive := true)
FROM query('SELECT ' || traj_col || ' AS traj_id, ' ||
           'coalesce(*COLUMNS(''^(' || user_col || '|__mob_no_user)$'')) AS user_id ' ||
           'FROM (SELECT *, NULL AS __mob_no_user FROM ' || tbl || ') LIMIT 0')
HAVING _mob_out_of_core(tbl)
UNION ALL
SELECT unnest(_mob_noisy_count(list({'traj_id': TRY_CAST(traj_id AS BIGINT), 'user_id': TRY_CAST(user_id AS BIGINT)}),
                               _mob_typed_source(tbl, typeof(any_value(traj_id)), typeof(any_value(user_id)), NULL,
                                                 traj_col, user_col, NULL), eps, seed,
                               privacy_unit, max_trajectories_per_user, what,
                               _mob_user_col(typeof(any_value(user_id)), user_col)), recursive := true)
FROM query('SELECT ' || traj_col || ' AS traj_id, ' ||
           'coalesce(*COLUMNS(''^(' || user_col || '|__mob_no_user)$'')) AS user_id ' ||
           'FROM (SELECT *, NULL AS __mob_no_user FROM ' || tbl || ') GROUP BY ALL')
WHERE NOT _mob_out_of_core(tbl) HAVING NOT _mob_out_of_core(tbl);
