"""The tree that spreads node 0's pack: node i receives from node (i-1)//k and forwards each
chunk to nodes k*i+1 .. k*i+k as it arrives, so the pack leaves node 0 k times whatever the node
count and reaches the last node after log_k(N) hops of one chunk each. Each node finds its
parent's address through the job's store (one key per node with children). A child proves it
belongs to the job with the token node 0 put in the store, and names itself.

Every wait is bounded: a parent that sends nothing for ``IDLE_S``, or a child that takes nothing
for as long, is gone; a child dropped takes its subtree with it, and each of those nodes says so.
"""

from __future__ import annotations

import datetime
import socket
import time
from collections.abc import Callable, Iterable, Iterator

FANOUT = 4
CHUNK = 1 << 20
IDLE_S = 60.0
HELLO_S = 5.0


class SpreadError(Exception):
    """This node could not receive the pack; the message names whom and why."""


def parent_of(node: int, fanout: int = FANOUT) -> int:
    return (node - 1) // fanout


def children_of(node: int, nnodes: int, fanout: int = FANOUT) -> list[int]:
    first = node * fanout + 1
    return list(range(first, min(nnodes, first + fanout)))


def depth_of(nnodes: int, fanout: int = FANOUT) -> int:
    """Hops from node 0 to the last node."""
    depth, node = 0, nnodes - 1
    while node > 0:
        node, depth = parent_of(node, fanout), depth + 1
    return depth


class Relay:
    """A node's side of the tree towards its children: listen, take each child once, forward."""

    def __init__(self, node: int, nnodes: int, host: str, token: str, fanout: int = FANOUT, idle_s: float = IDLE_S) -> None:
        self.children = children_of(node, nnodes, fanout)
        self.token = token
        self.idle_s = idle_s
        self.sockets: dict[int, socket.socket] = {}
        self.dropped: dict[int, str] = {}
        self.listener: socket.socket | None = None
        self.host = host
        if self.children:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self.listener = socket.create_server((host, 0), family=family, backlog=2 * fanout + 8)

    @property
    def address(self) -> str:
        assert self.listener is not None
        return f"{self.host}:{self.listener.getsockname()[1]}"

    def accept(self, deadline: float) -> None:
        """Take every child that connects with the job's token, until all did or ``deadline``."""
        while self.listener is not None and len(self.sockets) < len(self.children):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.listener.settimeout(left)
            try:
                conn, _ = self.listener.accept()
            except (TimeoutError, socket.timeout):
                break
            child = self._hello(conn)
            if child is None:
                conn.close()
                continue
            conn.settimeout(self.idle_s)
            self.sockets[child] = conn
        for child in self.children:
            if child not in self.sockets and child not in self.dropped:
                self.dropped[child] = "never connected"

    def _hello(self, conn: socket.socket) -> int | None:
        conn.settimeout(HELLO_S)
        line = b""
        try:
            while not line.endswith(b"\n") and len(line) < 256:
                part = conn.recv(256 - len(line))
                if not part:
                    return None
                line += part
        except OSError:
            return None
        fields = line.decode(errors="replace").split()
        if len(fields) != 2 or fields[0] != self.token or not fields[1].isdigit():
            return None
        child = int(fields[1])
        return child if child in self.children and child not in self.sockets else None

    def forward(self, chunk: bytes) -> None:
        for child, conn in list(self.sockets.items()):
            try:
                conn.sendall(chunk)
            except OSError as exc:  # gone, or took nothing for idle_s: its subtree says so itself
                self.dropped[child] = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                conn.close()
                del self.sockets[child]

    def close(self) -> None:
        for conn in self.sockets.values():
            try:
                conn.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            conn.close()
        self.sockets.clear()
        if self.listener is not None:
            self.listener.close()
            self.listener = None


class Upstream:
    """A node's side of the tree towards its parent: connect and name itself at once (the parent
    takes its children before it forwards a byte), then the pack's bytes, chunk by chunk."""

    def __init__(self, address: str, token: str, node: int, idle_s: float = IDLE_S) -> None:
        self.address = address
        self.idle_s = idle_s
        host, _, port = address.rpartition(":")
        try:
            self.conn = socket.create_connection((host, int(port)), timeout=idle_s)
            self.conn.sendall(f"{token} {node}\n".encode())
        except (OSError, ValueError) as exc:
            raise SpreadError(f"cannot reach its parent at {address}: {getattr(exc, 'strerror', None) or exc}") from None

    def chunks(self, size: int) -> Iterator[bytes]:
        got = 0
        try:
            while got < size:
                try:
                    chunk = self.conn.recv(min(CHUNK, size - got))
                except (TimeoutError, socket.timeout):
                    raise SpreadError(f"its parent at {self.address} sent nothing for {self.idle_s:.0f} s after {got} of {size} bytes") from None
                except OSError as exc:
                    raise SpreadError(f"its parent at {self.address} went away after {got} of {size} bytes ({exc.strerror or exc})") from None
                if not chunk:
                    raise SpreadError(f"its parent at {self.address} went away after {got} of {size} bytes")
                got += len(chunk)
                yield chunk
        finally:
            self.conn.close()


Consume = Callable[[Iterator[bytes], Callable[[bytes], None]], None]
"""What a node does with the pack: reads every chunk, passing each to the given forward first."""


def take_part(store, prefix: str, node: int, nnodes: int, host: str, token: str, size: int, consume: Consume,  # type: ignore[no-untyped-def]
              source: Iterable[bytes] | None = None, fanout: int = FANOUT, deadline: float | None = None,
              accept_s: float = 30.0, idle_s: float = IDLE_S, wanted: bool = True) -> None:
    """A node's part in spreading ``size`` bytes: node 0 reads ``source``, every other node its
    parent (found at ``<prefix>addr/<parent>`` in ``store``); each chunk goes to the children
    (who connect within ``accept_s``) and to ``consume``. A leaf that has no use for the bytes
    (not ``wanted``: its copy is there) only says so to its parent, which then sends it none."""
    deadline = time.monotonic() + 3600.0 if deadline is None else deadline
    relay = Relay(node, nnodes, host, token, fanout, idle_s)
    try:
        if relay.children:
            store.set(f"{prefix}addr/{node}", relay.address)
        if source is not None:
            chunks: Iterator[bytes] = iter(source)
        else:
            parent = parent_of(node, fanout)
            address = wait_for(store, f"{prefix}addr/{parent}", deadline, f"node {parent}'s address (its parent in the tree)")
            upstream = Upstream(address, token, node, idle_s)
            if not wanted and not relay.children:
                upstream.conn.close()  # taken by the parent at once, then dropped at its first chunk
                return
            chunks = upstream.chunks(size)
        relay.accept(min(deadline, time.monotonic() + accept_s))
        consume(chunks, relay.forward)
    finally:
        relay.close()


def wait_for(store, key: str, deadline: float, what: str) -> str:  # type: ignore[no-untyped-def]
    """``key``'s value once it is set, within ``deadline``; else SpreadError naming ``what``."""
    left = max(1.0, deadline - time.monotonic())
    try:
        store.wait([key], datetime.timedelta(seconds=left))
        return store.get(key).decode()
    except RuntimeError:  # torch's store timeout and lost connection (DistStoreError, DistNetworkError)
        raise SpreadError(f"waited {left:.0f} s for {what}") from None
