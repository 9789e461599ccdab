"""The keys the watchdog and hot spares (``start.spares``) share in the master's store."""

from __future__ import annotations

DONE = b"done"
"""A node's heartbeat counter once its workers all succeeded."""
REPLACED = b"replaced"
"""A node's counter once it left the job for a hot spare: never silent."""


def beat_key(run_id: str, node: int) -> str:
    """A node's heartbeat counter; ``DONE`` or ``REPLACED`` once it left."""
    return f"hpctorch/{run_id}/beat/{node}"


def spares_prefix(run_id: str) -> str:
    """The hot spares' keys: ``used`` (spares given a seat), ``in`` (spares that moved in), the
    faults claimed; node 0's watchdog gives a silent node's seat through them too."""
    return f"hpctorch/{run_id}/spares/"


def stall_dump_keys(run_id: str) -> tuple[str, str]:
    """A stall's stack dump: node 0's number for it, sealed (``asked``), and the counter whose
    move wakes the nodes to read it (``want``)."""
    return f"hpctorch/{run_id}/stacks/asked", f"hpctorch/{run_id}/stacks/want"
