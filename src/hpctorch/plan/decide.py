"""The decision: Allocation + options + host facts -> Plan. Pure; nothing is started."""

from __future__ import annotations

import os
from dataclasses import replace

from ..errors import HpctorchError
from ..host.facts import HostFacts, own_addresses
from ..schedulers.allocation import Allocation, Launched
from . import fabric, master, placement, ports, workerenv
from .types import MODES, Options, Plan, Worker, is_python


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
    if allocation.launched is Launched.TORCH and options.mode != "per-node":
        return "unchanged", f"{allocation.scheduler} already set every variable: nothing changed"
    if options.mode != "auto":
        return options.mode, f"--mode {options.mode}"
    if allocation.launched is Launched.RANKS:
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
    if options.nnodes is not None and allocation.launcher.numbers_nodes and options.nnodes != allocation.nnodes:
        raise HpctorchError(
            f"--nnodes {options.nnodes} contradicts {allocation.scheduler}, which granted "
            f"{allocation.nnodes} node(s)",
            "drop --nnodes; hpctorch reads the node count from the scheduler",
        )
    return nnodes


def _node_rank(allocation: Allocation, options: Options, nnodes: int, backend: str) -> tuple[int, str, bool]:
    """This node's rank, why, and whether it is known before the rendezvous."""
    if options.node_rank is not None:
        rank, why = options.node_rank, "--node-rank"
    elif allocation.launcher.numbers_nodes and allocation.node_rank is not None:
        rank, why = allocation.node_rank, f"from {allocation.scheduler}"
    elif nnodes == 1 and options.min_nodes is None:
        rank, why = 0, "single node"
    elif backend != "static":
        return 0, f"assigned by torch's {backend} rendezvous as nodes join", False
    else:
        raise HpctorchError(
            f"--nnodes {nnodes} but nothing tells this node's rank: no scheduler allocation "
            "was found and --node-rank was not given",
            "run under a scheduler (srun, mpirun, ...), pass --hostfile, or give --node-rank "
            "and --master-addr on every node",
        )
    if not 0 <= rank < nnodes:
        raise HpctorchError(f"node rank {rank} is out of range for {nnodes} node(s)", "give --node-rank 0.." + str(nnodes - 1))
    return rank, why, True


