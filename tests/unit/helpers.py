"""Hand-built host facts: a node with a fabric, a management network and loopback."""

from __future__ import annotations

import ipaddress

from hpctorch.host.facts import HostFacts
from hpctorch.host.network import Interface


def iface(name: str, cidr: str, up: bool = True) -> Interface:
    return Interface(name, (ipaddress.IPv4Interface(cidr),), (), up)


LO = iface("lo", "127.0.0.1/8")
HSN = iface("hsn0", "198.18.0.2/24")
MGMT = iface("mgmt0", "198.19.0.2/24")


def facts(**overrides: object) -> HostFacts:
    values: dict[str, object] = dict(
        hostname="node2",
        interfaces=(LO, MGMT, HSN),
        env={},
        gpus=(),
        cpus=8,
        default_route="mgmt0",
        pid=4242,
        spare_port=45678,
        resolved={},
    )
    values.update(overrides)
    return HostFacts(**values)  # type: ignore[arg-type]
