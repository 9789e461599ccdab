"""Where a job's time went, for node 0's closing summary and ``--summary-json``'s ``goodput``:
from hpctorch's start to the first collective (node 0's stages on the way: ``timings.mark``),
training (each attempt from its first completed collective to its end), stalled (``--stall-timeout``:
no rank wrote output, from the last output on; taken out of training), and lost to each restart
(from an attempt's end to the next one's first collective). The figures add up to the wall time.
When a rank's first collective completed is in its straggler-watch file (``straggler_worker``),
on the node's one monotonic clock, as the stalls are; node 0's own ranks stand for the job's, as
every rank completes a collective together."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
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


def account(started: float, ended: float, attempts: Sequence[Attempt], stages: Sequence[tuple[str, float]] = (),
            stalls: Sequence[Sequence[float | None]] = ()) -> dict[str, object] | None:
    """The goodput of a run from ``started`` to ``ended`` (monotonic) made of ``attempts``;
    None when no attempt reached a collective (nothing trained, nothing to say). ``stages``:
    node 0's start-up marks (stage, seconds since ``started``); ``stalls``: (from, to) monotonic,
    ``to`` None for a stall the run ended in."""
    trained = [n for n, attempt in enumerate(attempts) if attempt.first is not None]
    if not trained:
        return None
    wall = max(ended - started, 1e-9)
    first = attempts[trained[0]]
    start_s = first.first - started  # type: ignore[operator]
    spans = [(a.first, a.ended) for a in attempts if a.first is not None]
    stalled = [(max(started, float(since)), min(ended, float(until) if until is not None else ended)) for since, until in stalls]  # type: ignore[arg-type]
    stalled = _merged([(since, until) for since, until in stalled if until > since])
    # A stall before the first collective is part of the start; inside an attempt's training it is not training.
    lost_in_training = sum(max(0.0, min(until, end) - max(since, begin)) for since, until in stalled for begin, end in spans)  # type: ignore[type-var]
    training = sum(max(0.0, end - begin) for begin, end in spans) - lost_in_training  # type: ignore[operator]
    lost = []
    for before, after in zip(attempts[trained[0]:], attempts[trained[0] + 1:]):
        lost.append(round(max(0.0, (after.first if after.first is not None else after.ended) - before.ended), 3))
    result: dict[str, object] = {
        "wall_s": round(wall, 3), "start_s": round(start_s, 3), "training_s": round(training, 3), "lost_s": lost,
        # After the last attempt ended: its teardown and the closing work (seconds on a loaded machine).
        "ending_s": round(max(0.0, ended - attempts[-1].ended), 3),
        "share": round(training / wall, 4),
        "attempts": [{"first_s": None if a.first is None else round(a.first - started, 3), "ended_s": round(a.ended - started, 3)}
                     for a in attempts]}
    before_training = [(str(stage), round(float(at), 3)) for stage, at in stages if 0 <= at <= start_s]
    if before_training:
        result["start_stages"] = [{"stage": stage, "at_s": at} for stage, at in before_training]
    if stalled:
        result["stalled_s"] = round(lost_in_training, 3)
        result["stalls"] = [{"from_s": round(since - started, 3), "to_s": round(until - started, 3)} for since, until in stalled]
    return result


def _merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Spans that overlap (a stall left open when another began) counted once."""
    merged: list[tuple[float, float]] = []
    for since, until in sorted(spans):
        if merged and since <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], until))
        else:
            merged.append((since, until))
    return merged


def stalls_of(final: Mapping[str, object], alone: object = None) -> list[Sequence[float | None]]:
    """Node 0's stalls: its judge's, in the watchdog's closing record (``final["stalls"][0]``),
    or on one node the stall watch's beside the workers (``stallalone.AloneStall``)."""
    judged = final.get("stalls")
    spans = judged.get(0) if isinstance(judged, Mapping) else getattr(alone, "stalls", None)
    return [span for span in spans or [] if isinstance(span, Sequence) and len(span) == 2]


def line(goodput: dict) -> str:
    """The summary's line: the share of the wall time spent training, and where the rest went."""
    lost = goodput.get("lost_s") or []
    text = (f"hpctorch: goodput {goodput['share']:.0%}: {goodput['training_s']:.1f} s training of {goodput['wall_s']:.1f} s; "
            f"{goodput['start_s']:.1f} s to the first collective")
    stages = [s for s in goodput.get("start_stages") or [] if isinstance(s, dict)]
    if stages:
        text += " (" + ", ".join(f"{s.get('stage')} at {float(s.get('at_s') or 0):.1f} s" for s in stages) + ")"
    stalls = goodput.get("stalls") or []
    if stalls:
        text += f"; {float(goodput.get('stalled_s') or 0):.1f} s stalled in training ({len(stalls)} stall{'s' if len(stalls) != 1 else ''})"
    if lost:
        each = ", ".join(f"{s:.1f} s" for s in lost[:5]) + (", ..." if len(lost) > 5 else "")
        text += f"; {sum(lost):.1f} s lost to {len(lost)} restart{'s' if len(lost) != 1 else ''} ({each})"
    return text
