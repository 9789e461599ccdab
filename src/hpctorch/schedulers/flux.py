"""Flux (flux-run(1), "ENVIRONMENT"): FLUX_JOB_ID, FLUX_TASK_RANK, FLUX_TASK_LOCAL_ID,
FLUX_JOB_SIZE, FLUX_JOB_NNODES. Flux exports no node list; its PMI serves the
mpi4py allgather, which names the nodes and the master."""

from __future__ import annotations

from collections.abc import Mapping

from .allocation import Allocation, Launched, Launcher

LAUNCHER = Launcher("flux")
from ..errors import HpctorchError
from ._parse import check_rank, env_int


def detect(env: Mapping[str, str]) -> Allocation | None:
    job_id = env.get("FLUX_JOB_ID")
    rank = env_int(env, "FLUX_TASK_RANK")
    if not job_id or rank is None:
        return None
    pmi_rank = env.get("PMI_RANK")
    if any(env.get(v) for v in ("OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "PALS_RANKID")) or (pmi_rank not in (None, str(rank))):
        return None  # another MPI launched this process inside the Flux job
    size = env_int(env, "FLUX_JOB_SIZE", minimum=1) or 1
    nnodes = env_int(env, "FLUX_JOB_NNODES", minimum=1) or 1
    check_rank("FLUX_TASK_RANK", rank, "FLUX_JOB_SIZE", size)
    if size % nnodes:
        raise HpctorchError(f"FLUX_JOB_SIZE={size} tasks do not spread evenly over FLUX_JOB_NNODES={nnodes}", "use flux run -N NODES --tasks-per-node=K")
    per_node = size // nnodes
    return Allocation(
        launcher=LAUNCHER, tasks_per_node=(per_node,) * nnodes, launched=Launched.UNNAMED, job_id=job_id, task_rank=rank,
        local_task_rank=env_int(env, "FLUX_TASK_LOCAL_ID"),
        sources={"job_id": "FLUX_JOB_ID", "task_rank": "FLUX_TASK_RANK", "local_task_rank": "FLUX_TASK_LOCAL_ID",
                 "tasks_per_node": "FLUX_JOB_SIZE, FLUX_JOB_NNODES"},
    )
