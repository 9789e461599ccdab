"""``hpctorch run --timings``: where startup went, stage by stage, on every node.

This process notes when each of its stages ended, in seconds since it started (the
process's own start, so imports count; no clock is compared between nodes). The marks
travel to the workers in HPCTORCH_TIMINGS; each worker adds its own (``timings_worker``:
Python up, rendezvous reached and done, first collective) and sends one record through the
job's store; rank 0 prints, for each stage, the slowest node and rank.
"""

from __future__ import annotations

import json
import time

ENV = "HPCTORCH_TIMINGS"
enabled = False
_marks: list[tuple[str, float]] = []
_t0: float | None = None


def start_time() -> float:
    """When this process started (seconds since the epoch). On Linux from its age in clock
    ticks against /proc/uptime: psutil adds the ticks to the boot time, which /proc/stat
    gives in whole seconds (up to a second off)."""
    global _t0
    if _t0 is None:
        _t0 = _linux_start() or _psutil_start()
    return _t0


def _linux_start() -> float | None:
    try:
        import os

        with open("/proc/self/stat", encoding="ascii") as stat, open("/proc/uptime", encoding="ascii") as uptime:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
            age = float(uptime.read().split()[0]) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.time() - max(0.0, age)


def _psutil_start() -> float:
    import psutil

    return psutil.Process().create_time()


def mark(stage: str) -> None:
    """This process finished ``stage`` now: for the closing goodput always (a few per run), for
    the workers' table with --timings."""
    _marks.append((stage, round(time.time() - start_time(), 3)))


def marks() -> list[tuple[str, float]]:
    """This process's stages so far: (stage, seconds since it started)."""
    return list(_marks)


def worker_env(node: int, host: str) -> dict[str, str]:
    """What the workers need to report this node's stages with theirs."""
    if not enabled:
        return {}
    return {ENV: json.dumps({"t0": start_time(), "node": node, "host": host, "marks": _marks})}


def table(records: list[dict]) -> list[str]:
    """For each stage, in the order they happen: the slowest node (and rank) and its seconds."""
    slowest: dict[str, tuple[float, str]] = {}
    order: list[str] = []
    hosts = {r["node"]: r["host"] for r in records}
    shared = len(set(hosts.values())) < len(hosts)  # simulated nodes: one host name
    for record in records:
        where = f"node {record['node']}" if shared else record["host"]
        record = {**record, "host": where}
        who = f"{where} rank {record['rank']}"
        for stage, seconds in record["marks"]:
            if stage not in order:
                order.append(stage)
            if stage not in slowest or seconds > slowest[stage][0]:
                slowest[stage] = (seconds, who if stage.startswith("worker:") else record["host"])
    order.sort(key=lambda stage: slowest[stage][0])
    nodes = len({r["node"] for r in records})
    lines = [f"hpctorch: startup of {len(records)} rank(s) on {nodes} node(s), seconds from each node's hpctorch start (slowest shown):"]
    lines += [f"  {stage:<34} {slowest[stage][0]:7.2f}  {slowest[stage][1]}" for stage in order]
    return lines


def enable_from(flag: bool) -> None:
    global enabled
    enabled = flag
