"""The privacy unit: who one release protects, and the bound on what one of them contributes.

A :class:`PrivacyUnit` is either one trajectory, a ``(user_id, traj_id)`` pair (neighbouring tables differ by one
trajectory), or one user with at most ``max_trajectories_per_user`` trajectories (neighbouring tables differ by
all of one user's trajectories, bounded first: the release keeps at most that many per user, chosen at random).
Every sensitivity in duckmob is a per-trajectory sensitivity multiplied by ``max_trajectories_per_user`` (1 for
the trajectory unit), from SQL (``max_trajectories_per_user := k``) to DP-SGD's per-user clipping: that is the one
name of the contribution bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from duckmob.errors import DuckmobError

TRAJECTORY = "trajectory"
USER = "user"


@dataclass(frozen=True)
class PrivacyUnit:
    """``kind``: 'trajectory' or 'user'; ``max_trajectories_per_user``: the contribution bound (1 for a trajectory).
    Built from what the caller passed by :func:`duckmob.validators.privacy_unit`, which checks it."""

    kind: str = TRAJECTORY
    max_trajectories_per_user: int = 1

    KINDS: ClassVar[tuple[str, str]] = (TRAJECTORY, USER)

    def __post_init__(self):
        if self.kind not in self.KINDS:
            raise ValueError(f"privacy unit kind must be one of {self.KINDS}, got {self.kind!r}")
        if self.kind == TRAJECTORY and self.max_trajectories_per_user != 1:
            raise ValueError("the trajectory unit contributes one trajectory")
        if int(self.max_trajectories_per_user) < 1:
            raise ValueError("max_trajectories_per_user must be at least 1")

    @classmethod
    def trajectory(cls) -> "PrivacyUnit":
        return cls(TRAJECTORY, 1)

    @classmethod
    def user(cls, max_trajectories_per_user: int) -> "PrivacyUnit":
        return cls(USER, int(max_trajectories_per_user))

    @property
    def is_user(self) -> bool:
        return self.kind == USER

    def __str__(self) -> str:
        return self.kind


def no_user_column(table: str, what: str = "privacy_unit := 'user' cannot tell whose each trajectory is",
                   instead: str = "use privacy_unit := 'trajectory'", *,
                   column: str = "user_id column (nor one named with user_col := ...)",
                   name_it: str = "user_col := '...'") -> DuckmobError:
    """The refusal, before anything is reserved, of a release that needs user ids from ``table`` (as the message
    names it: "'trips'", "the DataFrame"), which has no user ``column``: ``what`` cannot be done without one; name
    it with ``name_it``, or do ``instead``. Which columns a table has is public schema, not data, so saying so
    releases nothing. Written once for SQL, the Python API and Spark (whose keywords are Python's)."""
    return DuckmobError(f"{table} has no {column}, so {what}: name its user column with {name_it}, or {instead}")


__all__ = ["PrivacyUnit", "TRAJECTORY", "USER", "no_user_column"]
