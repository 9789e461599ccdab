"""The median, as ``statistics.median`` gives it, without importing ``statistics`` (with decimal,
fractions and random): the judges run in every node's hpctorch, whose imports before a staged copy
exists come from the shared file system."""

from __future__ import annotations

from collections.abc import Iterable


def median(values: Iterable[float]) -> float:
    """The middle value, or the mean of the two middle ones; ValueError for no values (as statistics')."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no median for empty data")
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
