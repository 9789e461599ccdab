"""Everything before acting, in one place for the CLI and ``init()``:
detect the allocation, read this host, run the MPI bootstrap if needed, plan."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from . import network, sites
from .allocation import Allocation
from .errors import HpctorchError
from .facts import HostFacts, gather, resolve
from .schedulers import hostfile
from .plan import Options, Plan, make_plan
from .schedulers import detect


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
    names = [host for host, _ in entries]
    # Only the master's name must be resolved; the others only if this host is listed
    # neither by name nor by address (a long host list would cost a lookup per host).
    facts = gather(env, resolve_hosts=names[:1])
    own = [str(a.ip) for i in facts.interfaces for a in i.ipv4 + i.ipv6]  # type: ignore[operator]
    try:
        return hostfile.allocation(entries, origin, facts.hostname, own, facts.resolved), facts
    except HpctorchError:
        facts = replace(facts, resolved={**facts.resolved, **{name: resolve(name) for name in names[1:]}})
        return hostfile.allocation(entries, origin, facts.hostname, own, facts.resolved), facts


def plan_here(options: Options, env: Mapping[str, str]) -> Plan:
    if options.hostfile or options.hosts:
        allocation, facts = _from_host_list(options, env)
        return make_plan(allocation, options, facts)
    allocation = detect(env)
    # Only the master's name needs resolving: other nodes' addresses are theirs to give.
    facts = gather(env, resolve_hosts=allocation.nodes[:1] if allocation.nnodes > 1 else ())
    suffix = sites.resolve({"iface": options.iface}, facts.env, facts.hostname, facts.config).master_suffix
    if suffix and allocation.nnodes > 1:  # the site names fabric addresses host+suffix
        name = allocation.nodes[0] + suffix
        facts = replace(facts, resolved={**facts.resolved, name: resolve(name)})
    if allocation.needs_bootstrap:
        try:
            iface = network.choose_interface(options.iface, facts.interfaces, (), facts.default_route)[0].name
        except HpctorchError:
            if options.iface:
                raise
            iface = None  # a lone machine with loopback only: fine if every rank is here
        from .bootstrap import mpi_exchange  # subprocess and json only when MPI needs them

        allocation = mpi_exchange(allocation, iface, options.rdzv_timeout)
    return make_plan(allocation, options, facts)
