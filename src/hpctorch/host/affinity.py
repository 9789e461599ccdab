"""This node's CPUs (allowed set, NUMA nodes, cores, cgroup quota) and their split among
local workers. Reading is I/O on /sys and /proc (``root`` for tests); splitting is pure."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .cpulist import format_cpulist, parse_cpulist  # noqa: F401 - format_cpulist is re-exported

BIND_MODES = ("none", "cores", "numa")


@dataclass(frozen=True)
class CpuTopology:
    allowed: tuple[int, ...]
    """CPUs this process may run on (sched_getaffinity: the launcher's and cgroup's cpuset)."""
    numa: Mapping[int, int] = field(default_factory=dict)
    """CPU -> NUMA node; empty when the kernel does not say."""
    core: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    """CPU -> (package, core): hyperthreads of one core share it."""
    online: int = 0
    quota: float | None = None
    """CPUs' worth of time the cgroup grants (cpu.max), when limited."""


def read_sysfs(path: str) -> str | None:
    """A small /proc or /sys file, stripped; None when it cannot be read."""
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return None


def read_topology(root: str = "/", allowed: Sequence[int] | None = None) -> CpuTopology:
    if allowed is None:
        allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    system = os.path.join(root, "sys", "devices", "system")
    numa: dict[int, int] = {}
    try:
        nodes = [d for d in os.listdir(os.path.join(system, "node")) if d.startswith("node") and d[4:].isdigit()]
    except OSError:
        nodes = []
    for node in nodes:
        for cpu in parse_cpulist(read_sysfs(os.path.join(system, "node", node, "cpulist")) or ""):
            numa[cpu] = int(node[4:])
    core: dict[int, tuple[int, int]] = {}
    for cpu in allowed:
        topology = os.path.join(system, "cpu", f"cpu{cpu}", "topology")
        package, core_id = read_sysfs(os.path.join(topology, "physical_package_id")), read_sysfs(os.path.join(topology, "core_id"))
        if package is not None and core_id is not None:
            core[cpu] = (int(package), int(core_id))
    online = len(parse_cpulist(read_sysfs(os.path.join(system, "cpu", "online")) or "")) or len(allowed)
    return CpuTopology(tuple(allowed), numa, core, online, _cgroup_quota(root))


def _cgroup_quota(root: str) -> float | None:
    """cgroup v2 cpu.max of this container (``max 100000`` means unlimited)."""
    text = read_sysfs(os.path.join(root, "sys", "fs", "cgroup", "cpu.max"))
    if not text:
        return None
    limit, _, period = text.partition(" ")
    if limit == "max":
        return None
    try:
        return int(limit) / int(period or 100000)
    except ValueError:
        return None


def _cores(topology: CpuTopology, cpus: Sequence[int]) -> list[list[int]]:
    """``cpus`` grouped by physical core, cores ordered by NUMA node then position."""
    groups: dict[tuple, list[int]] = {}
    for cpu in sorted(cpus, key=lambda c: (topology.numa.get(c, 0), topology.core.get(c, (0, c)), c)):
        key = (topology.numa.get(cpu, 0), topology.core.get(cpu, (cpu, cpu)))
        groups.setdefault(key, []).append(cpu)
    return list(groups.values())


def _share(units: list[list[int]], count: int) -> list[tuple[int, ...]]:
    """Split ``units`` (cores) into ``count`` contiguous runs as even as possible;
    with fewer units than workers, split the CPUs themselves, then share them."""
    if len(units) < count:
        cpus = [c for unit in units for c in unit]
        if len(cpus) < count:
            return [(cpus[i % len(cpus)],) for i in range(count)]
        units = [[c] for c in cpus]
    result = []
    for i in range(count):
        chunk = units[i * len(units) // count : (i + 1) * len(units) // count]
        result.append(tuple(sorted(c for unit in chunk for c in unit)))
    return result


def split(topology: CpuTopology, workers: int, worker_numa: Sequence[int | None], mode: str) -> tuple[tuple[int, ...], ...]:
    """Each local worker's CPUs; empty tuples when ``mode`` is none."""
    if mode == "none" or workers < 1 or not topology.allowed:
        return ((),) * max(workers, 0)
    allowed = topology.allowed
    nodes = sorted({topology.numa[c] for c in allowed if c in topology.numa})
    known = bool(nodes) and all(n is not None and n in nodes for n in worker_numa) and len(worker_numa) == workers
    if mode == "numa":
        if not nodes:
            return (tuple(allowed),) * workers
        chosen = [worker_numa[i] if known else nodes[i * len(nodes) // workers] for i in range(workers)]
        return tuple(tuple(c for c in allowed if topology.numa.get(c) == node) for node in chosen)
    if known:
        # Each GPU's workers share the cores of that GPU's NUMA node.
        result: list[tuple[int, ...]] = [()] * workers
        for node in sorted(set(worker_numa)):  # type: ignore[type-var]
            members = [i for i in range(workers) if worker_numa[i] == node]
            cpus = [c for c in allowed if topology.numa.get(c) == node]
            for index, share in zip(members, _share(_cores(topology, cpus), len(members))):
                result[index] = share
        return tuple(result)
    return tuple(_share(_cores(topology, allowed), workers))


def threads(cpus: Sequence[int], topology: CpuTopology, workers: int) -> int:
    """OMP_NUM_THREADS for a worker bound to ``cpus`` (all allowed CPUs when unbound)."""
    count = len(cpus) or max(1, len(topology.allowed) // max(1, workers))
    if topology.quota is not None:
        count = min(count, max(1, int(topology.quota // max(1, workers))))
    return max(1, count)
