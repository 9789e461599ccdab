"""A launcher that already set torch's variables: torchrun, or RANK/WORLD_SIZE by hand.

Variables (torchrun's contract, docs.pytorch.org/docs/stable/elastic/run.html):
RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
MASTER_PORT, TORCHELASTIC_RUN_ID (set only by torchrun's agent).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from .allocation import Allocation, Launched, Launcher

TORCHRUN = Launcher("torchrun")
BY_HAND = Launcher("env")
from ..errors import HpctorchError
from ._parse import check_rank, env_int


def detect(env: Mapping[str, str]) -> Allocation | None:
    """Matches when RANK and WORLD_SIZE describe one process of a world."""
    rank = env_int(env, "RANK")
    world_size = env_int(env, "WORLD_SIZE", minimum=1)
    if rank is None or world_size is None:
        return None
    check_rank("RANK", rank, "WORLD_SIZE", world_size)
    local_rank = env_int(env, "LOCAL_RANK")
    local_world_size = env_int(env, "LOCAL_WORLD_SIZE", minimum=1)
    sources = {"task_rank": "RANK", "tasks_per_node": "WORLD_SIZE"}
    if local_world_size is None:
        # Without LOCAL_WORLD_SIZE the only safe reading is one node holding all ranks
        # when LOCAL_RANK equals RANK; otherwise the per-node count is unknowable.
        if local_rank not in (None, rank):
            raise HpctorchError(
                f"LOCAL_RANK={local_rank} and RANK={rank} are set but LOCAL_WORLD_SIZE is not",
                "export LOCAL_WORLD_SIZE (processes on this node) as torchrun does",
            )
        local_world_size = world_size
    else:
        sources["tasks_per_node"] = "WORLD_SIZE, LOCAL_WORLD_SIZE"
    if world_size % local_world_size:
        raise HpctorchError(
            f"WORLD_SIZE={world_size} is not a multiple of LOCAL_WORLD_SIZE={local_world_size}",
            "give every node the same number of processes, or launch with hpctorch run",
        )
    if local_rank is None:
        local_rank = rank % local_world_size
    else:
        sources["local_task_rank"] = "LOCAL_RANK"
    check_rank("LOCAL_RANK", local_rank, "LOCAL_WORLD_SIZE", local_world_size)
    nnodes = world_size // local_world_size
    node_rank = env_int(env, "GROUP_RANK")
    if node_rank is None:
        node_rank = rank // local_world_size
    else:
        sources["node_rank"] = "GROUP_RANK"
    check_rank("GROUP_RANK", node_rank, "nodes", nnodes)
    master_port = env_int(env, "MASTER_PORT", minimum=1)
    for key, var in (("master_addr", "MASTER_ADDR"), ("master_port", "MASTER_PORT")):
        if env.get(var):
            sources[key] = var
    by_torchrun = bool(env.get("TORCHELASTIC_RUN_ID"))
    complete = by_torchrun and bool(env.get("MASTER_ADDR")) and master_port is not None
    return Allocation(
        launcher=TORCHRUN if by_torchrun else BY_HAND,
        tasks_per_node=(local_world_size,) * nnodes,
        launched=Launched.TORCH if complete else Launched.RANKS,
        job_id=env.get("TORCHELASTIC_RUN_ID") or None,
        task_rank=rank,
        node_rank=node_rank,
        local_task_rank=local_rank,
        master_addr=env.get("MASTER_ADDR") or None,
        master_port=master_port,
        sources=sources,
    )


def set_by_hand(env: Mapping[str, str]) -> bool:
    """RANK is set, but not by torchrun's agent."""
    return env.get("RANK") is not None and not env.get("TORCHELASTIC_RUN_ID")


def mirrored(beneath: Allocation, env: Mapping[str, str]) -> Allocation:
    """``beneath`` (the scheduler's view of this task), when torch's variables only copy it.

    A wrapper script or a container hook (enroot's ``50-slurm-pytorch.sh`` in NGC
    containers sets RANK, WORLD_SIZE, LOCAL_RANK from SLURM_PROCID, SLURM_NTASKS and
    SLURM_LOCALID, MASTER_ADDR to the first node's name and MASTER_PORT from the job id)
    adds nothing: plan from the scheduler. A value that contradicts it is an error.
    """
    scheduler = beneath.scheduler
    checks = (
        ("RANK", env_int(env, "RANK"), beneath.task_rank, beneath.sources.get("task_rank", "its rank")),
        ("WORLD_SIZE", env_int(env, "WORLD_SIZE", minimum=1), beneath.ntasks, beneath.sources.get("tasks_per_node", "its task count")),
        ("LOCAL_RANK", env_int(env, "LOCAL_RANK"), beneath.local_task_rank, beneath.sources.get("local_task_rank", "its local rank")),
        ("LOCAL_WORLD_SIZE", env_int(env, "LOCAL_WORLD_SIZE", minimum=1), beneath.tasks_on_this_node, beneath.sources.get("tasks_per_node", "")),
    )
    copied = []
    for name, value, truth, origin in checks:
        if value is None or truth is None:
            continue
        if value != truth:
            raise HpctorchError(
                f"{name}={value} contradicts {scheduler}, which says {truth} ({origin})",
                f"unset {name} (hpctorch sets torch's variables from {scheduler}), or fix the wrapper that exports it",
            )
        copied.append(name)
    sources = dict(beneath.sources)
    sources["torch variables"] = f"{', '.join(copied)} copied from {scheduler}'s: planned from {scheduler}"
    master_port = env_int(env, "MASTER_PORT", minimum=1)
    for key, var in (("master_addr", "MASTER_ADDR"), ("master_port", "MASTER_PORT")):
        if env.get(var):
            sources[key] = var
    return replace(
        beneath,
        master_addr=env.get("MASTER_ADDR") or beneath.master_addr,
        master_port=master_port if master_port is not None else beneath.master_port,
        sources=sources,
    )
