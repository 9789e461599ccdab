"""Slurm: job and step variables (slurm.schedmd.com/srun.html#OPT_SLURM_STEP_ID,
slurm.schedmd.com/sbatch.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES).

Read: SLURM_JOB_ID, SLURM_STEP_ID, SLURM_STEP_NODELIST / SLURM_JOB_NODELIST,
SLURM_STEP_NUM_NODES / SLURM_NNODES, SLURM_STEP_TASKS_PER_NODE /
SLURM_TASKS_PER_NODE (``2(x3),1``), SLURM_STEP_NUM_TASKS / SLURM_NTASKS,
SLURM_PROCID, SLURM_NODEID, SLURM_LOCALID,
SLURM_STEP_RESV_PORTS, SLURM_SUBMIT_DIR, SLURM_RESTART_COUNT (the times a requeued job has
restarted), and in a batch script SLURM_TASKS_PER_NODE and
SLURM_JOB_CPUS_PER_NODE (whether every rank fits as a task); with SLURM_DISTRIBUTION=arbitrary (``srun -m
arbitrary``), SLURM_HOSTFILE for the node of task 0. Step variables win over job variables. Outside a step (the
batch script, an salloc shell) on several nodes, hpctorch relaunches itself with
``srun``, one task per node (``LAUNCHER.relaunch``); ``scontrol requeue`` requeues.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..errors import HpctorchError
from . import hostlist
from ._parse import check_rank, env_int
from .allocation import Allocation, Launched, Launcher, launched_by_tasks

LAUNCHER = Launcher(
    "slurm",
    # --kill-on-bad-exit: one failed node ends the step, not the wall-clock limit.
    relaunch=("srun", "--nodes={nnodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1"),
    relaunch_per_task=("srun", "--nodes={nnodes}", "--ntasks-per-node={tasks}", "--kill-on-bad-exit=1"),
    gpu_per_task=("--gpus-per-task=1",),
    requeue=("scontrol", "requeue"),
    # scontrol(1): ExcNodeList of a pending or requeued job; it replaces the list the job had.
    exclude_on_requeue=("scontrol", "update", "JobId={job}", "ExcNodeList={nodes}"),
)
_TASKS_ITEM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def parse_tasks_per_node(value: str, name: str = "SLURM_TASKS_PER_NODE") -> tuple[int, ...]:
    """``2(x3),1`` -> (2, 2, 2, 1)."""
    counts: list[int] = []
    for item in value.split(","):
        match = _TASKS_ITEM.match(item.strip())
        if match is None:
            raise HpctorchError(f"{name}={value!r} is not Slurm's 'N(xM),...' form", f"unset {name} or fix its value")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return tuple(counts)


def _per_node(env: Mapping[str, str], name: str, nnodes: int) -> tuple[int, ...] | None:
    """A per-node count in Slurm's ``2(x3),1`` form, when set and one per node."""
    value = env.get(name)
    if not value:
        return None
    counts = parse_tasks_per_node(value, name)
    return counts if len(counts) == nnodes else None


def _first(env: Mapping[str, str], *names: str) -> tuple[str | None, str | None]:
    for name in names:
        if env.get(name):
            return env[name], name
    return None, None


def _task_order(path: str, nodes: tuple[str, ...], tasks: tuple[int, ...], node_rank: int | None) -> tuple[tuple[str, ...], tuple[int, ...], int | None]:
    """``srun -m arbitrary``: SLURM_HOSTFILE names each task's host in task order, and the node
    list is sorted, so task 0 (the master) may run on any node. Nodes in the order their
    first task appears; SLURM_NODEID counts in the sorted list."""
    try:
        with open(path, encoding="utf-8") as source:
            hosts = [line.split()[0] for line in source if line.strip() and not line.lstrip().startswith("#")]
    except OSError as exc:
        raise HpctorchError(f"SLURM_HOSTFILE={path} (srun -m arbitrary) cannot be read: {exc.strerror}",
                            "keep the host file where every node can read it until the step ends") from None
    order = [h for i, h in enumerate(hosts) if h in nodes and h not in hosts[:i]]
    if sorted(order) != sorted(nodes):
        raise HpctorchError(f"SLURM_HOSTFILE={path} names {', '.join(sorted(set(hosts)))}, not the step's nodes {', '.join(nodes)}",
                            "point SLURM_HOSTFILE at the file this step was started with")
    counts = dict(zip(nodes, tasks))
    mine = nodes[node_rank] if node_rank is not None else None
    return tuple(order), tuple(counts[n] for n in order), (order.index(mine) if mine is not None else None)


def _check_node_count(env: Mapping[str, str], nodes: tuple[str, ...], nodelist: str, nodelist_var: str, in_step: bool) -> None:
    """The count Slurm gives beside the list must agree with it. In a step SLURM_NNODES is the
    step's count and SLURM_NODELIST the job's list (seen under srun -N1 in a 2-node salloc), so
    each list is compared with its own count only."""
    if nodelist_var == "SLURM_STEP_NODELIST":
        names = ("SLURM_STEP_NUM_NODES", "SLURM_NNODES")
    elif not in_step and nodelist_var == "SLURM_JOB_NODELIST":
        names = ("SLURM_JOB_NUM_NODES", "SLURM_NNODES")
    else:
        return
    for name in names:
        count = env_int(env, name)
        if count is not None:
            if count != len(nodes):
                raise HpctorchError(f"{name}={count} but {nodelist_var}={nodelist} names {len(nodes)} node(s)",
                                    "the Slurm variables contradict each other; unset the stale ones (e.g. from a nested salloc)")
            return


