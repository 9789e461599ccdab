"""The job's master port when its derived port is held: node 0 serves on the first of the job's
ports (``Plan.master_ports``, derived from the job id alike on every node) that it can bind, and
every other node joins the first of them whose store authenticates as this job's node 0
(``guard.authority``). A squatter on node 0 who took the derived port, or another job that took
it by accident, then costs the job a few seconds, not the job.

Node 0's store stays open here (multi-tenant: the agreement, the screen and the staging reuse
it in this process) from its first moments, so the others find it at once. torch's agent serves
through this very store; under hpctorch's own starter rank 0's store takes the port over
(``hand_over``): rank 0 asks for it by writing a file (``agreement.ask_for_port``), this process
lets go, rank 0 binds (a few retries apart): the port is free for milliseconds, and no node
waits for rank 0's torch import to find node 0.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import replace

from ..errors import HpctorchError
from ..host import network
from ..plan import ports
from ..plan.types import Plan

PROBE_S = 3.0
"""How long a store at one of the ports may take to show node 0's authority record before the
next port is tried (every port comes round again until the deadline)."""
POLL_S = 0.2
POLL_MAX_S = 2.0
"""A node waiting for node 0 backs off to one sweep of the ports every 2 s: at 10,000 nodes,
20,000 connection attempts a second at most, as the agreement's own polls."""
HANDOVER_POLL_S = 0.02

_held: list[object] = []
"""Node 0's store, held between ``settle`` and ``release``."""


def applies(plan: Plan) -> bool:
    """Several nodes, each with its own hpctorch, and a port with alternates (derived, not given),
    where node 0's hpctorch serves the store: torch's static rendezvous, or its c10d rendezvous
    hosted on node 0 (``_hosts_c10d``)."""
    hosted = plan.rdzv_backend == "static" or (plan.rdzv_backend == "c10d" and _hosts_c10d(plan))
    return (len(plan.master_ports) > 1 and plan.nnodes > 1 and plan.mode == "per-node" and not plan.simulated
            and plan.watched and hosted and plan.master_addr is not None)


def _hosts_c10d(plan: Plan) -> bool:
    """Node 0 hosts torch's c10d store where hpctorch told torch so (``is_host``: the master address
    is its own; ``plan.decide``), and the store it opened first is the one torch reuses. The other
    nodes cannot see node 0's addresses: they look for it unless the user chose ``is_host``."""
    if plan.is_master:
        return plan.rdzv_conf.get("is_host") == "true"
    return "is_host" not in plan.rdzv_conf


def at(plan: Plan, port: int) -> Plan:
    """``plan`` at ``port``: the watchdog's port, derived from the master port, moves with it."""
    if port == plan.master_port:
        return plan
    reasons = {**plan.reasons, "master_port": f"{port}, the next of the job's ports ({_listed(plan)}): "
                                              f"{plan.master_port} was held on node 0"}
    watch = ports.watch_port(plan.run_id, port) if plan.watch_port else 0
    return replace(plan, master_port=port, watch_port=watch, reasons=reasons)


def _listed(plan: Plan) -> str:
    return ", ".join(map(str, plan.master_ports))


def settle(plan: Plan) -> Plan:
    """This node's plan at the port the job's node 0 serves on: chosen here on node 0, found
    on the others. Unchanged where the port has no alternates."""
    if not applies(plan):
        return plan
    return _serve(plan) if plan.is_master else _find(plan)


def release() -> None:
    """Node 0: let go of the store (a port rank 0's own store takes over, or the run's end)."""
    _held.clear()


def held() -> bool:
    return bool(_held)


def hand_over(folder: str, run_id: str, timeout_s: float) -> dict[str, str]:
    """Node 0, hpctorch's starter: serve until rank 0 asks for the port (it writes a file of the
    node's private ``folder``), then let go, at the latest after ``timeout_s``. Rank 0 serves under
    this process's seal (a 0600 file beside it): a node that read either store's record trusts both.
    What rank 0's environment needs."""
    from ..guard.agreement import HANDOVER_ENV
    from ..guard.authority import SECRET_FILE_ENV, hand_secret

    asked, secret = os.path.join(folder, "port-asked"), os.path.join(folder, "run-secret")
    hand_secret(run_id, secret)

    def wait() -> None:
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(asked) and time.monotonic() < deadline:
            time.sleep(HANDOVER_POLL_S)
        release()

    threading.Thread(target=wait, name="hpctorch-port-handover", daemon=True).start()
    return {HANDOVER_ENV: asked, SECRET_FILE_ENV: secret}


