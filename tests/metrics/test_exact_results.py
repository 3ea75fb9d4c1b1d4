"""Every exact (NOT private) result says so on every row, in its first column, whatever the order (issue 38)."""

import duckmob
from metrics_helpers import BBOX, city, table


def test_exact_not_private_is_the_first_column_of_every_row_in_any_order():
    con = duckmob.connect()
    con.register("r", table(city(30)))
    con.execute("CREATE TEMP TABLE real AS FROM r")
    for query in (f"FROM mob_evaluate('real', 'real', bbox := {BBOX}, families := ['privtrace']) "
                  "ORDER BY value DESC NULLS FIRST LIMIT 3",
                  f"FROM mob_check('real', bbox := {BBOX}) ORDER BY count DESC NULLS LAST LIMIT 3",
                  f"FROM mob_audit('real', 'real', 'real', bbox := {BBOX}, k := 4, seed := 1) ORDER BY value"):
        result = con.execute(query)
        rows = result.fetchall()
        assert result.description[0][0] == "exact_not_private" and len(rows) >= 3
        assert [r[0] for r in rows] == [True] * len(rows)
    python = duckmob.evaluate(con, "real", "real", bbox=BBOX, families=["privtrace"])
    assert python.column_names[0] == "exact_not_private"
    assert python.column("exact_not_private").to_pylist() == [True] * python.num_rows
    con.close()
