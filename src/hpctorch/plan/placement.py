"""Which GPUs and CPUs each local worker gets, and its thread count. Pure.

GPUs: the visible set is never narrowed per worker in per-node mode: local rank r uses
devices [r*K, (r+1)*K) of it, as torchrun scripts index them (``LOCAL_RANK`` never points
past the visible devices; impossible requests are refused with the arithmetic). In
per-task mode, a task the launcher bound to its own K GPUs (srun --gpus-per-task) uses
devices 0..K-1, so its LOCAL_RANK becomes 0 (its place on the node stays in
HPCTORCH_LOCAL_TASK_RANK).
CPUs: the allowed set is split among the node's workers (``affinity.split``), by the NUMA
node of each worker's first GPU when known.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import HpctorchError
from ..host import affinity
from ..host.facts import HostFacts


@dataclass(frozen=True)
class Placement:
    devices: tuple[tuple[str, ...], ...]
    """Per local worker: positions in the visible device list."""
    cpus: tuple[tuple[int, ...], ...]
    """Per local worker: CPUs to bind to; empty means unbound."""
    threads: tuple[int, ...]
    local_rank: int | None = None
    """Per-task mode: the LOCAL_RANK to give instead of the launcher's (device 0)."""


def topology(facts: HostFacts) -> affinity.CpuTopology:
    return facts.topology or affinity.CpuTopology(tuple(range(facts.cpus)), online=facts.cpus)


def _bind_mode(requested: str | None, workers: int, facts: HostFacts, reasons: dict[str, str]) -> str:
    if requested and requested not in affinity.BIND_MODES:
        raise HpctorchError(f"--cpu-bind {requested!r} is not one of {', '.join(affinity.BIND_MODES)}", "give none, cores or numa")
    mode = requested or ("cores" if workers > 1 else "none")
    if mode != "none" and not facts.can_bind:
        reasons["cpu_bind"] = "none: this platform cannot bind processes to CPUs (no sched_setaffinity: macOS, Windows)"
        return "none"
    return mode


def _describe_gpus(facts: HostFacts) -> str:
    return f"{len(facts.gpus)} visible ({facts.gpu_source or 'GPUs'}={','.join(facts.gpus)})" if facts.gpus else "none visible"


def per_node(facts: HostFacts, workers: int, gpus_per_proc: int | None, cpu_bind: str | None, reasons: dict[str, str]) -> Placement:
    per = gpus_per_proc or 1
    devices: list[tuple[str, ...]] = []
    numa: list[int | None] = []
    if gpus_per_proc is not None and gpus_per_proc < 1:
        raise HpctorchError(f"--gpus-per-proc {gpus_per_proc} is not a count", "give 1 or more")
    if facts.gpus:
        if workers * per > len(facts.gpus):
            raise HpctorchError(
                f"{workers} processes x {per} GPU(s) = {workers * per} GPUs, but {_describe_gpus(facts)}",
                f"start at most {len(facts.gpus) // per} process(es) per node, or ask the scheduler for more GPUs",
            )
        for rank in range(workers):
            positions = range(rank * per, (rank + 1) * per)
            devices.append(tuple(str(p) for p in positions))
            numa.append(facts.gpu_numa[positions[0]] if positions[0] < len(facts.gpu_numa) else None)
        reasons["devices"] = f"local rank r uses visible devices [r*{per}, (r+1)*{per}) of {_describe_gpus(facts)}"
    elif gpus_per_proc is not None:
        raise HpctorchError(f"--gpus-per-proc {gpus_per_proc} but no GPU is visible here", "drop --gpus-per-proc, or run on a GPU node")
    else:
        devices = [()] * workers
        numa = [None] * workers
    topo = topology(facts)
    mode = _bind_mode(cpu_bind, workers, facts, reasons)
    cpus = affinity.split(topo, workers, numa, mode)
    if mode != "none":
        by = "each GPU's NUMA node" if numa and all(n is not None for n in numa) else "core order"
        if mode == "numa":
            reasons["cpu_bind"] = f"numa: each of {workers} worker(s) on all allowed CPUs of one NUMA node (by {by})"
        else:
            reasons["cpu_bind"] = f"cores: {len(topo.allowed)} allowed CPUs split among {workers} workers by {by}"
    else:
        reasons.setdefault("cpu_bind", "none" + (" (one worker)" if workers == 1 and not cpu_bind else ""))
    return Placement(tuple(devices), cpus, tuple(affinity.threads(c, topo, workers) for c in cpus))