def _serve(plan: Plan) -> Plan:
    from ..guard import authority
    from ..guard.agreement import open_store

    held: list[str] = []
    for port in plan.master_ports:
        if not network.port_is_free("", port):
            held.append(f"{port}{network.holder_line(port) or ' (in use)'}")
            continue
        moved = at(plan, port)
        try:
            store = open_store(moved, plan.rdzv_timeout)
        except Exception:  # noqa: BLE001 - taken between the check and the bind: the next one
            held.append(f"{port} (in use)")
            continue
        _held.append(authority.sealed(store, moved, plan.rdzv_timeout, serve=True))
        if held:
            print(f"hpctorch: master port {'; '.join(held)}: serving on {port}, the next of the job's ports "
                  "(every node tries them in order)", file=sys.stderr, flush=True)
        return moved
    raise HpctorchError(f"every one of the job's master ports is in use on this node: {'; '.join(held)}",
                        "pass --master-port (the same on every node), or stop the processes that hold them (ss -ltnp)")


def _client(plan: Plan, port: int, timeout_s: float, torch_free: bool):  # type: ignore[no-untyped-def]
    """A client of the store at ``port``: without importing torch where hpctorch's own client
    speaks the server's torch (this process must not import torch from the shared path before
    the environment is staged, nor spend a second on it before its workers start)."""
    if torch_free:
        from .. import storeclient

        return storeclient.StoreClient(plan.master_addr or "", port, timeout_s)
    from ..guard.agreement import open_store

    return open_store(at(plan, port), timeout_s, serve=False)


def _find(plan: Plan) -> Plan:
    """The first of the job's ports whose store authenticates, each tried in turn until the
    rendezvous timeout; what each gave is said if none does."""
    from ..guard import authority
    from .. import storeclient

    torch_free = storeclient.speaks_with(storeclient.installed_torch())

    deadline = time.monotonic() + plan.rdzv_timeout
    heard: dict[int, str] = {}
    said: set[int] = set()
    pause = POLL_S
    reached_any = False
    while True:
        for port in plan.master_ports:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            moved = at(plan, port)
            reached = network.connect(plan.master_addr or "", port, min(2.0, max(0.1, left)))
            if not reached["ok"]:
                heard[port] = str(reached["error"])
                continue
            reached_any = True
            store = None
            try:
                store = _client(plan, port, max(1.0, min(PROBE_S, left)), torch_free)
                authority.verify(store, moved, min(PROBE_S, left))
            except authority.AuthError as exc:
                heard[port] = exc.cause
                if port not in said and "another user" in heard[port]:
                    said.add(port)
                    print(f"hpctorch: node {plan.node_rank}: master port {port} is not this job's ({heard[port]}); "
                          "trying the job's next ports", file=sys.stderr, flush=True)
                continue
            except Exception as exc:  # noqa: BLE001 - not a store, or gone again: the next port
                heard[port] = authority.first_line(exc)
                continue
            finally:
                if store is not None and hasattr(store, "close"):
                    store.close()
            return moved
        if time.monotonic() >= deadline:
            break
        time.sleep(pause)
        pause = min(pause * 1.5, POLL_MAX_S)
    first, *rest = plan.master_ports
    if not reached_any:
        raise HpctorchError(
            f"could not reach the master's store at {plan.master_addr}:{first} (nor the job's other ports, "
            f"{', '.join(map(str, rest))}) from {plan.iface or 'this node'} within {plan.rdzv_timeout} s: {heard.get(first, 'no answer')}",
            f"check that node 0 started and is reachable on {plan.iface or 'the chosen interface'} ('hpctorch plan' shows why "
            "it was chosen), that every node got the same --master-addr, or raise --rdzv-timeout")
    tried = "; ".join(f"{port}: {why}" for port, why in heard.items()) or "none answered"
    raise HpctorchError(f"node {plan.node_rank}: none of the job's master ports on {plan.master_addr} served this job's node 0 "
                        f"within {plan.rdzv_timeout} s ({tried})",
                        "check that node 0 started and is reachable ('hpctorch plan' shows why its address was chosen), "
                        "or raise --rdzv-timeout")
