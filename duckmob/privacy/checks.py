"""Kept for the privacy modules' imports: the one validators module is :mod:`duckmob.validators`."""

from duckmob.validators import positive

__all__ = ["positive"]
