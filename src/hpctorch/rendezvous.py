"""Shared-file exchange of the master's address, for when its host name cannot be trusted.

Node 0 writes ``{"run_id", "addr", "port", "host"}`` atomically (write, then rename)
to ``Plan.master_exchange`` in a directory all nodes share; the other nodes poll for
it until the rendezvous timeout. torch's own TCP rendezvous takes over from there.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from .errors import HpctorchError
from .plan import Plan

POLL_S = 0.1


def exchange_master(plan: Plan) -> Plan:
    """The plan with ``master_addr`` filled in, writing or reading the exchange file."""
    if not plan.master_exchange:
        return plan
    path = Path(plan.master_exchange)
    if plan.is_master:
        if plan.workers and plan.workers[0].local_rank != 0:
            return plan  # one writer per job: local rank 0 of node 0
        record = {"run_id": plan.run_id, "addr": plan.master_addr, "port": plan.master_port, "host": socket.gethostname()}
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
        return plan
    deadline = time.monotonic() + plan.rdzv_timeout
    while True:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            record = None
        if isinstance(record, dict) and record.get("run_id") == plan.run_id and record.get("addr"):
            return plan.with_master_addr(str(record["addr"]))
        if time.monotonic() > deadline:
            master = plan.nodes[0] if plan.nodes else "node 0"
            raise HpctorchError(
                f"waited {plan.rdzv_timeout} s for {master} to write its address to {path}",
                f"check that {master} started, that {path.parent.parent} is shared by all nodes, "
                "or pass --master-addr",
            )
        time.sleep(POLL_S)
