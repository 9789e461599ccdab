"""A node's side of the tree towards its children: listen, take each child once (and any node of
its subtree whose parent failed it), send each the spool from a thread of its own, from the byte
it asks for, and cut off a child with children of its own that cannot keep up."""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Callable

from .tree import FANOUT, HELLO_S, IDLE_S, JOIN_SLACK_S, LAG_BYTES, OBSERVE_S, Spool, SpreadError, children_of, late, parent_of


class Relay:
    """A node's side of the tree towards its children: listen, take each child once (and any node
    further down whose parent failed it), send each the spool from a thread of its own, from the
    byte it asks for."""

    def __init__(self, node: int, nnodes: int, host: str, token: str, fanout: int = FANOUT, idle_s: float = IDLE_S,
                 on_cut: Callable[[int, str], None] | None = None, name_of: Callable[[int], str] | None = None) -> None:
        self.node, self.nnodes, self.fanout = node, nnodes, fanout
        self.name_of = name_of or (lambda rank: f"node {rank}")
        self.children = children_of(node, nnodes, fanout)
        self.token = token
        self.idle_s = idle_s
        self.on_cut = on_cut
        self.sockets: dict[int, socket.socket] = {}
        self.offsets: dict[int, int] = {}
        self.sent: dict[int, int] = {}
        self.dropped: dict[int, str] = {}
        self.senders: list[threading.Thread] = []
        self.listener: socket.socket | None = None
        self.host = host
        self._lock = threading.Lock()
        self._serving: tuple[Spool, float] | None = None
        self._closing = threading.Event()
        if self.children:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self.listener = socket.create_server((host, 0), family=family, backlog=2 * fanout + 8)

    @property
    def address(self) -> str:
        assert self.listener is not None
        return f"{self.host}:{self.listener.getsockname()[1]}"

    def accept(self, deadline: float) -> None:
        """Take every child that connects with the job's token, until all did or ``deadline``."""
        while self.listener is not None and not all(child in self.sockets for child in self.children):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._take_one(left)
        with self._lock:
            for child in self.children:
                if child not in self.sockets and child not in self.dropped:
                    self.dropped[child] = "never connected"

    def _take_one(self, wait_s: float) -> None:
        listener = self.listener  # close() may take it away meanwhile
        if listener is None:
            return
        try:
            listener.settimeout(wait_s)
            conn, _ = listener.accept()
        except OSError:  # the wait ended, or the listener was closed
            return
        hello = self._hello(conn)
        with self._lock:
            if hello is None or self._closing.is_set() or not self._welcome(*hello):
                conn.close()
                return
            node, offset = hello
            self.sockets[node], self.offsets[node] = conn, offset
            if self._serving is not None:
                self._start(node, *self._serving)

    def _hello(self, conn: socket.socket) -> tuple[int, int] | None:
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
        if len(fields) != 3 or fields[0] != self.token or not fields[1].isdigit() or not fields[2].isdigit():
            return None
        return int(fields[1]), int(fields[2])

    def _welcome(self, node: int, offset: int) -> bool:
        """A child of this node, or a node further down this node's subtree (one asks only when
        its own parent failed it, which this node may not have seen yet): each once."""
        if node in self.sockets:
            return False
        if node in self.children:
            return offset == 0
        below = node
        while below > self.node:
            below = parent_of(below, self.fanout)
        return below == self.node

    def serve(self, spool: Spool, deadline: float) -> None:
        """Send every child the spool, each from its own thread, none waiting on another; take
        in, meanwhile, the nodes that lost their parent below this one."""
        with self._lock:
            self._serving = (spool, deadline)
            for child in self.sockets:
                self._start(child, spool, deadline)
        if self.listener is not None:
            adopter = threading.Thread(target=self._adopt, args=(deadline,), daemon=True, name="hpctorch-stage-adopt")
            adopter.start()

    def _adopt(self, deadline: float) -> None:
        while not self._closing.is_set() and time.monotonic() < deadline:
            self._take_one(min(0.5, max(0.01, deadline - time.monotonic())))

    def _start(self, child: int, spool: Spool, deadline: float) -> None:
        self.sent[child] = self.offsets.get(child, 0)
        sender = threading.Thread(target=self._send, args=(child, self.sockets[child], spool, deadline, self.offsets.get(child, 0)),
                                  daemon=True, name=f"hpctorch-stage-to-{child}")
        self.senders.append(sender)
        sender.start()

    def _send(self, child: int, conn: socket.socket, spool: Spool, deadline: float, offset: int = 0) -> None:
        conn.setblocking(False)
        writable = select.poll()
        writable.register(conn, select.POLLOUT)
        started = moved = time.monotonic()
        paces = [(started, offset), (started, offset)]  # (when, bytes sent): the first, then the last OBSERVE_S's
        try:
            while offset < spool.size:
                count = spool.available(offset, deadline)
                now = time.monotonic()
                if now >= deadline:
                    raise late(offset, spool.size)
                if not writable.poll(1000 * min(1.0, deadline - now)):
                    if time.monotonic() - moved > self.idle_s:
                        raise TimeoutError(f"took nothing for {self.idle_s:.0f} s")
                    self._judge(child, offset, spool, deadline, paces)
                    continue
                try:
                    offset += os.sendfile(conn.fileno(), spool.fd, offset, count)  # the kernel copies: no byte through Python
                except BlockingIOError:
                    continue
                moved = time.monotonic()
                self.sent[child] = offset
                paces.append((moved, offset))
                self._judge(child, offset, spool, deadline, paces)
            conn.shutdown(socket.SHUT_WR)
        except _Cut as exc:
            with self._lock:
                self.dropped[child] = str(exc)
            if self.on_cut is not None:
                self.on_cut(child, str(exc))  # before its socket closes: it must not look for another parent
        except (OSError, SpreadError) as exc:  # gone, too slow, or this node's own upstream failed: its subtree says so itself
            with self._lock:
                self.dropped[child] = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        finally:
            conn.close()

    def _judge(self, child: int, offset: int, spool: Spool, deadline: float, paces: list[tuple[float, int]]) -> None:
        """Cut a child with children of its own that leaves bytes untaken and would end past the
        deadline at its pace, the better of the last OBSERVE_S's and the whole transfer's (a
        moment's stall, a disk's writeback, does not cut a child that kept up before). Such a child
        takes the bytes into its spool as they come, so its pace is its link's and CPU's; a leaf's
        is its extraction's, which a moment does not foretell (small files slowly, large ones at
        the disk's speed), and cutting it would spare nobody."""
        if not children_of(child, self.nnodes, self.fanout):
            return
        now = time.monotonic()
        while len(paces) > 3 and paces[2][0] < now - OBSERVE_S:
            del paces[1]  # paces[0] stays: the transfer's start
        (began, first), (since, then) = paces[0], paces[1]
        if now - began < OBSERVE_S or spool.written - offset < LAG_BYTES:
            return  # too soon to judge, or this node is the slow one (the child takes all it has)
        pace = max((offset - first) / (now - began), (offset - then) / max(now - since, 1e-3))
        if now + (spool.size - offset) / max(pace, 1.0) > deadline:
            raise _Cut(f"cut off by {self.name_of(self.node)}: it took {pace / 2**20:.1f} MiB/s, {offset / 2**20:.0f} of "
                       f"{spool.size / 2**20:.0f} MiB, and would not finish within its staging time (HPCTORCH_STAGE_TIMEOUT_S)")

    def least_sent(self) -> int:
        """The bytes the child furthest behind has been sent (what node 0 shows as progress)."""
        return min(self.sent.values(), default=0)

    def wait(self, deadline: float, tick: Callable[[int], None] | None = None) -> None:
        """Until every child (and every node taken in meanwhile) has the pack or was dropped: by
        ``deadline``, when the senders stop."""
        while time.monotonic() < deadline + JOIN_SLACK_S:
            running = [sender for sender in list(self.senders) if sender.is_alive()]
            if not running:
                break
            running[0].join(0.5)
            if tick is not None:
                tick(self.least_sent())

    def close(self) -> None:
        self._closing.set()
        with self._lock:
            for conn in self.sockets.values():
                conn.close()  # a sender still running stops at its next send
            self.sockets.clear()
            if self.listener is not None:
                self.listener.close()
                self.listener = None


class _Cut(Exception):
    """A child that cannot keep up (its parent's words)."""
