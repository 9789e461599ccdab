"""The job's failure records in the watchdog's store: each failed node's line and when its rank
raised or died, sealed, numbered as they come. Node 0 reads the first few at the end, a failed
node once its own is in, whatever N: the first failure in time is among the first reported (a
crash's consequences come after it), and each closing line names it (``workers.first_reported``)."""

from __future__ import annotations

import json

READ = 16
"""Records read, whatever N."""


def record(store, seal, prefix: str, node: int, line: str, at: float) -> None:  # type: ignore[no-untyped-def]
    """This node's failure, before its ack: node 0 lingers for every node's."""
    key = f"{prefix}failure/{store.add(prefix + 'failures', 1)}"
    store.set(key, seal.seal(key, json.dumps({"node": node, "line": line, "at": at})))


def read(store, seal, prefix: str) -> dict[int, object]:  # type: ignore[no-untyped-def]
    """The first ``READ`` records this job wrote, by number; one that does not open under the
    run's seal is not this job's, and never named as its failure."""
    from .authority import AuthError

    count = min(int(store.add(prefix + "failures", 0)), READ)
    keys = [f"{prefix}failure/{n}" for n in range(1, count + 1)]
    if not keys or not store.check(keys):
        return {}
    records: dict[int, object] = {}
    for n, (key, raw) in enumerate(zip(keys, store.multi_get(keys)), start=1):
        try:
            opened = json.loads(seal.open(key, bytes(raw)).decode(errors="replace"))
        except (AuthError, ValueError):
            continue
        if isinstance(opened, dict):
            records[n] = opened
    return records
