"""Network interfaces, the choice of one for the job, and whether a port is free."""

from __future__ import annotations

import errno
import fnmatch
import ipaddress
import os
import socket
import struct
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from ..errors import HpctorchError

# Fast fabrics first: Slingshot (hsn), InfiniBand (ib), Omni-Path (hfi/opa),
# Aries (ipogif); then ordinary Ethernet names. Management names come last.
FABRIC_PREFERENCE: tuple[str, ...] = ("hsn*", "ib*", "hfi*", "opa*", "ipogif*", "bond*")
MANAGEMENT_HINTS: tuple[str, ...] = ("nmn*", "mgmt*", "docker*", "virbr*", "veth*", "br-*")

@dataclass(frozen=True)
class Interface:
    """One network interface with its addresses."""

    name: str
    ipv4: tuple[ipaddress.IPv4Interface, ...] = ()
    ipv6: tuple[ipaddress.IPv6Interface, ...] = ()
    is_up: bool = True

    @property
    def is_loopback(self) -> bool:
        return any(a.ip.is_loopback for a in self.ipv4 + self.ipv6)  # type: ignore[operator]

    @property
    def address(self) -> str | None:
        """The address peers should use: the first IPv4, else the first global IPv6."""
        if self.ipv4:
            return str(self.ipv4[0].ip)
        for addr in self.ipv6:
            if not addr.ip.is_link_local:
                return str(addr.ip)
        return None

    def reaches(self, address: str) -> bool:
        """True when ``address`` lies in one of this interface's subnets."""
        ip = ipaddress.ip_address(address)
        return any(ip in a.network for a in self.ipv4 + self.ipv6)  # type: ignore[operator]

    def describe(self) -> str:
        addrs = ", ".join(str(a) for a in self.ipv4 + self.ipv6) or "no address"  # type: ignore[operator]
        return f"{self.name} ({addrs}{'' if self.is_up else ', down'})"


def list_interfaces() -> list[Interface]:
    """This host's interfaces: netlink on Linux (fast, no import), psutil elsewhere."""
    try:
        return _netlink_interfaces()
    except (OSError, AttributeError, struct.error):
        return _psutil_interfaces()


_RTM_GETADDR, _RTM_NEWADDR, _NLMSG_DONE, _NLMSG_ERROR = 22, 20, 3, 2
_RTM_GETLINK, _RTM_NEWLINK = 18, 16
_IFA_ADDRESS, _IFA_LOCAL = 1, 2
_IFF_UP = 0x1


def _netlink_interfaces() -> list[Interface]:
    """One RTM_GETADDR dump over rtnetlink: every address of every interface.

    psutil costs ~16 ms to import; this answers in well under 1 ms, and unlike the
    SIOCGIFCONF ioctl it also sees secondary addresses.
    """
    names = {index: name for index, name in socket.if_nameindex()}
    found: dict[str, tuple[list[ipaddress.IPv4Interface], list[ipaddress.IPv6Interface]]] = {n: ([], []) for n in names.values()}
    flags: dict[int, int] = {}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as link:  # 0: NETLINK_ROUTE
        link.settimeout(2.0)
        link.bind((0, 0))
        # Link flags from the kernel, not /sys/class/net: sysfs shows the namespace it
        # was mounted in, which is not ours after nsenter --net or ip netns exec.
        # nlmsghdr (len, type, flags=REQUEST|DUMP, seq, pid) + ifinfomsg (16 bytes)
        link.send(struct.pack("=IHHII", 32, _RTM_GETLINK, 0x301, 1, 0) + bytes(16))
        for kind, body in _dump(link):
            if kind == _RTM_NEWLINK:
                _, _, _, index, link_flags = struct.unpack_from("=BBHiI", body)
                flags[index] = link_flags
        # + ifaddrmsg (any family)
        link.send(struct.pack("=IHHII", 24, _RTM_GETADDR, 0x301, 2, 0) + struct.pack("=BBBBI", 0, 0, 0, 0, 0))
        for kind, body in _dump(link):
            if kind != _RTM_NEWADDR:
                continue
            family, prefix, _, _, index = struct.unpack_from("=BBBBI", body)
            attributes: dict[int, bytes] = {}
            position = 8
            while position + 4 <= len(body):
                size, attr = struct.unpack_from("=HH", body, position)
                if size < 4:
                    break
                attributes[attr] = body[position + 4 : position + size]
                position += (size + 3) & ~3
            # IFA_LOCAL is the interface's own address (IFA_ADDRESS is the peer on p2p links).
            raw = attributes.get(_IFA_LOCAL) or attributes.get(_IFA_ADDRESS)
            name = names.get(index)
            if raw and name:
                if family == socket.AF_INET:
                    found[name][0].append(ipaddress.IPv4Interface((socket.inet_ntop(family, raw), prefix)))
                elif family == socket.AF_INET6:
                    found[name][1].append(ipaddress.IPv6Interface((socket.inet_ntop(family, raw), prefix)))
    by_name = {name: index for index, name in names.items()}
    result = [
        Interface(name, tuple(v4), tuple(v6), bool(flags.get(by_name[name], 0) & _IFF_UP))
        for name, (v4, v6) in found.items()
    ]
    return sorted(result, key=lambda i: i.name)


