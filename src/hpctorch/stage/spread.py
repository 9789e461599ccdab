"""The tree that spreads node 0's pack: node i receives from node (i-1)//k and forwards to nodes
k*i+1 .. k*i+k as the bytes arrive, so the pack leaves node 0 k times whatever the node count and
reaches the last node after log_k(N) hops. Each node finds its parent's address through the
job's store (one key per node with children). A child proves it belongs to the job with the
token node 0 put in the store, and names itself.

No node waits on another's disk or link: a node with children keeps the bytes as they arrive in
a spool of its own (node 0: its pack), and each child is sent them by a thread of its own, at
the child's pace, while the node extracts its own copy at its disk's. A node whose own copy
fails still forwards.

Every wait is bounded by the node's deadline (``HPCTORCH_STAGE_TIMEOUT_S``), its own extraction
included: a parent that sends nothing for ``IDLE_S``, or a child that takes nothing for as long,
is gone, and a child still short of the pack at the deadline is cut off; a child dropped takes
its subtree with it, and each of those nodes says so.
"""

from __future__ import annotations

import datetime
import os
import select
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator

FANOUT = 4
CHUNK = 1 << 20
IDLE_S = 60.0
HELLO_S = 5.0
JOIN_SLACK_S = 5.0


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


def _late(got: int, size: int) -> SpreadError:
    return SpreadError(f"its staging time (HPCTORCH_STAGE_TIMEOUT_S) ran out at {got / 2**20:.1f} of {size / 2**20:.1f} MiB")


class Spool:
    """The pack's bytes on this node, read by each child's sender and by this node's own
    extraction at their own pace: node 0's pack file, or a file no other process can open
    (unnamed from the start, so nothing is left behind) that fills as the bytes arrive."""

    def __init__(self, fd: int, size: int, written: int) -> None:
        self.fd, self.size, self.written = fd, size, written
        self.problem: str | None = None
        self.changed = threading.Condition()

    @classmethod
    def whole(cls, path: str, size: int) -> Spool:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        spool = cls(fd, size, min(size, os.fstat(fd).st_size))
        if spool.written < size:
            spool.fail(f"node 0's pack {path} holds {spool.written} of {size} bytes")
        return spool

    @classmethod
    def empty(cls, folder: str, size: int) -> Spool:
        handle = tempfile.TemporaryFile(dir=folder)  # 0600, unlinked: O_TMPFILE where the file system has it
        fd = os.dup(handle.fileno())
        handle.close()
        return cls(fd, size, 0)

    def append(self, data: memoryview) -> None:
        while data:
            wrote = os.pwrite(self.fd, data, self.written)
            data = data[wrote:]
            with self.changed:
                self.written += wrote
                self.changed.notify_all()

    def fail(self, problem: str) -> None:
        with self.changed:
            self.problem = problem
            self.changed.notify_all()

    def available(self, offset: int, deadline: float) -> int:
        """Bytes past ``offset`` that are here, waiting for some until ``deadline``; 0 at the end."""
        with self.changed:
            while self.written <= offset < self.size:
                if self.problem:
                    raise SpreadError(self.problem)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _late(offset, self.size)
                self.changed.wait(left)
            return self.written - offset

    def chunks(self, deadline: float) -> Iterator[bytes]:
        offset = 0
        while offset < self.size:
            count = self.available(offset, deadline)
            if time.monotonic() > deadline:
                raise _late(offset, self.size)
            chunk = os.pread(self.fd, min(count, CHUNK), offset)
            if not chunk:
                raise SpreadError(f"the pack's {self.written} bytes kept here could not be read back")
            offset += len(chunk)
            yield chunk

    def close(self) -> None:
        os.close(self.fd)


