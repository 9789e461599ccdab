"""The decision: Allocation + options + host facts -> Plan. Pure; nothing is started."""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
import zlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace

from . import hostlist, network, placement, sites
from .allocation import Allocation
from .errors import HpctorchError
from .facts import HostFacts

MODES = ("auto", "per-node", "per-task")
DEFAULT_RDZV_TIMEOUT_S = 300
ROLE = "default"  # torchrun's role name, so ROLE_NAME matches a torchrun job


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
    command: tuple[str, ...] = ()


@dataclass(frozen=True)
class Worker:
    """One training process this machine will run, with its exact environment."""

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
    master_addr: str
    master_port: int
    rdzv_backend: str
    rdzv_timeout: int
    run_id: str
    iface: str | None
    simulated: bool
    max_restarts: int
    workers: tuple[Worker, ...]
    launcher_env: Mapping[str, str]
    """Variables the launcher adds to the environment it passes on to the workers."""
    reasons: Mapping[str, str] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)
    command: tuple[str, ...] = ()
    """The full argv of each worker, interpreter included."""
    node_plans: tuple["Plan", ...] = ()
    """With simulated nodes: the plan each simulated node's agent runs."""
    master_exchange: str | None = None
    """A file in a shared directory through which node 0 tells the others its address:
    node 0 writes it, the others wait for it (their ``master_addr`` is empty until then)."""
    agreement_dir: str | None = None
    """A directory all nodes share, where each node's planned values are compared with
    the others' before any worker starts (see ``agreement``); None when none is known."""
    step_launcher: tuple[str, ...] = ()
    """Mode launch-step: run re-executes itself under this command, one task per node."""

    @property
    def nnodes(self) -> int:
        return len(self.nproc_per_node)

    @property
    def world_size(self) -> int:
        return sum(self.nproc_per_node)

    @property
    def is_master(self) -> bool:
        return self.node_rank == 0

    def with_master_addr(self, address: str) -> "Plan":
        """This plan once the master's address is known (after the exchange)."""
        workers = tuple(replace(w, env={**w.env, "MASTER_ADDR": address}) for w in self.workers)
        return replace(self, master_addr=address, workers=workers)

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
        for key in ("nodes", "nproc_per_node", "command"):
            data[key] = tuple(data[key])
        data["workers"] = tuple(Worker(**w) for w in data["workers"])
        data["node_plans"] = tuple(cls.from_dict(p) for p in data["node_plans"])
        data["step_launcher"] = tuple(data["step_launcher"])
        return cls(**data)

    def _devices(self) -> str:
        sets = [w.env.get("HPCTORCH_DEVICES") for w in self.workers]
        return "; ".join(f"rank {w.rank}: {d}" for w, d in zip(self.workers, sets) if d) or "none"

    def _cpus(self) -> str:
        sets = [w.env.get("HPCTORCH_CPUS") for w in self.workers]
        return "; ".join(f"rank {w.rank}: {c}" for w, c in zip(self.workers, sets) if c) or "none"

    def table(self, explain: bool = False) -> str:
        """A human-readable summary: decision, value, reason."""
        port = str(self.master_port) if self.master_port else "(a free port bound at start)"
        nodes = hostlist.compress(self.nodes) if self.nodes else "(not named by the launcher)"
        sizes = sorted(set(self.nproc_per_node))
        per_node = str(sizes[0]) if len(sizes) == 1 else ",".join(map(str, self.nproc_per_node))
        rows = [
            ("scheduler", self.scheduler + (f" job {self.job_id}" if self.job_id else ""), "scheduler"),
            ("mode", self.mode + (" (simulated nodes)" if self.simulated else ""), "mode"),
            ("nodes", f"{self.nnodes}: {nodes}", "nodes"),
            ("node rank", f"{self.node_rank} of {self.nnodes}", "node_rank"),
            ("processes", f"{per_node} per node, world size {self.world_size}", "nproc_per_node"),
            ("master", self.master_addr, "master_addr"),
            ("port", port, "master_port"),
            ("interface", self.iface or "(left to torch)", "iface"),
            ("rendezvous", f"{self.rdzv_backend}, timeout {self.rdzv_timeout} s", "rdzv_backend"),
            ("gpus", self._devices(), "devices"),
            ("cpu bind", self._cpus(), "cpu_bind"),
            ("command", shlex.join(self.command) if self.command else "(none given)", ""),
        ]
        reasons = dict(self.reasons)
        if self.sources.get("profile"):
            name, _, why = self.sources["profile"].partition(" (")
            rows.insert(0, ("site", name, "profile"))
            reasons["profile"] = why.rstrip(")")
        lines = ["hpctorch plan"]
        for label, value, key in rows:
            reason = reasons.get(key, "")
            line = f"  {label:<11} {value}"
            if reason:
                line = f"{line:<46}  <- {reason}"
            lines.append(line)
        if explain:
            lines.append("where each value came from:")
            lines.extend(f"  {field:<16} {origin}" for field, origin in sorted(self.sources.items()))
            lines.extend(f"  {var:<16} {why}" for var, why in sorted(self.reasons.items()) if var.isupper())
        if self.launcher_env:
            lines.append("added to every worker's environment:")
            lines.extend(f"  {k}={v}" for k, v in sorted(self.launcher_env.items()))
        lines.append(f"workers on this machine ({len(self.workers)}):")
        for worker in self.workers:
            own = " ".join(f"{k}={v}" for k, v in sorted(worker.env.items()) if k not in self.launcher_env)
            lines.append(f"  rank {worker.rank}: {own or '(environment left as it is)'}")
        return "\n".join(lines)