def _dump(link: socket.socket) -> Iterator[tuple[int, bytes]]:
    """The messages of one netlink dump reply: (type, body after the 16-byte header)."""
    while True:
        data = link.recv(65536)
        offset = 0
        while offset + 16 <= len(data):
            length, kind = struct.unpack_from("=IH", data, offset)
            if length < 16 or kind in (_NLMSG_DONE, _NLMSG_ERROR):
                return
            yield kind, data[offset + 16 : offset + length]
            offset += (length + 3) & ~3


def _psutil_interfaces() -> list[Interface]:
    import psutil

    stats = psutil.net_if_stats()
    result = []
    for name, addrs in psutil.net_if_addrs().items():
        v4, v6 = [], []
        for a in addrs:
            if a.family == socket.AF_INET and a.netmask:
                v4.append(ipaddress.IPv4Interface(f"{a.address}/{a.netmask}"))
            elif a.family == socket.AF_INET6 and a.netmask:
                prefix = bin(int(ipaddress.IPv6Address(a.netmask))).count("1")
                v6.append(ipaddress.IPv6Interface(f"{a.address.split('%')[0]}/{prefix}"))
        up = stats[name].isup if name in stats else False
        result.append(Interface(name, tuple(v4), tuple(v6), up))
    return sorted(result, key=lambda i: i.name)


def _match_spec(spec: str, interfaces: Sequence[Interface]) -> list[Interface]:
    if "/" in spec:
        try:
            network = ipaddress.ip_network(spec, strict=False)
        except ValueError:
            raise HpctorchError(
                f"--iface {spec!r} is neither an interface name, a glob nor a CIDR",
                "use e.g. --iface hsn0, --iface 'ib*' or --iface 10.1.0.0/16",
            ) from None
        return [i for i in interfaces if any(a.ip in network for a in i.ipv4 + i.ipv6)]  # type: ignore[operator]
    return [i for i in interfaces if fnmatch.fnmatchcase(i.name, spec)]


def _usable(interface: Interface) -> bool:
    return interface.is_up and interface.address is not None


def _names(interfaces: Iterable[Interface]) -> str:
    return ", ".join(i.describe() for i in interfaces) or "none"