def per_task(facts: HostFacts, local_rank: int, local_tasks: int, gpus_per_proc: int | None, cpu_bind: str | None,
             reasons: dict[str, str]) -> Placement:
    per = gpus_per_proc or 1
    devices: tuple[str, ...] = ()
    override = None
    visible = len(facts.gpus)
    if visible:
        if visible >= local_tasks * per:
            devices = tuple(str(p) for p in range(local_rank * per, (local_rank + 1) * per))
            reasons["devices"] = f"every task sees the node's {visible} GPUs: local task r uses [r*{per}, (r+1)*{per})"
        elif visible == per:
            devices, override = tuple(str(p) for p in range(per)), 0
            reasons["devices"] = (f"the launcher bound {per} GPU(s) to this task ({_describe_gpus(facts)}): "
                                  "it uses device 0, so LOCAL_RANK=0 (HPCTORCH_LOCAL_TASK_RANK keeps its place)")
        else:
            raise HpctorchError(
                f"local task {local_rank} of {local_tasks} sees {visible} GPU(s) ({_describe_gpus(facts)}): "
                f"neither the node's {local_tasks} x {per} = {local_tasks * per} nor its own {per}",
                "ask the scheduler for --gpus-per-task matching --gpus-per-proc, or for all the node's GPUs",
            )
    elif gpus_per_proc is not None:
        raise HpctorchError(f"--gpus-per-proc {gpus_per_proc} but no GPU is visible to this task", "drop --gpus-per-proc, or ask for GPUs")
    topo = topology(facts)
    mode = _bind_mode(cpu_bind, local_tasks, facts, reasons)
    cpus: tuple[int, ...] = ()
    if mode != "none" and len(topo.allowed) < topo.online and not cpu_bind:  # srun/mpirun --cpu-bind did it
        reasons["cpu_bind"] = f"left as the launcher bound it ({affinity.format_cpulist(topo.allowed)})"
    elif mode != "none":
        # Every task sees the node's GPUs: task t's NUMA node is that of its first GPU.
        numas: list[int | None] = [None] * local_tasks
        if override is None and visible:
            numas = [facts.gpu_numa[t * per] if t * per < len(facts.gpu_numa) else None for t in range(local_tasks)]
        shares = affinity.split(topo, local_tasks, numas, mode)
        cpus = shares[local_rank] if local_rank < len(shares) else ()
        reasons["cpu_bind"] = f"{mode}: this task's share of {len(topo.allowed)} CPUs among {local_tasks} local tasks"
    else:
        reasons.setdefault("cpu_bind", "none")
    launcher_bound = len(topo.allowed) < topo.online
    threads = affinity.threads(cpus or (topo.allowed if launcher_bound else ()), topo, local_tasks)
    return Placement((devices,), (cpus,), (threads,), override)


def worker_vars(placement: Placement, index: int, facts: HostFacts, omp_from_user: bool) -> dict[str, str]:
    """The variables that differ between a node's workers."""
    env: dict[str, str] = {}
    if placement.devices[index]:
        env["HPCTORCH_DEVICES"] = ",".join(placement.devices[index])
    if placement.cpus[index]:
        env["HPCTORCH_CPUS"] = affinity.format_cpulist(placement.cpus[index])
    if not omp_from_user:
        env["OMP_NUM_THREADS"] = str(placement.threads[index])
    return env


def sets_env(placement: Placement, omp_from_user: bool) -> dict[str, str]:
    """Per-node mode: what the worker entry (``hpctorch/_worker.py``) reads to give worker
    LOCAL_RANK its own ``worker_vars``; empty when the workers do not differ."""
    env: dict[str, str] = {}
    if any(placement.cpus):
        env["HPCTORCH_CPU_SETS"] = ";".join(affinity.format_cpulist(c) for c in placement.cpus)
    if any(placement.devices):
        env["HPCTORCH_DEVICE_SETS"] = ";".join(",".join(d) for d in placement.devices)
    if env and not omp_from_user:
        env["HPCTORCH_THREAD_COUNTS"] = ",".join(map(str, placement.threads))
    return env

