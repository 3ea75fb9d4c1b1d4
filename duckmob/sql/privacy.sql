-- Privacy budgets and the ledger (duckmob.privacy.ledger), noisy counts and noisy transition counts.
-- No function here ever returns an exact count computed from a table.

-- What a release needs to know of the calling connection (facts about its catalog, never about data): the relation
-- as given, the caller's database and schema (a bare name resolves there, also after ATTACH + USE), and its
-- temporary tables and views (read on another connection, a name one of them shadows would mean another object).
CREATE OR REPLACE TEMP MACRO _mob_caller(tbl) AS
    {'relation': tbl, 'database': current_database(), 'schema': current_schema(),
     'temp_tables': coalesce((SELECT list(table_name) FROM duckdb_tables() WHERE temporary), []),
     'temp_views': coalesce((SELECT list(view_name) FROM duckdb_views() WHERE temporary AND NOT internal), [])};

-- Whether the release core's own connection can read `tbl` (a committed table or view, or a query over them, as the
-- caller's database and schema resolve it): folded once when the statement is planned, so the gathered rows of a
-- table read out of core are never scanned (see the release macros below and in synth.sql).
CREATE OR REPLACE TEMP MACRO _mob_readable(tbl) AS
    _mob_out_of_core({'relation': tbl, 'database': current_database(), 'schema': current_schema()});

-- Declare or raise the (eps, delta) budget of a table (any spelling of its name, or a view over that one table: the
-- budget belongs to the base table); lowering it below what is spent is refused. A first declaration for a name that
-- is no table or view is refused (a typo would otherwise budget nothing).
CREATE OR REPLACE TEMP MACRO mob_set_budget(source, eps := NULL, delta := NULL) AS TABLE
SELECT unnest(_mob_set_budget({'source': _mob_caller(source), 'eps': eps, 'delta': delta}), recursive := true);

-- One row per source: its latest budget, what is spent (PLD composition of every recorded release at the
-- budget's delta, or the exact sum for pure Laplace), what remains, and how many releases were recorded. The ledger is
-- verified first, as a release verifies it (rows, declarations and the head file <database file>.duckmob-ledger): a
-- tampered ledger is refused with the LedgerTampered message a release would get, never shown as a clean one.
CREATE OR REPLACE TEMP MACRO mob_budget() AS TABLE
SELECT unnest(_mob_budgets(true), recursive := true);

-- Every recorded release, oldest first; params and event are JSON; status is reserved (in progress), spent,
-- failed (after the data was read: it counts) or cancelled (refused before any data was read: it does not).
-- Verified first, like mob_budget(): a tampered ledger is refused.
CREATE OR REPLACE TEMP MACRO mob_ledger() AS TABLE
SELECT * REPLACE (params::JSON AS params, event::JSON AS event)
FROM (SELECT unnest(_mob_ledger(true), recursive := true));

-- Each counting macro below has one body, which reads its input one of two ways, chosen once when the statement is
-- planned (_mob_readable, as in synth.sql). When the release core's own connection can read `tbl` (a committed table
-- or view, or a query over them), the WHERE below is false, the rows are never scanned, and the UDF, told so by the
-- request's out_of_core, resolves the lineage and the column types on the schema, reserves, and reads the table out of
-- core itself (DuckDB counts the pairs, or the cell sequences come in record batches of whole sequences). Otherwise
-- `tbl` must be a temporary table of the caller: its rows are gathered (one per trajectory, values TRY_CAST) as one
-- list, with the column types (typeof: the schema, the same on an empty table) checked before anything is reserved.
-- The same release either way.

-- The column types of a table of trajectories (traj_id, user_id, cells), as typeof spells them (in an aggregate).
CREATE OR REPLACE TEMP MACRO _mob_id_types(traj_id, user_id, cells) AS
    [typeof(any_value(traj_id)), typeof(any_value(user_id)), typeof(any_value(cells))];

