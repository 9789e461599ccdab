"""What this host looks like: the only I/O that planning needs, gathered in one place."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from . import affinity, config, containers, devices, network


@dataclass(frozen=True)
class HostFacts:
    """Inputs to ``make_plan`` read from this host; tests build them by hand."""

    hostname: str
    interfaces: tuple[network.Interface, ...]
    env: Mapping[str, str]
    gpus: tuple[str, ...] = ()
    cpus: int = 1
    default_route: str | None = None
    pid: int = 0
    spare_port: int = 0
    """A port free on loopback when gathered, for one-machine runs that need one."""
    resolved: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Addresses that host names resolved to (the master's, when not this node)."""
    gpu_numa: tuple[int | None, ...] = ()
    gpu_source: str = ""
    topology: affinity.CpuTopology | None = None
    """CPUs, NUMA nodes and cores; None: ``cpus`` CPUs numbered from 0, one NUMA node."""
    config: Mapping[str, object] = field(default_factory=dict)
    """Settings from the config files, by origin (``config.load``)."""
    container: str | None = None
    """The container runtime this process runs in (``containers.detect``), if any."""
    platform: str = "linux"
    """``sys.platform``: win32 needs torch's TCPStore without libuv."""
    can_bind: bool = True
    """The platform can bind a process to CPUs (Linux's sched_setaffinity; not macOS or Windows)."""


def own_addresses(interfaces: Iterable[network.Interface], loopback: bool = True) -> set[str]:
    """Every address of this host's interfaces (without loopback's when ``loopback`` is False)."""
    return {str(a.ip) for i in interfaces if loopback or not i.is_loopback for a in i.ipv4 + i.ipv6}  # type: ignore[operator]


def resolve(host: str) -> tuple[str, ...]:
    """Every address ``host`` resolves to here, IPv4 first; empty when it does not."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return ()
    addresses = dict.fromkeys(str(info[4][0]) for info in infos)
    return tuple(sorted(addresses, key=lambda a: ":" in a))


def gather(env: Mapping[str, str] | None = None, resolve_hosts: Iterable[str] = ()) -> HostFacts:
    """Read this host's facts; ``resolve_hosts`` are names to look up in DNS/hosts."""
    env = dict(os.environ if env is None else env)
    gpus = devices.gpus(env)
    topology = affinity.read_topology()
    return HostFacts(
        hostname=socket.gethostname(),
        interfaces=tuple(network.list_interfaces()),
        env=env,
        gpus=gpus.ids,
        gpu_numa=gpus.numa,
        gpu_source=gpus.source,
        topology=topology,
        config=config.load(env),
        cpus=len(topology.allowed),
        default_route=network.default_route_interface(),
        pid=os.getpid(),
        spare_port=network.free_port(),
        resolved={host: resolve(host) for host in resolve_hosts},
        container=containers.detect(env),
        can_bind=hasattr(os, "sched_setaffinity"),
        platform=sys.platform,
    )
