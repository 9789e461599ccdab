"""Before any worker starts, every node checks that all nodes planned the same job.

A node that planned another port, master, world size or job would otherwise wait in the
rendezvous until its timeout. Each node publishes a record of what it planned through
two channels and compares every record it sees with its own:

- the master's TCPStore: node 0 creates it now (multi-tenant, so torch's static
  rendezvous reuses it later) and every node that planned the same address and port
  reaches it; the check passes once all nodes' records are there and equal;
- when the nodes share a directory, one beating file per node (``sharedfiles``): how
  nodes that cannot reach the same store still see each other.
"""

from __future__ import annotations

import datetime
import json
import socket
import time
from collections.abc import Mapping

from .errors import HpctorchError
from .plan import Plan
from .sharedfiles import BeatingFiles

POLL_S = 0.25
GRACE_S = 1.5
"""A node that found a disagreement keeps beating this long, so the others see it too."""
STORE_PREFIX = "hpctorch/agreement/"
FIELDS = (
    ("job", "job id"),
    ("master", "master address:port"),
    ("nnodes", "number of nodes"),
    ("nproc_per_node", "processes per node"),
    ("world_size", "world size"),
    ("nodes", "node list"),
)


def record(plan: Plan) -> dict[str, object]:
    """What this node planned, in the terms every node must share."""
    return {
        "node": plan.node_rank,
        "host": socket.gethostname(),
        "job": plan.job_id or "",
        "master": f"{plan.master_addr}:{plan.master_port}",
        "nnodes": plan.nnodes,
        "nproc_per_node": list(plan.nproc_per_node),
        "world_size": plan.world_size,
        "nodes": ",".join(plan.nodes),
    }


def differences(records: Mapping[int, Mapping[str, object]]) -> list[str]:
    """One line per field on which the records differ, naming each node's value."""
    lines = []
    for key, label in FIELDS:
        values = {node: r.get(key) for node, r in sorted(records.items())}
        if len({json.dumps(v) for v in values.values()}) > 1:
            shown = ", ".join(f"node {n} ({records[n].get('host')}) {_show(v)}" for n, v in values.items())
            lines.append(f"{label}: {shown}")
    return lines


def _show(value: object) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value) if value not in ("", None) else "(none)"


def disagreement_error(lines: list[str]) -> HpctorchError:
    return HpctorchError(
        "the nodes planned different jobs: " + "; ".join(lines),
        "start every node with the same options and environment ('hpctorch plan' on each node "
        "shows where each value came from)",
    )


def reachable(address: str, port: int, timeout_s: float) -> bool:
    """A plain connect first: torch's store client logs a C++ trace for every refusal."""
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def open_store(plan: Plan, timeout_s: float):  # type: ignore[no-untyped-def]
    from torch.distributed import TCPStore

    return TCPStore(
        plan.master_addr, plan.master_port, None, plan.is_master,
        datetime.timedelta(seconds=timeout_s), wait_for_workers=False, multi_tenant=True,
    )


def check(plan: Plan, timeout_s: float):  # type: ignore[no-untyped-def]
    """Wait until every node published the same record; raise on a difference or timeout.

    Returns node 0's store, to be kept open until torch's rendezvous has taken it over.
    """
    mine = record(plan)
    files = BeatingFiles(plan.agreement_dir, plan.node_rank, mine)
    deadline = time.monotonic() + timeout_s
    store = None
    if plan.is_master:
        try:
            store = open_store(plan, timeout_s)
        except Exception as exc:  # noqa: BLE001 - torch raises several kinds here
            raise HpctorchError(
                f"cannot serve the rendezvous store on port {plan.master_port}: {str(exc).splitlines()[0]}",
                "pass another --master-port, or stop the process that holds it (ss -ltnp)",
            ) from None
        store.set(f"{STORE_PREFIX}{plan.node_rank}", json.dumps(mine))
    keys = [f"{STORE_PREFIX}{n}" for n in range(plan.nnodes)]
    stored: dict[int, object] = {}
    try:
        while True:
            files.publish()
            seen = {**files.read_live()}
            if store is None and reachable(plan.master_addr, plan.master_port, POLL_S):
                try:
                    store = open_store(plan, max(1.0, deadline - time.monotonic()))
                    store.set(f"{STORE_PREFIX}{plan.node_rank}", json.dumps(mine))
                except Exception:  # noqa: BLE001 - not a store, or gone again: keep waiting
                    store = None
            if store is not None:
                try:
                    stored = {int(k.rsplit("/", 1)[1]): json.loads(store.get(k)) for k in keys if store.check([k])}
                except Exception:  # noqa: BLE001 - node 0 went away: wait for it again
                    store, stored = (store, stored) if plan.is_master else (None, {})
                seen.update(stored)
                if len(stored) == len(keys) and not differences({**seen, plan.node_rank: mine}):
                    return store if plan.is_master else None
            lines = differences({**seen, plan.node_rank: mine})
            if lines:
                _linger(files)
                raise disagreement_error(lines)
            if time.monotonic() > deadline:
                raise _timeout_error(plan, timeout_s, store is not None, stored)
            time.sleep(POLL_S)
    finally:
        files.remove()


def _timeout_error(plan: Plan, timeout_s: float, connected: bool, stored: Mapping[int, object]) -> HpctorchError:
    where = f"{plan.master_addr}:{plan.master_port}"
    if not connected:
        return HpctorchError(
            f"could not reach the master's store at {where} from {plan.iface or 'this node'} within {timeout_s:.0f} s",
            f"check that node 0 started and is reachable on {plan.iface or 'the chosen interface'} "
            "('hpctorch plan' shows why it was chosen), that every node got the same --master-addr "
            "and --master-port, or raise --rdzv-timeout",
        )
    missing = [n for n in range(plan.nnodes) if n not in stored and n != plan.node_rank]
    names = ", ".join(f"{n} ({plan.nodes[n]})" if plan.nodes else str(n) for n in missing)
    return HpctorchError(
        f"waited {timeout_s:.0f} s for node(s) {names} to reach the master's store at {where}",
        "check that every node started, with the same options (a different --master-port or "
        "--master-addr on one node is named here when the nodes share --rendezvous-dir), "
        "or raise --rdzv-timeout",
    )


def _linger(files: BeatingFiles) -> None:
    end = time.monotonic() + GRACE_S
    while time.monotonic() < end:
        files.publish()
        time.sleep(POLL_S)
