"""Everything before acting, in one place for the CLI, ``init()`` and the doctor: detect
the allocation, read this host, resolve the settings and choose the interface once, run
the MPI allgather or the master-address exchange where needed, and plan."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace

from .. import timings
from ..errors import HpctorchError
from ..host.facts import HostFacts, gather, own_addresses, resolve
from ..schedulers import detect, hostfile, this_machine
from ..schedulers.allocation import Allocation, Launched
from . import fabric
from .decide import make_plan
from .types import Options, Plan


def _from_host_list(options: Options, env: Mapping[str, str]) -> tuple[Allocation, HostFacts]:
    if options.hostfile:
        origin = options.hostfile
        try:
            with open(options.hostfile, encoding="utf-8") as listing:
                text = listing.read()
        except OSError as exc:
            raise HpctorchError(f"cannot read --hostfile {options.hostfile}: {exc.strerror}", "check the path") from None
    else:
        origin, text = "--hosts", "\n".join(h for h in (options.hosts or "").replace(",", " ").split())
    entries = hostfile.parse(text, origin)
    import shlex

    run_key = options.run_id or shlex.join(options.command)
    names = [host for host, _ in entries]
    # Only the master's name must be resolved; the others only if this host is listed
    # neither by name nor by address (a long host list would cost a lookup per host).
    facts = gather(env, resolve_hosts=names[:1])
    own = own_addresses(facts.interfaces)
    try:
        return hostfile.allocation(entries, origin, facts.hostname, own, facts.resolved, run_key), facts
    except HpctorchError:
        facts = replace(facts, resolved={**facts.resolved, **{name: resolve(name) for name in names[1:]}})
        return hostfile.allocation(entries, origin, facts.hostname, own, facts.resolved, run_key), facts


def _allocation(options: Options, env: Mapping[str, str]) -> tuple[Allocation, HostFacts]:
    if options.hostfile or options.hosts:
        return _from_host_list(options, env)
    allocation = this_machine(env) if options.standalone else detect(env)
    # Only the master's name needs resolving: other nodes' addresses are theirs to give.
    return allocation, gather(env, resolve_hosts=allocation.nodes[:1] if allocation.nnodes > 1 else ())


def plan_here(options: Options, env: Mapping[str, str], exchange: bool = True) -> Plan:
    """The final plan for this process. With ``exchange`` (run, init), a master address
    that must come through the shared directory is written or read first; without it
    (``hpctorch plan``), the plan says where it will be read."""
    allocation, facts = _allocation(options, env)
    choices = fabric.choose(options, facts, options.master_addr or allocation.master_addr)
    suffix = choices.settings.master_suffix
    if suffix and allocation.nnodes > 1:  # the site names fabric addresses host+suffix
        name = allocation.nodes[0] + suffix
        facts = replace(facts, resolved={**facts.resolved, name: resolve(name)})
    if allocation.launched is Launched.UNNAMED:
        if choices.settings.iface:
            choices.require()  # an interface asked for but not here
        from .bootstrap import mpi_exchange  # subprocess and json only when MPI needs them

        # A lone machine with loopback only has no interface: fine if every rank is here.
        allocation = mpi_exchange(allocation, choices.iface.name if choices.iface else None, options.rdzv_timeout)
        timings.mark("MPI allgather done")
    plan = make_plan(allocation, options, facts, choices)
    if not (exchange and plan.master_exchange):
        return plan
    from . import rendezvous

    if plan.master_addr is not None:  # node 0
        if plan.workers and plan.workers[0].local_rank == 0:  # one writer per node
            try:
                rendezvous.write_master(plan)
            except HpctorchError as exc:
                if not plan.master_exchange_offered:
                    raise
                sys.stderr.write(f"hpctorch: warning: {exc.line()} (needed only by nodes on another subnet)\n")
            timings.mark("master address written")
        return plan
    address = rendezvous.read_master(plan)
    timings.mark("master address read")
    sources = {**allocation.sources, "master_addr": f"{plan.master_exchange}, written by node 0"}
    # A master given by name (the flag or a wrapper's MASTER_ADDR) named node 0: its address is this one.
    final = make_plan(replace(allocation, master_addr=address, sources=sources), replace(options, master_addr=None), facts, choices)
    assert final.master_addr is not None
    return final


def plan_keeping(options: Options, env: Mapping[str, str], kept: Sequence[int], master_addr: str, master_port: int) -> Plan:
    """This node's plan for the job on the nodes ``kept`` alone (``--spare-nodes``, after the
    screen): renumbered in their order, the first one the master, on the port already chosen."""
    allocation, facts = _allocation(options, env)
    if allocation.launched not in (Launched.NODES, Launched.RANKS) or allocation.node_rank is None:
        raise HpctorchError(f"--spare-nodes needs a launcher that numbers the nodes, and {allocation.scheduler} did not",
                            "start the job with srun, mpirun or --hostfile (one hpctorch per node, or one per rank), or drop --spare-nodes")
    mine = list(kept).index(allocation.node_rank)
    narrowed = replace(options, master_addr=master_addr, master_port=master_port,
                       nnodes=len(kept) if options.nnodes is not None else None, node_rank=mine if options.node_rank is not None else None)
    return make_plan(allocation.keeping(kept, master_addr), narrowed, facts, fabric.choose(narrowed, facts, master_addr))
