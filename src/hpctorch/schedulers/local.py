"""No scheduler: this machine alone, one launcher process."""

from __future__ import annotations

import socket
from collections.abc import Mapping

from .allocation import Allocation, Launcher

LAUNCHER = Launcher("local", numbers_nodes=False)


def detect(env: Mapping[str, str]) -> Allocation:
    """Always matches; the last detector in the registry."""
    return Allocation(
        launcher=LAUNCHER,
        nodes=(socket.gethostname(),),
        tasks_per_node=(1,),
        task_rank=0,
        node_rank=0,
        local_task_rank=0,
        sources={"nodes": "socket.gethostname()"},
    )
