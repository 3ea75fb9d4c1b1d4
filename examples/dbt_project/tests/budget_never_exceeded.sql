-- The ledger's spend of every source stays within its declared budget (mob_budget composes every counted release by
-- PLD at the budget's delta). Failing rows: the sources over budget.
select source, eps, spent
from mob_budget()
where spent > eps
