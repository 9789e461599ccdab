"""PBS Pro and Torque (Altair PBS Professional Reference Guide, "PBS environment
variables"; Torque Administrator Guide, "Exported batch environment variables").

Read: PBS_JOBID, PBS_NODEFILE (one line per slot), PBS_O_WORKDIR, and under
Torque's ``pbsdsh -u`` PBS_NODENUM (this node's index). Under ``mpiexec`` on a Cray
system the PALS variables are read by the MPI detector first.

A job script on several nodes relaunches itself one task per node with PALS's ``mpiexec -n
NODES --ppn 1`` when PALS is on PATH (HPE Cray EX: /opt/cray/pals/<version>/bin; it passes
the environment and the working directory on). Not with ``pbsdsh``: its tasks start in the
home directory with PBS's variables only (Torque and OpenPBS manuals), so a virtual
environment or module set up in the script would be lost; the error says how instead.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import HpctorchError
from ._hostfiles import group_slots, read_slot_file
from ._parse import check_rank, env_int
from .allocation import Allocation, Launched, Launcher

LAUNCHER = Launcher("pbs", requeue=("qrerun",))
PALS = Launcher("pbs", requeue=("qrerun",), relaunch=("mpiexec", "-n", "{nnodes}", "--ppn", "1"),
                relaunch_per_task=("mpiexec", "-n", "{ntasks}", "--ppn", "{tasks}"))


def _pals_on_path(env: Mapping[str, str]) -> bool:
    return any("/pals/" in entry for entry in env.get("PATH", "").split(":"))


def detect(env: Mapping[str, str]) -> Allocation | None:
    job_id = env.get("PBS_JOBID")
    if not job_id:
        return None
    nodefile = env.get("PBS_NODEFILE")
    if not nodefile:
        raise HpctorchError(f"PBS_JOBID={job_id} is set but PBS_NODEFILE is not", "request nodes with -l select=... (or unset the stale PBS_ variables)")
    # A line per mpiprocs (PBS Pro) or per ppn CPU (Torque): CPUs, not workers. A one-node
    # ngpus=4 job plans one worker per visible GPU; ppn=32 does not ask for 32 workers.
    nodes, _ = group_slots(read_slot_file(nodefile, "PBS_NODEFILE"))
    sources = {"job_id": "PBS_JOBID", "nodes": "PBS_NODEFILE"}
    node_rank = env_int(env, "PBS_NODENUM")
    if node_rank is not None:  # pbsdsh -u: one task per node
        check_rank("PBS_NODENUM", node_rank, "nodes in PBS_NODEFILE", len(nodes))
        sources["node_rank"] = "PBS_NODENUM"
        return Allocation(
            launcher=LAUNCHER, nodes=nodes, tasks_per_node=(1,) * len(nodes), job_id=job_id,
            task_rank=node_rank, node_rank=node_rank, local_task_rank=0,
            submit_dir=env.get("PBS_O_WORKDIR"), sources=sources,
        )
    if len(nodes) > 1 and _pals_on_path(env):
        return Allocation(
            launcher=PALS, nodes=nodes, tasks_per_node=(1,) * len(nodes), launched=Launched.BATCH, job_id=job_id,
            submit_dir=env.get("PBS_O_WORKDIR"), sources=sources,
        )
    if len(nodes) > 1:
        raise HpctorchError(
            f"this is the PBS job script of job {job_id} on {len(nodes)} nodes, not one task per node",
            "start one hpctorch per node: 'pbsdsh -u hpctorch run ...' (Torque) or "
            "'mpiexec -n NODES --ppn 1 hpctorch run ...' (PBS Pro, Cray PALS)",
        )
    return Allocation(
        launcher=LAUNCHER, nodes=nodes, tasks_per_node=(1,), job_id=job_id, task_rank=0, node_rank=0,
        local_task_rank=0, submit_dir=env.get("PBS_O_WORKDIR"), sources=sources,
    )
