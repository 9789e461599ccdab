"""How often a process's CPU quota held it back: its cgroup's ``cpu.stat``.

A cgroup with a CPU quota (a container's limit, a batch system's cgroup, Kubernetes' ``cpu``
limit) runs until its quota for the scheduler's period is spent, then waits for the next period:
its processes freeze wherever they are, inside a collective too. ``nr_periods`` counts the periods
in which the group ran, ``nr_throttled`` those in which it used its quota up and was held back
(the same names in cgroup v1's cpu controller and in v2); their ratio over a window is bounded,
whatever the number of CPUs (``throttled_time``/``throttled_usec`` add up per CPU).
"""

from __future__ import annotations

import os

CGROUP_ROOT = "/sys/fs/cgroup"


def cpu_stat_path(pid: int, root: str = CGROUP_ROOT) -> str | None:
    """The ``cpu.stat`` of ``pid``'s CPU controller, where it can be read."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as source:
            lines = source.read().splitlines()
    except OSError:
        return None
    candidates = []
    for line in lines:
        _id, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        names = controllers.split(",")
        if "cpu" in names:  # v1: the mount is named after its controllers (cpu, or cpu,cpuacct)
            for mount in (",".join(names), "cpu", "cpu,cpuacct", "cpuacct,cpu"):
                candidates.append(os.path.join(root, mount, path.lstrip("/"), "cpu.stat"))
        elif controllers == "":  # v2: one hierarchy (under "unified" in a hybrid layout, with no cpu there)
            candidates.append(os.path.join(root, path.lstrip("/"), "cpu.stat"))
    for candidate in candidates:
        if os.path.isfile(candidate) and periods(candidate) is not None:
            return candidate
    return None


def periods(path: str) -> tuple[int, int] | None:
    """The running counters ``(nr_periods, nr_throttled)`` of a ``cpu.stat``, or None where it
    has none."""
    try:
        with open(path, encoding="ascii") as source:
            fields = dict(line.split(None, 1) for line in source.read().splitlines() if " " in line)
        return int(fields["nr_periods"]), int(fields["nr_throttled"])
    except (OSError, KeyError, ValueError):
        return None

