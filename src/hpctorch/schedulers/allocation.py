"""What a scheduler or launcher granted, before anything is decided."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace


class Launched(enum.Enum):
    """What the launcher started, which decides how hpctorch runs: one value, not flags."""

    NODES = "one process per node"
    """This process is the node's only one (or the machine is alone): it starts the workers."""
    RANKS = "every rank"
    """The launcher started each training rank itself: this process is one of them."""
    TORCH = "every rank, torch's variables set"
    """torchrun's agent (or equal) set the whole torch environment: change nothing."""
    BATCH = "a batch script"
    """The job's batch script on several nodes, no rank: relaunch one task per node."""
    UNNAMED = "tasks on unnamed nodes"
    """Tasks started, but nothing names their nodes or master: an allgather must (MPI)."""


@dataclass(frozen=True)
class Launcher:
    """What one launcher is, beyond what it says of one job: the behaviours that differ.

    Each module in ``schedulers/`` defines one (or a few, for flavours of MPI). The rest
    of hpctorch asks these fields; it never compares a launcher's name.
    """

    name: str
    numbers_nodes: bool = True
    """False when it knows only this machine (no scheduler): --nnodes/--node-rank then decide."""
    relaunch: tuple[str, ...] = ()
    """From a batch script: the command prefix that starts one task per node; ``{nnodes}``
    is replaced by the node count. Empty: this launcher cannot be relaunched by hpctorch."""
    requeue: tuple[str, ...] = ()
    """The command that requeues a job, the job id appended; empty: none."""
    exclude_on_requeue: tuple[str, ...] = ()
    """Run before ``requeue``: leaves the user's bad nodes out of the requeued job (``{job}``,
    ``{nodes}`` a hostlist); empty: the launcher has no such command."""
    relaunch_per_task: tuple[str, ...] = ()
    """The prefix that starts every rank from a batch script (``{tasks}`` per node, ``{ntasks}``
    in all), when the launcher can; empty: relaunch one task per node only."""
    gpu_per_task: tuple[str, ...] = ()
    """Added to ``relaunch_per_task`` to bind one GPU to each task, where it can."""
    mpi_libraries: tuple[str, ...] = ()
    """An MPI launcher: the shared libraries of its MPI family, for mpi4py to load
    (``MPI4PY_LIBMPI``: mpi4py's wheels carry both the MPICH and the Open MPI ABI)."""


@dataclass(frozen=True)
class Allocation:
    """The facts a launcher states about this job and this process.

    ``nodes`` is empty when the launcher does not name the hosts (torchrun,
    Kubernetes, MPI before the allgather); otherwise it has one name per entry of
    ``tasks_per_node``, in the order that global ranks follow. ``sources`` maps a field
    name to the environment variables it was read from, for ``hpctorch plan --explain``.
    """

    launcher: Launcher
    tasks_per_node: tuple[int, ...]
    launched: Launched = Launched.NODES
    nodes: tuple[str, ...] = ()
    job_id: str | None = None
    step_id: str | None = None
    task_rank: int | None = None
    node_rank: int | None = None
    local_task_rank: int | None = None
    cpus_per_node: tuple[int, ...] = ()
    """CPUs the scheduler granted on each node, where it says (a batch script: whether every
    rank fits as a task of its own)."""
    master_addr: str | None = None
    master_port: int | None = None
    slots_per_node: tuple[int, ...] | None = None
    """Workers each node should start, when the host list says (``host slots=N``)."""
    submit_dir: str | None = None
    """A directory every node of the job shares (where it was submitted from)."""
    restarts: int = 0
    """How often the scheduler requeued or restarted this job (the same on every node): a
    requeued run keeps its job id, and must not read what the previous one left."""
    sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def scheduler(self) -> str:
        return self.launcher.name

    @property
    def nnodes(self) -> int:
        return len(self.tasks_per_node)

    @property
    def ntasks(self) -> int:
        return sum(self.tasks_per_node)

    @property
    def tasks_on_this_node(self) -> int:
        return self.tasks_per_node[self.node_rank or 0]

    def keeping(self, kept: Sequence[int], master_addr: str) -> "Allocation":
        """The same job on the nodes ``kept`` alone (--spare-nodes), renumbered in their order,
        with ``master_addr`` (the first kept node's); this node must be one of them."""
        assert self.node_rank is not None and self.node_rank in kept, "a spare does not plan"

        def subset(values: tuple[int, ...] | None) -> tuple[int, ...] | None:
            return tuple(values[n] for n in kept) if values else values

        mine = list(kept).index(self.node_rank)
        before = sum(self.tasks_per_node[n] for n in kept[:mine])  # the ranks of the kept nodes ahead of this one
        return replace(self, nodes=tuple(self.nodes[n] for n in kept) if self.nodes else (), tasks_per_node=subset(self.tasks_per_node),
                       cpus_per_node=subset(self.cpus_per_node) or (), slots_per_node=subset(self.slots_per_node), node_rank=mine,
                       task_rank=None if self.task_rank is None else before + (self.local_task_rank or 0), master_addr=master_addr,
                       sources={**self.sources, "master_addr": "the first node kept after the screen (--spare-nodes)"})

    def relaunch_command(self, tasks: int | None = None, gpus: bool = False) -> tuple[str, ...]:
        """The launcher's relaunch prefix for this job's node count: one task per node, or with
        ``tasks`` every rank (and a GPU bound to each with ``gpus``)."""
        template = self.launcher.relaunch if tasks is None else (*self.launcher.relaunch_per_task, *(self.launcher.gpu_per_task if gpus else ()))
        values = {"{nnodes}": self.nnodes, "{tasks}": tasks, "{ntasks}": (tasks or 1) * self.nnodes}
        for key, value in values.items():
            template = tuple(part.replace(key, str(value)) for part in template)
        return tuple(template)


def launched_by_tasks(tasks_per_node: tuple[int, ...]) -> Launched:
    """Several tasks on any node means the launcher started every rank: mixed 1- and
    2-task nodes must all run per task, or ranks would not add up."""
    return Launched.RANKS if max(tasks_per_node, default=1) > 1 else Launched.NODES
