"""The privacy unit and the one refusal of the user unit on a table without a user column."""

import pytest

from duckmob.errors import DuckmobError
from duckmob.privacy.unit import PrivacyUnit, no_user_column


def test_a_unit_is_checked_where_it_is_made():
    assert PrivacyUnit() == PrivacyUnit.trajectory() and PrivacyUnit().max_trajectories_per_user == 1
    assert PrivacyUnit.user(3).is_user and str(PrivacyUnit.user(3)) == "user"
    for bad in (lambda: PrivacyUnit("person"), lambda: PrivacyUnit("trajectory", 2), lambda: PrivacyUnit.user(0)):
        with pytest.raises(ValueError):
            bad()


def test_the_no_user_column_refusal_reads_as_each_face_wrote_it():
    sql = no_user_column("'trips'")
    assert isinstance(sql, DuckmobError)
    assert str(sql) == ("'trips' has no user_id column (nor one named with user_col := ...), so privacy_unit := 'user' "
                        "cannot tell whose each trajectory is: name its user column with user_col := '...', or use "
                        "privacy_unit := 'trajectory'")
    assert str(no_user_column("'s'", "its users cannot be counted", "count trajectories with what := 'trajectories'")
               ).endswith("so its users cannot be counted: name its user column with user_col := '...', or count "
                          "trajectories with what := 'trajectories'")
    spark = no_user_column("the DataFrame", instead="use privacy_unit='trajectory'", column="uid column",
                           name_it="user_col=...")
    assert str(spark) == ("the DataFrame has no uid column, so privacy_unit := 'user' cannot tell whose each trajectory "
                          "is: name its user column with user_col=..., or use privacy_unit='trajectory'")