def make_plan(allocation: Allocation, options: Options, facts: HostFacts, choices: fabric.Choices | None = None) -> Plan:
    """Decide how to run ``options.command`` on ``allocation``; raises HpctorchError.

    ``choices`` (settings and interface) are made here when the caller has not made them.
    """
    if options.nproc_per_node is not None and options.nproc_per_node < 1:
        raise HpctorchError(f"--nproc-per-node {options.nproc_per_node} starts nothing", "give 1 or more")
    if options.rdzv_timeout <= 0:
        raise HpctorchError(f"--rdzv-timeout {options.rdzv_timeout} leaves no time to meet", "give a number of seconds above 0")
    if options.max_restarts < 0:
        raise HpctorchError(f"--max-restarts {options.max_restarts} is not a count", "give 0 or more")
    if allocation.launched is Launched.UNNAMED:
        raise HpctorchError(
            f"{allocation.scheduler} names no nodes: the MPI allgather must run first",
            "plan through hpctorch.discover.plan_here, which runs it",
        )
    if options.simulate_nodes is not None:
        return _simulated_plan(allocation, options, facts)
    if allocation.launched is Launched.BATCH:
        return _relaunch_plan(allocation, options, facts)
    if choices is None:
        choices = fabric.choose(options, facts, options.master_addr or allocation.master_addr)
    options = fabric.applied(options, choices)
    reasons: dict[str, str] = {}
    sources = dict(allocation.sources)
    sources.update({k: v for k, v in choices.settings.origins.items() if k in ("iface", "cpu_bind", "gpus_per_proc", "profile")})
    mode, reasons["mode"] = _resolve_mode(allocation, options)
    nnodes = _check_nnodes(allocation, options)
    backend = options.rdzv_backend or "static"
    if backend == "file":
        _file_store_dir(options, nnodes)  # the one thing the file backend needs: checked first
    if options.min_nodes is not None and backend == "static":
        raise HpctorchError(f"--nnodes {options.min_nodes}:{nnodes} needs torch's dynamic rendezvous",
                            "add --rdzv-backend c10d (and --rdzv-endpoint HOST:PORT), as with torchrun")
    known = True
    if mode in ("per-task", "unchanged"):
        if options.nproc_per_node not in (None, 1):
            raise _nested_launch_error(allocation.tasks_on_this_node, options.nproc_per_node, allocation.scheduler)
        nproc_per_node = allocation.tasks_per_node
        node_rank = allocation.node_rank or 0
        reasons["node_rank"] = f"from {allocation.scheduler}"
        reasons["nproc_per_node"] = f"tasks {allocation.scheduler} started per node"
    else:
        node_rank, reasons["node_rank"], known = _node_rank(allocation, options, nnodes, backend)
        nproc_per_node, reasons["nproc_per_node"] = _workers_per_node(allocation, options, facts, nnodes)

    restarts = mode == "per-node" and options.max_restarts > 0
    if restarts and options.rdzv_backend == "static":
        # torch's static rendezvous restarts only the failing node's workers (the others wait
        # in their collectives), and its one store keeps the dead workers' addresses, which the
        # restarted ones then read (pytorch/pytorch#135712).
        raise HpctorchError(
            f"--max-restarts {options.max_restarts} with --rdzv-backend static: torch's static rendezvous cannot restart "
            "workers (its store keeps the old workers' keys; on several nodes only the failing node would restart)",
            "drop --rdzv-backend static (hpctorch then restarts through torch's c10d rendezvous), or let the scheduler requeue the job (--requeue)",
        )
    nodes = allocation.nodes if len(allocation.nodes) == nnodes else ()
    port = ports.master_port(allocation, options, facts, nnodes, sum(nproc_per_node), mode, reasons)
    run_id = ports.run_id(allocation, options, facts, nnodes, port)
    where_master = master.locate(allocation, options, facts, choices, nnodes, node_rank, nodes, run_id, reasons)
    if options.rdzv_backend == "file":
        rdzv_backend = "file"
        reasons["rdzv_backend"] = f"--rdzv-backend file: torch's FileStore in {_file_store_dir(options, nnodes)} (no TCP store)"
    elif options.rdzv_backend:
        rdzv_backend, reasons["rdzv_backend"] = options.rdzv_backend, "--rdzv-backend"
        if port == 0 and rdzv_backend == "static":
            port = facts.spare_port  # torch's static rendezvous needs the port in advance
    elif restarts:
        rdzv_backend = "c10d"
        reasons["rdzv_backend"] = (f"--max-restarts {options.max_restarts}: torch's c10d rendezvous, with a fresh store for each "
                                   "restart" + (", and every node restarts its workers together (static would restart only the "
                                                "failing node's)" if nnodes > 1 else ""))
    else:
        rdzv_backend = "c10d" if port == 0 else "static"
        reasons["rdzv_backend"] = (
            "single node: the agent binds a free port itself (no race between jobs)"
            if rdzv_backend == "c10d"
            else "every node knows the master address and port"
        )
    common = dict(
        mode=mode, scheduler=allocation.scheduler, job_id=allocation.job_id, nodes=nodes, node_rank=node_rank,
        nproc_per_node=tuple(nproc_per_node), master_addr=where_master.address, master_port=port,
        rdzv_backend=rdzv_backend, rdzv_timeout=options.rdzv_timeout, run_id=run_id, simulated=False,
        max_restarts=options.max_restarts, reasons=reasons, sources=sources, command=options.command,
        master_exchange=where_master.exchange, master_exchange_offered=where_master.offered, agreement_dir=ports.agreement_dir(allocation, options, nodes),
        requeue=allocation.launcher.requeue, requeue_exclude=allocation.launcher.exclude_on_requeue, container=facts.container, min_nodes=options.min_nodes,
        node_rank_known=known, agent=dict(options.agent), rdzv_conf=_rdzv_conf(options, facts, rdzv_backend, where_master.address, nnodes),
        master_ports=ports.master_ports(allocation, options, nnodes, mode, rdzv_backend, reasons),
        local_addr=(where_master.iface.address if where_master.iface and nnodes > 1 else where_master.address),
    )
    if mode == "unchanged":
        reasons["iface"] = reasons["mode"]
        local = allocation.local_task_rank or 0
        worker = Worker(node_rank, local, allocation.task_rank or 0, {})
        return Plan(iface=None, workers=(worker,), common_env={}, **common)  # type: ignore[arg-type]

    omp_from_user = "OMP_NUM_THREADS" in facts.env
    iface_forced = choices.asked(nnodes)
    if mode == "per-task":
        local = allocation.local_task_rank if allocation.local_task_rank is not None else 0
        where = placement.per_task(facts, local, nproc_per_node[node_rank], options.gpus_per_proc, options.cpu_bind, reasons)
        env = workerenv.common_env(allocation, facts, where_master.iface, iface_forced, nodes, 1, reasons, choices.settings, where)
        rank = allocation.task_rank if allocation.task_rank is not None else 0
        own = workerenv.torch_contract(rank, local if where.local_rank is None else where.local_rank, node_rank,
                                       nproc_per_node, where_master.address or "", port, run_id)
        reasons["TORCHELASTIC_RUN_ID"] = ("set in per-task mode too, so Lightning, Accelerate and DeepSpeed take "
                                          "torchrun's environment rather than their own Slurm/MPI detection")
        if where.local_rank is not None:
            own["HPCTORCH_LOCAL_TASK_RANK"] = str(local)
        own.update(placement.worker_vars(where, 0, facts, omp_from_user))
        workers: tuple[Worker, ...] = (Worker(node_rank, local, rank, {**env, **own}),)
        if options.local_rank_arg:
            common["command"] = (*options.command, f"{options.local_rank_arg}={own['LOCAL_RANK']}")
    else:
        count = nproc_per_node[node_rank]
        where = placement.per_node(facts, count, options.gpus_per_proc, options.cpu_bind, reasons)
        env = workerenv.common_env(allocation, facts, where_master.iface, iface_forced, nodes, count, reasons, choices.settings, where)
        bind_sets = {} if options.agent.get("numa_options") else placement.sets_env(where, omp_from_user)
        if options.agent.get("numa_options"):
            reasons["cpu_bind"] = f"torch's own NUMA binding (--numa-binding {options.agent['numa_options']}); hpctorch binds no CPUs"
        if options.local_rank_arg:  # torch's agent puts each worker's local rank in place of the macro
            common["command"] = (*options.command, f"{options.local_rank_arg}=${{local_rank}}")
        env.update(bind_sets)
        base = sum(nproc_per_node[:node_rank])
        # Only through the worker entry does each worker get its own variables (_worker.py).
        workers = tuple(
            Worker(node_rank, local, base + local, {**env, **(placement.worker_vars(where, local, facts, omp_from_user) if bind_sets else {})})
            for local in range(count)
        )
        common["starter"], reasons["starter"] = _starter(options, nnodes)
        if common["starter"] == "hpctorch" and nnodes > 1:
            common["watch_port"] = ports.watch_port(run_id, port)
            reasons["watch_port"] = "node 0's watchdog store, derived from the run id and master port (the workers' store is rank 0's, at the master port)"
    return Plan(iface=where_master.iface.name if where_master.iface else None, workers=workers, common_env=env, **common)  # type: ignore[arg-type]


