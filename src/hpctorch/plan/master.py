"""Where rank 0's node is reached: the master address and the interface this node uses."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

from ..errors import HpctorchError
from ..host import network
from ..host.facts import HostFacts
from ..schedulers.allocation import Allocation
from .fabric import Choices, is_ip
from .types import Options


@dataclass(frozen=True)
class Master:
    address: str | None
    """None: this node reads it from ``exchange`` at start."""
    iface: network.Interface | None
    exchange: str | None
    """The shared file node 0 writes its address to, when its name cannot be trusted."""
    offered: bool = False
    """Node 0 writes the file although its own name reaches it here: whether a node needs it
    depends on that node's subnet (a routed fabric, a subnet per rack), so node 0 cannot know."""


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def _names_node_0(given: str | None, given_why: str, nodes: tuple[str, ...]) -> str:
    """A master given by host name is checked against the job's nodes: the node holding
    rank 0 is reached at its address on the chosen interface (a wrapper's MASTER_ADDR
    often names it by a name that resolves elsewhere); another node of the job is an
    error. Returns the note for the reason, or "" (an address, or a name not in the job,
    stays as given)."""
    if not given or not nodes or is_ip(given) or _is_loopback(given):
        return ""
    short = [node.split(".")[0] for node in nodes]
    name = given.split(".")[0]
    if name == short[0]:
        return f" ({given_why} names {given}, the node of rank 0, by a name not trusted for its address)"
    if name in short:
        raise HpctorchError(
            f"the master address {given} ({given_why}) is node {short.index(name)} of the job, but rank 0 runs on {nodes[0]}",
            "unset MASTER_ADDR (hpctorch finds the node of rank 0), or name that node",
        )
    return ""


def exchange_file(shared_dir: str, run_id: str) -> str:
    return os.path.join(shared_dir, ".hpctorch", f"{run_id}.master.json")


def locate(
    allocation: Allocation,
    options: Options,
    facts: HostFacts,
    choices: Choices,
    nnodes: int,
    node_rank: int,
    nodes: tuple[str, ...],
    run_id: str,
    reasons: dict[str, str],
) -> Master:
    """The master address, the interface this node talks on, and the exchange file if any."""
    given = options.master_addr or allocation.master_addr
    given_why = options.master_flag if options.master_addr else f"from {allocation.scheduler} ({allocation.sources.get('master_addr', 'MASTER_ADDR')})"
    iface_asked = choices.asked(nnodes)
    if nnodes == 1 and not iface_asked:
        lo = network.loopback(facts.interfaces)
        reasons["iface"] = "single node: loopback"
        if given and not _is_loopback(given):
            reasons["master_addr"] = given_why
            return Master(given, None, None)
        reasons["master_addr"] = given_why if given else "single node: loopback"
        return Master(given or "127.0.0.1", lo, None)
    if given and _is_loopback(given) and not iface_asked:
        reasons["master_addr"] = given_why
        reasons["iface"] = "the master address is loopback"
        return Master(given, network.loopback(facts.interfaces), None)

    named = _names_node_0(given, given_why, nodes)
    if given and nodes and options.master_flag == "--rdzv-endpoint" and not named and not is_ip(given) and not _is_loopback(given):
        raise HpctorchError(
            f"--rdzv-endpoint {given} is not one of this job's nodes ({', '.join(nodes[:4])}{', ...' if len(nodes) > 4 else ''})",
            "give the first node of the job (scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1), or leave "
            "--rdzv-endpoint out: hpctorch finds the master",
        )
    if named:
        given = None  # its address is found as for any master host name: fabric, exchange
    # Some sites name each node's fabric address with a suffix (JSC: jwb0001 -> jwb0001i).
    master_host = nodes[0] if nodes else None
    suffix = choices.settings.master_suffix
    if master_host and suffix and facts.resolved.get(master_host + suffix):
        master_host += suffix
    iface = choices.require()
    reasons["iface"] = choices.reason
    if given:
        reasons["master_addr"] = given_why
        if is_ip(given) and not iface.reaches(given) and iface_asked:
            raise HpctorchError(
                f"the master address {given} is not on {iface.describe()}",
                "give a --master-addr on that interface's network, or another --iface",
            )
        return Master(given, iface, None)
    own = iface.address
    assert own is not None  # choose_interface only returns interfaces with one
    if master_host is None:
        if node_rank == 0:
            reasons["master_addr"] = f"this node holds rank 0: its address on {iface.name}"
            return Master(own, iface, None)
        raise HpctorchError(
            f"this is node {node_rank} of {nnodes} and nothing names the master",
            "pass --master-addr (rank 0's node address), or run under a scheduler",
        )
    resolved = facts.resolved.get(master_host, ())
    reaching = [a for a in resolved if iface.reaches(a)]
    # Whether the name's address is on this node's subnet is a fact of each node, not of the job:
    # node 0 writes its address whenever a shared directory exists, and a node reads it when the
    # name does not resolve onto its own subnet.
    shared_dir = options.rendezvous_dir or allocation.submit_dir
    listed_by_address = is_ip(master_host)  # nothing better to exchange: every node uses it
    exchange = exchange_file(shared_dir, run_id) if not reaching and shared_dir and not listed_by_address else None
    if node_rank == 0:
        reasons["master_addr"] = f"this node holds rank 0: its address on {iface.name}" + named
        if exchange:
            reasons["master_addr"] += f"; written to {exchange} (its name resolves elsewhere)"
        elif shared_dir and not listed_by_address:
            offered = exchange_file(shared_dir, run_id)
            reasons["master_addr"] += f"; also written to {offered}, for nodes whose subnet its name does not resolve onto"
            return Master(own, iface, offered, offered=True)
        return Master(own, iface, exchange)
    if reaching:
        reasons["master_addr"] = f"{master_host} (node holding rank 0) resolves to it on {iface.name}" + named
        return Master(reaching[0], iface, None)
    if listed_by_address:
        reasons["master_addr"] = f"node 0 is listed by its address (not on {iface.name})"
        return Master(master_host, iface, None)
    found = ", ".join(resolved) or "nothing"
    if exchange:
        reasons["master_addr"] = (
            f"{master_host} resolves to {found}, not on {iface.name}: read from {exchange}, "
            "where node 0 writes its address" + named
        )
        return Master(None, iface, exchange)
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