CREATE OR REPLACE TEMP MACRO _mob_raw_ids(tbl, traj_col, user_col, cells_col) AS TABLE
FROM query('SELECT ' || _mob_column_sql(traj_col, 'traj_id') || ', ' || _mob_column_sql(user_col, 'user_id') ||
           ', ' || CASE WHEN cells_col IS NULL THEN 'NULL::BIGINT[] AS cells'
                        ELSE _mob_column_sql(cells_col, 'cells') END ||
           ' FROM (SELECT *, NULL AS __mob_none FROM ' || tbl || ')');

-- eps-DP length-normalised transition counts (PrivTrace §4.3, App. B.2) of a table of cell sequences
-- (traj_id, user_id, cells BIGINT[]: the output of mob_cell_sequences), noised on the whole data-independent
-- support and NormCut per row: rows (prev_state, from_state, to_state, count) with count > 0; prev_state is NULL
-- for markov_order 1; state n_states is the virtual start, n_states + 1 the virtual end. Checks and records the
-- budget of every base table `tbl` reads. n_states is public (w * w); support := 'neighbours' (with w) restricts to
-- neighbouring cells; privacy_unit := 'user' needs max_trajectories_per_user := k.
CREATE OR REPLACE TEMP MACRO mob_transitions(tbl, markov_order := 1, eps := NULL, n_states := NULL, seed := NULL,
                                            privacy_unit := 'trajectory', max_trajectories_per_user := NULL,
                                            max_length := NULL, support := NULL, w := NULL,
                                            traj_col := 'traj_id', user_col := 'user_id',
                                            cells_col := 'cells', stability := NULL) AS TABLE
SELECT unnest(_mob_transitions(list({'traj_id': TRY_CAST(traj_id AS BIGINT), 'user_id': TRY_CAST(user_id AS BIGINT),
                                     'cells': TRY_CAST(cells AS BIGINT[])}),
                               {'source': _mob_caller(tbl), 'out_of_core': _mob_readable(tbl),
                                'types': _mob_id_types(traj_id, user_id, cells),
                                'mapping': {'traj_col': traj_col, 'user_col': user_col, 'cells_col': cells_col},
                                'order': markov_order, 'eps': eps, 'n_states': n_states, 'seed': seed,
                                'privacy_unit': privacy_unit, 'max_trajectories_per_user': max_trajectories_per_user,
                                'max_length': max_length, 'support': support, 'w': w,
                                'stability': stability}), recursive := true)
FROM _mob_raw_ids(tbl, traj_col, user_col, cells_col)
WHERE NOT _mob_readable(tbl);

-- An eps-DP count of the trajectories or users of a table: one row (count DOUBLE). Sensitivity 1 per trajectory;
-- with privacy_unit := 'user', at most max_trajectories_per_user := k are counted per user and the sensitivity is k.
-- A trajectory is a (user_id, traj_id) pair, as everywhere (one traj_id used by two users is two trajectories).
-- Checks and records the budget of every base table `tbl` reads.
CREATE OR REPLACE TEMP MACRO mob_noisy_count(tbl, eps := NULL, seed := NULL, privacy_unit := 'trajectory',
                                            max_trajectories_per_user := NULL, what := 'trajectories',
                                            traj_col := 'traj_id', user_col := 'user_id', stability := NULL) AS TABLE
SELECT unnest(_mob_noisy_count(list({'traj_id': TRY_CAST(traj_id AS BIGINT), 'user_id': TRY_CAST(user_id AS BIGINT)}),
                               {'source': _mob_caller(tbl), 'out_of_core': _mob_readable(tbl),
                                'types': _mob_id_types(traj_id, user_id, NULL::BIGINT[]),
                                'mapping': {'traj_col': traj_col, 'user_col': user_col},
                                'eps': eps, 'seed': seed, 'privacy_unit': privacy_unit,
                                'max_trajectories_per_user': max_trajectories_per_user, 'what': what,
                                'stability': stability}),
              recursive := true)
FROM _mob_raw_ids(tbl, traj_col, user_col, NULL)
WHERE NOT _mob_readable(tbl);
