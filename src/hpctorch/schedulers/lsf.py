"""IBM Spectrum LSF (IBM docs, "Environment variables set for job execution") and
jsrun (IBM Job Step Manager, JSM_NAMESPACE_* variables, as on OLCF Summit).

Read: LSB_JOBID, LSB_DJOB_RANKFILE (one host per rank, after the launch node),
LSB_DJOB_HOSTFILE / LSB_MCPU_HOSTS ("hostA 4 hostB 4"), LS_SUBCWD, and under jsrun
JSM_NAMESPACE_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import HpctorchError
from ._hostfiles import group_slots, read_slot_file
from ._parse import check_rank, env_int
from .allocation import Allocation, Launcher, launched_by_tasks

LAUNCHER = Launcher("lsf", requeue=("brequeue",))


def _without_launch_node(hosts: list[str]) -> list[str]:
    """LSF lists the launch (batch) node first, once; it runs no rank (as on OLCF Summit,
    where it is batchN; Lightning's LSFEnvironment skips it too)."""
    if len(set(hosts)) > 1 and hosts.count(hosts[0]) == 1:
        return hosts[1:]
    return hosts


def _slot_hosts(env: Mapping[str, str]) -> tuple[list[str], str]:
    for variable in ("LSB_DJOB_RANKFILE", "LSB_DJOB_HOSTFILE"):
        if env.get(variable):
            return _without_launch_node(read_slot_file(env[variable], variable)), variable
    words = env.get("LSB_MCPU_HOSTS", "").split()
    if not words or len(words) % 2:
        raise HpctorchError("an LSF job without LSB_DJOB_RANKFILE, LSB_DJOB_HOSTFILE or a valid LSB_MCPU_HOSTS", "run inside the LSF job")
    hosts: list[str] = []
    for host, count in zip(words[::2], words[1::2]):
        hosts.extend([host] * int(count))
    return _without_launch_node(hosts), "LSB_MCPU_HOSTS"


def detect(env: Mapping[str, str]) -> Allocation | None:
    job_id = env.get("LSB_JOBID")
    if not job_id:
        return None
    hosts, origin = _slot_hosts(env)
    # Slots are CPUs (job slots), not workers: the worker count comes from the GPUs, as elsewhere.
    nodes, _ = group_slots(hosts)
    sources = {"job_id": "LSB_JOBID", "nodes": origin}
    rank = env_int(env, "JSM_NAMESPACE_RANK")
    if rank is None:
        if len(nodes) > 1:
            raise HpctorchError(
                f"this is the LSF job script of job {job_id} on {len(nodes)} nodes, not one task per node",
                "start one hpctorch per node: 'jsrun -r 1 hpctorch run ...' or 'blaunch ...'",
            )
        return Allocation(launcher=LAUNCHER, nodes=nodes, tasks_per_node=(1,), job_id=job_id, task_rank=0, node_rank=0,
                          local_task_rank=0, submit_dir=env.get("LS_SUBCWD"), sources=sources)
    size = env_int(env, "JSM_NAMESPACE_SIZE", minimum=1) or 1
    local = env_int(env, "JSM_NAMESPACE_LOCAL_RANK")
    local_size = env_int(env, "JSM_NAMESPACE_LOCAL_SIZE", minimum=1) or 1
    check_rank("JSM_NAMESPACE_RANK", rank, "JSM_NAMESPACE_SIZE", size)
    if size % local_size or size // local_size > len(nodes):
        raise HpctorchError(
            f"jsrun started {size} tasks, {local_size} per node, but the job has {len(nodes)} node(s) in {origin}",
            "launch with a fixed number of tasks per node (jsrun -r N)",
        )
    tasks = (local_size,) * (size // local_size)
    sources.update(task_rank="JSM_NAMESPACE_RANK", local_task_rank="JSM_NAMESPACE_LOCAL_RANK", tasks_per_node="JSM_NAMESPACE_SIZE, JSM_NAMESPACE_LOCAL_SIZE")
    # jsrun fills nodes in order (-r resource sets per host): rank // local size is the node.
    return Allocation(
        launcher=LAUNCHER, nodes=nodes[: len(tasks)], tasks_per_node=tasks, launched=launched_by_tasks(tasks), job_id=job_id,
        task_rank=rank, node_rank=rank // local_size, local_task_rank=local,
        submit_dir=env.get("LS_SUBCWD"), sources=sources,
    )
