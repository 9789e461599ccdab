"""MPI launchers: the rank variables each one exports to the processes it starts.

- OpenMPI: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
  (docs.open-mpi.org/en/v5.0.x/tuning-apps/environment-var.html). Its _NODE_RANK is
  not the node's index, so it is not read.
- MPICH / Intel MPI (Hydra): PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS; inside
  a Slurm step too, when they are not the step's own (Hydra's proxies started by srun).
- MVAPICH2: MV2_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE.
- Cray PALS (mpiexec on HPE Cray EX): PALS_RANKID, PALS_LOCAL_RANKID, PALS_NODEID,
  PMI_SIZE, PMI_LOCAL_SIZE.
None of them exports the node list or a master address: the Allocation is marked
``Launched.UNNAMED`` and ``bootstrap.mpi_exchange`` fills them in with an allgather.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import HpctorchError
from ._parse import check_rank, env_int
from .allocation import Allocation, Launched, Launcher

# (launcher, rank, size, local rank, local size, node index or None)
OPEN_MPI = ("libmpi.so.40",)
MPICH_ABI = ("libmpi.so.12", "libmpich.so.12")
"""MPICH, Intel MPI, MVAPICH2 and Cray MPICH share MPICH's ABI: libmpi.so.12 (Debian's MPICH
names it libmpich.so.12)."""
FLAVOURS: tuple[tuple[Launcher, str, str, str, str, str | None], ...] = (
    (Launcher("openmpi", mpi_libraries=OPEN_MPI), "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", None),
    (Launcher("mvapich2", mpi_libraries=MPICH_ABI), "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK",
     "MV2_COMM_WORLD_LOCAL_SIZE", None),
    (Launcher("cray-pals", mpi_libraries=MPICH_ABI), "PALS_RANKID", "PMI_SIZE", "PALS_LOCAL_RANKID", "PMI_LOCAL_SIZE", "PALS_NODEID"),
    (Launcher("mpich", mpi_libraries=MPICH_ABI), "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", None),
)
JOB_ID_VARS = ("PMIX_NAMESPACE", "PALS_APID", "PMI_JOBID")


def _mirrors_the_step(env: Mapping[str, str]) -> bool:
    """srun's PMI gives each task its step rank; Hydra inside a Slurm allocation
    (``mpiexec -bootstrap slurm``) starts its proxies as the step's tasks, one per node, and
    the ranks below them carry PMI values of their own."""
    step_size = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS")
    return env.get("PMI_RANK") == env.get("SLURM_PROCID") and (step_size is None or env.get("PMI_SIZE") == step_size)


def detect(env: Mapping[str, str]) -> Allocation | None:
    for launcher, rank_var, size_var, local_var, local_size_var, node_var in FLAVOURS:
        if env.get(rank_var) is None:
            continue
        if rank_var == "PMI_RANK" and env.get("SLURM_STEP_ID") and _mirrors_the_step(env):
            return None  # srun's own PMI sets PMI_RANK: the Slurm detector reads the step
        rank = env_int(env, rank_var)
        size = env_int(env, size_var, minimum=1)
        if rank is None or size is None:
            raise HpctorchError(f"{rank_var} is set but {size_var} is not", f"unset {rank_var} or launch with a complete MPI")
        check_rank(rank_var, rank, size_var, size)
        local_size = env_int(env, local_size_var, minimum=1) or 1
        local = env_int(env, local_var)
        check_rank(local_var, local, local_size_var, local_size)
        node_rank = env_int(env, node_var) if node_var else None
        job_id = next((env[v] for v in JOB_ID_VARS if env.get(v)), None)
        sources = {"task_rank": rank_var, "local_task_rank": local_var, "tasks_per_node": f"{size_var}, {local_size_var}"}
        if node_var:
            sources["node_rank"] = node_var
        # Until the allgather: one node per local group, this node's count everywhere.
        nnodes = max(1, -(-size // local_size))
        return Allocation(
            launcher=launcher,
            tasks_per_node=(local_size,) * nnodes,
            launched=Launched.UNNAMED,
            job_id=job_id,
            task_rank=rank,
            node_rank=node_rank,
            local_task_rank=local,
            sources=sources,
        )
    return None
