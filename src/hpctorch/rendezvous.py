"""Shared-file exchange of the master's address, for when its host name cannot be trusted.

Node 0 writes ``{"run_id", "addr", "port", "host"}`` atomically (write, then rename) to
``Plan.master_exchange`` in a directory all nodes share; the other nodes poll for it
until the rendezvous timeout. ``discover`` runs it before the final plan is made, and
torch's own TCP rendezvous takes over from there.

At scale this must not bury a parallel file system: only node 0 (local rank 0) writes,
one file; a reader stops at its first good read and polls with exponential backoff and
jitter, from ``POLL_FIRST_S`` up to ``POLL_MAX_S``: at most ~38 reads in its first minute
and 30 a minute after that, whatever the node count.
"""

from __future__ import annotations

import json
import os
import random
import socket
import time
from pathlib import Path

from .errors import HpctorchError
from .plan import Plan
from .progress import Progress

POLL_FIRST_S = 0.1
POLL_MAX_S = 2.0


def write_master(plan: Plan) -> None:
    """Node 0: publish this node's address for the others."""
    assert plan.master_exchange and plan.master_addr
    path = Path(plan.master_exchange)
    # The scheduler's name for this node, which every reader compares with its node list
    # (gethostname() may differ: nid001234 vs nid001234.local, or a container's name).
    host = plan.nodes[plan.node_rank] if plan.nodes else socket.gethostname()
    record = {"run_id": plan.run_id, "addr": plan.master_addr, "port": plan.master_port, "host": host}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(record))
        os.replace(temporary, path)
    except OSError as exc:
        raise HpctorchError(
            f"cannot write the master's address to {path}: {exc.strerror}",
            "pass --rendezvous-dir with a directory all nodes share and can write, or --master-addr",
        ) from None


def read_master(plan: Plan) -> str:
    """Any other node: wait for node 0's record of this run and return its address."""
    assert plan.master_exchange
    path = Path(plan.master_exchange)
    deadline = time.monotonic() + plan.rdzv_timeout
    pause = POLL_FIRST_S
    progress = Progress(plan.rdzv_timeout)
    master = plan.nodes[0] if plan.nodes else "node 0"
    while True:
        progress.tick(lambda: f"node {plan.node_rank}: waiting for {master} to write its address to {path}")
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            record = None
        if _written_by_master(plan, record):
            progress.done()
            return str(record["addr"])
        if time.monotonic() > deadline:
            progress.done()
            raise HpctorchError(
                f"waited {plan.rdzv_timeout} s for {master} to write its address to {path}",
                f"check that {master} started, that {path.parent.parent} is shared by all nodes, "
                "or pass --master-addr",
            )
        # Jitter spreads thousands of readers that started together.
        time.sleep(min(pause * random.uniform(0.75, 1.25), max(0.0, deadline - time.monotonic()) + 0.01))
        pause = min(POLL_MAX_S, pause * 1.5)


def _written_by_master(plan: Plan, record: object) -> bool:
    """This run's record, written on the node that holds rank 0 now.

    A requeued job keeps its job and step ids, so a file from its previous run has
    the same run id; the address is only right if the writer is today's node 0.
    """
    if not isinstance(record, dict) or record.get("run_id") != plan.run_id or not record.get("addr"):
        return False
    if not plan.nodes:
        return True
    return str(record.get("host", "")).split(".")[0] == plan.nodes[0].split(".")[0]
