"""What hpctorch will do: the ``Plan`` (and the ``Options`` it answers), as data.

``decide.make_plan`` makes it; ``render`` prints it; ``launch`` carries it out. A Plan is
final when shown: it is never patched afterwards.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

MODES = ("auto", "per-node", "per-task")
"""What ``--mode`` accepts."""
PLAN_MODES = ("per-node", "per-task", "unchanged", "relaunch")
"""What a Plan does: start the node's workers; become one rank; run the command with the
environment as the launcher set it; re-run hpctorch one task per node (batch script)."""
DEFAULT_RDZV_TIMEOUT_S = 300
ROLE = "default"  # torchrun's role name, so ROLE_NAME matches a torchrun job
TORCH_AGENT_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                    "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_*")
"""What torch's elastic agent sets for each worker in per-node mode (torchrun's contract)."""


@dataclass(frozen=True)
class Options:
    """What the user asked for; None means "decide for me"."""

    nproc_per_node: int | None = None
    nnodes: int | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    iface: str | None = None
    mode: str = "auto"
    simulate_nodes: int | None = None
    max_restarts: int = 0
    rdzv_timeout: int = DEFAULT_RDZV_TIMEOUT_S
    run_id: str | None = None
    rendezvous_dir: str | None = None
    hostfile: str | None = None
    hosts: str | None = None
    gpus_per_proc: int | None = None
    cpu_bind: str | None = None
    standalone: bool = False
    command: tuple[str, ...] = ()
    min_nodes: int | None = None
    """``--nnodes MIN:MAX``: the fewest nodes torch's c10d rendezvous may start with."""
    rdzv_backend: str | None = None
    rdzv_conf: Mapping[str, str] = field(default_factory=dict)
    agent: Mapping[str, object] = field(default_factory=dict)
    """LaunchConfig fields the user set with torchrun's agent options (``cli.torchrun.AGENT``)."""
    torch_agent_for: tuple[str, ...] = ()
    """Options given that only torch's elastic agent serves (``--tee``, ``--stall-timeout``...)."""
    local_rank_arg: str | None = None
    """Also pass the local rank as ``SPELLING=N`` (torch.distributed.launch's scripts)."""
    master_flag: str = "--master-addr"
    """The flag the master address and port came from (``--rdzv-endpoint`` too), for the reasons."""


def is_python(command: Sequence[str]) -> bool:
    """A worker command that is a Python script or module as hpctorch builds it
    (``python -u ...``): run through ``_worker.py`` in the same process."""
    from ..staged import pythons

    return len(command) > 2 and command[0] in pythons() and command[1] == "-u"


@dataclass(frozen=True)
class Worker:
    """One training process this machine will run, and what hpctorch sets for it.

    Per task: its whole environment (hpctorch sets it and execs). Per node: what hpctorch
    adds for this worker; torch's agent sets ``TORCH_AGENT_VARS`` itself.
    """

    node_rank: int
    local_rank: int
    rank: int
    env: Mapping[str, str]


@dataclass(frozen=True)
class Plan:
    """What hpctorch will do. ``master_port`` 0 means the rendezvous binds a free one."""

    mode: str
    scheduler: str
    job_id: str | None
    nodes: tuple[str, ...]
    node_rank: int
    nproc_per_node: tuple[int, ...]
    master_addr: str | None
    """None only where it is still to be learnt: from ``master_exchange`` at start (this
    node is not node 0), or on each node once relaunched."""
    master_port: int
    rdzv_backend: str
    rdzv_timeout: int
    run_id: str
    iface: str | None
    simulated: bool
    max_restarts: int
    workers: tuple[Worker, ...]
    common_env: Mapping[str, str]
    """Variables added to the environment of every worker on this node."""
    reasons: Mapping[str, str] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)
    command: tuple[str, ...] = ()
    """The full argv of each worker, interpreter included."""
    node_plans: tuple["Plan", ...] = ()
    """With simulated nodes: the plan each simulated node's agent runs."""
    master_exchange: str | None = None
    """A file in a shared directory where node 0 writes its address for the others, because
    the master's host name resolves to a network the chosen interface cannot reach."""
    master_exchange_offered: bool = False
    """On node 0: the file is written for nodes on other subnets, though its own name serves
    here; failing to write it is then a warning, not an error."""
    agreement_dir: str | None = None
    """A directory all nodes share, where each node's planned values are compared with
    the others' before any worker starts (see ``agreement``); None when none is known."""
    relaunch: tuple[str, ...] = ()
    """Mode relaunch: the command prefix that starts one hpctorch per node, or every rank."""
    relaunch_per_task: bool = False
    """Mode relaunch: the prefix starts every rank (each then runs per task)."""
    requeue: tuple[str, ...] = ()
    """The scheduler's requeue command (the job id appended); empty when it has none."""
    requeue_exclude: tuple[str, ...] = ()
    """Run first: the bad nodes left out of the requeued job (``Launcher.exclude_on_requeue``)."""
    container: str | None = None
    """The container runtime hpctorch runs in, if any (shown; it changes nothing)."""
    min_nodes: int | None = None
    """Elastic (``--nnodes MIN:MAX``): torch's c10d rendezvous starts with MIN to ``nnodes`` nodes."""
    node_rank_known: bool = True
    """False under torch's c10d rendezvous without a scheduler: torch numbers the nodes."""
    local_addr: str | None = None
    """This node's address on the chosen interface (what torch's c10d rendezvous advertises)."""
    agent: Mapping[str, object] = field(default_factory=dict)
    rdzv_conf: Mapping[str, str] = field(default_factory=dict)
    starter: str = "torch"
    """Per-node mode: who starts this node's workers: ``torch`` (its elastic agent) or
    ``hpctorch`` (``supervisor``: nothing only torch's agent does is asked; no torch import
    before the workers start)."""
    watch_port: int = 0
    """hpctorch's starter on several nodes: the port of node 0's watchdog store (``nodewatch``),
    apart from the workers' own store at the master port (rank 0's, torch's env://)."""
    master_ports: tuple[int, ...] = ()
    """A port derived from the job id, and its alternates: node 0 serves on the first it can
    bind, every other node joins the first that authenticates (``start.masterport``)."""

    @property
    def watched(self) -> bool:
        """hpctorch's agreement check and watchdog run: every node known by its rank, the node count
        fixed, and a TCP store to share (not with ``--rdzv-backend file``)."""
        return self.node_rank_known and self.min_nodes is None and self.rdzv_backend != "file"

    @property
    def nnodes(self) -> int:
        return len(self.nproc_per_node)

    @property
    def world_size(self) -> int:
        return sum(self.nproc_per_node)

    @property
    def is_master(self) -> bool:
        return self.node_rank == 0 and self.node_rank_known

    def to_dict(self) -> dict:
        data = asdict(self)
        data.update(nnodes=self.nnodes, world_size=self.world_size)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping) -> "Plan":
        """The inverse of ``to_dict``, for handing a plan to another process."""
        data = {k: v for k, v in data.items() if k not in ("nnodes", "world_size")}
        for key in ("nodes", "nproc_per_node", "command", "relaunch", "requeue", "requeue_exclude", "master_ports"):
            data[key] = tuple(data[key])
        data["workers"] = tuple(Worker(**w) for w in data["workers"])
        data["node_plans"] = tuple(cls.from_dict(p) for p in data["node_plans"])
        return cls(**data)
