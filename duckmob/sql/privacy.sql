-- Privacy budgets and the ledger (duckmob.privacy.ledger), noisy counts and noisy transition counts.
-- No function here ever returns an exact count computed from a table.

-- Declare or raise the (eps, delta) budget of a source table; lowering it below what is spent is refused.
CREATE OR REPLACE TEMP MACRO mob_set_budget(source, eps := NULL, delta := NULL) AS TABLE
SELECT unnest(_mob_set_budget(source, eps, delta), recursive := true);

-- One row per source: its latest budget, what is spent (PLD composition of every recorded release at the
-- budget's delta, or the exact sum for pure Laplace), what remains, and how many releases were recorded.
CREATE OR REPLACE TEMP MACRO mob_budget() AS TABLE
SELECT unnest(_mob_budgets(true), recursive := true);

-- Every recorded release, oldest first; params and event are JSON.
CREATE OR REPLACE TEMP MACRO mob_ledger() AS TABLE
SELECT * REPLACE (params::JSON AS params, event::JSON AS event)
FROM (SELECT unnest(_mob_ledger(true), recursive := true));