class Relay:
    """A node's side of the tree towards its children: listen, take each child once, send each
    the spool from a thread of its own."""

    def __init__(self, node: int, nnodes: int, host: str, token: str, fanout: int = FANOUT, idle_s: float = IDLE_S) -> None:
        self.children = children_of(node, nnodes, fanout)
        self.token = token
        self.idle_s = idle_s
        self.sockets: dict[int, socket.socket] = {}
        self.sent: dict[int, int] = {}
        self.dropped: dict[int, str] = {}
        self.senders: list[threading.Thread] = []
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

    def serve(self, spool: Spool, deadline: float) -> None:
        """Send every child the spool, each from its own thread, none waiting on another."""
        for child, conn in self.sockets.items():
            self.sent[child] = 0
            sender = threading.Thread(target=self._send, args=(child, conn, spool, deadline), daemon=True,
                                      name=f"hpctorch-stage-to-{child}")
            sender.start()
            self.senders.append(sender)

    def _send(self, child: int, conn: socket.socket, spool: Spool, deadline: float) -> None:
        conn.setblocking(False)
        writable = select.poll()
        writable.register(conn, select.POLLOUT)
        offset = 0
        try:
            while offset < spool.size:
                count = spool.available(offset, deadline)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _late(offset, spool.size)
                if not writable.poll(1000 * min(self.idle_s, left)):
                    raise _late(offset, spool.size) if left <= self.idle_s else TimeoutError(f"took nothing for {self.idle_s:.0f} s")
                try:
                    offset += os.sendfile(conn.fileno(), spool.fd, offset, count)  # the kernel copies: no byte through Python
                except BlockingIOError:
                    continue
                self.sent[child] = offset
            conn.shutdown(socket.SHUT_WR)
        except (OSError, SpreadError) as exc:  # gone, too slow, or this node's own upstream failed: its subtree says so itself
            self.dropped[child] = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        finally:
            conn.close()

    def least_sent(self) -> int:
        """The bytes the child furthest behind has been sent (what node 0 shows as progress)."""
        return min(self.sent.values(), default=0)

    def wait(self, deadline: float, tick: Callable[[int], None] | None = None) -> None:
        """Until every child has the pack or was dropped: by ``deadline``, when the senders stop."""
        for sender in self.senders:
            while sender.is_alive() and time.monotonic() < deadline + JOIN_SLACK_S:
                sender.join(0.5)
                if tick is not None:
                    tick(self.least_sent())

    def close(self) -> None:
        for conn in self.sockets.values():
            conn.close()  # a sender still running stops at its next send
        self.sockets.clear()
        if self.listener is not None:
            self.listener.close()
            self.listener = None


class Upstream:
    """A node's side of the tree towards its parent: connect and name itself at once (the parent
    takes its children before it sends a byte), then the pack's bytes."""

    def __init__(self, address: str, token: str, node: int, idle_s: float = IDLE_S) -> None:
        self.address = address
        self.idle_s = idle_s
        host, _, port = address.rpartition(":")
        try:
            self.conn = socket.create_connection((host, int(port)), timeout=idle_s)
            self.conn.sendall(f"{token} {node}\n".encode())
        except (OSError, ValueError) as exc:
            raise SpreadError(f"cannot reach its parent at {address}: {getattr(exc, 'strerror', None) or exc}") from None

    def _receive(self, into: memoryview | None, got: int, size: int, deadline: float) -> bytes | int:
        """One receive of at most ``size - got`` bytes (into ``into`` where given), within the
        idle limit and ``deadline``; nothing received is the parent gone."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise _late(got, size)
        try:
            self.conn.settimeout(min(self.idle_s, left))
            data = self.conn.recv_into(into) if into is not None else self.conn.recv(min(CHUNK, size - got))
        except (TimeoutError, socket.timeout):
            if left <= self.idle_s:
                raise _late(got, size) from None
            raise SpreadError(f"its parent at {self.address} sent nothing for {self.idle_s:.0f} s after {got} of {size} bytes") from None
        except OSError as exc:
            raise SpreadError(f"its parent at {self.address} went away after {got} of {size} bytes ({exc.strerror or exc})") from None
        if not data:
            raise SpreadError(f"its parent at {self.address} went away after {got} of {size} bytes")
        return data

    def chunks(self, size: int, deadline: float) -> Iterator[bytes]:
        """The bytes as they come, for a node that keeps none for children."""
        got = 0
        try:
            while got < size:
                chunk = self._receive(None, got, size, deadline)
                assert isinstance(chunk, bytes)
                got += len(chunk)
                yield chunk
        finally:
            self.conn.close()

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
        try:
            self.conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _spooled(source: Iterable[bytes], size: int, folder: str | None, helpers: list[threading.Thread]) -> Spool:
    """Node 0's pack given as chunks (tests, benchmarks): spooled by a thread as they come."""
    spool = Spool.empty(folder or tempfile.gettempdir(), size)

    def feed() -> None:
        try:
            for chunk in source:
                spool.append(memoryview(chunk))
            if spool.written != size:
                spool.fail(f"node 0's pack held {spool.written} of {size} bytes")
        except (OSError, SpreadError) as exc:
            spool.fail(f"node 0 could not read its pack: {exc}")

    helpers.append(threading.Thread(target=feed, daemon=True, name="hpctorch-stage-pack"))
    helpers[-1].start()
    return spool