def _nested_launch_error(tasks: int, nproc: int, scheduler: str) -> HpctorchError:
    return HpctorchError(
        f"nested launch: {scheduler} already started {tasks} tasks on this node and "
        f"--nproc-per-node {nproc} would make each start {nproc}, {tasks} x {nproc} = "
        f"{tasks * nproc} processes",
        "drop --nproc-per-node (each task is one rank), or launch one task per node "
        "(srun --ntasks-per-node=1, mpirun --map-by ppr:1:node)",
    )


def _resolve_mode(allocation: Allocation, options: Options) -> tuple[str, str]:
    if options.mode not in MODES:
        raise HpctorchError(f"unknown mode {options.mode!r}", f"use one of {', '.join(MODES)}")
    tasks = allocation.tasks_on_this_node
    if options.mode == "per-node" and tasks > 1:
        raise _nested_launch_error(tasks, options.nproc_per_node or 1, allocation.scheduler)
    if options.mode != "auto":
        return options.mode, f"--mode {options.mode}"
    if allocation.launched_ranks:
        return "per-task", f"{allocation.scheduler} already started every rank"
    if tasks > 1:
        return "per-task", f"{allocation.scheduler} started {tasks} tasks on this node, one per rank"
    return "per-node", "one launcher on this node starts the workers"


