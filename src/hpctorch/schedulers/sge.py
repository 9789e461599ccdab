"""Son of Grid Engine / Univa Grid Engine (sge_pe(5), qsub(1) "ENVIRONMENTAL
VARIABLES"): JOB_ID, PE_HOSTFILE ("host slots queue processors" per line), NSLOTS,
SGE_O_WORKDIR. The job script runs on the first host of PE_HOSTFILE."""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import HpctorchError
from .allocation import Allocation, Launcher

LAUNCHER = Launcher("sge")


def detect(env: Mapping[str, str]) -> Allocation | None:
    job_id = env.get("JOB_ID")
    pe_hostfile = env.get("PE_HOSTFILE")
    if not job_id or not (pe_hostfile or env.get("SGE_TASK_ID") or env.get("SGE_O_WORKDIR")):
        return None  # JOB_ID alone is too common a name to claim
    nodes: tuple[str, ...] = ()
    if pe_hostfile:
        try:
            with open(pe_hostfile, encoding="utf-8") as listing:
                rows = [line.split() for line in listing if line.strip()]
            nodes = tuple(row[0] for row in rows if int(row[1]) >= 0)
        except (OSError, IndexError, ValueError):
            raise HpctorchError(f"PE_HOSTFILE={pe_hostfile} cannot be read as 'host slots ...' lines", "run inside the SGE job with a parallel environment (-pe)") from None
    if len(nodes) > 1:
        raise HpctorchError(
            f"this is the SGE job script of job {job_id} on {len(nodes)} hosts, not one task per node",
            "start one hpctorch per host with the parallel environment's launcher (mpirun with tight integration, or qrsh -inherit)",
        )
    return Allocation(
        launcher=LAUNCHER, nodes=nodes, tasks_per_node=(1,), job_id=job_id, task_rank=0, node_rank=0, local_task_rank=0,
        submit_dir=env.get("SGE_O_WORKDIR"),  # slots are CPUs, not workers
        sources={"job_id": "JOB_ID", "nodes": "PE_HOSTFILE"},
    )
