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