def choose_interface(
    spec: str | None,
    interfaces: Sequence[Interface],
    peers: Sequence[str] = (),
    default_route: str | None = None,
) -> tuple[Interface, str]:
    """The interface for this job and the reason it was chosen.

    ``spec`` is the user's ``--iface`` (name, glob or CIDR). Without it: an
    interface whose subnet holds the ``peers`` addresses, else a fast fabric,
    else the one carrying the default route, else the first non-loopback one.
    """
    if spec:
        matches = [i for i in _match_spec(spec, interfaces) if _usable(i)]
        if not matches:
            raise HpctorchError(
                f"no interface that is up and has an address matches --iface {spec!r}",
                f"choose one of: {_names(i for i in interfaces if _usable(i))}",
            )
        return matches[0], f"--iface {spec}"
    candidates = [i for i in interfaces if _usable(i) and not i.is_loopback]
    if peers:
        reaching = [i for i in candidates if all(i.reaches(p) for p in peers)]
        if reaching:
            return reaching[0], f"its subnet holds the other nodes' addresses ({', '.join(peers)})"
    for pattern in FABRIC_PREFERENCE:
        for interface in candidates:
            if fnmatch.fnmatchcase(interface.name, pattern):
                return interface, f"fast fabric (matches {pattern})"
    for interface in candidates:
        if interface.name == default_route:
            return interface, "carries the default route"
    others = [i for i in candidates if not any(fnmatch.fnmatchcase(i.name, p) for p in MANAGEMENT_HINTS)]
    if others or candidates:
        return (others or candidates)[0], "first interface that is up with an address"
    raise HpctorchError(
        "no network interface other than loopback is up with an address",
        "bring the cluster network up, or run on one node (which uses loopback)",
    )


def loopback(interfaces: Sequence[Interface]) -> Interface:
    for interface in interfaces:
        if interface.is_loopback and interface.is_up:
            return interface
    return Interface("lo", (ipaddress.IPv4Interface("127.0.0.1/8"),))


def default_route_interface(route_table: str = "/proc/net/route") -> str | None:
    """The interface of the IPv4 default route, from the kernel's table."""
    try:
        with open(route_table, encoding="ascii") as table:
            next(table, None)
            for line in table:
                fields = line.split()
                if len(fields) > 2 and fields[1] == "00000000":
                    return fields[0]
    except OSError:
        return None
    return None


def port_is_free(address: str, port: int) -> bool:
    """Whether ``port`` can be bound on ``address`` right now."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # TCPStore sets SO_REUSEADDR too, so TIME_WAIT leftovers don't count as busy.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            if exc.errno == errno.EADDRNOTAVAIL:
                # Not our address: only the master can check its own port.
                return True
            raise
    return True


def listener_uid(port: int, tables: tuple[str, ...] = ("/proc/net/tcp", "/proc/net/tcp6")) -> int | None:
    """The uid whose socket listens on ``port`` in this network namespace, as /proc shows it to
    anyone (no privilege needed); None where nothing listens or /proc is not there."""
    for table in tables:
        try:
            with open(table, encoding="ascii") as handle:
                rows = handle.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid ...; st 0A is LISTEN
            if len(fields) > 7 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return int(fields[7])
    return None


def holder_line(port: int) -> str:
    """Who holds ``port`` here, for a line that says it is taken: another user by name, or you."""
    uid = listener_uid(port)
    if uid is None:
        return ""
    if uid == os.getuid():
        return " (held by a process of your own)"
    try:
        import pwd

        name = f" ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, ImportError):
        name = ""
    return f" (held by another user: uid {uid}{name})"


def free_port(address: str = "127.0.0.1") -> int:
    """A port the OS reports free on ``address`` now."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


def connect(address: str, port: int, timeout_s: float) -> dict[str, object]:
    """One plain TCP connection: ok, time in ms, or why not (refused, timed out, unreachable)."""
    started = time.perf_counter()
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return {"ok": True, "ms": (time.perf_counter() - started) * 1e3, "error": None}
    except ConnectionRefusedError:
        error = f"connection refused (nothing listens on {address}:{port})"
    except TimeoutError:
        error = f"timed out after {timeout_s:.0f} s (packets dropped: firewall, or a network this node does not reach)"
    except OSError as exc:
        error = exc.strerror or str(exc)
    return {"ok": False, "ms": None, "error": error}
