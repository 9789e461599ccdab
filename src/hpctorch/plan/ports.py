"""Names every node of one job agrees on without talking: master port, run id, and the
agreement directory."""

from __future__ import annotations

import os
import zlib

from ..errors import HpctorchError
from ..host.facts import HostFacts
from ..schedulers import job_port
from ..schedulers.allocation import Allocation
from .types import Options, Plan


def master_port(allocation: Allocation, options: Options, facts: HostFacts, nnodes: int, world_size: int, mode: str,
                reasons: dict[str, str]) -> int:
    if options.master_port is not None:
        flag = "--rdzv-endpoint" if options.master_flag == "--rdzv-endpoint" else "--master-port"
        if not 0 < options.master_port < 65536:
            raise HpctorchError(f"{flag} port {options.master_port} is not a TCP port", "give a port in 1..65535")
        reasons["master_port"] = flag
        return options.master_port
    if allocation.master_port is not None:
        reasons["master_port"] = f"from {allocation.scheduler} ({allocation.sources.get('master_port', 'MASTER_PORT')})"
        return allocation.master_port
    if allocation.job_id:
        port = job_port.derive_port(allocation.job_id, allocation.step_id)
        reasons["master_port"] = (
            f"derived from job id {allocation.job_id}"
            + (f" step {allocation.step_id}" if allocation.step_id else "")
            + f" (range {job_port.PORT_BASE}-{job_port.PORT_BASE + job_port.PORT_SPAN - 1})"
        )
        return port
    if nnodes == 1 and mode == "per-node":
        reasons["master_port"] = "chosen by the OS when the agent binds it"
        return 0
    if world_size == 1:
        reasons["master_port"] = "a port free on loopback now (world of one)"
        return facts.spare_port
    raise HpctorchError(
        f"{world_size} processes must agree on a master port, and neither --master-port, "
        "MASTER_PORT nor a job id gives one",
        "pass --master-port (the same on every node), or export MASTER_PORT",
    )


def watch_port(run_id: str, master_port: int) -> int:
    """Node 0's watchdog store when hpctorch starts the workers on several nodes: derived
    like a master port (every node finds it without talking), never the master port itself."""
    port = job_port.derive_port(f"{run_id}/watch/{master_port}")
    return port if port != master_port else job_port.PORT_BASE + (port - job_port.PORT_BASE + 1) % job_port.PORT_SPAN


def job_key(allocation: Allocation, options: Options) -> str | None:
    """What names this job on every node alike: --run-id, else the launcher's job and step."""
    if options.run_id:
        return options.run_id
    if allocation.job_id:
        step = f".{allocation.step_id}" if allocation.step_id else ""
        # A requeued job keeps its id: each run its own store files, records and folders.
        again = f"-r{allocation.restarts}" if allocation.restarts else ""
        return f"{allocation.scheduler}-{allocation.job_id}{step}{again}"
    return None


def run_id(allocation: Allocation, options: Options, facts: HostFacts, nnodes: int, port: int) -> str:
    """The rendezvous' run id: torch keys its store by it, so every node must agree."""
    key = job_key(allocation, options)
    if key:
        return key
    if nnodes > 1:
        return f"{allocation.scheduler}-{port}"
    return f"{facts.hostname}-{facts.pid}"


def agreement_dir(allocation: Allocation, options: Options, nodes: tuple[str, ...]) -> str | None:
    """Named by what every node of one job shares even when their plans differ (not the port)."""
    shared_dir = options.rendezvous_dir or allocation.submit_dir
    if not shared_dir:
        return None
    key = job_key(allocation, options)
    if key is None and nodes:
        key = f"{allocation.scheduler}-{zlib.crc32(','.join(nodes).encode()):08x}"
    elif key is None and options.rendezvous_dir:
        key = "job"  # nothing else names it: the directory the user gave is the job's
    if key is None:
        return None
    return os.path.join(shared_dir, ".hpctorch", f"{key}.agreement")


def master_ports(allocation: Allocation, options: Options, nnodes: int, mode: str, rdzv_backend: str,
                 reasons: dict[str, str]) -> tuple[int, ...]:
    """A port derived from the job id and its alternates, where hpctorch on node 0 serves the store
    of several nodes (torch's static rendezvous, hpctorch's starter, and torch's c10d rendezvous,
    which reuses the store node 0's hpctorch opened first); else none (a port the user or the
    scheduler gives)."""
    derived = options.master_port is None and allocation.master_port is None and allocation.job_id
    if not (derived and nnodes > 1 and mode == "per-node" and rdzv_backend in ("static", "c10d")):
        return ()
    reasons["master_ports"] = ("derived alike: if the port is held on node 0 (another user, another job), node 0 serves on "
                               "the next, and every node joins the first whose store authenticates")
    return job_port.port_sequence(allocation.job_id, allocation.step_id)  # type: ignore[arg-type]


def check_master_port(plan: Plan) -> None:
    """On the master, a fixed port must be free before anything starts (a derived one with
    alternates moves on instead: ``start.masterport``)."""
    if not plan.is_master or not plan.master_port or plan.simulated or len(plan.master_ports) > 1:
        return
    if plan.mode == "per-task" and plan.workers and plan.workers[0].rank != 0:
        return  # rank 0 on this node binds the port, perhaps already
    if plan.mode == "unchanged":
        return  # the launcher that set every variable (torchrun's agent) holds it
    from ..host import network

    if not network.port_is_free("", plan.master_port):
        why = plan.reasons.get("master_port", "")
        raise HpctorchError(
            f"master port {plan.master_port} ({why}) is already in use on this node{network.holder_line(plan.master_port)}",
            "pass another --master-port, or stop the process that holds it (ss -ltnp)",
        )