def _workers_per_node(allocation: Allocation, options: Options, facts: HostFacts, nnodes: int) -> tuple[tuple[int, ...], str]:
    """Per-node mode: how many workers each node starts, and why."""
    if options.nproc_per_node is not None:
        return (options.nproc_per_node,) * nnodes, "--nproc-per-node"
    if allocation.slots_per_node and len(allocation.slots_per_node) == nnodes:
        return allocation.slots_per_node, f"slots in {allocation.sources.get('nodes', allocation.scheduler)}"
    if facts.gpus:
        per = options.gpus_per_proc or 1
        count = max(1, len(facts.gpus) // per)
        what = "one per visible GPU" if per == 1 else f"one per {per} visible GPUs"
        return (count,) * nnodes, f"{what} ({','.join(facts.gpus)})"
    return (1,) * nnodes, "no GPU visible: one process"


def _check_nnodes(allocation: Allocation, options: Options) -> int:
    nnodes = options.nnodes if options.nnodes is not None else allocation.nnodes
    if nnodes < 1:
        raise HpctorchError(f"--nnodes {nnodes} is not a node count", "give --nnodes 1 or more")
    if options.nnodes is not None and allocation.scheduler != "local" and options.nnodes != allocation.nnodes:
        raise HpctorchError(
            f"--nnodes {options.nnodes} contradicts {allocation.scheduler}, which granted "
            f"{allocation.nnodes} node(s)",
            "drop --nnodes; hpctorch reads the node count from the scheduler",
        )
    return nnodes


def _node_rank(allocation: Allocation, options: Options, nnodes: int) -> tuple[int, str]:
    if options.node_rank is not None:
        rank, why = options.node_rank, "--node-rank"
    elif allocation.scheduler != "local" and allocation.node_index is not None:
        rank, why = allocation.node_index, f"from {allocation.scheduler}"
    elif nnodes == 1:
        rank, why = 0, "single node"
    else:
        raise HpctorchError(
            f"--nnodes {nnodes} but nothing tells this node's rank: no scheduler allocation "
            "was found and --node-rank was not given",
            "run under a scheduler (srun, mpirun, ...), pass --hostfile, or give --node-rank "
            "and --master-addr on every node",
        )
    if not 0 <= rank < nnodes:
        raise HpctorchError(f"node rank {rank} is out of range for {nnodes} node(s)", "give --node-rank 0.." + str(nnodes - 1))
    return rank, why


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def _is_ip(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


def make_plan(allocation: Allocation, options: Options, facts: HostFacts) -> Plan:
    """Decide how to run ``options.command`` on ``allocation``; raises HpctorchError."""
    reasons: dict[str, str] = {}
    sources = dict(allocation.sources)
    if options.nproc_per_node is not None and options.nproc_per_node < 1:
        raise HpctorchError(f"--nproc-per-node {options.nproc_per_node} starts nothing", "give 1 or more")

    if options.simulate_nodes is not None:
        return _simulated_plan(allocation, options, facts)

    if allocation.step_launcher:
        return _launch_step_plan(allocation, options, facts)
    settings = sites.resolve({"iface": options.iface, "cpu_bind": options.cpu_bind, "gpus_per_proc": options.gpus_per_proc},
                             facts.env, facts.hostname, facts.config)
    options = replace(options, iface=settings.iface, cpu_bind=settings.cpu_bind, gpus_per_proc=settings.gpus_per_proc)
    sources.update({k: v for k, v in settings.origins.items() if k in ("iface", "cpu_bind", "gpus_per_proc", "profile")})
    mode, reasons["mode"] = _resolve_mode(allocation, options)
    nnodes = _check_nnodes(allocation, options)
    if mode == "per-task":
        if options.nproc_per_node not in (None, 1):
            raise _nested_launch_error(allocation.tasks_on_this_node, options.nproc_per_node, allocation.scheduler)
        nproc_per_node = allocation.tasks_per_node
        node_rank = allocation.node_index or 0
        reasons["node_rank"] = f"from {allocation.scheduler}"
        reasons["nproc_per_node"] = f"tasks {allocation.scheduler} started per node"
    else:
        node_rank, reasons["node_rank"] = _node_rank(allocation, options, nnodes)
        nproc_per_node, reasons["nproc_per_node"] = _workers_per_node(allocation, options, facts, nnodes)

    nodes = allocation.nodes if len(allocation.nodes) == nnodes else ()
    master_port = _master_port(allocation, options, facts, nnodes, sum(nproc_per_node), mode, reasons)
    run_id = _run_id(allocation, options, facts, nnodes, master_port)
    iface_origin = settings.origins.get("iface", "flag")
    if nnodes == 1 and iface_origin.startswith("site profile"):
        options = replace(options, iface=None)  # one node talks over loopback, whatever the machine
    master_addr, iface, exchange = _master_and_iface(allocation, options, facts, nnodes, node_rank, nodes, reasons, run_id,
                                                     iface_origin, settings.master_suffix)
    rdzv_backend = "c10d" if master_port == 0 else "static"
    reasons["rdzv_backend"] = (
        "single node: the agent binds a free port itself (no race between jobs)"
        if rdzv_backend == "c10d"
        else "every node knows the master address and port"
    )
    plan_fields = dict(
        mode=mode,
        scheduler=allocation.scheduler,
        job_id=allocation.job_id,
        nodes=nodes,
        node_rank=node_rank,
        nproc_per_node=tuple(nproc_per_node),
        master_addr=master_addr,
        master_port=master_port,
        rdzv_backend=rdzv_backend,
        rdzv_timeout=options.rdzv_timeout,
        run_id=run_id,
        iface=iface.name if iface and not allocation.complete else None,
        simulated=False,
        max_restarts=options.max_restarts,
        reasons=reasons,
        sources=sources,
        command=options.command,
        master_exchange=exchange,
        agreement_dir=_agreement_dir(allocation, options, nodes),
    )
    local_count = nproc_per_node[node_rank] if mode == "per-node" else 1
    if mode == "per-task":
        local_rank = allocation.local_task_rank if allocation.local_task_rank is not None else 0
        where = placement.per_task(facts, local_rank, nproc_per_node[node_rank], options.gpus_per_proc, options.cpu_bind, reasons)
    else:
        where = placement.per_node(facts, local_count, options.gpus_per_proc, options.cpu_bind, reasons)
    launcher_env = _launcher_env(allocation, options, facts, iface, nodes, local_count, reasons, settings, where)
    omp_from_user = "OMP_NUM_THREADS" in facts.env
    if mode == "per-node" and not allocation.complete:
        launcher_env.update(placement.sets_env(where, omp_from_user))
    if mode == "per-task":
        rank = allocation.task_rank if allocation.task_rank is not None else 0
        env = {} if allocation.complete else _worker_env(
            rank, local_rank if where.local_rank is None else where.local_rank, node_rank, nproc_per_node,
            master_addr, master_port, launcher_env, agent=None)
        if where.local_rank is not None and not allocation.complete:
            env["HPCTORCH_LOCAL_TASK_RANK"] = str(local_rank)
        if not allocation.complete:
            # What torch.distributed.is_torchelastic_launched() checks: Lightning, Accelerate
            # and DeepSpeed then read torchrun's variables instead of detecting Slurm or MPI.
            env["TORCHELASTIC_RUN_ID"] = run_id
            reasons["TORCHELASTIC_RUN_ID"] = ("set in per-task mode too, so Lightning, Accelerate and DeepSpeed take "
                                              "torchrun's environment rather than their own Slurm/MPI detection")
        if not allocation.complete:
            env.update(placement.worker_vars(where, 0, facts, omp_from_user))
        workers = (Worker(node_rank, local_rank, rank, env),)
    else:
        agent = {"run_id": run_id, "max_restarts": options.max_restarts}
        base = sum(nproc_per_node[:node_rank])
        workers = tuple(
            Worker(node_rank, local, base + local, {**_worker_env(
                base + local, local, node_rank, nproc_per_node, master_addr, master_port,
                launcher_env, agent=agent), **placement.worker_vars(where, local, facts, omp_from_user)})
            for local in range(nproc_per_node[node_rank])
        )
    return Plan(workers=workers, launcher_env=launcher_env, **plan_fields)


def _simulated_plan(allocation: Allocation, options: Options, facts: HostFacts) -> Plan:
    """N node agents on this machine: each runs the plan a real node would get."""
    count = options.simulate_nodes or 0
    if count < 1:
        raise HpctorchError(f"--simulate-nodes {count} simulates nothing", "give 1 or more")
    if allocation.nnodes > 1 or allocation.launched_ranks:
        raise HpctorchError(
            f"--simulate-nodes runs every node on this machine, but {allocation.scheduler} "
            f"already describes {allocation.ntasks} task(s) on {allocation.nnodes} node(s)",
            "drop --simulate-nodes inside a multi-node job, or run it outside the job",
        )
    for flag, value in (("--nnodes", options.nnodes), ("--node-rank", options.node_rank), ("--master-addr", options.master_addr)):
        if value is not None:
            raise HpctorchError(f"{flag} contradicts --simulate-nodes", f"drop {flag}; simulated nodes are numbered 0..{count - 1}")
    node_options = replace(
        options,
        simulate_nodes=None,
        mode="per-node",
        nnodes=count,
        master_addr="127.0.0.1",
        master_port=options.master_port or facts.spare_port,
        run_id=_run_id(allocation, options, facts, 1, 0),
    )
    node_plans = tuple(
        make_plan(allocation, replace(node_options, node_rank=rank), _simulated_node_facts(facts, rank, count)) for rank in range(count)
    )
    first = node_plans[0]
    reasons = dict(first.reasons)
    reasons.update(
        mode=f"{count} node agents on this machine, each its own node rank",
        node_rank="simulated nodes are numbered 0.." + str(count - 1),
        master_addr="simulated nodes share loopback",
        master_port="--master-port" if options.master_port else "a port free on loopback now",
    )
    return replace(
        first,
        simulated=True,
        reasons=reasons,
        workers=tuple(w for p in node_plans for w in p.workers),
        node_plans=node_plans,
    )


def _simulated_node_facts(facts: HostFacts, rank: int, count: int) -> HostFacts:
    """Simulated nodes share this machine: node ``rank`` gets its slice of CPUs and GPUs."""
    topology = placement.topology(facts)
    allowed = topology.allowed
    share = allowed[rank * len(allowed) // count : (rank + 1) * len(allowed) // count] or allowed[rank % len(allowed) :][:1]
    per_gpu = len(facts.gpus) // count
    return replace(
        facts, cpus=len(share), topology=replace(topology, allowed=tuple(share), online=len(share)),
        gpus=facts.gpus[rank * per_gpu : (rank + 1) * per_gpu], gpu_numa=facts.gpu_numa[rank * per_gpu : (rank + 1) * per_gpu],
    )


def _launch_step_plan(allocation: Allocation, options: Options, facts: HostFacts) -> Plan:
    """A batch script on several nodes is no rank: start one hpctorch per node instead."""
    launcher = " ".join(allocation.step_launcher)
    nproc = options.nproc_per_node or len(facts.gpus) or 1
    return Plan(
        mode="launch-step", scheduler=allocation.scheduler, job_id=allocation.job_id, nodes=allocation.nodes,
        node_rank=0, nproc_per_node=(nproc,) * allocation.nnodes, master_addr=allocation.nodes[0],
        master_port=options.master_port or 0, rdzv_backend="static", rdzv_timeout=options.rdzv_timeout,
        run_id=_run_id(allocation, options, facts, 1, 0), iface=None, simulated=False, max_restarts=options.max_restarts,
        workers=(), launcher_env={},
        reasons={
            "mode": f"this is the job's batch script, not a step: re-running under '{launcher}'",
            "master_addr": "decided by each node once the step starts",
            "master_port": "decided by each node once the step starts",
        },
        sources=dict(allocation.sources), command=options.command, step_launcher=allocation.step_launcher,
    )


def _master_and_iface(
    allocation: Allocation,
    options: Options,
    facts: HostFacts,
    nnodes: int,
    node_rank: int,
    nodes: tuple[str, ...],
    reasons: dict[str, str],
    run_id: str,
    iface_origin: str = "flag",
    master_suffix: str = "",
) -> tuple[str, network.Interface | None, str | None]:
    """The master address, the interface this node talks on, and the exchange file if any."""
    given = options.master_addr or allocation.master_addr
    given_why = "--master-addr" if options.master_addr else f"from {allocation.scheduler} ({allocation.sources.get('master_addr', 'MASTER_ADDR')})"
    single = nnodes == 1
    if single and not options.iface:
        lo = network.loopback(facts.interfaces)
        reasons["iface"] = "single node: loopback"
        if given and not _is_loopback(given):
            reasons["master_addr"] = given_why
            return given, None, None
        reasons["master_addr"] = given_why if given else "single node: loopback"
        return given or "127.0.0.1", lo, None
    if given and _is_loopback(given) and not options.iface:
        reasons["master_addr"] = given_why
        reasons["iface"] = "the master address is loopback"
        return given, network.loopback(facts.interfaces), None

    # Some sites name each node's fabric address with a suffix (JSC: jwb0001 -> jwb0001i).
    master_host = nodes[0] if nodes else None
    if master_host and master_suffix and facts.resolved.get(master_host + master_suffix):
        master_host += master_suffix
    peers: tuple[str, ...] = ()
    if given and _is_ip(given):
        peers = (given,)
    iface, reasons["iface"] = _choose(options.iface, iface_origin, facts, peers)
    if given:
        reasons["master_addr"] = given_why
        if _is_ip(given) and not iface.reaches(given) and options.iface:
            raise HpctorchError(
                f"the master address {given} is not on {iface.describe()}",
                "give a --master-addr on that interface's network, or another --iface",
            )
        return given, iface, None
    if master_host is None:
        if node_rank == 0:
            address = iface.address
            assert address is not None  # choose_interface only returns interfaces with one
            reasons["master_addr"] = f"this node holds rank 0: its address on {iface.name}"
            return address, iface, None
        raise HpctorchError(
            f"this is node {node_rank} of {nnodes} and nothing names the master",
            "pass --master-addr (rank 0's node address), or run under a scheduler",
        )
    resolved = facts.resolved.get(master_host, ())
    reaching = [a for a in resolved if iface.reaches(a)]
    # Every node sees the same name service, so all agree on whether the name serves.
    shared_dir = options.rendezvous_dir or allocation.submit_dir
    exchange = None
    if not reaching and shared_dir:
        exchange = os.path.join(shared_dir, ".hpctorch", f"{run_id}.master.json")
    if node_rank == 0:
        address = iface.address
        assert address is not None  # choose_interface only returns interfaces with one
        reasons["master_addr"] = f"this node holds rank 0: its address on {iface.name}"
        if exchange:
            reasons["master_addr"] += f"; written to {exchange} (its name resolves elsewhere)"
        return address, iface, exchange
    if reaching:
        reasons["master_addr"] = f"{master_host} (node holding rank 0) resolves to it on {iface.name}"
        return reaching[0], iface, None
    if _is_ip(master_host):
        # Node 0 is listed by address: there is nothing better to exchange.
        reasons["master_addr"] = f"node 0 is listed by its address (not on {iface.name})"
        return master_host, iface, None
    found = ", ".join(resolved) or "nothing"
    if exchange:
        reasons["master_addr"] = (
            f"{master_host} resolves to {found}, not on {iface.name}: read from {exchange}, "
            "where node 0 writes its address"
        )
        return "", iface, exchange
    if not resolved:
        raise HpctorchError(
            f"the master node {master_host} does not resolve to any address here",
            f"pass --master-addr with {master_host}'s address on {iface.name}, or --rendezvous-dir "
            "with a directory all nodes share",
        )
    raise HpctorchError(
        f"the master node {master_host} resolves to {found}, which {iface.describe()} "
        "cannot reach (its hostname names another network)",
        f"pass --master-addr with {master_host}'s address on {iface.name}, --rendezvous-dir "
        "with a directory all nodes share, or --iface for the network its name resolves on",
    )


def _choose(spec: str | None, origin: str, facts: HostFacts, peers: tuple[str, ...]) -> tuple[network.Interface, str]:
    """The user's interface must exist; a profile's or a file's is a default that may not."""
    if spec and origin != "flag":
        try:
            chosen, _ = network.choose_interface(spec, facts.interfaces, peers, facts.default_route)
            return chosen, f"{spec} from {origin}"
        except HpctorchError:
            chosen, why = network.choose_interface(None, facts.interfaces, peers, facts.default_route)
            return chosen, f"{why} ({origin} names {spec}, which is not here)"
    return network.choose_interface(spec, facts.interfaces, peers, facts.default_route)


def _master_port(
    allocation: Allocation,
    options: Options,
    facts: HostFacts,
    nnodes: int,
    world_size: int,
    mode: str,
    reasons: dict[str, str],
) -> int:
    if options.master_port is not None:
        if not 0 < options.master_port < 65536:
            raise HpctorchError(f"--master-port {options.master_port} is not a TCP port", "give a port in 1..65535")
        reasons["master_port"] = "--master-port"
        return options.master_port
    if allocation.master_port is not None:
        reasons["master_port"] = f"from {allocation.scheduler} ({allocation.sources.get('master_port', 'MASTER_PORT')})"
        return allocation.master_port
    if allocation.job_id:
        port = network.derive_port(allocation.job_id, allocation.step_id)
        reasons["master_port"] = (
            f"derived from job id {allocation.job_id}"
            + (f" step {allocation.step_id}" if allocation.step_id else "")
            + f" (range {network.PORT_BASE}-{network.PORT_BASE + network.PORT_SPAN - 1})"
        )
        return port
    if nnodes == 1 and mode == "per-node":
        reasons["master_port"] = "chosen by the OS when the agent binds it"
        return 0
    if world_size == 1:
        reasons["master_port"] = "a port free on loopback now (world of one)"
        return facts.spare_port
    raise HpctorchError(
        f"{world_size} processes must agree on a master port, and neither --master-port, "
        "MASTER_PORT nor a job id gives one",
        "pass --master-port (the same on every node), or export MASTER_PORT",
    )


def _agreement_dir(allocation: Allocation, options: Options, nodes: tuple[str, ...]) -> str | None:
    """Named by what every node of one job shares even when their plans differ (not the port)."""
    shared_dir = options.rendezvous_dir or allocation.submit_dir
    if not shared_dir:
        return None
    if options.run_id:
        key = options.run_id
    elif allocation.job_id:
        key = f"{allocation.scheduler}-{allocation.job_id}" + (f".{allocation.step_id}" if allocation.step_id else "")
    elif nodes:
        key = f"{allocation.scheduler}-{zlib.crc32(','.join(nodes).encode()):08x}"
    elif options.rendezvous_dir:
        key = "job"  # nothing else names it: the directory the user gave is the job's
    else:
        return None
    return os.path.join(shared_dir, ".hpctorch", f"{key}.agreement")


def _run_id(allocation: Allocation, options: Options, facts: HostFacts, nnodes: int, master_port: int) -> str:
    """The rendezvous' run id: torch keys its store by it, so every node must agree."""
    if options.run_id:
        return options.run_id
    if allocation.job_id:
        step = f".{allocation.step_id}" if allocation.step_id else ""
        return f"{allocation.scheduler}-{allocation.job_id}{step}"
    if nnodes > 1:
        return f"{allocation.scheduler}-{master_port}"
    return f"{facts.hostname}-{facts.pid}"


def _launcher_env(
    allocation: Allocation,
    options: Options,
    facts: HostFacts,
    iface: network.Interface | None,
    nodes: tuple[str, ...],
    local_workers: int,
    reasons: dict[str, str],
    settings: sites.Settings | None = None,
    where: placement.Placement | None = None,
) -> dict[str, str]:
    env: dict[str, str] = {}
    if allocation.complete:
        reasons["iface"] = f"{allocation.scheduler} already set every variable: nothing changed"
        return env
    if iface is not None:
        for var, value in (("GLOO_SOCKET_IFNAME", iface.name), ("NCCL_SOCKET_IFNAME", f"={iface.name}")):
            if var in facts.env and not options.iface:
                reasons[var] = f"kept {var}={facts.env[var]} from the environment"
            else:
                env[var] = value
        env["HPCTORCH_IFACE"] = iface.name
    for var, value in (settings.env.items() if settings else ()):
        if var in facts.env:
            reasons[var] = f"kept {var}={facts.env[var]} from the environment over {settings.origins.get('env ' + var)}"  # type: ignore[union-attr]
        else:
            env[var] = value
            reasons[var] = settings.origins.get(f"env {var}", "settings")  # type: ignore[union-attr]
    if "OMP_NUM_THREADS" not in facts.env:
        threads = min(where.threads) if where and where.threads else max(1, facts.cpus // max(1, local_workers))
        env["OMP_NUM_THREADS"] = str(threads)
        reasons["OMP_NUM_THREADS"] = f"{facts.cpus} usable CPUs shared by {local_workers} local process(es)"
        if where and any(where.cpus):
            reasons["OMP_NUM_THREADS"] += "; each worker: the CPUs it is bound to"

    env["HPCTORCH_SCHEDULER"] = allocation.scheduler
    if allocation.job_id:
        env["HPCTORCH_JOB_ID"] = allocation.job_id
    if nodes:
        env["HPCTORCH_NODELIST"] = hostlist.compress(nodes)
    return env


def _worker_env(
    rank: int,
    local_rank: int,
    node_rank: int,
    nproc_per_node: tuple[int, ...],
    master_addr: str,
    master_port: int,
    launcher_env: Mapping[str, str],
    agent: Mapping[str, object] | None,
) -> dict[str, str]:
    """torchrun's worker contract; ``agent`` adds what torch's elastic agent sets."""
    world_size = sum(nproc_per_node)
    env = dict(launcher_env)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(nproc_per_node[node_rank]),
        GROUP_RANK=str(node_rank),
        GROUP_WORLD_SIZE=str(len(nproc_per_node)),
        ROLE_NAME=ROLE,
        ROLE_RANK=str(rank),
        ROLE_WORLD_SIZE=str(world_size),
        MASTER_ADDR=master_addr,
    )
    if master_port:
        env["MASTER_PORT"] = str(master_port)
    if agent is not None:
        env.update(
            TORCHELASTIC_RESTART_COUNT="0",
            TORCHELASTIC_MAX_RESTARTS=str(agent["max_restarts"]),
            TORCHELASTIC_RUN_ID=str(agent["run_id"]),
            TORCHELASTIC_USE_AGENT_STORE="True",
        )
    return env
