"""No scheduler, a list of hosts: ``--hostfile FILE`` or ``--hosts a,b,c``.

Accepted lines, the formats users already have: ``host`` (one per line),
``host slots=N`` (OpenMPI, DeepSpeed), ``host:N`` (MPICH); ``#`` starts a comment.
Slots, when given, are the node's worker count. The node's own index is found by
matching its host name, or any of its addresses, against the list.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from ..errors import HpctorchError
from .allocation import Allocation, Launcher
from .job_port import derive_port

_LINE = re.compile(r"^(?P<host>[^\s:#=]+)(?::(?P<colon>\d+))?(?P<pairs>(?:\s+[\w-]+\s*=\s*\d+)*)$")
_PAIR = re.compile(r"([\w-]+)\s*=\s*(\d+)")
# OpenMPI's hostfile also allows max_slots; it does not change how many workers start.
_KEYS = ("slots", "max_slots", "max-slots")

LAUNCHER = Launcher("hostfile")


def parse(text: str, origin: str) -> list[tuple[str, int | None]]:
    """(host, slots or None) per entry, in order."""
    entries: list[tuple[str, int | None]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _LINE.match(line)
        if match is None:
            raise HpctorchError(
                f"{origin} line {number} ({raw.strip()!r}) is not 'host', 'host slots=N' or 'host:N'",
                "fix that line of the host file",
            )
        pairs = dict(_PAIR.findall(match.group("pairs")))
        unknown = set(pairs) - set(_KEYS)
        if unknown:
            raise HpctorchError(f"{origin} line {number}: unknown key {sorted(unknown)[0]!r}", f"use one of {', '.join(_KEYS)}")
        slots = pairs.get("slots") or match.group("colon")
        entries.append((match.group("host"), int(slots) if slots else None))
    if not entries:
        raise HpctorchError(f"{origin} names no host", "list one host per line")
    hosts = [h for h, _ in entries]
    if len(set(hosts)) != len(hosts):
        raise HpctorchError(f"{origin} lists a host twice", "list each node once (use slots=N for several workers)")
    return entries


def allocation(
    entries: list[tuple[str, int | None]],
    origin: str,
    hostname: str,
    own_addresses: Iterable[str],
    resolved: Mapping[str, tuple[str, ...]],
    run_key: str = "",
) -> Allocation:
    """The Allocation for this host; ``resolved`` maps listed names to their addresses.

    ``run_key`` names this run on every host alike (``--run-id``, else the command line),
    so two runs on the same hosts get different ports."""
    mine = {hostname, hostname.split(".")[0], *own_addresses}
    index = None
    for position, (host, _) in enumerate(entries):
        if host in mine or host.split(".")[0] in mine or set(resolved.get(host, ())) & mine - {"127.0.0.1", "::1"}:
            index = position
            break
    if index is None:
        raise HpctorchError(
            f"this host ({hostname}) is not in {origin}: neither its name nor its addresses match",
            "run hpctorch on the listed hosts, or list this host by name or address",
        )
    nodes = tuple(h for h, _ in entries)
    slots = tuple(s for _, s in entries)
    # Without a job id, every node derives the same port from the node list and the run.
    port = derive_port(",".join(nodes) + "|" + run_key)
    return Allocation(
        launcher=LAUNCHER,
        nodes=nodes,
        tasks_per_node=(1,) * len(nodes),
        task_rank=index,
        node_rank=index,
        local_task_rank=0,
        master_port=port,
        slots_per_node=slots if all(s is not None for s in slots) else None,  # type: ignore[arg-type]
        sources={"nodes": origin, "node_rank": f"this host's name or address in {origin}", "master_port": f"derived from the node list of {origin} and the run (--run-id, else the command)"},
    )
