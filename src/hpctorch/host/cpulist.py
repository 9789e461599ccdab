"""Linux's cpulist syntax (``0-3,8,10-11``), both ways. Imports nothing: the bind
entry (``_worker.py``) reads it just before each worker starts."""

from __future__ import annotations

import os
from collections.abc import Iterable


def parse_cpulist(text: str) -> tuple[int, ...]:
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return tuple(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """``(0, 1, 2, 3, 8)`` -> ``0-3,8``."""
    parts: list[str] = []
    ordered: list[int | None] = [*sorted(set(cpus)), None]
    start = previous = None
    for cpu in ordered:
        if cpu is not None and previous is not None and cpu == previous + 1:
            previous = cpu
            continue
        if start is not None:
            parts.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = cpu
    return ",".join(parts)


def bind_to(text: str) -> None:
    """Bind this process (and what it execs or starts later) to the CPUs in ``text``; a
    no-op where the platform has no sched_setaffinity (macOS, Windows: the plan says so)."""
    if text and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, parse_cpulist(text))