def _starter(options: Options, nnodes: int) -> tuple[str, str]:
    """Per node: torch's elastic agent, unless nothing needs it. It imports torch (about a
    second) before it starts any worker; without restarts the workers rendezvous through rank 0's
    store (torch's env://) and hpctorch checks the nodes' agreement in the workers (``nodewatch``)."""
    # --stall-timeout asks for a per-node agent, not torch's: hpctorch's own watches the output
    # (several nodes: the watchdog's helper, nodewatch; one node: guard.stallalone).
    needs = [flag for flag in options.torch_agent_for if flag != "--stall-timeout"]
    if nnodes > 1 and not is_python(options.command):
        needs.append(f"{nnodes} nodes and a command that is not Python (hpctorch checks the nodes agree inside Python workers)")
    if options.max_restarts:
        needs.append(f"--max-restarts {options.max_restarts}")
    if options.agent:
        needs.append("torchrun's agent options")
    if options.rdzv_backend:
        needs.append(f"--rdzv-backend {options.rdzv_backend}")
    if needs:
        warm = ("; each local rank keeps a warm standby (torch imported ahead, a CUDA context where there is a GPU; "
                "HPCTORCH_STANDBY=0: off) that becomes its next worker" if options.max_restarts else "")
        return "torch", "torch's elastic agent: " + ", ".join(needs) + warm
    if nnodes > 1:
        return "hpctorch", ("no restarts: hpctorch starts the workers, forked from one import of torch (torch's agent imports it, then each worker); "
                            "they meet at rank 0's store, after the nodes' agreement; a helper per node runs the watchdog")
    return "hpctorch", "one node, no restarts: hpctorch starts the workers, forked from one import of torch (torch's agent imports it, then each worker)"


