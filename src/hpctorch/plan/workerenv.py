"""The environment each worker gets: torchrun's contract plus hpctorch's additions."""

from __future__ import annotations

from ..host import network
from ..host.facts import HostFacts
from ..schedulers import hostlist
from ..schedulers.allocation import Allocation
from . import placement, sites
from .types import ROLE


def common_env(
    allocation: Allocation,
    facts: HostFacts,
    iface: network.Interface | None,
    iface_forced: bool,
    nodes: tuple[str, ...],
    local_workers: int,
    reasons: dict[str, str],
    settings: sites.Settings,
    where: placement.Placement,
) -> dict[str, str]:
    """What every worker on this node gets added (the user's own variables are kept)."""
    env: dict[str, str] = {}
    if iface is not None:
        for var, value in (("GLOO_SOCKET_IFNAME", iface.name), ("NCCL_SOCKET_IFNAME", f"={iface.name}")):
            if var in facts.env and not iface_forced:
                reasons[var] = f"kept {var}={facts.env[var]} from the environment"
            else:
                env[var] = value
        env["HPCTORCH_IFACE"] = iface.name
    for var, value in settings.env.items():
        if var in facts.env:
            reasons[var] = f"kept {var}={facts.env[var]} from the environment over {settings.origins.get('env ' + var)}"
        else:
            env[var] = value
            reasons[var] = settings.origins.get(f"env {var}", "settings")
    if "OMP_NUM_THREADS" not in facts.env:
        threads = min(where.threads) if where.threads else max(1, facts.cpus // max(1, local_workers))
        env["OMP_NUM_THREADS"] = str(threads)
        reasons["OMP_NUM_THREADS"] = f"{facts.cpus} usable CPUs shared by {local_workers} local process(es)"
        if any(where.cpus):
            reasons["OMP_NUM_THREADS"] += "; each worker: the CPUs it is bound to"
    if facts.platform == "win32" and "USE_LIBUV" not in facts.env:
        # torch >= 2.4 asks for a libuv TCPStore, which its Windows builds lack.
        env["USE_LIBUV"] = "0"
        reasons["USE_LIBUV"] = "Windows: torch's TCPStore there is built without libuv"
    env["HPCTORCH_SCHEDULER"] = allocation.scheduler
    if allocation.job_id:
        env["HPCTORCH_JOB_ID"] = allocation.job_id
    if nodes:
        env["HPCTORCH_NODELIST"] = hostlist.compress(nodes)
    return env


def torch_contract(rank: int, local_rank: int, node_rank: int, nproc_per_node: tuple[int, ...], master_addr: str,
                   master_port: int, run_id: str) -> dict[str, str]:
    """torchrun's worker variables, for a rank hpctorch execs itself (per-task mode).

    TORCHELASTIC_RUN_ID is what ``torch.distributed.is_torchelastic_launched()`` checks:
    Lightning, Accelerate and DeepSpeed then read torchrun's variables instead of
    detecting Slurm or MPI themselves.
    """
    world_size = sum(nproc_per_node)
    env = dict(
        RANK=str(rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(nproc_per_node[node_rank]),
        GROUP_RANK=str(node_rank),
        GROUP_WORLD_SIZE=str(len(nproc_per_node)),
        ROLE_NAME=ROLE,
        ROLE_RANK=str(rank),
        ROLE_WORLD_SIZE=str(world_size),
        MASTER_ADDR=master_addr,
        TORCHELASTIC_RUN_ID=run_id,
    )
    if master_port:
        env["MASTER_PORT"] = str(master_port)
    return env