def detect(env: Mapping[str, str]) -> Allocation | None:
    job_id, job_var = _first(env, "SLURM_JOB_ID", "SLURM_JOBID")
    if job_id is None:
        return None
    in_step = bool(env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")) and env.get("SLURM_PROCID") is not None
    step_id, _ = _first(env, "SLURM_STEP_ID", "SLURM_STEPID")
    # The batch script runs with no SLURM_STEP_* lists: it reads the job's node list.
    step_first = ("SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST")
    nodelist, nodelist_var = _first(env, *(step_first if in_step else ("SLURM_JOB_NODELIST", "SLURM_NODELIST")))
    if nodelist is None or nodelist_var is None:
        raise HpctorchError(
            f"{job_var}={job_id} is set but no SLURM_*NODELIST is",
            "run inside a Slurm job (sbatch, salloc, srun), or unset the stale SLURM_ variables",
        )
    nodes = tuple(hostlist.expand(nodelist))
    _check_node_count(env, nodes, nodelist, nodelist_var, in_step)
    sources = {"job_id": job_var or "", "nodes": nodelist_var}

    if not in_step:
        # The batch script or an salloc shell: one process, not a training rank. What the job
        # asked for per node decides how it relaunches itself (every rank, if that fits).
        asked = _per_node(env, "SLURM_TASKS_PER_NODE", len(nodes))
        cpus = _per_node(env, "SLURM_JOB_CPUS_PER_NODE", len(nodes))
        return Allocation(
            launcher=LAUNCHER,
            nodes=nodes,
            tasks_per_node=(asked or (1,) * len(nodes)) if len(nodes) > 1 else (1,),
            cpus_per_node=cpus or (),
            launched=Launched.BATCH if len(nodes) > 1 else Launched.NODES,
            job_id=job_id,
            submit_dir=env.get("SLURM_SUBMIT_DIR"),
        restarts=env_int(env, "SLURM_RESTART_COUNT") or 0,
            sources=sources,
        )

    tasks_raw, tasks_var = _first(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    _, ntasks_var = _first(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    if tasks_raw is None or tasks_var is None:
        raise HpctorchError("a Slurm step without SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE", "run the step with srun")
    tasks = parse_tasks_per_node(tasks_raw, tasks_var)
    sources["tasks_per_node"] = tasks_var
    if len(tasks) != len(nodes):
        raise HpctorchError(
            f"{tasks_var}={tasks_raw} describes {len(tasks)} node(s) but {nodelist_var} names {len(nodes)}",
            "the Slurm variables contradict each other; unset the stale ones (e.g. from a nested salloc)",
        )
    total = env_int(env, ntasks_var) if ntasks_var else None
    if total is not None and total != sum(tasks):
        raise HpctorchError(
            f"{ntasks_var}={total} does not match {tasks_var}={tasks_raw} (sum {sum(tasks)})",
            "the Slurm variables contradict each other; unset the stale ones",
        )
    rank = env_int(env, "SLURM_PROCID")
    node_rank = env_int(env, "SLURM_NODEID")
    local = env_int(env, "SLURM_LOCALID")
    check_rank("SLURM_PROCID", rank, "tasks", sum(tasks))
    check_rank("SLURM_NODEID", node_rank, "nodes", len(nodes))
    if node_rank is not None:
        check_rank("SLURM_LOCALID", local, f"tasks on node {node_rank}", tasks[node_rank])
    sources.update(task_rank="SLURM_PROCID", node_rank="SLURM_NODEID", local_task_rank="SLURM_LOCALID", step_id="SLURM_STEP_ID")
    if env.get("SLURM_DISTRIBUTION", "").startswith("arbitrary") and env.get("SLURM_HOSTFILE"):
        nodes, tasks, node_rank = _task_order(env["SLURM_HOSTFILE"], nodes, tasks, node_rank)
        sources["nodes"] = "SLURM_HOSTFILE (srun -m arbitrary: the node of task 0 first)"
    resv = env.get("SLURM_STEP_RESV_PORTS")
    port = int(resv.split("-")[0].split(",")[0]) if resv and resv[0].isdigit() else None
    if port is not None:
        sources["master_port"] = "SLURM_STEP_RESV_PORTS"
    return Allocation(
        launcher=LAUNCHER,
        nodes=nodes,
        tasks_per_node=tasks,
        launched=launched_by_tasks(tasks),
        job_id=job_id,
        step_id=step_id,
        task_rank=rank,
        node_rank=node_rank,
        local_task_rank=local,
        master_port=port,
        submit_dir=env.get("SLURM_SUBMIT_DIR"),
        restarts=env_int(env, "SLURM_RESTART_COUNT") or 0,
        sources=sources,
    )
