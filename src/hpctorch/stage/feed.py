"""A node's side of the tree towards its parent: the pack's bytes from its parent, or, when that
parent fails it, from the nearest ancestor still there, from the byte it had."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

from .tree import CHUNK, IDLE_S, LateError, Spool, SpreadError, ancestors_of, late


class Upstream:
    """A node's side of the tree towards its parent: connect and name itself at once (the parent
    takes its children before it sends a byte), and the byte it wants first; then the pack's bytes."""

    def __init__(self, address: str, token: str, node: int, idle_s: float = IDLE_S, offset: int = 0) -> None:
        self.address, self.node = address, node
        self.idle_s = idle_s
        host, _, port = address.rpartition(":")
        try:
            self.conn = socket.create_connection((host, int(port)), timeout=idle_s)
            self.conn.sendall(f"{token} {node} {offset}\n".encode())
        except (OSError, ValueError) as exc:
            raise SpreadError(f"cannot reach its parent at {address}: {getattr(exc, 'strerror', None) or exc}") from None

    def receive(self, into: memoryview | None, got: int, size: int, deadline: float) -> bytes | int:
        """One receive of at most ``size - got`` bytes (into ``into`` where given), within the
        idle limit and ``deadline``; nothing received is the parent gone."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise late(got, size)
        try:
            self.conn.settimeout(min(self.idle_s, left))
            data = self.conn.recv_into(into) if into is not None else self.conn.recv(min(CHUNK, size - got))
        except (TimeoutError, socket.timeout):
            if left <= self.idle_s:
                raise late(got, size) from None
            raise SpreadError(f"its parent at {self.address} sent nothing for {self.idle_s:.0f} s after {got} of {size} bytes") from None
        except OSError as exc:
            raise SpreadError(f"its parent at {self.address} went away after {got} of {size} bytes ({exc.strerror or exc})") from None
        if not data:
            raise SpreadError(f"its parent at {self.address} went away after {got} of {size} bytes")
        return data

    def stop(self) -> None:
        try:
            self.conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class Feed:
    """A node's bytes from the tree: from its parent, and, should it go away, send nothing, or
    never come, from the nearest ancestor still there (which takes in any node of its subtree),
    from the byte this node had. A node its parent cut off looks for no other: it is the slow one."""

    def __init__(self, node: int, fanout: int, token: str, idle_s: float, address_of: Callable[[int, float, bool], str],
                 cut: Callable[[], str | None], say: Callable[[str], None] | None, deadline: float, parent_wait_s: float,
                 name_of: Callable[[int], str] | None = None) -> None:
        self.node, self.token, self.idle_s = node, token, idle_s
        self.name_of = name_of or (lambda rank: f"node {rank}")
        self.address_of, self.cut, self.say = address_of, cut, say
        self.ancestors = ancestors_of(node, fanout)
        self.upstream: Upstream | None = None
        self._stopped = threading.Event()
        self._connect(0, deadline, parent_wait_s)

    def _connect(self, offset: int, deadline: float, parent_wait_s: float, why: SpreadError | None = None) -> None:
        """The nearest ancestor left that takes this node, asked for the bytes from ``offset``."""
        first = why
        while self.ancestors and not self._stopped.is_set():
            ancestor = self.ancestors[0]
            wait_s = parent_wait_s if why is None else 5.0  # an ancestor's address was set before its children's
            try:
                address = self.address_of(ancestor, min(deadline, time.monotonic() + wait_s), self.upstream is None and why is None)
                upstream = Upstream(address, self.token, self.node, self.idle_s, offset)
            except SpreadError as exc:
                why = exc
                self.ancestors.pop(0)
                continue
            if why is not None and self.say is not None:
                self.say(f"takes the pack from {self.name_of(ancestor)} from {offset / 2**20:.1f} MiB on ({why})")
            self.upstream = upstream
            return
        if first is not None:  # its parent's failure is the cause; the nodes above could not make up for it
            raise SpreadError(f"{first}; no node above it could give the rest")
        raise why or SpreadError("no parent to take the pack from")

    def _receive(self, into: memoryview | None, got: int, size: int, deadline: float) -> bytes | int:
        while True:
            assert self.upstream is not None
            try:
                return self.upstream.receive(into, got, size, deadline)
            except LateError:
                raise
            except SpreadError as exc:
                if self._stopped.is_set():
                    raise
                self.upstream.conn.close()
                cut = self.cut()
                if cut:
                    raise SpreadError(cut) from None
                self.ancestors.pop(0)
                self._connect(got, deadline, 0.0, exc)

    def chunks(self, size: int, deadline: float) -> Iterator[bytes]:
        """The bytes as they come, for a node that keeps none for children."""
        got = 0
        while got < size:
            chunk = self._receive(None, got, size, deadline)
            assert isinstance(chunk, bytes)
            got += len(chunk)
            yield chunk

    def fill(self, spool: Spool, deadline: float) -> None:
        """Every byte into ``spool`` as it comes (a thread of its own: the node's extraction and
        its children's senders read the spool at their own pace)."""
        buffer = memoryview(bytearray(CHUNK))
        try:
            while spool.written < spool.size:
                count = self._receive(buffer[:min(CHUNK, spool.size - spool.written)], spool.written, spool.size, deadline)
                assert isinstance(count, int)
                try:
                    spool.append(buffer[:count])
                except OSError as exc:
                    raise SpreadError(f"could not keep the pack for its children: {exc.strerror or exc}") from None
        except SpreadError as exc:
            spool.fail(str(exc))

    def stop(self) -> None:
        """Wake a ``fill`` still waiting (nobody needs its bytes any more)."""
        self._stopped.set()
        if self.upstream is not None:
            self.upstream.stop()

    def close(self) -> None:
        if self.upstream is not None:
            self.upstream.conn.close()
