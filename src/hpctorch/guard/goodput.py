"""Where a job's time went, for node 0's closing summary and ``--summary-json``'s ``goodput``:
from hpctorch's start to the first collective, training (each attempt from its first completed
collective to its end), and lost to each restart (from an attempt's end to the next one's first
collective). When a rank's first collective completed is in its straggler-watch file
(``straggler_worker``), on the node's one monotonic clock; node 0's own ranks stand for the
job's, as every rank completes a collective together."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Attempt:
    ended: float
    """When its workers were stopped (monotonic)."""
    first: float | None
    """When its first collective completed on this node; None if none did."""


def first_collective(directory: str | None, pids: set[int] | None = None) -> float | None:
    """The earliest first completed collective in this node's files (of ``pids`` where given)."""
    if directory is None:
        return None
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    found = []
    for name in names:
        if not (name.endswith(".json") and name.removesuffix(".json").isdigit()):
            continue
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as source:
                data = json.load(source)
        except (OSError, ValueError):
            continue  # being replaced
        if isinstance(data, dict) and isinstance(data.get("first"), (int, float)) and (pids is None or data.get("pid") in pids):
            found.append(float(data["first"]))
    return min(found) if found else None


def account(started: float, ended: float, attempts: Sequence[Attempt]) -> dict[str, object] | None:
    """The goodput of a run from ``started`` to ``ended`` (monotonic) made of ``attempts``;
    None when no attempt reached a collective (nothing trained, nothing to say)."""
    trained = [n for n, attempt in enumerate(attempts) if attempt.first is not None]
    if not trained:
        return None
    wall = max(ended - started, 1e-9)
    first = attempts[trained[0]]
    training = sum(max(0.0, a.ended - a.first) for a in attempts if a.first is not None)
    lost = []
    for before, after in zip(attempts[trained[0]:], attempts[trained[0] + 1:]):
        lost.append(round(max(0.0, (after.first if after.first is not None else after.ended) - before.ended), 3))
    return {"wall_s": round(wall, 3), "start_s": round(first.first - started, 3), "training_s": round(training, 3),  # type: ignore[operator]
            "lost_s": lost, "share": round(training / wall, 4),
            "attempts": [{"first_s": None if a.first is None else round(a.first - started, 3), "ended_s": round(a.ended - started, 3)}
                         for a in attempts]}


def line(goodput: dict) -> str:
    """The summary's line: the share of the wall time spent training, and where the rest went."""
    lost = goodput.get("lost_s") or []
    text = (f"hpctorch: goodput {goodput['share']:.0%}: {goodput['training_s']:.1f} s training of {goodput['wall_s']:.1f} s; "
            f"{goodput['start_s']:.1f} s to the first collective")
    if lost:
        each = ", ".join(f"{s:.1f} s" for s in lost[:5]) + (", ..." if len(lost) > 5 else "")
        text += f"; {sum(lost):.1f} s lost to {len(lost)} restart{'s' if len(lost) != 1 else ''} ({each})"
    return text
