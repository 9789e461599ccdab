"""Everything before acting, in one place for the CLI and ``init()``:
detect the allocation, read this host, run the MPI bootstrap if needed, plan."""

from __future__ import annotations

from collections.abc import Mapping

from . import network
from .bootstrap import mpi_exchange
from .errors import HpctorchError
from .facts import gather
from .plan import Options, Plan, make_plan
from .schedulers import detect


def plan_here(options: Options, env: Mapping[str, str]) -> Plan:
    allocation = detect(env)
    # Only the master's name needs resolving: other nodes' addresses are theirs to give.
    facts = gather(env, resolve_hosts=allocation.nodes[:1] if allocation.nnodes > 1 else ())
    if allocation.needs_bootstrap:
        try:
            iface = network.choose_interface(options.iface, facts.interfaces, (), facts.default_route)[0].name
        except HpctorchError:
            if options.iface:
                raise
            iface = None  # a lone machine with loopback only: fine if every rank is here
        allocation = mpi_exchange(allocation, iface, options.rdzv_timeout)
    return make_plan(allocation, options, facts)
