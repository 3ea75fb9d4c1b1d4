-- Every release in the ledger that counts (spent, failed after reading its data, or still reserved) was charged to
-- a source with a declared budget. Failing rows: the releases without one.
select l.id, l.source, l.mechanism, l.status
from mob_ledger() l
where l.status <> 'cancelled'
  and l.source not in (select source from mob_budget())
