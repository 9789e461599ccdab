"""Settings and the job's network interface, decided once, before anything uses them.

The MPI bootstrap advertises this interface's address and the plan takes the master's
address on it: both read the same ``Choices``, so they cannot disagree.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..errors import HpctorchError
from ..host import network
from ..host.facts import HostFacts
from . import sites
from .types import Options


@dataclass(frozen=True)
class Choices:
    """The effective settings and the interface chosen from them."""

    settings: sites.Settings
    iface: network.Interface | None
    """None when no interface fits (a machine with loopback only); ``error`` says why."""
    reason: str
    error: HpctorchError | None = None

    @property
    def iface_origin(self) -> str:
        return self.settings.origins.get("iface", "flag")

    @property
    def iface_from_profile(self) -> bool:
        """A site profile's interface is a multi-node default; one node talks on loopback."""
        return self.iface_origin.startswith("site profile")

    def asked(self, nnodes: int) -> bool:
        """Whether settings name an interface for this job (a profile's does not bind one node)."""
        return bool(self.settings.iface) and not (nnodes == 1 and self.iface_from_profile)

    def require(self) -> network.Interface:
        """The interface, where the job cannot do without one."""
        if self.iface is None:
            assert self.error is not None
            raise self.error
        return self.iface


def is_ip(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


def resolve_settings(options: Options, facts: HostFacts) -> sites.Settings:
    flags = {"iface": options.iface, "cpu_bind": options.cpu_bind, "gpus_per_proc": options.gpus_per_proc}
    return sites.resolve(flags, facts.env, facts.hostname, facts.config)


def choose(options: Options, facts: HostFacts, given_master: str | None = None) -> Choices:
    """Resolve the settings and choose the interface; a master given by address steers the
    choice to the interface whose subnet holds it."""
    settings = resolve_settings(options, facts)
    peers: Sequence[str] = (given_master,) if given_master and is_ip(given_master) else ()
    spec, origin = settings.iface, settings.origins.get("iface", "flag")
    try:
        if spec and origin != "flag":
            # A profile's or a file's interface is a default that may not exist here.
            try:
                chosen, _ = network.choose_interface(spec, facts.interfaces, peers, facts.default_route)
                return Choices(settings, chosen, f"{spec} from {origin}")
            except HpctorchError:
                chosen, why = network.choose_interface(None, facts.interfaces, peers, facts.default_route)
                return Choices(settings, chosen, f"{why} ({origin} names {spec}, which is not here)")
        chosen, why = network.choose_interface(spec, facts.interfaces, peers, facts.default_route)
        return Choices(settings, chosen, why)
    except HpctorchError as exc:
        return Choices(settings, None, "", exc)


def applied(options: Options, choices: Choices) -> Options:
    """``options`` with the settings' values in place of what the user left open."""
    settings = choices.settings
    return replace(options, iface=settings.iface, cpu_bind=settings.cpu_bind, gpus_per_proc=settings.gpus_per_proc)