def _rdzv_conf(options: Options, facts: HostFacts, backend: str, master: str | None, nnodes: int) -> dict[str, str]:
    """torchrun's --rdzv-conf, and whether this node hosts torch's c10d store: torch guesses it
    from what this host's *name* resolves to, which is the trap of a name on another network
    (and never true for an address on a second interface), so hpctorch says it."""
    conf = dict(options.rdzv_conf)
    if backend == "file":
        conf["path"] = _file_store_dir(options, nnodes)
    if backend == "c10d" and master and "is_host" not in conf:
        if master in own_addresses(facts.interfaces, loopback=False):  # on loopback torch's guess serves, with its fall-back to a client
            conf["is_host"] = "true"
    return conf


def _file_store_dir(options: Options, nnodes: int) -> str:
    """``--rdzv-backend file``: the directory every node shares (one machine: a private one)."""
    if options.rendezvous_dir:
        return os.path.abspath(options.rendezvous_dir)
    if nnodes > 1:
        raise HpctorchError(f"--rdzv-backend file on {nnodes} nodes needs a directory every node shares",
                            "add --rdzv-endpoint DIR (or --rendezvous-dir DIR) on a shared file system")
    return default_file_store_dir()


def default_file_store_dir() -> str:
    """One machine's file store: in hpctorch's own folder (made private when used)."""
    from ..host.folders import node_dir

    return os.path.join(node_dir(), "filestore")


def _simulated_plan(allocation: Allocation, options: Options, facts: HostFacts) -> Plan:
    """N node agents on this machine: each runs the plan a real node would get."""
    count = options.simulate_nodes or 0
    if count < 1:
        raise HpctorchError(f"--simulate-nodes {count} simulates nothing", "give 1 or more")
    if allocation.nnodes > 1 or allocation.launched in (Launched.RANKS, Launched.TORCH):
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
        run_id=ports.run_id(allocation, options, facts, 1, 0),
        # Simulated nodes share this machine: the file backend's directory may be private.
        rendezvous_dir=_file_store_dir(options, 1) if options.rdzv_backend == "file" else options.rendezvous_dir,
    )
    node_plans = tuple(
        _torch_agent(_served_by_node_0(make_plan(allocation, replace(node_options, node_rank=rank), _simulated_node_facts(facts, rank, count))))
        for rank in range(count)
    )
    first = node_plans[0]
    reasons = dict(first.reasons)
    reasons.update(
        mode=f"{count} node agents on this machine, each its own node rank",
        node_rank="simulated nodes are numbered 0.." + str(count - 1),
        master_addr="simulated nodes share loopback",
        master_port="--master-port" if options.master_port else "a port free on loopback now",
    )
    return replace(first, simulated=True, reasons=reasons, workers=tuple(w for p in node_plans for w in p.workers), node_plans=node_plans)


def _torch_agent(plan: Plan) -> Plan:
    """Simulated nodes are torch's agents, one per node, in this one process (``simulated``)."""
    return replace(plan, starter="torch", watch_port=0, reasons={**plan.reasons, "starter": "simulated nodes: one torch agent per node in this process"})