Consume = Callable[[Iterator[bytes]], None]
"""What a node does with the pack for its own copy: reads every chunk, at its own pace."""


def take_part(store, prefix: str, node: int, nnodes: int, host: str, token: str, size: int, consume: Consume | None,  # type: ignore[no-untyped-def]
              source: str | Iterable[bytes] | None = None, fanout: int = FANOUT, deadline: float | None = None,
              accept_s: float = 30.0, idle_s: float = IDLE_S, spool_dir: str | None = None,
              tick: Callable[[int], None] | None = None) -> None:
    """A node's part in spreading ``size`` bytes: node 0 reads ``source`` (its pack's path, or
    chunks), every other node its parent (found at ``<prefix>addr/<parent>`` in ``store``); the
    children (who connect within ``accept_s``) are sent every byte, and ``consume`` (None: this
    node has its copy) reads them too. Returns once its own copy and every child are done or
    dropped, by ``deadline``; raises the node's own failure (a SpreadError, or ``consume``'s)
    only after its children were served. A node with children keeps the bytes in ``spool_dir``."""
    deadline = time.monotonic() + 3600.0 if deadline is None else deadline
    relay = Relay(node, nnodes, host, token, fanout, idle_s)
    spool: Spool | None = None
    upstream: Upstream | None = None
    helpers: list[threading.Thread] = []
    try:
        if relay.children:
            store.set(f"{prefix}addr/{node}", relay.address)
        if source is not None:
            spool = Spool.whole(source, size) if isinstance(source, str) else _spooled(source, size, spool_dir, helpers)
            chunks = spool.chunks(deadline)
        else:
            parent = parent_of(node, fanout)
            address = wait_for(store, f"{prefix}addr/{parent}", deadline, f"node {parent}'s address (its parent in the tree)")
            upstream = Upstream(address, token, node, idle_s)
            if consume is None and not relay.children:
                return  # taken by the parent at once, then dropped at its first send
            if relay.children:
                spool = Spool.empty(spool_dir or tempfile.gettempdir(), size)
                helpers.append(threading.Thread(target=upstream.fill, args=(spool, deadline), daemon=True, name="hpctorch-stage-from-parent"))
                helpers[-1].start()
                chunks = spool.chunks(deadline)
            else:
                chunks = upstream.chunks(size, deadline)
        relay.accept(min(deadline, time.monotonic() + accept_s))
        if spool is not None:
            relay.serve(spool, deadline)
        try:
            if consume is not None:
                consume(_ticking(chunks, relay, tick) if tick is not None else chunks)
        finally:  # its own copy failed or not, its children get every byte it gets
            relay.wait(deadline, tick)
    finally:
        relay.close()
        if upstream is not None:
            upstream.stop()  # wakes a fill still waiting: its children are served or dropped
        for helper in helpers:
            helper.join(max(0.0, deadline - time.monotonic()) + JOIN_SLACK_S)
        if upstream is not None:
            upstream.conn.close()  # after the fill ended: it never meets a closed socket
        if spool is not None and not any(thread.is_alive() for thread in [*helpers, *relay.senders]):
            spool.close()  # else left open: a thread still writing or sending must never meet a reused descriptor


def _ticking(chunks: Iterator[bytes], relay: Relay, tick: Callable[[int], None]) -> Iterator[bytes]:
    for chunk in chunks:
        tick(relay.least_sent())
        yield chunk


def wait_for(store, key: str, deadline: float, what: str) -> str:  # type: ignore[no-untyped-def]
    """``key``'s value once it is set, within ``deadline``; else SpreadError naming ``what``."""
    left = max(1.0, deadline - time.monotonic())
    try:
        store.wait([key], datetime.timedelta(seconds=left))
        return store.get(key).decode()
    except RuntimeError:  # torch's store timeout and lost connection (DistStoreError, DistNetworkError)
        raise SpreadError(f"waited {left:.0f} s for {what}") from None
