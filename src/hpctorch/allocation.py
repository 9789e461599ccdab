"""What a scheduler or launcher granted, before anything is decided."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Allocation:
    """The facts a scheduler states about this job and this process.

    ``nodes`` is empty when the launcher does not name the hosts (torchrun,
    Kubernetes); otherwise it has one name per entry of ``tasks_per_node``, in
    the order that global ranks follow. ``sources`` maps a field name to the
    environment variables it was read from, for ``hpctorch plan --explain``.
    """

    scheduler: str
    tasks_per_node: tuple[int, ...]
    nodes: tuple[str, ...] = ()
    job_id: str | None = None
    step_id: str | None = None
    task_rank: int | None = None
    node_index: int | None = None
    local_task_rank: int | None = None
    gpus: tuple[str, ...] | None = None
    master_addr: str | None = None
    master_port: int | None = None
    launched_ranks: bool = False
    """The launcher itself started every training rank (per-task by nature)."""
    complete: bool = False
    """The launcher already set the whole torch environment: change nothing."""
    slots_per_node: tuple[int, ...] | None = None
    """Workers each node should start, when the host list says (``host slots=N``)."""
    needs_bootstrap: bool = False
    """The launcher names no nodes or master (MPI): an allgather must find them."""
    submit_dir: str | None = None
    """A directory every node of the job shares (where it was submitted from)."""
    step_launcher: tuple[str, ...] = ()
    """Outside any job step (a batch script on several nodes): the command prefix
    that starts one task per node, e.g. ``srun --nodes=2 --ntasks-per-node=1``."""
    sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def nnodes(self) -> int:
        return len(self.tasks_per_node)

    @property
    def ntasks(self) -> int:
        return sum(self.tasks_per_node)

    @property
    def tasks_on_this_node(self) -> int:
        return self.tasks_per_node[self.node_index or 0]