def _served_by_node_0(plan: Plan) -> Plan:
    """Under torch's c10d rendezvous simulated nodes share loopback, where torch's guess has
    every node try to serve the store (the first wins); node 0 serves it, as on a cluster, so
    the store outlives the other nodes and node 0 can read how each ended."""
    if plan.rdzv_backend != "c10d" or "is_host" in plan.rdzv_conf:
        return plan
    return replace(plan, rdzv_conf={**plan.rdzv_conf, "is_host": "true" if plan.node_rank == 0 else "false"})


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


def _relaunch_per_node_because(allocation: Allocation, options: Options, nproc: int) -> str | None:
    """Why a batch script's relaunch keeps one hpctorch per node; None: every rank per task."""
    if allocation.cpus_per_node and min(allocation.cpus_per_node) < nproc:
        return (f"the job has {min(allocation.cpus_per_node)} CPU(s) on a node, too few for {nproc} tasks "
                f"(ask for --ntasks-per-node={nproc} to run every rank as a task)")
    if not allocation.launcher.relaunch_per_task:
        return f"{allocation.scheduler} has no way here to start and bind every rank"
    if not options.command:
        return "hpctorch doctor runs once per node"
    if options.mode == "per-node":
        return "--mode per-node"
    if options.max_restarts:
        return f"--max-restarts {options.max_restarts} restarts the workers from torch's agent"
    if options.torch_agent_for or options.agent:
        return f"{', '.join(options.torch_agent_for) or 'torchrun agent options'} need(s) a per-node agent"
    if options.gpus_per_proc not in (None, 1):
        return f"--gpus-per-proc {options.gpus_per_proc}"
    return None


def _relaunch_plan(allocation: Allocation, options: Options, facts: HostFacts) -> Plan:
    """A batch script on several nodes is no rank: start one hpctorch per node instead."""
    relaunch = allocation.relaunch_command()
    if not relaunch:
        raise HpctorchError(
            f"this is the {allocation.scheduler} job script of job {allocation.job_id} on {allocation.nnodes} nodes, "
            "not one task per node", "start one hpctorch per node with the scheduler's task launcher")
    # The job's own tasks per node when it asked for several (sbatch --ntasks-per-node=4).
    asked = min(allocation.tasks_per_node, default=1)
    nproc = options.nproc_per_node or (asked if asked > 1 else 0) or len(facts.gpus) or 1
    per_node_because = _relaunch_per_node_because(allocation, options, nproc)
    gpus = bool(facts.gpus) and nproc * (options.gpus_per_proc or 1) <= len(facts.gpus) and (options.gpus_per_proc or 1) == 1
    if per_node_because is None:
        relaunch = allocation.relaunch_command(tasks=nproc, gpus=gpus)
        how = (f"per task: {allocation.scheduler} starts all {nproc} rank(s) per node" + (" and binds a GPU to each" if gpus else "")
               + "; no agent imports torch before them")
    else:
        how = f"one hpctorch per node, which starts the workers: {per_node_because}"
    return Plan(
        mode="relaunch", relaunch_per_task=per_node_because is None, scheduler=allocation.scheduler, job_id=allocation.job_id, nodes=allocation.nodes,
        node_rank=0, nproc_per_node=(nproc,) * allocation.nnodes, master_addr=None,
        master_port=options.master_port or 0, rdzv_backend="static", rdzv_timeout=options.rdzv_timeout,
        run_id=ports.run_id(allocation, options, facts, 1, 0), iface=None, simulated=False, max_restarts=options.max_restarts,
        workers=(), common_env={},
        reasons={
            "mode": f"this is the job's batch script, not a step: re-running under '{' '.join(relaunch)}' ({how})",
            "master_addr": "decided by each node once the step starts",
            "master_port": "decided by each node once the step starts",
        },
        sources=dict(allocation.sources), command=options.command, relaunch=relaunch, requeue=allocation.launcher.requeue, requeue_exclude=allocation.launcher.exclude_on_requeue,
    )
